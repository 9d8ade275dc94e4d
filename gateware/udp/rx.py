from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..counters import counters_layout, event_counter
from ..headers import IPV4, UDP
from ..ip.rx import IP_RX_META
from ..packet.extract import HeaderExtractor
from ..packet.router import PacketRouter
from ..stream import BEAT_BYTES, meta_with, packet_signature

__all__ = ["UdpReceiver", "UDP_RX_META"]

#: Meta of the datagrams this layer hands to services: frame length, Ethernet,
#: IPv4 and UDP headers (the source address and port to reply to are there).
UDP_RX_META = meta_with(IP_RX_META, udp=UDP)


class UdpReceiver(wiring.Component):
    """Hands each datagram, without its UDP header, to the service that
    listens on its destination port: ``o[k]`` for ``ports[k]``.

    Dropped and counted: ``length`` (UDP length other than the IPv4 payload
    length), ``port`` (no service on it), ``truncated``. The UDP checksum is
    not checked (the Ethernet FCS covers the frame; RoCEv2 has its ICRC).
    Latency: one beat and a cycle (the router's register slice: no path runs
    through this layer).
    """

    DROP_REASONS = ("length", "port")

    def __init__(self, ports, *, width=BEAT_BYTES):
        ports = tuple(ports)
        if not ports or len(set(ports)) != len(ports) or not all(
                isinstance(port, int) and 0 < port < 65536 for port in ports):
            raise ValueError(f"Ports must be distinct integers from 1 to 65535, not {ports!r}")
        self._ports = ports
        self._width = width
        super().__init__({
            "i": In(packet_signature(IP_RX_META, width=width)),
            "o": Out(packet_signature(UDP_RX_META, width=width)).array(len(ports)),
            "o_counters": Out(self.counters_layout()),
        })

    @property
    def ports(self):
        return self._ports

    @classmethod
    def counters_layout(cls):
        return counters_layout(*cls.DROP_REASONS, "truncated")

    def elaborate(self, platform):
        m = Module()
        width = self._width

        m.submodules.header = header = HeaderExtractor("udp", UDP, IP_RX_META, width=width)
        m.submodules.router = router = PacketRouter(UDP_RX_META, outputs=len(self._ports),
                                                    drop_reasons=self.DROP_REASONS, width=width,
                                                    registered=True)
        connect(m, flipped(self.i), header.i)
        connect(m, header.o, router.i)
        for index, port in enumerate(self.o):
            connect(m, router.o[index], flipped(port))

        meta = router.i.p.meta
        with m.If(meta.udp.length != meta.ip.total_length - IPV4.length):
            m.d.comb += router.i_drop.eq(router.drop_code("length"))
        with m.Else():
            m.d.comb += router.i_drop.eq(router.drop_code("port"))
            for index, port in enumerate(self._ports):
                with m.If(meta.udp.dst_port == port):
                    m.d.comb += [
                        router.i_drop.eq(0),
                        router.i_route.eq(index),
                    ]

        for reason in self.DROP_REASONS:
            m.d.comb += self.o_counters[reason].eq(router.o_drops[reason])
        m.d.comb += self.o_counters.truncated.eq(event_counter(m, header.o_truncated, "truncated"))
        return m
