from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..config import NetworkConfig
from ..headers import IPV4
from ..packet.insert import HeaderInserter
from ..stream import BEAT_BYTES, forward, meta_with, packet_signature
from .checksum import header_checksum

__all__ = ["IPv4Transmitter", "IP_TX_META", "NEXT_HOP_META"]

#: Meta of the packets this layer sends: where to, which protocol, the payload
#: length in bytes, and the DSCP/ECN byte (traffic class).
IP_TX_META = data.StructLayout({"dst_ip": 32, "protocol": 8, "length": 16, "tos": 8})

#: Meta of the packets it hands down: the destination, for address resolution.
NEXT_HOP_META = data.StructLayout({"dst_ip": 32})

TTL = 64


class IPv4Transmitter(wiring.Component):
    """Puts an IPv4 header in front of each packet: no options, DF set, TTL 64,
    our address as source, an identification that counts packets, and the
    header checksum. Latency 0; one beat per cycle.
    """

    def __init__(self, *, width=BEAT_BYTES):
        self._width = width
        super().__init__({
            "i": In(packet_signature(IP_TX_META, width=width)),
            "i_config": In(NetworkConfig),
            "o": Out(packet_signature(NEXT_HOP_META, width=width)),
        })

    def elaborate(self, platform):
        m = Module()
        width = self._width

        m.submodules.header = inserter = HeaderInserter(
            "ip", IPV4, meta_with(NEXT_HOP_META, ip=IPV4), width=width)
        connect(m, inserter.o, flipped(self.o))

        first = Signal(init=1)
        identification = Signal(16)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += first.eq(self.i.p.last)
            with m.If(first):
                m.d.sync += identification.eq(identification + 1)

        src = self.i.p.meta
        header = Signal(IPV4)
        m.d.comb += [
            header.version.eq(4),
            header.ihl.eq(IPV4.length // 4),
            header.dscp.eq(src.tos[2:]),
            header.ecn.eq(src.tos[:2]),
            header.total_length.eq(src.length + IPV4.length),
            header.identification.eq(identification),
            header.df.eq(1),
            header.ttl.eq(TTL),
            header.protocol.eq(src.protocol),
            header.src.eq(self.i_config.ip),
            header.dst.eq(src.dst_ip),
        ]
        m.d.comb += forward(self.i, inserter.i)
        m.d.comb += [
            inserter.i.p.meta.dst_ip.eq(src.dst_ip),
            inserter.i.p.meta.ip.eq(header),
            inserter.i.p.meta.ip.checksum.eq(header_checksum(header)),
        ]
        return m
