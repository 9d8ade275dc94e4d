from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..config import NetworkConfig
from ..headers import IPV4
from ..packet.insert import HeaderInserter
from ..packet.register import PacketRegister
from ..stream import BEAT_BYTES, forward, meta_with, packet_signature
from .checksum import ones_complement_fold, word_sum

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
    header checksum. One beat per cycle.

    Latency 1 cycle: the packets pass a register slice first, with the sum of
    the header's words that come from their meta, so that neither the
    multiplexer in front of this block nor the block after it chains with the
    checksum. The header's other fields (``i_config.ip`` among them) and the
    sum of their words are kept in registers for the next packet, so a new
    address is used from the second cycle after it is set.
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

        # The header checksum (RFC 791) is the one's-complement sum of the header's 16-bit
        # words; its fields lie in disjoint bits, so that is the sum of the words of two
        # halves: the fields from the meta, and the others.
        words = IPV4.length // 2
        sum_shape = range(words * 0xFFFF + 1)

        m.submodules.summed = summed = PacketRegister(
            meta_with(NEXT_HOP_META, ip=IPV4, ip_sum=sum_shape), width=width)
        m.submodules.header = inserter = HeaderInserter(
            "ip", IPV4, meta_with(NEXT_HOP_META, ip=IPV4), width=width)
        connect(m, inserter.o, flipped(self.o))

        meta = self.i.p.meta
        from_meta = Signal(IPV4)
        m.d.comb += [
            from_meta.dscp.eq(meta.tos[2:]),
            from_meta.ecn.eq(meta.tos[:2]),
            from_meta.total_length.eq(meta.length + IPV4.length),
            from_meta.protocol.eq(meta.protocol),
            from_meta.dst.eq(meta.dst_ip),
            forward(self.i, summed.i),
            summed.i.p.meta.dst_ip.eq(meta.dst_ip),
            summed.i.p.meta.ip.eq(from_meta),
            summed.i.p.meta.ip_sum.eq(word_sum(from_meta)),
        ]

        # The other fields, for the next packet to start.
        first = Signal(init=1)
        start = summed.o.valid & summed.o.ready & first
        with m.If(summed.o.valid & summed.o.ready):
            m.d.sync += first.eq(summed.o.p.last)
        own = Signal(IPV4)
        own_next = Signal(IPV4)
        own_sum = Signal(sum_shape)
        m.d.comb += [
            own_next.version.eq(4),
            own_next.ihl.eq(IPV4.length // 4),
            own_next.identification.eq(own.identification + start),
            own_next.df.eq(1),
            own_next.ttl.eq(TTL),
            own_next.src.eq(self.i_config.ip),
        ]
        m.d.sync += [own.eq(own_next), own_sum.eq(word_sum(own_next))]

        m.d.comb += [
            forward(summed.o, inserter.i),
            inserter.i.p.meta.dst_ip.eq(summed.o.p.meta.dst_ip),
            inserter.i.p.meta.ip.eq(Value.cast(own) | Value.cast(summed.o.p.meta.ip)),
            inserter.i.p.meta.ip.checksum.eq(
                ~ones_complement_fold(own_sum + summed.o.p.meta.ip_sum)),
        ]
        return m
