"""The reliability engine's ACK handler: one FSM that acts on one QP at a time (an
acknowledgement, an expired timer, a close, a reset) and retires the messages
acknowledged as completions."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..arith import difference_at_least, wrapped_before
from ..stream import BEAT_BYTES
from .ack import AETH_ACK, AETH_NAK, AETH_RNR_NAK, NAK_SEQUENCE
from .ack_intake import ACK_TAKEN
from .descriptor import POINTER_BITS, SLOT_BITS
from .qp_context import (
    EVENT_COUNTERS,
    PEER,
    QP_FLAGS,
    lookup,
    per_qp_layouts,
    update,
)
from .qp_flags import ENGINE_FLAG_WRITES
from .requests import (
    COMPLETION,
    MAX_MESSAGE_BYTES,
    QP_INDEX_BITS,
    QP_WRITE,
    CompletionStatus,
    PathMtu,
    check_qp_count,
)
from .slot_pool import slot_entry
from .timer_sweep import expired_timer

__all__ = ["AckHandler", "RNR_RETRY_FOREVER", "MAX_PACKETS"]

#: Packets of the longest message (2^31 bytes at path MTU 256).
MAX_PACKETS = MAX_MESSAGE_BYTES // PathMtu.MTU_256.bytes

#: An RNR retry count of 7 retries without limit (IBTA 9.7.5.2.8).
RNR_RETRY_FOREVER = 7

#: Packets a QP may have outstanding, at most: a packet with payload takes a beat or more
#: of the QP's retransmit ring (under 2^21 beats), an empty one a message slot. Below half
#: the PSN space (IBTA 9.7.1: the PSNs outstanding and those acknowledged must not alias),
#: so ``nxt - una`` never wraps, and ``una - first_psn`` of the QP's oldest message is
#: either up to its packets and those outstanding after it (``una`` reached it) or, in
#: ERROR, down to minus those outstanding: below 3 * 2^22, or above it, modulo 2^24.
_MAX_OUTSTANDING = (1 << POINTER_BITS - 1) + (1 << SLOT_BITS)
assert MAX_PACKETS + _MAX_OUTSTANDING < 3 << 22 and _MAX_OUTSTANDING < 1 << 22

#: NAK codes (AETH syndrome bits 4:0) and what the work request completes with.
_NAK_STATUS = {
    1: CompletionStatus.REMOTE_INVALID_REQUEST,
    2: CompletionStatus.REMOTE_ACCESS_ERROR,
    3: CompletionStatus.REMOTE_OPERATIONAL_ERROR,
    4: CompletionStatus.REMOTE_INVALID_REQUEST,     # invalid RD request
}

#: The per-QP memories the handler reads, and those it writes.
_READS = ("una", "nxt", "end", "positions", "retry", "peer", "event_counters")
_WRITES = ("una", "positions", "retry", "rnr_code", "peer", "event_counters")


class AckHandler(wiring.Component):
    """Acts on one QP at a time, ``qp``, in an FSM; between two jobs it waits in IDLE
    (``o_busy`` low) and takes, in this order: a reset (``i_reset``, once ``i_quiet``
    says nothing else writes the QP's state in the next cycle and ``i_pages_clear``
    that the QP holds no retransmit page; written in that next cycle, from a register;
    ``i_quiet`` is looked at there, from a register, and without it the reset waits
    in IDLE again),
    a close (``i_close``), an expired timer
    (``i_expired``, so that acknowledgements streaming in do not hold it), an
    acknowledgement (``i_ack``, from :class:`AckIntake`).

    - Reset: taken once the QP's list of messages is empty; a QP with messages
      outstanding is closed first (below), so that each of them completes and
      its slot goes back to the pool.

    - Acknowledgement for p (an ACK covers p, a NAK or RNR NAK the PSNs before p):
      checked again against the QP's window (one behind ``una`` says nothing new),
      then ``una`` advances; progress restores both retry counts and restarts the
      ACK timer. NAK sequence error: resend from p, ``una`` now (``resend``), one of
      ``retry_count`` retries, unless a resend from p is already under way
      (``retrying``: IBTA 9.7.5.2, as rxe). RNR NAK: an RNR wait (``rnr_wait``, the
      AETH's timer code) then a resend from p, ``rnr_retry`` times
      (:data:`RNR_RETRY_FOREVER`: always). Error NAKs: ERROR with their status.
    - Expired ACK timer: resend from ``una``, one retry; expired RNR wait: the wait
      ends (the resend was due already).
    - Close: ERROR (FLUSHED) unless the QP is in ERROR already.
    - No retries left: ERROR, RETRY_EXCEEDED or RNR_RETRY_EXCEEDED.

    After an acknowledgement taken, a timeout that fails the QP, or a close, it
    retires the QP's oldest messages in order (``o_completion``): each whose last
    packet is acknowledged with the status its payload ended with (``r_status``),
    and in ERROR every one (the failed work request with the error status, the
    others FLUSHED), and gives its slot back to the pool (``o_free``); the ring
    room of a message that is not done is freed up to its packets acknowledged.

    It reads the QP's state through registered ports addressed a cycle ahead
    (``r_*`` of the per-QP memories and its flags, ``"transparent"``), the oldest message slot
    through registered ports of the slot pool (``r_ring``, ``r_status``), and
    writes the QP's state (``w_*``; a reset writes the QP's settings and clears
    the rest but its list, empty by then) and its flags (``o_flags``); a restart of
    the QP's timer shows on ``o_timer_restart``, for the timer sweep.
    ``o_reset`` shows the reset it takes, and ``o_reset_waits`` that a reset waits on
    it (in IDLE, or in RESET).

    Latency, from IDLE back to IDLE: an acknowledgement 4 cycles (IDLE, ACK,
    ACK_APPLY, RETIRE; 3 when it says nothing new by then) and 1 more per message
    it completes; an expired timer 2 (IDLE, EXPIRE), 4 when it fails the QP (then
    RETIRE_CHECK, RETIRE); a close 4 (IDLE, CLOSE, RETIRE_CHECK, RETIRE); a reset 2
    (IDLE, RESET), or 3 when the FSM's QP was another (its list is read first), and 2
    more each time it finds the other writers busy. A
    failed QP takes 1 cycle more per message it flushes. The reads of ``r_*`` come a
    cycle after their address, so each state acts on the QP it was entered with.
    """

    def __init__(self, *, qps, slots, count_bits, width=BEAT_BYTES):
        self._qps = check_qp_count(qps)
        self._width = width
        slot_bits = (slots - 1).bit_length()
        layouts = per_qp_layouts(slot_bits, count_bits)
        members = {
            "i_reset": In(stream.Signature(QP_WRITE)),
            "i_quiet": In(1),
            "i_pages_clear": In(1),
            "i_close": In(stream.Signature(QP_INDEX_BITS)),
            "i_expired": In(stream.Signature(expired_timer(qps))),
            "i_ack": In(stream.Signature(ACK_TAKEN)),
            "r_flags": Out(lookup(QP_FLAGS, QP_INDEX_BITS)),
            "r_ring": Out(lookup(slot_entry(slot_bits), slot_bits)),
            "r_status": Out(lookup(CompletionStatus, slot_bits)),
            "o_free": Out(stream.Signature(slot_bits, always_ready=True)),
            "o_flags": Out(ENGINE_FLAG_WRITES),
            "o_reset": Out(stream.Signature(QP_WRITE, always_ready=True)),
            "o_busy": Out(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o_reset_waits": Out(1),
            "o_timer_restart": Out(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o_completion": Out(stream.Signature(COMPLETION)),
        }
        for name in _READS:
            members[f"r_{name}"] = Out(lookup(layouts[name], QP_INDEX_BITS))
        for name in _WRITES:
            members[f"w_{name}"] = Out(update(layouts[name], QP_INDEX_BITS))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        qps = self._qps
        beat_bits = (self._width - 1).bit_length()
        reset = self.i_reset.p
        una_write, positions_write, retry_write = self.w_una, self.w_positions, self.w_retry
        rnr_code_write = self.w_rnr_code
        peer_write, event_counters_write = self.w_peer, self.w_event_counters

        def fsm_flag(name, value):
            m.d.comb += [self.o_flags[name].en.eq(1), self.o_flags[name].value.eq(value)]

        # A reset is taken (in RESET) when no other writer of its state is busy then
        # (``i_quiet`` in the cycle before, registered: so that the other writers' offers
        # reach no decision of the FSM in their cycle).
        resetting = Signal()
        quiet_then = Signal()
        m.d.sync += quiet_then.eq(self.i_quiet)
        reset_write = self.o_reset.valid
        m.d.comb += [
            reset_write.eq(resetting & (reset.qp < qps)),
            self.o_reset.p.eq(reset),
        ]

        # The FSM works on one QP, ``qp``, at a time; it reads that QP's state through
        # ports addressed a cycle ahead (``qp_next``).
        qp = Signal(QP_INDEX_BITS)
        qp_next = Signal(QP_INDEX_BITS)
        m.d.comb += [qp_next.eq(qp), self.o_flags.qp.eq(qp)]
        m.d.sync += qp.eq(qp_next)
        for name in (*_READS, "flags"):
            m.d.comb += getattr(self, f"r_{name}").addr.eq(qp_next)
        s_una, s_nxt, s_end = self.r_una.data, self.r_nxt.data, self.r_end.data
        s_positions, s_retry = self.r_positions.data, self.r_retry.data
        s_peer, s_counters = self.r_peer.data, self.r_event_counters.data
        s_error, s_retrying = self.r_flags.data.error, self.r_flags.data.retrying
        # What the FSM writes; fields it leaves alone keep their value.
        for write, kept in ((una_write, None), (positions_write, s_positions),
                            (retry_write, s_retry), (rnr_code_write, None)):
            m.d.comb += write.addr.eq(qp)
            if kept is not None:
                m.d.comb += write.data.eq(kept)
        counts = {name: Signal(name=f"count_{name}") for name in EVENT_COUNTERS.members}

        event = Signal(ACK_TAKEN)
        # What ``una`` becomes if the acknowledgement is taken (an ACK covers its PSN, a
        # NAK the ones before it), worked out as the acknowledgement is: the ACK state
        # only compares it with ``una``.
        una_after = Signal(24)
        entry = self.r_ring.data
        # The oldest message's slot is read a cycle ahead and checked (ACK_APPLY,
        # RETIRE_CHECK), into registers that RETIRE acts on; each slot after it is read as
        # the one before is checked, and checked as that one completes, so that the FSM
        # retires a message a cycle (it holds the next slot's read while a completion
        # waits).
        retire_slot = Signal.like(self.r_ring.addr)
        retiring = Signal()                 # a message completes
        # The message checked, for RETIRE: its slot's entry and status, whether it is past
        # the end of the list, whether ``una`` reached it (see ``_MAX_OUTSTANDING``: a
        # message of 2^23 packets completes too) and how far.
        held = Signal.like(entry)
        held_status = Signal.like(self.r_status.data)
        held_empty = Signal()
        held_done = Signal()
        held_covered = Signal(24)

        # One check for every state that checks (see below, after the FSM): each state
        # names its slot and whether it checks against the acknowledgement's ``una``
        # (``new_una``) or the QP's (``s_una``).
        checking = Signal()
        check_slot = Signal.like(retire_slot)
        check_acked = Signal()

        def check(slot, *, acked):
            """Checks the message in ``slot`` (read in the cycle before) against the
            acknowledgement's ``una`` (``acked``) or the QP's."""
            m.d.comb += [checking.eq(1), check_slot.eq(slot), check_acked.eq(acked)]
        m.d.comb += [
            self.r_ring.addr.eq(retire_slot),
            self.r_status.addr.eq(retire_slot),
        ]
        expired_rnr_wait = Signal()         # the timer taken is an RNR wait

        def fail(status):
            fsm_flag("error", 1)
            fsm_flag("resend", 0)
            fsm_flag("rnr_wait", 0)
            fsm_flag("retrying", 0)
            m.d.comb += [
                retry_write.en.eq(1),
                retry_write.data.error_status.eq(status),
                retry_write.data.error_reported.eq(0),
            ]

        def resend():
            """A resend from ``una`` is due (the walker reads it when it starts)."""
            fsm_flag("resend", 1)
            fsm_flag("retrying", 1)

        def restart_timer(rnr_code=None):
            """The QP's timer starts again (an RNR wait, with ``rnr_code``): the timer
            sweep takes the start."""
            m.d.comb += self.o_timer_restart.valid.eq(1)
            if rnr_code is not None:
                m.d.comb += [rnr_code_write.en.eq(1), rnr_code_write.data.eq(rnr_code)]

        def ring_room_after(covered):
            """The ring position after the first ``covered`` packets of ``held``."""
            position = Signal(POINTER_BITS)
            with m.Switch(held.message.path_mtu):
                for mtu in PathMtu:
                    with m.Case(mtu):
                        m.d.comb += position.eq(
                            held.message.start
                            + (covered << ((mtu.bytes >> beat_bits).bit_length() - 1)))
            return position

        with m.FSM() as engine:
            with m.State("IDLE"):
                # While a reset waits for quiet, nothing else goes in (the views soon
                # block new packets): the other choices do not wait on ``i_quiet``. The
                # QP's list is read first (for ``qp``, the QP of the cycle before): with
                # messages in it, the QP is closed first. The QP read next is the
                # acknowledgement's unless another job goes first, whether one is offered
                # or not (in IDLE the QP is written nothing), so that the reads' address
                # does not wait on the offer.
                m.d.comb += qp_next.eq(self.i_ack.p.qp)
                with m.If(self.i_reset.valid):
                    m.d.comb += qp_next.eq(reset.qp)
                    listed = s_positions.first.slot != s_end.slot
                    with m.If(reset.qp >= qps):
                        m.next = "RESET"
                    with m.Elif(qp == reset.qp):
                        with m.If(listed):
                            m.next = "CLOSE"
                        with m.Elif(self.i_pages_clear):
                            m.next = "RESET"
                with m.Elif(self.i_close.valid):
                    m.d.comb += [self.i_close.ready.eq(1), qp_next.eq(self.i_close.p)]
                    with m.If(self.i_close.p < qps):
                        m.next = "CLOSE"
                # A timer expired goes first, so that acknowledgements streaming in do
                # not hold it.
                with m.Elif(self.i_expired.valid):
                    m.d.comb += [qp_next.eq(self.i_expired.p.qp), self.i_expired.ready.eq(1)]
                    m.d.sync += expired_rnr_wait.eq(self.i_expired.p.rnr_wait)
                    m.next = "EXPIRE"
                with m.Elif(self.i_ack.valid):
                    m.d.comb += self.i_ack.ready.eq(1)
                    m.d.sync += [
                        event.eq(self.i_ack.p),
                        una_after.eq(Mux(self.i_ack.p.syndrome[5:7] == AETH_ACK,
                                         self.i_ack.p.psn + 1, self.i_ack.p.psn)[:24]),
                    ]
                    m.next = "ACK"

            # An acknowledgement in two steps: what it means (kept in registers), then
            # what the handler does about it.
            kind = event.syndrome[5:7]
            code = event.syndrome[:5]
            taken = Signal()
            progress = Signal()
            new_una = Signal(24)
            retries = Signal.like(s_retry.retries)
            rnr_retries = Signal.like(s_retry.rnr_retries)
            # Worked out with them, so that the decisions of ACK_APPLY start from registers.
            retries_zero = Signal()             # retries == 0
            rnr_retries_zero = Signal()         # rnr_retries == 0
            rnr_forever = Signal()              # the QP's rnr_retry is RNR_RETRY_FOREVER

            # The intake checked the acknowledgement; checked again here, as the QP may
            # have moved on since (one behind ``una`` says nothing new).
            with m.State("ACK"):
                advances = una_after != s_una
                retries_next = Mux(advances, s_peer.retry_count, s_retry.retries)
                rnr_retries_next = Mux(advances, s_peer.rnr_retry, s_retry.rnr_retries)
                m.d.sync += [
                    taken.eq(wrapped_before(event.psn, s_nxt, s_una) & ~s_error),
                    progress.eq(advances),
                    new_una.eq(una_after),
                    retries.eq(retries_next),
                    rnr_retries.eq(rnr_retries_next),
                    retries_zero.eq(retries_next == 0),
                    rnr_retries_zero.eq(rnr_retries_next == 0),
                    rnr_forever.eq(s_peer.rnr_retry == RNR_RETRY_FOREVER),
                ]
                m.next = "ACK_APPLY"

            with m.State("ACK_APPLY"):
                # The oldest slot was read in ACK and is checked here (against the
                # acknowledgement's ``una``: the writes of this state show from the next).
                check(s_positions.first.slot, acked=True)
                m.next = "RETIRE"
                with m.If(~taken):
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += [
                        una_write.en.eq(1), una_write.data.eq(new_una),
                        retry_write.en.eq(1),
                        retry_write.data.retries.eq(retries),
                        retry_write.data.rnr_retries.eq(rnr_retries),
                    ]
                    with m.If(progress):
                        restart_timer()
                        fsm_flag("retrying", 0)
                    with m.Switch(kind):
                        with m.Case(AETH_RNR_NAK):
                            with m.If(rnr_retries_zero & ~rnr_forever):
                                fail(CompletionStatus.RNR_RETRY_EXCEEDED)
                            with m.Else():
                                m.d.comb += [
                                    counts["rnr_waits"].eq(1),
                                    retry_write.data.rnr_retries.eq(
                                        Mux(rnr_forever, rnr_retries, rnr_retries - 1)),
                                ]
                                restart_timer(rnr_code=code)
                                fsm_flag("rnr_wait", 1)
                                resend()
                        with m.Case(AETH_NAK):
                            with m.If(code == NAK_SEQUENCE):
                                # A resend from p under way (after a NAK, an RNR NAK or a
                                # timeout, nothing acknowledged since): the responder's NAK
                                # for p is no news and starts no retry (IBTA 9.7.5.2; rxe
                                # ignores NAKs while ``started_retry``). Else go back to p
                                # (IBTA 9.7.5.2), one retry of ``retry_count``.
                                with m.If(s_retrying & ~progress):
                                    pass
                                with m.Elif(retries_zero):
                                    fail(CompletionStatus.RETRY_EXCEEDED)
                                with m.Else():
                                    m.d.comb += retry_write.data.retries.eq(retries - 1)
                                    resend()
                                    restart_timer()
                            for nak_code, status in _NAK_STATUS.items():
                                with m.Elif(code == nak_code):
                                    fail(status)
                            with m.Else():
                                fail(CompletionStatus.REMOTE_OPERATIONAL_ERROR)

            with m.State("EXPIRE"):
                m.next = "IDLE"
                restart_timer()
                with m.If(expired_rnr_wait):
                    fsm_flag("rnr_wait", 0)
                with m.Else():
                    m.d.comb += counts["timeouts"].eq(1)
                    with m.If(s_retry.retries == 0):
                        fail(CompletionStatus.RETRY_EXCEEDED)
                        m.next = "RETIRE_CHECK"
                    with m.Else():
                        m.d.comb += [
                            retry_write.en.eq(1),
                            retry_write.data.retries.eq(s_retry.retries - 1),
                        ]
                        resend()

            with m.State("RESET"):
                m.d.comb += qp_next.eq(reset.qp)
                with m.If(quiet_then):
                    m.d.comb += [resetting.eq(1), self.i_reset.ready.eq(1)]
                m.next = "IDLE"

            with m.State("CLOSE"):
                with m.If(~s_error):
                    fail(CompletionStatus.FLUSHED)
                m.next = "RETIRE_CHECK"

            with m.State("RETIRE_CHECK"):
                check(s_positions.first.slot, acked=False)
                m.next = "RETIRE"

            with m.State("RETIRE"):
                # The message checked in the cycle before (``held``), while the next one's
                # slot is read: as this one completes, that one is checked.
                done = held_done
                message = held.message
                completion = self.o_completion.p
                m.d.comb += [
                    completion.qp.eq(qp),
                    completion.tag.eq(message.request.tag),
                    completion.first_psn.eq(message.first_psn),
                    completion.packets.eq(message.packets),
                    completion.status.eq(Mux(done, held_status,
                                             Mux(s_retry.error_reported, CompletionStatus.FLUSHED,
                                                 s_retry.error_status))),
                ]
                beats = (message.request.length + self._width - 1) >> beat_bits
                with m.If(held_empty):
                    m.next = "IDLE"
                with m.Elif(done | s_error):
                    m.d.comb += self.o_completion.valid.eq(1)
                    with m.If(self.o_completion.ready):
                        m.d.comb += [
                            retiring.eq(1),
                            self.o_free.valid.eq(1),
                            self.o_free.p.eq(s_positions.first.slot),
                            positions_write.en.eq(1),
                            positions_write.data.first.slot.eq(held.next),
                            positions_write.data.first.count.eq(s_positions.first.count + 1),
                            positions_write.data.head.eq(message.start + beats),
                            retry_write.en.eq(1),
                            retry_write.data.error_reported.eq(s_error),
                        ]
                        check(held.next, acked=False)
                with m.Else():
                    m.d.comb += [
                        positions_write.en.eq(1),
                        positions_write.data.head.eq(ring_room_after(held_covered)),
                    ]
                    m.next = "IDLE"

        m.d.comb += [
            self.o_busy.valid.eq(~engine.ongoing("IDLE")),
            self.o_reset_waits.eq(self.i_reset.valid
                                  & (engine.ongoing("IDLE") | engine.ongoing("RESET"))),
            self.o_busy.p.eq(qp),
            self.o_timer_restart.p.eq(qp),
            retire_slot.eq(Mux(engine.ongoing("ACK_APPLY") | engine.ongoing("RETIRE_CHECK")
                               | retiring,
                               entry.next,
                               Mux(engine.ongoing("RETIRE"), held.next,
                                   s_positions.first.slot))),
        ]

        # The check, against both ``una``s side by side into registers of each, and the
        # state's choice between them after those registers: neither a chain's operands
        # nor what follows a chain wait on that choice.
        def checked(una):
            """Whether ``una`` reached the message read and is past its end (covered ≥
            packets, from a carry chain beside the subtraction's), and how far it is in."""
            covered = (una - entry.message.first_psn)[:24]
            reached = ~(covered[22] & covered[23])
            done = reached & difference_at_least(una, entry.message.first_psn,
                                                 entry.message.packets)
            return done, Mux(reached, covered, 0)
        held_acked = Signal()
        held_checks = Signal(data.ArrayLayout(data.StructLayout({"done": 1, "covered": 24}), 2))
        with m.If(checking):
            m.d.sync += [
                held.eq(entry),
                held_status.eq(self.r_status.data),
                held_empty.eq(check_slot == s_end.slot),
                held_acked.eq(check_acked),
                *(held_checks[n].eq(Cat(checked(una))) for n, una in enumerate((s_una, new_una))),
            ]
        m.d.comb += [held_done.eq(held_checks[held_acked].done),
                     held_covered.eq(held_checks[held_acked].covered)]

        # The FSM's counts, and a reset of what it owns.
        m.d.comb += [
            event_counters_write.addr.eq(qp),
            event_counters_write.en.eq(Cat(counts.values()).any()),
        ]
        for name, strobe in counts.items():
            m.d.comb += event_counters_write.data[name].eq(s_counters[name] + strobe)
        with m.If(reset_write):
            m.d.comb += [
                una_write.addr.eq(reset.qp),
                una_write.data.eq(reset.state.next_psn),
                una_write.en.eq(1),
                positions_write.addr.eq(reset.qp),
                positions_write.data.head.eq(0),
                positions_write.en.eq(1),
                retry_write.addr.eq(reset.qp),
                retry_write.data.eq(0),
                retry_write.data.retries.eq(reset.state.retry_count),
                retry_write.data.rnr_retries.eq(reset.state.rnr_retry),
                retry_write.en.eq(1),
                peer_write.addr.eq(reset.qp),
                peer_write.en.eq(1),
                event_counters_write.addr.eq(reset.qp),
                event_counters_write.data.eq(0),
                event_counters_write.en.eq(1),
            ]
            for name in PEER.members:
                m.d.comb += peer_write.data[name].eq(reset.state[name])
        return m
