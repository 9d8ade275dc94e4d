"""The requester's acknowledgement intake: every acknowledgement checked at once,
and per QP only the newest ACK and the newest NAK kept for the reliability engine."""

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .ack import ACK_EVENT, AETH_ACK, AETH_NAK, AETH_RESERVED, AETH_RNR_NAK, NAK_SEQUENCE
from .requests import QP_INDEX_BITS, check_qp_count

__all__ = ["AckIntake", "ACK_WINDOW", "ACK_TAKEN", "ACK_VERDICT", "lowest_set"]

#: What the intake checks an acknowledgement against: its QP's oldest unacknowledged
#: and next PSN, peer address and whether it is in ERROR (the engine's, read
#: combinationally at ``window_qp``).
ACK_WINDOW = data.StructLayout({"una": 24, "nxt": 24, "remote_ip": 32, "error": 1})

#: An acknowledgement for the engine to act on: its QP, PSN and AETH syndrome.
ACK_TAKEN = data.StructLayout({"qp": QP_INDEX_BITS, "psn": 24, "syndrome": 8})

#: What became of each acknowledgement: taken (it acknowledges packets not acknowledged
#: before, or is a NAK for the oldest unacknowledged packet) or dropped (a duplicate, a
#: ghost, from a stranger, for a QP in ERROR); and its AETH syndrome.
ACK_VERDICT = data.StructLayout({"qp": QP_INDEX_BITS, "taken": 1, "syndrome": 8})

#: A QP's NAK slot: the PSN and the AETH syndrome (its ACK slot is a PSN).
_NAK_SLOT = data.StructLayout({"psn": 24, "syndrome": 8})


def lowest_set(flags):
    """Whether any bit of ``flags`` (a power of 2 of them, 2 or more) is set, and the index
    of the lowest one that is: a tree, log2(len(flags)) multiplexers deep."""
    if len(flags) == 2:
        return flags.any(), ~flags[0]
    half = len(flags) // 2
    low_any, low_index = lowest_set(flags[:half])
    high_any, high_index = lowest_set(flags[half:])
    return low_any | high_any, Mux(low_any, Cat(low_index, C(0, 1)), Cat(high_index, C(1, 1)))


def _nak_rank(syndrome):
    """How much a NAK says, for two NAKs of one PSN: a sequence error 0, an RNR NAK 1
    (the packet arrived, the responder had no receive for it), an error NAK 2."""
    kind = syndrome[5:7]
    return Mux(kind == AETH_RNR_NAK, 1, Mux(syndrome[:5] == NAK_SEQUENCE, 0, 2))


