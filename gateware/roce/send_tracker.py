"""The planner's side of the reliability engine's per-QP state: what each message loaded
and each packet sent writes (next PSN, ring tail, the end of the QP's list of messages,
the sent counters; the ACK timer's start shown), and the messages themselves into the
slot pool."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..stream import registered
from .descriptor import MESSAGE_END, MESSAGE_LOADED, PACKET_SENT
from .qp_context import lookup, per_qp_layouts, update
from .requests import QP_INDEX_BITS, QP_WRITE, CompletionStatus, check_qp_count
from .slot_pool import slot_entry

__all__ = ["SendTracker"]


class SendTracker(wiring.Component):
    """Writes what the planner's events change of a QP, a cycle after each event.

    The events (``i_sent``, ``i_loaded``) pass a register first; the QP's state they
    change is read through registered ports addressed by the event as it comes in
    (``r_*``, ``"transparent"`` ports of :class:`ContextMemory`: a write in the
    cycle of the address shows), so each event is written a cycle after it came, from
    registers and the read, and no memory is read combinationally.

    A packet sent (``i_sent``) that is new writes its QP's next PSN (``w_nxt``) and
    ring tail (``w_tail``); every packet sent adds to the QP's sent counters
    (``w_sent_counters``: ``packets`` and ``bytes``, or ``retransmitted`` for a
    resent one). A new packet sent while none is outstanding (``una`` = ``nxt``, read
    through ``r_una`` and ``r_nxt``) starts the ACK timer: it shows on
    ``o_timer_from_sent`` (which sets the QP's ``timer_started`` for the timer sweep to
    take); the others leave it running
    (IBTA 9.7.6.1.3: the timer measures from the oldest unacknowledged packet; progress
    restarts it). A message loaded (``i_loaded``) goes into the QP's empty slot, the
    end of its list (``r_end``), with the slot the pool hands out (``i_spare``, taken
    by ``o_take``) as the one after it (``w_ring``); that slot is the QP's empty one
    from then on (``w_end``, with one more message counted). A message whose payload
    ended (``i_message_end``) leaves its status in its slot (``w_status``).

    ``i_reset`` (a QP being set, in a cycle without a registered event) writes the QP's
    next PSN and clears its tail and sent counters; its list, empty by then, stays.
    """

    def __init__(self, *, qps, slots, count_bits):
        self._qps = check_qp_count(qps)
        slot_bits = (slots - 1).bit_length()
        layouts = per_qp_layouts(slot_bits, count_bits)
        members = {
            "i_sent": In(stream.Signature(PACKET_SENT, always_ready=True)),
            "i_loaded": In(stream.Signature(MESSAGE_LOADED, always_ready=True)),
            "i_message_end": In(stream.Signature(MESSAGE_END, always_ready=True)),
            "i_reset": In(stream.Signature(QP_WRITE, always_ready=True)),
            "o_timer_from_sent": Out(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_spare": In(slot_bits),
            "o_take": Out(1),
            "w_ring": Out(update(slot_entry(slot_bits), slot_bits)),
            "w_status": Out(update(CompletionStatus, slot_bits)),
        }
        for name in ("una", "nxt", "end", "sent_counters"):
            members[f"r_{name}"] = Out(lookup(layouts[name], QP_INDEX_BITS))
        for name in ("nxt", "tail", "end", "sent_counters"):
            members[f"w_{name}"] = Out(update(layouts[name], QP_INDEX_BITS))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        ended = self.i_message_end
        reset = self.i_reset.p

        # The events, registered; the state they change read as they come in.
        sent = registered(m, self.i_sent, "sent")
        loaded = registered(m, self.i_loaded, "loaded")
        for read in (self.r_una, self.r_nxt, self.r_sent_counters):
            m.d.comb += read.addr.eq(self.i_sent.p.qp)
        m.d.comb += self.r_end.addr.eq(self.i_loaded.p.qp)

        end_loaded, counted_sent = self.r_end, self.r_sent_counters
        timer_starts = self.o_timer_from_sent.valid
        m.d.comb += [
            timer_starts.eq(sent.valid & ~sent.p.replay & (self.r_una.data == self.r_nxt.data)),
            self.o_timer_from_sent.p.eq(sent.p.qp),
            self.w_ring.addr.eq(end_loaded.data.slot),
            self.w_ring.data.message.eq(loaded.p.message),
            self.w_ring.data.next.eq(self.i_spare),
            self.w_ring.en.eq(loaded.valid),
            self.o_take.eq(loaded.valid),
            self.w_status.addr.eq(ended.p.slot),
            self.w_status.data.eq(ended.p.completion.status),
            self.w_status.en.eq(ended.valid & ended.p.tracked),
        ]
        nxt_write, tail_write, end_write = self.w_nxt, self.w_tail, self.w_end
        sent_counters_write = self.w_sent_counters
        with m.If(self.i_reset.valid):
            m.d.comb += [
                nxt_write.addr.eq(reset.qp),
                nxt_write.data.eq(reset.state.next_psn),
                nxt_write.en.eq(1),
                tail_write.addr.eq(reset.qp),
                tail_write.en.eq(1),
                sent_counters_write.addr.eq(reset.qp),
                sent_counters_write.en.eq(1),
            ]
        with m.Else():
            m.d.comb += [
                nxt_write.addr.eq(sent.p.qp),
                nxt_write.data.eq(sent.p.next_psn),
                nxt_write.en.eq(sent.valid & ~sent.p.replay),
                tail_write.addr.eq(sent.p.qp),
                tail_write.data.eq(sent.p.next_tail),
                tail_write.en.eq(sent.valid & ~sent.p.replay),
                end_write.addr.eq(loaded.p.qp),
                end_write.data.slot.eq(self.i_spare),
                end_write.data.count.eq(end_loaded.data.count + 1),
                end_write.en.eq(loaded.valid),
                sent_counters_write.addr.eq(sent.p.qp),
                sent_counters_write.data.eq(counted_sent.data),
                sent_counters_write.en.eq(sent.valid),
            ]
            with m.If(sent.p.replay):
                m.d.comb += sent_counters_write.data.retransmitted.eq(
                    counted_sent.data.retransmitted + 1)
            with m.Else():
                m.d.comb += [
                    sent_counters_write.data.packets.eq(counted_sent.data.packets + 1),
                    sent_counters_write.data.bytes.eq(counted_sent.data.bytes + sent.p.bytes),
                ]
        return m
