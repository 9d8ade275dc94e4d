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

__all__ = ["AckReceiver", "ACK_EVENT", "ACK_COUNTERS"]

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

#: An ACKNOWLEDGE packet from the IPv4 header to the AETH; the ICRC follows.
_HEADERS = IPV4.length + UDP.length + BTH.length + AETH.length


class AckReceiver(wiring.Component):
    """Takes the datagrams of UDP port 4791 and passes on the acknowledgements.

    A datagram is an acknowledgement when it is exactly BTH, AETH and ICRC in
    one beat with opcode ACKNOWLEDGE and BTH version 0 (else dropped as
    ``unsupported``: this endpoint is a requester only), for one of our
    ``qps`` QPs (QPN ``FIRST_QPN`` + index; else ``unknown_qp``), and its ICRC
    is right (else ``icrc_errors``; computed over the IPv4 and UDP headers of
    ``meta`` and the BTH and AETH, with the variant fields as ones, in one
    flat XOR per bit). Never stalls the receive path (``i`` is always ready).
    ``o`` has no backpressure: an event is valid for one cycle, 3 cycles
    after the datagram's beat (the ICRC is computed in one, compared in the
    next); so is ``o_icrc_error``, the QP of an acknowledgement dropped for
    its ICRC.
    """

    def __init__(self, *, qps, width=BEAT_BYTES):
        if width < BTH.length + AETH.length + ICRC_BYTES:
            raise ValueError(f"Beat width {width} does not hold an acknowledgement")
        self._qps = qps
        self._width = width
        super().__init__({
            "i": In(packet_signature(UDP_RX_META, width=width)),
            "o": Out(stream.Signature(ACK_EVENT, always_ready=True)),
            "o_icrc_error": Out(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o_counters": Out(ACK_COUNTERS),
        })

    def elaborate(self, platform):
        m = Module()
        meta = self.i.p.meta
        transport_bytes = BTH.length + AETH.length
        bth = BTH.from_wire(self.i.p.data[:8 * BTH.length])
        aeth = AETH.from_wire(self.i.p.data[8 * BTH.length:8 * transport_bytes])
        received_icrc = self.i.p.data[8 * transport_bytes:8 * (transport_bytes + ICRC_BYTES)]

        first = Signal(init=1)
        m.d.comb += self.i.ready.eq(1)
        with m.If(self.i.valid):
            m.d.sync += first.eq(self.i.p.last)

        # Stage 1: the covered bytes, and the checks that need no CRC.
        covered = Signal(8 * _HEADERS)
        expected_icrc = Signal(8 * ICRC_BYTES)
        candidate = Signal()
        shaped = Signal()
        known_qp = Signal()
        event = Signal(ACK_EVENT)
        qp = bth.dest_qp - FIRST_QPN
        m.d.sync += [
            covered.eq(Cat(IPV4.to_wire(meta.ip), UDP.to_wire(meta.udp),
                           self.i.p.data[:8 * transport_bytes])),
            expected_icrc.eq(received_icrc),
            candidate.eq(self.i.valid & first),
            shaped.eq(self.i.p.last
                      & (meta.udp.length == UDP.length + transport_bytes + ICRC_BYTES)
                      & (bth.opcode == Opcode.ACKNOWLEDGE) & (bth.version == 0)),
            known_qp.eq((bth.dest_qp >= FIRST_QPN) & (qp < self._qps)),
            event.qp.eq(qp),
            event.src_ip.eq(meta.ip.src),
            event.psn.eq(bth.psn),
            event.syndrome.eq(aeth.syndrome),
            event.msn.eq(aeth.msn),
        ]

        # Stage 2: the ICRC. The variant fields count as ones, so their
        # share of each bit, like the pseudo-LRH's, is a constant: each register bit is
        # one flat XOR of the other covered bits.
        register_matrix, data_matrix = ICRC.matrices(_HEADERS)
        mask = variant_mask(_HEADERS)
        constant = (data_matrix @ mask) ^ (register_matrix @ ICRC.process(ICRC.initial,
                                                                          PSEUDO_LRH))
        # The register is kept, with what stage 1 found, for stage 3 to compare.
        register = Signal(ICRC.width)
        received = Signal.like(expected_icrc)
        wanted = Signal()                   # a candidate, shaped, for a known QP
        found = Signal(ACK_EVENT)
        m.d.sync += [
            register.eq(Cat(
                Cat(covered[bit] for bit in range(len(covered))
                    if (row >> bit) & 1 and not (mask >> bit) & 1).xor()
                ^ ((constant >> index) & 1)
                for index, row in enumerate(data_matrix.rows))),
            received.eq(expected_icrc),
            wanted.eq(candidate & shaped & known_qp),
            found.eq(event),
        ]

        # Stage 3: the verdict.
        icrc_ok = ICRC.finalize_value(register) == received
        accepted = wanted & icrc_ok
        icrc_error = wanted & ~icrc_ok
        m.d.sync += [
            self.o.valid.eq(accepted),
            self.o.p.eq(found),
            self.o_icrc_error.valid.eq(icrc_error),
            self.o_icrc_error.p.eq(found.qp),
        ]
        counters = self.o_counters
        m.d.comb += [
            counters.acks.eq(event_counter(m, accepted, "acks")),
            counters.unsupported.eq(event_counter(m, candidate & ~shaped, "unsupported")),
            counters.unknown_qp.eq(event_counter(m, candidate & shaped & ~known_qp, "unknown_qp")),
            counters.icrc_errors.eq(event_counter(m, icrc_error, "icrc_errors")),
        ]
        return m