class AckIntake(wiring.Component):
    """Takes one acknowledgement (``i``) every cycle, at any rate, and keeps per QP what
    the engine needs of them, so that none is ever lost.

    Acknowledgements are cumulative (IBTA 9.7.5.1, coalesced ACKs): an ACK for
    PSN p acknowledges every packet up to p, a NAK or RNR NAK for p every packet
    before p. Per QP the intake keeps ``furthest``, the last PSN the QP's
    acknowledgements so far acknowledge (``una - 1`` once the engine has acted
    on them). An acknowledgement is taken when it is from the QP's peer, its QP
    is not in ERROR, its syndrome is not reserved, and its PSN lies inside the
    window of packets outstanding (the engine's ``window``, read as
    ``window_qp``) and beyond ``furthest`` (a NAK: at ``furthest + 1`` or
    beyond); else it is dropped (a duplicate, a ghost, a stranger's). So the
    verdicts are those the engine would give acting on every acknowledgement
    in turn. Of those taken, the intake keeps per QP an ACK slot (up to
    ``furthest``) and apart a NAK slot (NAK sequence error, RNR NAK or error
    NAK; the newest, but of two for one PSN the error NAK over the RNR NAK
    over the sequence error, and an error NAK for good: the QP fails on it). An
    acknowledgement taken and not kept repeats what is kept. Every
    acknowledgement gets a verdict (``o_verdict``, with its syndrome, 2 cycles
    after ``i``); there is no queue, so none is lost, whatever the rate. An
    acknowledgement counts against the packets sent up to 2 cycles before it.

    ``o`` offers the engine one slot of one QP at a time, the NAK before the ACK
    of a QP, the QPs round-robin; an acknowledgement is offered from 4 cycles
    after ``i`` on. Taking it (``o.ready``) empties the slot, unless a newer
    acknowledgement fills it in the same cycle; after a take or a ``i_clear``
    the next offer comes a cycle later. ``i_clear`` empties the slots of a QP
    being set again, and drops its acknowledgements in flight.
    """

    def __init__(self, *, qps):
        self._qps = check_qp_count(qps)
        super().__init__({
            "i": In(stream.Signature(ACK_EVENT, always_ready=True)),
            "window_qp": Out(QP_INDEX_BITS),
            "window": In(ACK_WINDOW),
            "i_clear": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o": Out(stream.Signature(ACK_TAKEN)),
            "o_verdict": Out(stream.Signature(ACK_VERDICT, always_ready=True)),
        })

    @staticmethod
    def qp_state_bits():
        """Bits the intake keeps per QP: the slots, and their flags (in registers)."""
        return {"furthest": 24, "nak": _NAK_SLOT.size, "flags": 3}

    def elaborate(self, platform):
        m = Module()
        qp_bits = max((self._qps - 1).bit_length(), 1)
        entries = 1 << qp_bits
        clear = self.i_clear

        def one_hot(enable, qp):
            # A decoder (a LUT per bit), not a shifter of a 1.
            return Mux(enable, Cat(qp[:qp_bits] == entry for entry in range(entries)), 0)

        def cleared(qp):
            return clear.valid & (clear.p[:qp_bits] == qp[:qp_bits])

        # Stage 1: the window check's operands, from the QP's state as the engine has it.
        event = Signal(ACK_TAKEN)
        event_bit = Signal(entries)     # its QP, one-hot
        checked = Signal()
        stale = Signal()            # its QP is being set again: checked against the old one
        ahead = Signal(24)
        window = Signal(24)
        usable = Signal()
        acknowledgement = self.i.p
        state = self.window
        m.d.comb += self.window_qp.eq(acknowledgement.qp)
        m.d.sync += [
            checked.eq(self.i.valid),
            stale.eq(cleared(acknowledgement.qp)),
            event.qp.eq(acknowledgement.qp),
            event_bit.eq(one_hot(1, acknowledgement.qp)),
            event.psn.eq(acknowledgement.psn),
            event.syndrome.eq(acknowledgement.syndrome),
            ahead.eq(acknowledgement.psn - state.una),
            window.eq(state.nxt - state.una),
            usable.eq((acknowledgement.src_ip == state.remote_ip) & ~state.error
                      & (acknowledgement.syndrome[5:7] != AETH_RESERVED)),
        ]

        # Stage 2: against what the QP's acknowledgements said so far: ``furthest``, the
        # last PSN they acknowledge (an ACK for p: p; a NAK for p: p - 1), as ``una - 1``
        # will be once the engine has acted on them. An acknowledgement inside the window
        # and beyond it is taken (any NAK for p there, also one repeating the news); the
        # PSNs in memories, the flags in registers.
        known = Signal(entries)         # ``furthest`` holds since the QP was set
        has_ack = Signal(entries)       # an ACK up to ``furthest`` waits for the engine
        has_nak = Signal(entries)
        m.submodules.furthest = furthest = memory.Memory(shape=24, depth=entries, init=[])
        m.submodules.naks = naks = memory.Memory(shape=_NAK_SLOT, depth=entries, init=[])
        furthest_write = furthest.write_port()
        nak_write = naks.write_port()
        furthest_read = furthest.read_port(domain="comb")
        nak_slot = naks.read_port(domain="comb")
        m.d.comb += furthest_read.addr.eq(event.qp)

        is_nak = event.syndrome[5:7] != AETH_ACK
        # Beyond ``furthest``: not equal to it, and less than half the PSN space on (the
        # equality straight from the PSNs, beside the subtraction, not after it). Both lie
        # in the window of outstanding PSNs, far less than that wide.
        beyond = ~(event.psn == furthest_read.data) & ~(event.psn - furthest_read.data)[23]
        taken = Signal()
        m.d.comb += taken.eq(checked & usable & ~stale & (ahead < window)
                             & (~(known & event_bit).any() | beyond) & ~cleared(event.qp))
        m.d.comb += [
            furthest_write.addr.eq(event.qp),
            furthest_write.data.eq(event.psn - is_nak),
            furthest_write.en.eq(taken),
        ]
        kept = Signal(ACK_TAKEN)        # stage 3: an acknowledgement taken, to keep
        kept_bit = Signal(entries)
        kept_ack = Signal()
        kept_nak = Signal()
        m.d.sync += [
            self.o_verdict.valid.eq(checked),
            self.o_verdict.p.qp.eq(event.qp),
            self.o_verdict.p.taken.eq(taken),
            self.o_verdict.p.syndrome.eq(event.syndrome),
            kept.eq(event),
            kept_bit.eq(event_bit),
            kept_ack.eq(taken & ~is_nak),
            kept_nak.eq(taken & is_nak),
        ]

        # Stage 3: into the slots. A NAK taken is kept unless the one kept is for the same
        # PSN and says as much (a NAK taken is never behind the one kept), or is an error
        # NAK.
        m.d.comb += nak_slot.addr.eq(kept.qp)
        nak_fatal = ((nak_slot.data.syndrome[5:7] == AETH_NAK)
                     & (nak_slot.data.syndrome[:5] != NAK_SEQUENCE))
        nak_says_more = _nak_rank(kept.syndrome) > _nak_rank(nak_slot.data.syndrome)
        nak_news = ~(has_nak & kept_bit).any() | (
            ~nak_fatal & ((kept.psn != nak_slot.data.psn) | nak_says_more))
        sets_nak = kept_nak & nak_news & ~cleared(kept.qp)
        sets_ack = kept_ack & ~cleared(kept.qp)
        m.d.comb += [
            nak_write.addr.eq(kept.qp),
            nak_write.data.psn.eq(kept.psn),
            nak_write.data.syndrome.eq(kept.syndrome),
            nak_write.en.eq(sets_nak),
        ]

        # The offer: a QP with a slot filled, round-robin (``after``: the QPs after the
        # one last taken), chosen a cycle ahead from the flags.
        head = Signal(qp_bits)
        head_valid = Signal()
        settling = Signal()         # the flags changed by a take or a clear: choose again
        after = Signal(entries)
        pending = has_ack | has_nak
        any_after, first_after = lowest_set(pending & after)
        any_pending, first_pending = lowest_set(pending)
        head_nak = has_nak.bit_select(head, 1)
        offered_furthest = furthest.read_port(domain="comb")
        offered_nak = naks.read_port(domain="comb")
        m.d.comb += [
            offered_furthest.addr.eq(head),
            offered_nak.addr.eq(head),
            self.o.valid.eq(head_valid & ~settling),
            self.o.p.qp.eq(head),
            self.o.p.psn.eq(Mux(head_nak, offered_nak.data.psn, offered_furthest.data)),
            self.o.p.syndrome.eq(Mux(head_nak, offered_nak.data.syndrome, 0)),
        ]
        take = self.o.valid & self.o.ready
        m.d.sync += [
            head.eq(Mux(any_after, first_after, first_pending)),
            head_valid.eq(any_pending),
            settling.eq(take | clear.valid),
        ]
        with m.If(take):
            m.d.sync += after.eq(Cat(head < index for index in range(entries)))

        # The flags: a take or a clear empties a slot, an acknowledgement kept fills it
        # (also one being taken: the newer one stays).
        clear_mask = one_hot(clear.valid, clear.p)
        m.d.sync += [
            known.eq(known & ~clear_mask | Mux(taken, event_bit, 0)),
            has_ack.eq(has_ack & ~one_hot(take & ~head_nak, head) & ~clear_mask
                       | Mux(sets_ack, kept_bit, 0)),
            has_nak.eq(has_nak & ~one_hot(take & head_nak, head) & ~clear_mask
                       | Mux(sets_nak, kept_bit, 0)),
        ]
        return m
