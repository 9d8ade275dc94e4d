"""The requester's Reliable Connection state: what is outstanding, what is
acknowledged, when to resend, and when a QP has failed. The top that composes the
parts (each in its own module) around the per-QP memories they share."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..stream import BEAT_BYTES, registered
from .ack import ACK_EVENT
from .ack_counters import COUNT_FLAGS, AckCounters
from .ack_handler import MAX_PACKETS, RNR_RETRY_FOREVER, AckHandler
from .ack_intake import AckIntake
from .descriptor import (
    MESSAGE_END,
    MESSAGE_LOADED,
    PACKET_SENT,
    QP_VIEW,
    REPLAY,
)
from .page_pool import PAGE_STATE
from .planner import TRANSMIT_CONFIG
from .qp_context import FLAGS, ContextMemory, lookup, per_qp_layouts, qp_bits_of
from .qp_flags import QpFlags
from .requests import (
    COMPLETION,
    QP_INDEX_BITS,
    QP_STATE,
    QP_STATUS,
    QP_WRITE,
    CompletionStatus,
    check_qp_count,
)
from .resend_walker import ResendWalker
from .send_tracker import SendTracker
from .slot_pool import SlotPool, check_message_count, check_message_slots, slot_entry
from .tick_count import TickCount
from .timer_sweep import TimerSweep

__all__ = ["ReliabilityEngine", "RNR_RETRY_FOREVER", "STATUS_PORTS", "MAX_PACKETS",
           "check_message_count", "check_message_slots"]

#: Read ports of the QP status (user logic, the connection manager).
STATUS_PORTS = 2


def _count_bits(messages):
    """Bits of a QP's count of messages: room to tell its list's length (up to
    ``messages``) from how far behind its oldest message a slot the walker holds is."""
    return messages.bit_length() + 1


class ReliabilityEngine(wiring.Component):
    """Tracks every QP's outstanding packets and messages and acts on acknowledgements.

    The planner tells it of each new message (``i_loaded``: it takes a slot of
    the pool all QPs share, ``message_slots``, up to ``messages`` a QP) and each
    packet it sends
    (``i_sent``); it tells the planner, per QP, the next PSN, the ring tail
    and whether the QP may send (``new_view``/``replay_view``, registers, for
    ``new_qp``/``replay_qp`` of the cycle before, as that cycle's writes left
    the QP: the planner addresses its views a cycle ahead; an event shows from
    the next cycle on, a message loaded or a packet sent, which pass a register
    first, from the second), and hands it the messages to resend (``o_replay``).

    Acknowledgements (``i_ack``, one a cycle at any rate) go through an
    :class:`AckIntake`: from the QP's peer address (the QP table's, read through
    ``r_remote_ip`` a cycle after its address, as it was before that cycle's
    write), inside the window of
    outstanding PSNs and beyond what the QP's acknowledgements acknowledged
    so far, they are taken (and counted as ``acks`` and, a NAK, by its kind),
    the others dropped (``acks_dropped``: duplicates, ghosts, strangers); per
    QP the newest ACK and the NAK that says most wait for the engine, the NAK
    first. Acknowledgements are cumulative, so nothing taken is ever lost:
    there is no queue to overflow. An ACK for PSN p acknowledges
    every packet up to p; a NAK or RNR NAK for p every packet before p. Every
    message whose last packet is acknowledged completes (``o_completion``) in
    order, with the status its payload ended with; the ring position of the
    QP's oldest unacknowledged payload moves on packet by packet (the page pool
    gives the pages behind it back: ``pages_qp`` → ``pages_state``, a cycle
    later, and ``o_head_moved`` names the QP whenever it moves), so a message
    longer than the ring (up to 2^23 packets: 2^31 bytes at path MTU 256)
    completes as it is acknowledged. A reset waits for ``i_pages_clear`` (the
    QP holds no retransmit page) and sets both positions to 0. Latency: the
    engine acts on an acknowledgement 5 cycles after ``i_ack`` at the
    earliest, takes 4 cycles for it (3 for one that says nothing new by then),
    and 1 more per message it completes; a completion leaves 8 cycles after
    the ``i_ack`` that finished its message, when the engine is idle (7 when
    an older ACK of the QP waits to be taken, the new one read with it). An
    acknowledgement counts against the packets sent up to the cycle before it.

    - NAK sequence error for p: resend from p (go-back-N), one of
      ``retry_count`` retries, unless a resend from p is already under way
      (after a NAK, RNR NAK or timeout for p, nothing acknowledged since: the
      responder's next NAK repeats the news; IBTA 9.7.5.2, as rxe). ACK
      timeout (2^timeout ticks, IBTA 9.7.6.1.3: started by a packet sent when
      none was outstanding, restarted by progress and by each retry): resend
      from the oldest unacknowledged packet, one retry. None left: ERROR,
      RETRY_EXCEEDED.
    - RNR NAK: wait the AETH's RNR time (IBTA table 45), sending nothing, then
      resend from p; ``rnr_retry`` times (7: always), then ERROR,
      RNR_RETRY_EXCEEDED.
    - NAK invalid request, remote access or remote operational error: ERROR
      with that status.

    Progress (an acknowledgement that covers a new packet) restores both retry
    counts. A QP in ERROR sends nothing; its outstanding work requests
    complete, the failed one with the error status, the others FLUSHED, and it
    stays so until it is set again (``i_reset``). ``i_close`` puts a QP in
    ERROR (FLUSHED) unless it is already; it is taken when the engine is idle.
    ``status_qp[n]`` → ``status[n]``: a
    QP's state and counters, 1 cycle later.

    ``i_reset`` is taken (and written) in the cycle after the idle engine saw
    neither ``i_sent`` nor ``i_loaded`` (their register would write them in
    that cycle) and no resend being looked up: while it waits, no new
    resend starts and the engine takes nothing else, and while it waits on an
    idle engine both views show every QP without a free slot, and from the
    next cycle on blocked, so that the planner pauses its new messages and the
    reset soon goes in. The caller sends no packet of the QP being set in the
    cycle it sets it (the planner's ``holds``).

    Each QP's state lives in memories (:class:`ContextMemory`, every read of them
    registered and addressed a cycle ahead, so that a large one can be block RAM),
    its 1-bit flags too (:class:`QpFlags`), and the QPs
    due for a resend wait in a queue: no part reads or chooses among all QPs at once.
    Its outstanding messages are a list through the slots of a :class:`SlotPool`,
    from its oldest message (``positions.first``) to the empty slot its next
    message takes (``end``; each QP holds one from the start, slot = its index);
    the pool keeps a few slots back, and a QP at its cap or a pool with none left
    shows no free slot in the views.
    The parts: :class:`SendTracker` writes what the planner's events change,
    :class:`AckIntake` checks acknowledgements, :class:`AckCounters` counts them,
    :class:`TimerSweep` checks the timers, :class:`AckHandler` acts on
    acknowledgements, timers, closes and resets and retires messages,
    :class:`ResendWalker` hands the planner the messages to resend, and
    :class:`TickCount` counts the ticks. A timer that starts sets a flag; the sweep,
    a scan of the QPs in rows of up to 32, a row a cycle, finds the QP and takes the
    start, and keeps the deadline on the count of ticks: a timer runs from that check,
    up to a pass of the rows and 3 cycles after it started. Timers are served before
    acknowledgements: a timer expires up to a pass of the rows and 5 cycles after its
    deadline when no other QP's state changes meanwhile (a cycle more for each other QP
    the scan finds changed or expired on the way, and for each row that holds one),
    plus at most one acknowledgement's work (4 cycles and 1 per message it completes).
    ``i_icrc_error`` and ``i_cnp`` (a QP index each) count the
    acknowledgements dropped for their ICRC and the CNPs of a QP. While
    ``i_paused`` (the link pauses RoCEv2 frames: PAUSE or PFC) the tick count
    stands still, so pause time counts against no ACK timer or RNR wait.
    """

    def __init__(self, *, qps, messages=128, message_slots=4096, width=BEAT_BYTES):
        check_qp_count(qps)
        check_message_count(messages)
        check_message_slots(message_slots, qps)
        self._qps = qps
        self._messages = messages
        self._slots = message_slots
        self._width = width
        super().__init__({
            "i_reset": In(stream.Signature(QP_WRITE)),
            "i_close": In(stream.Signature(QP_INDEX_BITS)),
            "i_config": In(TRANSMIT_CONFIG),
            "i_paused": In(1),
            "i_ack": In(stream.Signature(ACK_EVENT, always_ready=True)),
            "i_icrc_error": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_cnp": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "new_qp": In(QP_INDEX_BITS),
            "new_view": Out(QP_VIEW),
            "replay_qp": In(QP_INDEX_BITS),
            "replay_view": Out(QP_VIEW),
            "i_loaded": In(stream.Signature(MESSAGE_LOADED, always_ready=True)),
            "i_sent": In(stream.Signature(PACKET_SENT, always_ready=True)),
            "i_message_end": In(stream.Signature(MESSAGE_END, always_ready=True)),
            "o_replay": Out(stream.Signature(REPLAY)),
            "o_completion": Out(stream.Signature(COMPLETION)),
            "status_qp": In(QP_INDEX_BITS).array(STATUS_PORTS),
            "status": Out(QP_STATUS).array(STATUS_PORTS),
            "i_pages_clear": In(1, init=1),
            "pages_qp": In(QP_INDEX_BITS),
            "pages_state": Out(PAGE_STATE),
            "o_head_moved": Out(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "r_remote_ip": Out(lookup(QP_STATE.members["remote_ip"], QP_INDEX_BITS)),
        })

    @staticmethod
    def qp_state_bits(messages=128, message_slots=4096):
        """Bits the engine keeps per QP, by memory (``flags``: its 1-bit flags and its
        counts' flags)."""
        bits = {name: Shape.cast(shape).width
                for name, shape in per_qp_layouts((message_slots - 1).bit_length(),
                                                  _count_bits(messages)).items()}
        return {**bits, "flags": len(FLAGS) + len(COUNT_FLAGS)}

    def elaborate(self, platform):
        m = Module()
        qps, messages, slots = self._qps, self._messages, self._slots
        slot_bits = (slots - 1).bit_length()
        count_bits = _count_bits(messages)
        qp_bits = qp_bits_of(qps)
        entries = 1 << qp_bits
        layouts = per_qp_layouts(slot_bits, count_bits)

        m.submodules.tick = tick = TickCount()
        # The flags' readers, all registered: the sweep, the walker, the handler, the two
        # views and the intake's window (addressed a cycle ahead), the status ports.
        flag_reads = {"sweep": "transparent", "walker": "transparent",
                      "handler": "transparent", "new_view": "transparent",
                      "replay_view": "transparent", "window": "transparent",
                      **{f"status{n}": "sync" for n in range(STATUS_PORTS)}}
        m.submodules.flags = flags = QpFlags(qps=qps, reads=flag_reads.values())
        flag_port = dict(zip(flag_reads, flags.r, strict=True))
        m.submodules.pool = pool = SlotPool(slots=slots, reserved=entries)
        m.submodules.tracker = tracker = SendTracker(qps=qps, slots=slots,
                                                     count_bits=count_bits)
        m.submodules.intake = intake = AckIntake(qps=qps)
        m.submodules.counters = counters = AckCounters(qps=qps, ports=STATUS_PORTS)
        m.submodules.sweep = sweep = TimerSweep(qps=qps)
        m.submodules.walker = walker = ResendWalker(qps=qps, slots=slots,
                                                    count_bits=count_bits)
        m.submodules.handler = handler = AckHandler(qps=qps, slots=slots,
                                                    count_bits=count_bits, width=self._width)
        reset = handler.o_reset

        # Messages loaded and packets sent pass a register first (the tracker's, and this
        # one for the timer sweep): no path goes on from the planner's decisions into the
        # engine's memories and flags.
        sent = registered(m, self.i_sent, "sent")

        def qp_event(port, valid, qp):
            m.d.comb += [port.valid.eq(valid), port.p.eq(qp)]

        m.d.comb += [tick.i_cycles.eq(self.i_config.tick), tick.i_paused.eq(self.i_paused)]
        m.d.comb += sweep.i_now.eq(tick.o_now)

        # What the planner tells of messages and packets.
        connect(m, flipped(self.i_sent), tracker.i_sent)
        connect(m, flipped(self.i_loaded), tracker.i_loaded)
        connect(m, flipped(self.i_message_end), tracker.i_message_end)
        connect(m, reset, tracker.i_reset)
        m.d.comb += [pool.i_take.eq(tracker.o_take), tracker.i_spare.eq(pool.o_slot)]
        connect(m, handler.o_free, pool.i_free)

        # Acknowledgements: checked by the intake against the QP's window, counted, and
        # handed to the handler.
        connect(m, flipped(self.i_ack), intake.i)
        connect(m, intake.o, handler.i_ack)
        connect(m, intake.o_verdict, counters.i_verdict)
        qp_event(counters.i_icrc_error, self.i_icrc_error.valid, self.i_icrc_error.p)
        qp_event(counters.i_cnp, self.i_cnp.valid, self.i_cnp.p)
        qp_event(counters.i_reset, reset.valid, reset.p.qp)
        qp_event(intake.i_clear, reset.valid, reset.p.qp)
        m.d.comb += [
            flag_port["window"].addr.eq(intake.window_qp),
            intake.window.error.eq(flag_port["window"].data.error),
        ]

        # The timers, the handler, the resends.
        connect(m, sweep.o_expired, handler.i_expired)
        connect(m, handler.o_busy, sweep.i_busy)
        qp_event(sweep.i_reset, reset.valid, reset.p.qp)
        qp_event(sweep.i_sent, sent.valid, sent.p.qp)
        qp_event(sweep.i_timer_from_sent, tracker.o_timer_from_sent.valid,
                 tracker.o_timer_from_sent.p)
        connect(m, handler.o_timer_restart, sweep.i_timer_restart)
        connect(m, flipped(self.i_reset), handler.i_reset)
        connect(m, flipped(self.i_close), handler.i_close)
        m.d.comb += flags.i_engine.eq(handler.o_flags)
        connect(m, handler.o_completion, flipped(self.o_completion))
        qp_event(flags.i_reset, reset.valid, reset.p.qp)
        # Nothing else writes what a reset writes (``i_sent``, ``i_loaded``, a cycle after
        # they come), or works on a QP's state (the resend walker, held while a reset
        # waits), in the next cycle.
        m.d.comb += [
            handler.i_quiet.eq(~self.i_sent.valid & ~self.i_loaded.valid & walker.o_idle),
            handler.i_pages_clear.eq(self.i_pages_clear),
            walker.i_hold.eq(self.i_reset.valid),
        ]
        connect(m, walker.o_replay, flipped(self.o_replay))
        connect(m, walker.o_taken, flags.i_resend_taken)
        connect(m, flags.o_due, walker.i_due)
        for name, part in (("sweep", sweep), ("walker", walker), ("handler", handler)):
            connect(m, part.r_flags, flag_port[name])

        # The memories, each with its writer and readers: a part's port, or the top's
        # own (``None``: the views, the intake's window, the status ports).
        def context(name, writer, readers, *, shape=None, depth=entries, addr_bits=None,
                    init=()):
            m.submodules[name] = store = ContextMemory(
                shape=layouts[name] if shape is None else shape, depth=depth,
                reads=[kind for kind, _ in readers],
                addr_bits=QP_INDEX_BITS if addr_bits is None else addr_bits, init=init)
            connect(m, writer, store.w)
            own = []
            for (_, reader), port in zip(readers, store.r, strict=True):
                if reader is None:
                    own.append(port)
                else:
                    connect(m, reader, port)
            return own

        # Every read is registered: the views and the intake's window, like the parts' own
        # ports, are addressed a cycle ahead and see the writes of that cycle.
        window, view = ("transparent", None), [("transparent", None)] * 2
        status = [("sync", None)] * STATUS_PORTS
        # Each QP's list starts empty, at the slot of its index.
        own_slots = [{"slot": qp} for qp in range(entries)]
        nxt = context("nxt", tracker.w_nxt, [
            ("transparent", tracker.r_nxt), window, *view, ("transparent", handler.r_nxt),
            ("transparent", sweep.r_nxt), *status])
        tail = context("tail", tracker.w_tail, [*view, ("transparent", None)])
        end = context("end", tracker.w_end, [
            ("transparent", tracker.r_end), *view, ("transparent", handler.r_end),
            ("transparent", walker.r_end), ("transparent", None)], init=own_slots)
        sent_counters = context("sent_counters", tracker.w_sent_counters, [
            ("transparent", tracker.r_sent_counters), *status])
        una = context("una", handler.w_una, [
            ("transparent", tracker.r_una), window, ("transparent", handler.r_una),
            ("transparent", sweep.r_una), ("transparent", walker.r_una), *status])
        positions = context("positions", handler.w_positions, [
            *view, ("transparent", handler.r_positions), ("transparent", walker.r_positions),
            ("transparent", None)], init=[{"first": own} for own in own_slots])
        retry = context("retry", handler.w_retry, [("transparent", handler.r_retry), *status])
        context("rnr_code", handler.w_rnr_code, [("transparent", sweep.r_rnr_code)])
        context("peer", handler.w_peer, [("transparent", handler.r_peer),
                                         ("transparent", sweep.r_peer)])
        event_counters = context("event_counters", handler.w_event_counters, [
            ("transparent", handler.r_event_counters), *status])
        # The slot pool's messages, and the status each one's payload ended with; reads
        # see a write in the same cycle: a slot may be filled as it is read.
        context("ring", tracker.w_ring, [("transparent", handler.r_ring),
                                         ("transparent", walker.r_ring)],
                shape=slot_entry(slot_bits), depth=slots, addr_bits=slot_bits)
        context("statuses", tracker.w_status, [("transparent", handler.r_status)],
                shape=CompletionStatus, depth=slots, addr_bits=slot_bits)

        # The intake's window of the QP it checks.
        window = {"una": una.pop(0), "nxt": nxt.pop(0), "remote_ip": self.r_remote_ip}
        for port in window.values():
            m.d.comb += port.addr.eq(intake.window_qp)
        m.d.comb += [
            intake.window.una.eq(window["una"].data),
            intake.window.nxt.eq(window["nxt"].data),
            intake.window.remote_ip.eq(window["remote_ip"].data),
        ]

        # The planner's views, for the view's QP of the cycle before: the memories and
        # the flags as that cycle's writes left them; a resend looked up or a reset
        # waiting (registered) shows a cycle later.
        reset_waiting = handler.o_reset_waits
        for reader, qp, view in (("new_view", self.new_qp, self.new_view),
                                 ("replay_view", self.replay_qp, self.replay_view)):
            shown = {}
            for name, ports in (("nxt", nxt), ("tail", tail), ("end", end),
                                ("positions", positions)):
                port = ports.pop(0)
                m.d.comb += port.addr.eq(qp)
                shown[name] = port.data
            m.d.comb += [
                view.next_psn.eq(shown["nxt"]),
                view.tail.eq(shown["tail"]),
                view.slot.eq(shown["end"].slot),
                view.slot_free.eq(
                    ((shown["end"].count - shown["positions"].first.count)[:count_bits]
                     != messages) & pool.o_available & ~reset_waiting),
                flag_port[reader].addr.eq(qp),
            ]
            shown_flags = flag_port[reader].data
            held = Signal(name=f"{reader}_held")
            m.d.sync += held.eq((walker.o_busy.valid & (walker.o_busy.p == qp)) | reset_waiting)
            m.d.comb += [
                view.error.eq(shown_flags.error),
                view.rnr_wait.eq(shown_flags.rnr_wait),
                view.blocked.eq(shown_flags.resend | shown_flags.rnr_wait | held),
            ]

        # The ring positions the page pool gives pages back behind, and which QP's oldest
        # one moved.
        pages_tail, pages_positions, pages_end = tail.pop(0), positions.pop(0), end.pop(0)
        m.d.comb += [
            pages_tail.addr.eq(self.pages_qp),
            pages_positions.addr.eq(self.pages_qp),
            pages_end.addr.eq(self.pages_qp),
            self.pages_state.head.eq(pages_positions.data.head),
            self.pages_state.tail.eq(pages_tail.data),
            self.pages_state.idle.eq(pages_end.data.count == pages_positions.data.first.count),
            self.o_head_moved.valid.eq(handler.w_positions.en),
            self.o_head_moved.p.eq(handler.w_positions.addr),
        ]

        # A QP's state for the user and the connection manager: the memories as they were
        # in the cycle of the request.
        for index, (select, status) in enumerate(zip(self.status_qp, self.status,
                                                     strict=True)):
            shown = {}
            for name, ports in (("una", una), ("nxt", nxt), ("retry", retry),
                                ("sent", sent_counters), ("events", event_counters)):
                port = ports.pop(0)
                m.d.comb += port.addr.eq(select)
                shown[name] = port.data
            shown_flags = flag_port[f"status{index}"]
            counters_shown = status.counters
            m.d.comb += [
                shown_flags.addr.eq(select),
                status.error.eq(shown_flags.data.error),
                status.error_status.eq(shown["retry"].error_status),
                status.outstanding.eq(shown["nxt"] - shown["una"]),
                counters.status_qp[index].eq(select),
            ]
            for name in shown["sent"].shape().members:
                m.d.comb += counters_shown[name].eq(shown["sent"][name])
            for name in shown["events"].shape().members:
                m.d.comb += counters_shown[name].eq(shown["events"][name])
            for name in counters.o_status[index].shape().members:
                m.d.comb += counters_shown[name].eq(counters.o_status[index][name])
        return m
