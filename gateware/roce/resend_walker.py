"""The reliability engine's go-back-N resend: the outstanding messages of a QP with a
resend due, handed to the planner from its oldest unacknowledged packet on."""

from amaranth import *
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..arith import difference_at_least
from ..stream import registered
from .descriptor import REPLAY
from .flag_memory import FlagMemory, write_flags
from .qp_context import QP_FLAGS, lookup, per_qp_layouts, qp_bits_of
from .qp_flags import due_for_resend
from .requests import QP_INDEX_BITS, check_qp_count
from .slot_pool import slot_entry

__all__ = ["ResendWalker"]


class ResendWalker(wiring.Component):
    """Finds the message of a QP's oldest unacknowledged packet (``una``, where every
    resend starts: a NAK or RNR NAK for p acknowledges the packets before p, and a timeout
    resends from ``una``), and hands the planner (``o_replay``) that message from that
    packet on, then every later outstanding message of the QP.

    The QPs come from ``i_due`` (a QP an engine write left due for a resend) through a
    queue (block RAM, a QP in it once at most), in the order they became due. Unless
    ``i_hold`` (a reset waits), the walker takes the first one, reads its flags
    (``r_flags``), and if a resend of it is still due (``resend`` set, neither
    ``rnr_wait`` nor ``error``) clears its ``resend`` (``o_taken``, in the cycle after
    it takes the QP); else it goes on to the next. It reads the QP's ``una``
    (``r_una``: as it is when the walk starts, so packets acknowledged since the resend
    was due are not sent again), the ends of its list of messages (``r_positions``, ``r_end``:
    registered reads addressed a cycle ahead, as ``r_flags``) and each message slot
    from the oldest on along the list (``r_ring``, registered). It stops after the
    QP's last outstanding message, when the QP enters ERROR, or when a new resend of
    the QP is due before a hand-over (which starts the walk again: the QP is in the
    queue again). A slot it comes to that is no longer in the list
    (its message completed while the walker waited) may hold another QP's message by
    then: it goes on from the list's oldest message instead, resending that one from
    its first packet if ``una`` is older.

    Latency: a QP is taken from the queue 3 cycles after ``i_due`` at the earliest;
    the first message is offered 4 cycles after the cycle the walker takes the QP
    (then clear, read, find, offer), plus 3 cycles per older message it skips;
    a later message 3 cycles after the one before is taken. ``o_busy`` shows the QP
    from the cycle of ``o_taken`` through the walk's last cycle; ``o_idle`` while the
    walker waits for a QP.
    """

    def __init__(self, *, qps, slots, count_bits):
        self._qps = check_qp_count(qps)
        self._count_bits = count_bits
        slot_bits = (slots - 1).bit_length()
        layouts = per_qp_layouts(slot_bits, count_bits)
        members = {
            "i_due": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_hold": In(1),
            "r_flags": Out(lookup(QP_FLAGS, QP_INDEX_BITS)),
            "r_ring": Out(lookup(slot_entry(slot_bits), slot_bits)),
            "o_replay": Out(stream.Signature(REPLAY)),
            "o_taken": Out(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o_busy": Out(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o_idle": Out(1),
        }
        for name in ("una", "positions", "end"):
            members[f"r_{name}"] = Out(lookup(layouts[name], QP_INDEX_BITS))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        qp_bits = qp_bits_of(self._qps)
        count_bits = self._count_bits
        entries = 1 << qp_bits

        # The queue of QPs due, each in it once at most (``queued``: pushed and not yet
        # taken out), so it never overflows. A QP due is registered, its ``queued`` read
        # as it comes in (a registered read). A QP due again after it is taken out goes
        # back in: the walker finds its resend taken already, or walks it again.
        m.submodules.queue = queue = fifo.SyncFIFOBuffered(width=qp_bits, depth=entries)
        m.submodules.queued = queued = FlagMemory(
            flags=("queued",), depth=entries, addr_bits=QP_INDEX_BITS,
            writers=(("pop", ("queued",)), ("push", ("queued",))), reads=("transparent",))
        due = registered(m, self.i_due, "due")
        popped = Signal()
        m.d.comb += [
            queued.r[0].addr.eq(self.i_due.p),
            queue.w_data.eq(due.p),
            queue.w_en.eq(due.valid & ~queued.r[0].data.queued),
            *write_flags(queued.w_push, due.p, queue.w_en, 1),
            *write_flags(queued.w_pop, queue.r_data, popped, 0),
            queue.r_en.eq(popped),
        ]

        walking = Signal()
        walk_qp = Signal(QP_INDEX_BITS)
        walk = Signal(REPLAY)
        walk_psn = Signal(24)
        walk_slot = Signal.like(self.r_ring.addr)
        walk_count = Signal(count_bits)         # the list's count at ``walk_slot``
        walk_found = Signal()                   # the message holds a packet to resend
        walk_clear = self.o_taken.valid
        walk_next = Signal(QP_INDEX_BITS)
        m.d.comb += walk_next.eq(walk_qp)
        m.d.sync += walk_qp.eq(walk_next)
        for reader in (self.r_una, self.r_positions, self.r_end, self.r_flags):
            m.d.comb += reader.addr.eq(walk_next)
        k_una, k_positions, k_end = self.r_una.data, self.r_positions.data, self.r_end.data
        k_flags = self.r_flags.data
        k_error = k_flags.error
        walk_entry = self.r_ring.data
        walk_record = walk_entry.message
        m.d.comb += [
            self.r_ring.addr.eq(walk_slot),
            self.o_replay.p.eq(walk),
            self.o_taken.p.eq(walk_qp),
            self.o_busy.valid.eq(walking | walk_clear),
            self.o_busy.p.eq(walk_qp),
        ]
        with m.FSM() as walker:
            with m.State("IDLE"):
                with m.If(queue.r_rdy & ~self.i_hold):
                    m.d.comb += [popped.eq(1), walk_next.eq(queue.r_data)]
                    m.next = "START"
            with m.State("START"):
                with m.If(due_for_resend(k_flags)):
                    m.d.comb += walk_clear.eq(1)
                    m.d.sync += [
                        walking.eq(1),
                        walk_psn.eq(k_una),
                        walk_slot.eq(k_positions.first.slot),
                        walk_count.eq(k_positions.first.count),
                    ]
                    m.next = "READ"
                with m.Else():
                    m.next = "IDLE"
            with m.State("READ"):
                m.next = "FIND"
            with m.State("FIND"):
                # Where the slot is in the QP's list, as the list was when it was read:
                # from its oldest message (0) to its empty slot (the length), or behind
                # the oldest (completed, far below 2^count_bits).
                into = (walk_psn - walk_record.first_psn)[:24]
                before = into[23]               # ``una`` is older than the message
                listed = (walk_count - k_positions.first.count)[:count_bits]
                length = (k_end.count - k_positions.first.count)[:count_bits]
                with m.If((walk_count == k_end.count) | k_error):
                    m.d.sync += walking.eq(0)
                    m.next = "IDLE"
                with m.Elif(listed > length):
                    m.d.sync += [
                        walk_slot.eq(k_positions.first.slot),
                        walk_count.eq(k_positions.first.count),
                    ]
                    m.next = "READ"
                # The message, and whether it holds a packet from ``walk_psn`` on (into <
                # packets: from a carry chain beside the subtraction's), into registers
                # that ISSUE acts on, and the walk on to the next slot.
                with m.Else():
                    m.d.sync += [
                        walk.qp.eq(walk_qp),
                        walk.slot.eq(walk_slot),
                        walk.packet.eq(Mux(before, 0, into)),
                        walk.message.eq(walk_record),
                        walk_found.eq(before | ~difference_at_least(
                            walk_psn, walk_record.first_psn, walk_record.packets)),
                        walk_slot.eq(walk_entry.next),
                        walk_count.eq(walk_count + 1),
                    ]
                    m.next = "ISSUE"
            with m.State("ISSUE"):
                m.d.comb += self.o_replay.valid.eq(walk_found)
                with m.If(~walk_found):
                    m.next = "READ"         # (all its packets are older than ``una``)
                with m.Elif(self.o_replay.ready):
                    m.d.sync += walk_psn.eq(walk.message.first_psn + walk.message.packets)
                    with m.If(k_flags.resend | k_error):
                        m.d.sync += walking.eq(0)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "READ"
        m.d.comb += self.o_idle.eq(walker.ongoing("IDLE"))
        return m
