from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..arith import sum_of_three
from ..config import NetworkConfig
from ..headers import IPV4
from ..packet.insert import HeaderInserter
from ..packet.register import PacketRegister
from ..stream import BEAT_BYTES, forward, meta_with, packet_signature
from .checksum import header_words, ones_complement_fold, word_sum

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

    Latency 2 cycles. The packets pass two register slices. The first takes them as they
    are offered, with their header (the payload's length as its total length, the
    identification taken then, the fields that stay) and the plain sum of its words in
    three parts, so that the multiplexer in front of this block does not chain with a
    sum of many words. The second takes the header with its total length and the sum of
    the three parts, so that the block after it does not chain with a sum either; as a
    packet leaves, the sum is folded into the checksum by one adder and a choice
    (:func:`.checksum.ones_complement_add`). The fields that stay from packet to packet
    (``i_config.ip`` among them) and the sum of their words are kept in registers, so a
    new address is used from the packet that enters the cycle after it is set.
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
        # words; its fields lie in disjoint bits, so the plain sum of the words is that of
        # the words of the fields from the meta and the identification, plus that of the
        # fields that stay. It is summed in three parts, each one carry chain: the words
        # of the address and the protocol, those of the packet's other own fields, and
        # those that stay.
        words = IPV4.length // 2
        sum_shape = range(words * 0xFFFF + 1)
        m.submodules.entered = entered = PacketRegister(
            data.StructLayout({"ip": IPV4, "parts": data.ArrayLayout(sum_shape, 3)}),
            width=width)
        m.submodules.summed = summed = PacketRegister(
            meta_with(NEXT_HOP_META, ip=IPV4, ip_sum=sum_shape), width=width)
        m.submodules.header = inserter = HeaderInserter(
            "ip", IPV4, meta_with(NEXT_HOP_META, ip=IPV4), width=width)
        connect(m, inserter.o, flipped(self.o))

        # The fields that stay, and the sum of their words (the constant ones from reset
        # on) with the header's own length, the part of the total length not in the meta.
        constant = IPV4.const({"version": 4, "ihl": IPV4.length // 4, "df": 1, "ttl": TTL})
        stay = Signal(IPV4, init=constant)
        stay_sum = Signal(sum_shape, init=IPV4.length + sum(
            (constant.as_bits() >> 16 * index) & 0xFFFF for index in range(words)))
        stay_next = Signal(IPV4)
        m.d.comb += [
            stay_next.eq(constant),
            stay_next.src.eq(self.i_config.ip),
        ]
        m.d.sync += [stay.eq(stay_next), stay_sum.eq(word_sum(stay_next) + IPV4.length)]

        # A packet's own fields, its identification taken as its first beat enters, with
        # the fields that stay; the sum of their words in three parts.
        first = Signal(init=1)
        identification = Signal(16)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += first.eq(self.i.p.last)
            with m.If(first):
                m.d.sync += identification.eq(identification + 1)
        meta = self.i.p.meta
        own = Signal(IPV4)                      # the payload's length as the total length
        m.d.comb += [
            own.dscp.eq(meta.tos[2:]),
            own.ecn.eq(meta.tos[:2]),
            own.total_length.eq(meta.length),
            own.identification.eq(identification),
            own.protocol.eq(meta.protocol),
            own.dst.eq(meta.dst_ip),
            forward(self.i, entered.i),
            entered.i.p.meta.ip.eq(Value.cast(own) | Value.cast(stay)),
            entered.i.p.meta.parts[0].eq(word_sum(header_words(own, "dst", "protocol"))),
            entered.i.p.meta.parts[1].eq(word_sum(header_words(
                own, "dscp", "ecn", "total_length", "identification"))),
            entered.i.p.meta.parts[2].eq(stay_sum),
        ]

        # The header with its total length, and the sum of the parts.
        entering = entered.o.p.meta
        m.d.comb += [
            forward(entered.o, summed.i),
            summed.i.p.meta.dst_ip.eq(entering.ip.dst),
            summed.i.p.meta.ip.eq(entering.ip),
            summed.i.p.meta.ip.total_length.eq(entering.ip.total_length + IPV4.length),
            summed.i.p.meta.ip_sum.eq(sum_of_three(*entering.parts)),
        ]

        header = summed.o.p.meta
        m.d.comb += [
            forward(summed.o, inserter.i),
            inserter.i.p.meta.dst_ip.eq(header.dst_ip),
            inserter.i.p.meta.ip.eq(header.ip),
            inserter.i.p.meta.ip.checksum.eq(~ones_complement_fold(header.ip_sum)),
        ]
        return m
