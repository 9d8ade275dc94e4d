from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..counters import counters_layout, event_counter
from ..headers import ICMP_ECHO, IP_PROTO_ICMP
from ..ip.checksum import ones_complement_add
from ..ip.rx import IP_RX_META
from ..ip.tx import IP_TX_META
from ..packet.extract import HeaderExtractor
from ..packet.fifo import PacketFIFO
from ..packet.insert import HeaderInserter
from ..packet.router import PacketRouter
from ..stream import BEAT_BYTES, forward, meta_with, packet_signature

__all__ = ["IcmpEcho", "ICMP_COUNTERS"]

ICMP_COUNTERS = counters_layout("ignored", "dropped", "truncated")

ECHO_REPLY = 0
ECHO_REQUEST = 8


class IcmpEcho(wiring.Component):
    """Answers ICMP echo requests (ping) with echo replies carrying the same
    identifier, sequence number and data.

    The reply's checksum is the request's, updated for the type change
    (RFC 1624), so the data need not be summed. Requests wait whole in a FIFO
    of ``depth`` beats, so a busy transmitter never stalls the receive path.
    Counters: ``ignored`` (other ICMP messages), ``dropped`` (no room for the
    request), ``truncated``. The router before the FIFO ends in a register
    slice.
    """

    def __init__(self, *, depth=256, width=BEAT_BYTES):
        self._depth = depth
        self._width = width
        super().__init__({
            "i": In(packet_signature(IP_RX_META, width=width)),
            "o": Out(packet_signature(IP_TX_META, width=width)),
            "o_counters": Out(ICMP_COUNTERS),
        })

    def elaborate(self, platform):
        m = Module()
        width = self._width
        request_meta = meta_with(IP_RX_META, icmp=ICMP_ECHO)

        m.submodules.header = header = HeaderExtractor("icmp", ICMP_ECHO, IP_RX_META, width=width)
        m.submodules.router = router = PacketRouter(request_meta, outputs=1,
                                                    drop_reasons=("ignored",), width=width,
                                                    registered=True)
        m.submodules.fifo = fifo = PacketFIFO(request_meta, depth=self._depth,
                                              length_field="echo_length", width=width)
        m.submodules.reply = reply = HeaderInserter(
            "icmp", ICMP_ECHO, meta_with(IP_TX_META, icmp=ICMP_ECHO), width=width)
        connect(m, flipped(self.i), header.i)
        connect(m, header.o, router.i)
        connect(m, router.o[0], fifo.i)
        connect(m, reply.o, flipped(self.o))

        icmp = router.i.p.meta.icmp
        with m.If((icmp.type != ECHO_REQUEST) | (icmp.code != 0)):
            m.d.comb += router.i_drop.eq(router.drop_code("ignored"))

        request = fifo.o.p.meta
        meta = reply.i.p.meta
        m.d.comb += forward(fifo.o, reply.i)
        m.d.comb += [
            meta.dst_ip.eq(request.ip.src),
            meta.protocol.eq(IP_PROTO_ICMP),
            meta.length.eq(request.ip.total_length - request.ip.ihl * 4),
            meta.tos.eq(Cat(request.ip.ecn, request.ip.dscp)),
            meta.icmp.eq(request.icmp),
            meta.icmp.type.eq(ECHO_REPLY),
            # RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m') with m = type 8, code 0, and m' = 0.
            meta.icmp.checksum.eq(~ones_complement_add(
                ~request.icmp.checksum, C(~(ECHO_REQUEST << 8) & 0xFFFF, 16))),
        ]

        m.d.comb += [
            self.o_counters.ignored.eq(router.o_drops.ignored),
            self.o_counters.dropped.eq(event_counter(m, fifo.o_overflow_drop, "dropped")),
            self.o_counters.truncated.eq(event_counter(m, header.o_truncated, "truncated")),
        ]
        return m
