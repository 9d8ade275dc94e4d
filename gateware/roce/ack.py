"""The requester's receive side: ACKNOWLEDGE packets (ACKs, RNR NAKs and NAKs)."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..counters import counters_layout, event_counter
from ..headers import AETH, BTH, IPV4, UDP
from ..stream import BEAT_BYTES, packet_signature
from ..udp.rx import UDP_RX_META
from .icrc import ICRC, ICRC_BYTES, PSEUDO_LRH, variant_mask
from .opcodes import Opcode
from .requests import FIRST_QPN, QP_INDEX_BITS

__all__ = ["AckReceiver", "ACK_EVENT", "ACK_COUNTERS", "AETH_ACK", "AETH_RNR_NAK",
           "AETH_RESERVED", "AETH_NAK", "NAK_SEQUENCE", "CNP_RESERVED"]

#: AETH syndrome bits 6:5 (IBTA table 41), and the NAK code (bits 4:0) of a PSN
#: sequence error.
AETH_ACK, AETH_RNR_NAK, AETH_RESERVED, AETH_NAK = 0, 1, 2, 3
NAK_SEQUENCE = 0

#: One acknowledgement, as the reliability engine needs it: which QP, from
#: where, the PSN it covers and the AETH (syndrome: ACK, RNR NAK or NAK, with
#: its credits, timer or code; MSN).
ACK_EVENT = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "src_ip": 32,
    "psn": 24,
    "syndrome": 8,
    "msn": 24,
})

#: What the ACK receiver counts: accepted acknowledgements, and drops by reason.
ACK_COUNTERS = counters_layout("acks", "icrc_errors", "unsupported", "unknown_qp")

#: Bytes after the BTH of a RoCEv2 congestion notification packet (IBTA annex A17.9.3:
#: BTH opcode 0x81, 16 reserved bytes, ICRC).
CNP_RESERVED = 16

#: What the ICRC of either covers first: the IPv4, UDP and BTH headers.
_PREFIX = IPV4.length + UDP.length + BTH.length


class AckReceiver(wiring.Component):
    """Takes the datagrams of UDP port 4791 and passes on the acknowledgements and
    congestion notifications.

    A datagram is an acknowledgement when it is exactly BTH, AETH and ICRC in
    one beat with opcode ACKNOWLEDGE, and a CNP when it is exactly BTH, 16
    reserved bytes and ICRC with opcode CNP (0x81); either with BTH version 0
    (else dropped as ``unsupported``: this endpoint is a requester only), for
    one of our ``qps`` QPs (QPN ``FIRST_QPN`` + index; else ``unknown_qp``),
    and with a right ICRC (else ``icrc_errors``). The ICRC is computed over the
    IPv4 and UDP headers of ``meta`` and the BTH, with the variant fields as
    ones, in one flat XOR per bit, then over the AETH or the reserved bytes in
    another. Never stalls the receive path (``i`` is always ready). ``o`` has
    no backpressure: an event is valid for one cycle, 3 cycles after the
    datagram's beat (the headers' share of the ICRC and, apart, the tail's
    are computed in one, their sum and the comparison in the next); so are
    ``o_icrc_error``, the QP of an acknowledgement dropped for its ICRC, and
    ``o_cnp``, the QP of a CNP.
    """

    def __init__(self, *, qps, width=BEAT_BYTES):
        if width < BTH.length + CNP_RESERVED + ICRC_BYTES:
            raise ValueError(f"Beat width {width} does not hold a CNP")
        self._qps = qps
        self._width = width
        super().__init__({
            "i": In(packet_signature(UDP_RX_META, width=width)),
            "o": Out(stream.Signature(ACK_EVENT, always_ready=True)),
            "o_icrc_error": Out(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o_cnp": Out(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o_counters": Out(ACK_COUNTERS),
        })

    def elaborate(self, platform):
        m = Module()
        meta = self.i.p.meta
        beat = self.i.p.data
        bth = BTH.from_wire(beat[:8 * BTH.length])
        aeth = AETH.from_wire(beat[8 * BTH.length:8 * (BTH.length + AETH.length)])

        def bytes_at(offset, length):
            return beat[8 * offset:8 * (offset + length)]

        def udp_length(after_bth):
            return meta.udp.length == UDP.length + BTH.length + after_bth + ICRC_BYTES

        first = Signal(init=1)
        m.d.comb += self.i.ready.eq(1)
        with m.If(self.i.valid):
            m.d.sync += first.eq(self.i.p.last)

        # Stage 1: the covered bytes, and the checks that need no CRC.
        prefix = Signal(8 * _PREFIX)
        tail = Signal(8 * CNP_RESERVED)         # the AETH first, for an ACK
        ack_icrc = Signal(8 * ICRC_BYTES)
        cnp_icrc = Signal(8 * ICRC_BYTES)
        candidate = Signal()
        is_ack = Signal()
        is_cnp = Signal()
        known_qp = Signal()
        event = Signal(ACK_EVENT)
        qp = bth.dest_qp - FIRST_QPN
        plain = self.i.p.last & (bth.version == 0)
        m.d.sync += [
            prefix.eq(Cat(IPV4.to_wire(meta.ip), UDP.to_wire(meta.udp), beat[:8 * BTH.length])),
            tail.eq(bytes_at(BTH.length, CNP_RESERVED)),
            ack_icrc.eq(bytes_at(BTH.length + AETH.length, ICRC_BYTES)),
            cnp_icrc.eq(bytes_at(BTH.length + CNP_RESERVED, ICRC_BYTES)),
            candidate.eq(self.i.valid & first),
            is_ack.eq(plain & (bth.opcode == Opcode.ACKNOWLEDGE) & udp_length(AETH.length)),
            is_cnp.eq(plain & (bth.opcode == Opcode.CNP) & udp_length(CNP_RESERVED)),
            known_qp.eq((bth.dest_qp >= FIRST_QPN) & (qp < self._qps)),
            event.qp.eq(qp),
            event.src_ip.eq(meta.ip.src),
            event.psn.eq(bth.psn),
            event.syndrome.eq(aeth.syndrome),
            event.msn.eq(aeth.msn),
        ]

        # Stage 2: the register after the headers. The variant fields count as ones, so
        # their share of each bit, like the pseudo-LRH's, is a constant: each register bit
        # is one flat XOR of the other covered bits.
        register_matrix, data_matrix = ICRC.matrices(_PREFIX)
        mask = variant_mask(_PREFIX)
        constant = (data_matrix @ mask) ^ (register_matrix @ ICRC.process(ICRC.initial,
                                                                          PSEUDO_LRH))
        register = Signal(ICRC.width)
        # The tail's share of the ICRC, worked out here from its bytes beside the register.
        tail_lengths = {"ack": AETH.length, "cnp": CNP_RESERVED}
        tails = {kind: ICRC.matrices(length) for kind, length in tail_lengths.items()}
        tail_share = {kind: Signal(ICRC.width, name=f"{kind}_tail_share") for kind in tails}
        received = {"ack": Signal.like(ack_icrc), "cnp": Signal.like(cnp_icrc)}
        wanted = {"ack": Signal(), "cnp": Signal()}     # a candidate of that kind, known QP
        found = Signal(ACK_EVENT)
        m.d.sync += [
            register.eq(Cat(
                Cat(prefix[bit] for bit in range(len(prefix))
                    if (row >> bit) & 1 and not (mask >> bit) & 1).xor()
                ^ ((constant >> index) & 1)
                for index, row in enumerate(data_matrix.rows))),
            received["ack"].eq(ack_icrc),
            received["cnp"].eq(cnp_icrc),
            wanted["ack"].eq(candidate & is_ack & known_qp),
            wanted["cnp"].eq(candidate & is_cnp & known_qp),
            found.eq(event),
        ]
        for kind, length in tail_lengths.items():
            m.d.sync += tail_share[kind].eq(tails[kind][1].apply(tail[:8 * length]))

        # Stage 3: the rest of the ICRC, and the verdict.
        right = {}
        for kind in ("ack", "cnp"):
            final = Signal(ICRC.width, name=f"{kind}_register")
            right[kind] = Signal(name=f"{kind}_right")
            m.d.comb += [final.eq(tails[kind][0].apply(register) ^ tail_share[kind]),
                         right[kind].eq(ICRC.finalize_value(final) == received[kind])]
        accepted = wanted["ack"] & right["ack"]
        cnp = wanted["cnp"] & right["cnp"]
        icrc_error = (wanted["ack"] & ~right["ack"]) | (wanted["cnp"] & ~right["cnp"])
        m.d.sync += [
            self.o.valid.eq(accepted),
            self.o.p.eq(found),
            self.o_icrc_error.valid.eq(icrc_error),
            self.o_icrc_error.p.eq(found.qp),
            self.o_cnp.valid.eq(cnp),
            self.o_cnp.p.eq(found.qp),
        ]
        counters = self.o_counters
        m.d.comb += [
            counters.acks.eq(event_counter(m, accepted, "acks")),
            counters.unsupported.eq(event_counter(m, candidate & ~is_ack & ~is_cnp,
                                                  "unsupported")),
            counters.unknown_qp.eq(event_counter(m, candidate & (is_ack | is_cnp) & ~known_qp,
                                                 "unknown_qp")),
            counters.icrc_errors.eq(event_counter(m, icrc_error, "icrc_errors")),
        ]
        return m
