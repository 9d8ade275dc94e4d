from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..headers import IP_PROTO_UDP, UDP
from ..ip.tx import IP_TX_META
from ..packet.insert import HeaderInserter
from ..stream import BEAT_BYTES, forward, meta_with, packet_signature

__all__ = ["UdpTransmitter", "UDP_TX_META"]

#: Meta of the datagrams a service sends: destination address and ports,
#: payload length in bytes, DSCP/ECN byte.
UDP_TX_META = data.StructLayout({
    "dst_ip": 32, "src_port": 16, "dst_port": 16, "length": 16, "tos": 8})


class UdpTransmitter(wiring.Component):
    """Puts a UDP header in front of each datagram (checksum 0: none, as
    RoCEv2 sends it). Latency 0; one beat per cycle.
    """

    def __init__(self, *, width=BEAT_BYTES):
        self._width = width
        super().__init__({
            "i": In(packet_signature(UDP_TX_META, width=width)),
            "o": Out(packet_signature(IP_TX_META, width=width)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.header = inserter = HeaderInserter(
            "udp", UDP, meta_with(IP_TX_META, udp=UDP), width=self._width)
        connect(m, inserter.o, flipped(self.o))

        src = self.i.p.meta
        dst = inserter.i.p.meta
        m.d.comb += forward(self.i, inserter.i)
        m.d.comb += [
            dst.dst_ip.eq(src.dst_ip),
            dst.protocol.eq(IP_PROTO_UDP),
            dst.length.eq(src.length + UDP.length),
            dst.tos.eq(src.tos),
            dst.udp.src_port.eq(src.src_port),
            dst.udp.dst_port.eq(src.dst_port),
            dst.udp.length.eq(src.length + UDP.length),
        ]
        return m
