"""The requester's Reliable Connection state: what is outstanding, what is
acknowledged, when to resend, and when a QP has failed."""

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES
from .ack import ACK_EVENT, AETH_ACK, AETH_NAK, AETH_RNR_NAK, NAK_SEQUENCE
from .ack_intake import ACK_TAKEN, AckIntake, lowest_set
from .descriptor import (
    MESSAGE,
    MESSAGE_END,
    MESSAGE_LOADED,
    PACKET_SENT,
    POINTER_BITS,
    QP_VIEW,
    REPLAY,
    SLOT_BITS,
)
from .planner import TRANSMIT_CONFIG
from .requests import (
    COMPLETION,
    MAX_MESSAGE_BYTES,
    QP_COUNTERS,
    QP_INDEX_BITS,
    QP_STATE,
    QP_STATUS,
    QP_WRITE,
    CompletionStatus,
    PathMtu,
    check_qp_count,
)
from .timers import rnr_delay_ticks

__all__ = ["ReliabilityEngine", "RNR_RETRY_FOREVER", "STATUS_PORTS"]

#: Packets of the longest message (2^31 bytes at path MTU 256).
MAX_PACKETS = MAX_MESSAGE_BYTES // PathMtu.MTU_256.bytes

#: Read ports of the QP status (user logic, the connection manager).
STATUS_PORTS = 2

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
_NAK_COUNTERS = {0: "naks_sequence", 1: "naks_invalid", 2: "naks_access",
                 3: "naks_operational", 4: "naks_invalid"}

#: Bits of the tick count the timers are stamped with: an ACK timeout is up to 2^31 ticks.
_TIME_BITS = 32

#: The counters each packet sent adds to, each acknowledgement's verdict, and the engine's
#: acting on an acknowledgement or a timeout; ICRC errors and CNPs are counted apart.
_SENT_COUNTERS = data.StructLayout({name: QP_COUNTERS.members[name]
                                    for name in ("packets", "bytes", "retransmitted")})
_INTAKE_COUNTERS = data.StructLayout({
    name: QP_COUNTERS.members[name]
    for name in ("acks", "acks_dropped", "naks_sequence", "naks_rnr", "naks_invalid",
                 "naks_access", "naks_operational")})
_EVENT_COUNTERS = data.StructLayout({
    name: shape for name, shape in QP_COUNTERS.members.items()
    if name not in (*_SENT_COUNTERS.members, *_INTAKE_COUNTERS.members, "icrc_errors",
                    "cnps")})

#: A QP's settings as the reliability engine keeps them.
_PEER = data.StructLayout({name: QP_STATE.members[name]
                           for name in ("remote_ip", "timeout", "retry_count", "rnr_retry")})

#: A QP's retries left before ERROR, and why it failed.
_RETRIES = data.StructLayout({
    "retries": 3,
    "rnr_retries": 3,
    "error_status": CompletionStatus,
    "error_reported": 1,            # the failed work request has completed
})


#: When the QP's timer last started (in ticks), and the RNR NAK's timer code of an RNR wait.
_TIMER = data.StructLayout({"start": _TIME_BITS, "rnr_code": 5})


#: The 1-bit flags of every QP, kept in registers (bit vectors over the QPs).
_FLAGS = ("error", "resend", "rnr_wait", "retrying", "from_sent", "icrc_cleared",
          "cnp_cleared", "intake_cleared")


def _per_qp_layouts(slot_bits):
    """The shape of each per-QP memory of the engine, by name."""
    return {
        # the planner's side: written by each new packet sent, message loaded, packet sent
        "nxt": 24,
        "tail": POINTER_BITS,
        "end": slot_bits + 1,
        "sent_time": _TIME_BITS,
        # the engine's side: written by the FSM, the settings by a reset
        "una": 24,
        "positions": data.StructLayout({"head": POINTER_BITS, "first": slot_bits + 1}),
        "retry": _RETRIES,
        "timer": _TIMER,
        "resend_psn": 24,
        "peer": _PEER,
        # counters, each memory with one writer
        "sent_counters": _SENT_COUNTERS,
        "event_counters": _EVENT_COUNTERS,
        "intake_counters": _INTAKE_COUNTERS,
        "icrc_errors": 32,
        "cnps": 32,
    }


class ReliabilityEngine(wiring.Component):
    """Tracks every QP's outstanding packets and messages and acts on acknowledgements.

    The planner tells it of each new message (``i_loaded``: it takes the QP's
    next message slot, one of ``messages``) and each packet it sends
    (``i_sent``); it tells the planner, per QP, the next PSN, the ring room
    and whether the QP may send (``new_view``/``replay_view``, combinational
    from ``new_qp``/``replay_qp``; an event shows from the next cycle on, a
    message loaded or a packet sent, which pass a register first, from the
    second; whether the QP may send, ``error``, ``rnr_wait`` and ``blocked``,
    is a register, for ``new_qp``/``replay_qp`` of the cycle before), and hands
    it the messages to resend (``o_replay``).

    Acknowledgements (``i_ack``, one a cycle at any rate) go through an
    :class:`AckIntake`: from the QP's peer address, inside the window of
    outstanding PSNs and beyond what the QP's acknowledgements acknowledged
    so far, they are taken (and counted as ``acks`` and, a NAK, by its kind),
    the others dropped (``acks_dropped``: duplicates, ghosts, strangers); per
    QP the newest ACK and the NAK that says most wait for the engine, the NAK
    first. Acknowledgements are cumulative, so nothing taken is ever lost:
    there is no queue to overflow. An ACK for PSN p acknowledges
    every packet up to p; a NAK or RNR NAK for p every packet before p. Every
    message whose last packet is acknowledged completes (``o_completion``) in
    order, with the status its payload ended with; its ring room is freed
    packet by packet, so a message longer than the ring (up to 2^23 packets:
    2^31 bytes at path MTU 256) completes as it is acknowledged. Latency: the
    engine acts on an acknowledgement 4 cycles after ``i_ack`` at the
    earliest, takes 4 cycles for it (3 for one that says nothing new by then),
    and 1 more per message it completes; a completion leaves 7 cycles after
    the ``i_ack`` that finished its message, when the engine is idle (6 when
    an older ACK of the QP waits to be taken, the new one read with it). An
    acknowledgement counts against the packets sent up to 2 cycles before it.

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

    ``i_reset`` is taken when the engine is idle, in a cycle without
    ``i_sent`` or ``i_loaded`` in the cycle before (while their register
    writes them) and with no resend being looked up: while it waits, no new
    resend starts and the engine takes nothing else, and while it waits on an
    idle engine both views show every QP without a free slot, and from the
    next cycle on blocked, so that the planner pauses its new messages and the
    reset soon goes in. The caller sends no packet of the QP being set in the
    cycle it sets it (the planner's ``holds``).

    Each QP's state lives in memories (distributed RAM where a view reads it
    combinationally; the engine's own reads are registered, addressed a cycle
    ahead), its 1-bit flags in registers. The timers are start times on a
    count of ticks, checked by a sweep of one QP per cycle and served before
    acknowledgements: a timer expires up to ``qps`` + 2 cycles after its time, plus
    at most one acknowledgement's work (4 cycles and 1 per message it
    completes). ``i_icrc_error`` and ``i_cnp`` (a QP index each) count the
    acknowledgements dropped for their ICRC and the CNPs of a QP. While
    ``i_paused`` (the link pauses RoCEv2 frames: PAUSE or PFC) the tick count
    stands still, so pause time counts against no ACK timer or RNR wait.
    """

    def __init__(self, *, qps, messages=128, width=BEAT_BYTES):
        check_qp_count(qps)
        if messages < 2 or messages & (messages - 1) or messages > 128:
            raise ValueError(f"Messages per QP must be a power of 2, 2..128, not {messages!r}")
        self._qps = qps
        self._messages = messages
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
        })

    @staticmethod
    def qp_state_bits(messages=128):
        """Bits the engine keeps per QP, by memory (and ``flags``, in registers)."""
        slot_bits = (messages - 1).bit_length()
        bits = {name: Shape.cast(shape).width
                for name, shape in _per_qp_layouts(slot_bits).items()}
        return {**bits, "flags": len(_FLAGS)}

    def elaborate(self, platform):
        m = Module()
        qps, messages = self._qps, self._messages
        slot_bits = (messages - 1).bit_length()
        qp_bits = max((qps - 1).bit_length(), 1)
        entries = 1 << qp_bits
        beat_bits = (self._width - 1).bit_length()
        ended = self.i_message_end
        # Messages loaded and packets sent pass a register first: no path goes on from
        # the planner's decisions into the engine's memories and flags.
        sent = stream.Signature(PACKET_SENT).create(path=("sent",))
        loaded = stream.Signature(MESSAGE_LOADED).create(path=("loaded",))
        for registered, port in ((sent, self.i_sent), (loaded, self.i_loaded)):
            m.d.sync += [registered.valid.eq(port.valid), registered.p.eq(port.p)]
        reset = self.i_reset.p

        layouts = _per_qp_layouts(slot_bits)

        def per_qp(name):
            """A memory of one entry per QP, and its write port."""
            m.submodules[name] = store = memory.Memory(shape=layouts[name], depth=entries,
                                                       init=[])
            return store, store.write_port()

        def slot_address(qp, slot):
            return Cat(slot[:slot_bits], qp[:qp_bits])

        # 1-bit flags, in registers: every reader sees every QP's at once.
        def flags(name):
            return Signal(entries, name=name)

        (error, resend, rnr_wait, retrying, from_sent,
         icrc_cleared, cnp_cleared, intake_cleared) = map(flags, _FLAGS)
        # resend: a go-back-N resend is due; rnr_wait: the timer is an RNR wait, not the
        # ACK timeout; retrying: a resend from the oldest unacknowledged packet started
        # (after a NAK, an RNR NAK or a timeout) and nothing was acknowledged since;
        # from_sent: the ACK timer runs from the packet sent when none was outstanding;
        # icrc_cleared (cnp_cleared, intake_cleared): set again since its count of ICRC
        # errors (of CNPs, of acknowledgements) was last written, so the count reads as 0.
        # What the engine's FSM writes to the flags of its QP.
        fsm_flags = {flag.name: (Signal(name=f"fsm_{flag.name}_write"),
                                 Signal(name=f"fsm_{flag.name}"))
                     for flag in (error, resend, rnr_wait, retrying, from_sent)}

        def fsm_flag(flag, value):
            write, bit = fsm_flags[flag.name]
            m.d.comb += [write.eq(1), bit.eq(value)]

        def flag_of(flag, qp):
            return flag.bit_select(qp[:qp_bits], 1)

        # Setting a QP: taken when no other writer of its state is busy (see ``quiet``).
        resetting = Signal()
        reset_write = Signal()
        m.d.comb += reset_write.eq(resetting & (reset.qp < qps))

        # The timer tick, and the count of ticks the timers are stamped with.
        tick = Signal()
        tick_count = Signal(16)
        now = Signal(_TIME_BITS)
        m.d.comb += tick.eq((tick_count + 1 >= self.i_config.tick) & ~self.i_paused)
        with m.If(~self.i_paused):
            m.d.sync += tick_count.eq(Mux(tick, 0, tick_count + 1))
        with m.If(tick):
            m.d.sync += now.eq(now + 1)

        # The planner's side: next PSN and ring tail (written by each new packet sent),
        # the next free message slot (by each message loaded), and the time of the packet
        # sent when none was outstanding (it starts the ACK timer).
        nxt, nxt_write = per_qp("nxt")
        tail, tail_write = per_qp("tail")
        end, end_write = per_qp("end")
        sent_time, sent_time_write = per_qp("sent_time")
        # The engine's side: oldest unacknowledged PSN, ring head and oldest message slot,
        # retries, timer, resend PSN (written by the FSM), the QP's settings (by a reset).
        una, una_write = per_qp("una")
        positions, positions_write = per_qp("positions")
        retry, retry_write = per_qp("retry")
        timer, timer_write = per_qp("timer")
        resend_psn, resend_psn_write = per_qp("resend_psn")
        peer, peer_write = per_qp("peer")
        # Counters, each memory with one writer.
        sent_counters, sent_counters_write = per_qp("sent_counters")
        event_counters, event_counters_write = per_qp("event_counters")
        intake_counters, intake_counters_write = per_qp("intake_counters")
        icrc_errors, icrc_errors_write = per_qp("icrc_errors")
        cnps, cnps_write = per_qp("cnps")

        # Outstanding messages, and the status each one's payload ended with.
        depth = messages << qp_bits
        m.submodules.ring = ring = memory.Memory(shape=MESSAGE, depth=depth, init=[])
        m.submodules.statuses = statuses = memory.Memory(shape=CompletionStatus, depth=depth,
                                                         init=[])
        # Reads see a write in the same cycle: a slot may be filled as it is read.
        ring_write = ring.write_port()
        retire_read = ring.read_port(transparent_for=(ring_write,))
        walk_read = ring.read_port(transparent_for=(ring_write,))
        status_write = statuses.write_port()
        status_read = statuses.read_port(transparent_for=(status_write,))

        def current(store, write, qp_next):
            """A read port of ``store`` whose data, a cycle after ``qp_next``, is the entry of
            that QP as a combinational read would give it (writes seen from the next cycle)."""
            port = store.read_port(transparent_for=(write,))
            m.d.comb += port.addr.eq(qp_next)
            return port.data

        # Messages loaded and packets sent. A new packet sent while none is outstanding
        # starts the ACK timer; the others leave it running (IBTA 9.7.6.1.3: the timer
        # measures from the oldest unacknowledged packet; progress restarts it).
        end_loaded = end.read_port(domain="comb")
        counted_sent = sent_counters.read_port(domain="comb")
        una_sent = una.read_port(domain="comb")
        nxt_sent = nxt.read_port(domain="comb")
        timer_starts = Signal()
        m.d.comb += [
            una_sent.addr.eq(sent.p.qp),
            nxt_sent.addr.eq(sent.p.qp),
            timer_starts.eq(sent.valid & ~sent.p.replay & (una_sent.data == nxt_sent.data)),
            end_loaded.addr.eq(loaded.p.qp),
            ring_write.addr.eq(slot_address(loaded.p.qp, end_loaded.data)),
            ring_write.data.eq(loaded.p.message),
            ring_write.en.eq(loaded.valid),
            status_write.addr.eq(slot_address(ended.p.completion.qp, ended.p.slot)),
            status_write.data.eq(ended.p.completion.status),
            status_write.en.eq(ended.valid & ended.p.tracked),
            counted_sent.addr.eq(sent.p.qp),
            sent_time_write.addr.eq(sent.p.qp),
            sent_time_write.data.eq(now),
            sent_time_write.en.eq(timer_starts),
        ]
        with m.If(reset_write):
            m.d.comb += [
                nxt_write.addr.eq(reset.qp),
                nxt_write.data.eq(reset.state.next_psn),
                nxt_write.en.eq(1),
                tail_write.addr.eq(reset.qp),
                tail_write.en.eq(1),
                end_write.addr.eq(reset.qp),
                end_write.en.eq(1),
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
                end_write.data.eq(end_loaded.data + 1),
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

        # Acknowledgements go through the intake, which checks each against its QP's
        # window at once and keeps per QP the newest ACK and NAK for the FSM. Its verdicts,
        # the acknowledgements dropped for their ICRC and the CNPs are counted at once: a
        # QP's count reads as 0 while the QP was set again after its last write.
        m.submodules.intake = intake = AckIntake(qps=qps)
        wiring.connect(m, wiring.flipped(self.i_ack), intake.i)
        window_una = una.read_port(domain="comb")
        window_nxt = nxt.read_port(domain="comb")
        window_peer = peer.read_port(domain="comb")
        m.d.comb += [
            window_una.addr.eq(intake.window_qp),
            window_nxt.addr.eq(intake.window_qp),
            window_peer.addr.eq(intake.window_qp),
            intake.window.una.eq(window_una.data),
            intake.window.nxt.eq(window_nxt.data),
            intake.window.remote_ip.eq(window_peer.data.remote_ip),
            intake.window.error.eq(flag_of(error, intake.window_qp)),
            intake.i_clear.valid.eq(reset_write),
            intake.i_clear.p.eq(reset.qp),
        ]
        icrc_error, cnp, verdict = self.i_icrc_error, self.i_cnp, intake.o_verdict
        # What each verdict adds to: taken or dropped, and a NAK taken by its kind.
        nak_kind, nak_code = verdict.p.syndrome[5:7], verdict.p.syndrome[:5]
        verdict_counts = {name: Signal(name=f"verdict_{name}")
                          for name in _INTAKE_COUNTERS.members}
        nak_codes = {name: [code for code, counter in _NAK_COUNTERS.items() if counter == name]
                     for name in set(_NAK_COUNTERS.values())}
        m.d.comb += [
            verdict_counts["acks"].eq(verdict.p.taken),
            verdict_counts["acks_dropped"].eq(~verdict.p.taken),
            verdict_counts["naks_rnr"].eq(verdict.p.taken & (nak_kind == AETH_RNR_NAK)),
        ]
        for name, codes in nak_codes.items():
            matches = [nak_code == code for code in codes]
            if name == "naks_operational":      # and the codes IBTA reserves
                matches.append(nak_code > max(_NAK_COUNTERS))
            m.d.comb += verdict_counts[name].eq(
                verdict.p.taken & (nak_kind == AETH_NAK) & Cat(matches).any())
        for count, write, cleared, counted, qp in (
                (icrc_errors, icrc_errors_write, icrc_cleared, icrc_error.valid, icrc_error.p),
                (cnps, cnps_write, cnp_cleared, cnp.valid, cnp.p),
                (intake_counters, intake_counters_write, intake_cleared, verdict.valid,
                 verdict.p.qp)):
            before = count.read_port(domain="comb")
            counts_before = Mux(flag_of(cleared, qp), 0, before.data)
            m.d.comb += [
                before.addr.eq(qp),
                write.addr.eq(qp),
                write.en.eq(counted),
            ]
            if count is intake_counters:
                counts_before = data.View(_INTAKE_COUNTERS, counts_before)
                for name, strobe in verdict_counts.items():
                    m.d.comb += write.data[name].eq(counts_before[name] + strobe)
            else:
                m.d.comb += write.data.eq(counts_before + 1)

        # The planner's views.
        walking = Signal()
        walk_qp = Signal(QP_INDEX_BITS)
        engine_idle = Signal()
        reset_waiting = Signal()
        m.d.comb += reset_waiting.eq(self.i_reset.valid & engine_idle)
        for qp, view in ((self.new_qp, self.new_view), (self.replay_qp, self.replay_view)):
            shown = {}
            for name, store in (("nxt", nxt), ("tail", tail), ("end", end),
                                ("positions", positions)):
                port = store.read_port(domain="comb")
                m.d.comb += port.addr.eq(qp)
                shown[name] = port.data
            m.d.comb += [
                view.next_psn.eq(shown["nxt"]),
                view.head.eq(shown["positions"].head),
                view.tail.eq(shown["tail"]),
                view.slot.eq(shown["end"][:slot_bits]),
                view.slot_free.eq(((shown["end"] - shown["positions"].first)[:slot_bits + 1]
                                   != messages) & ~reset_waiting),
            ]

        # The engine's FSM works on one QP, ``qp``, at a time; it reads that QP's state
        # through ports addressed a cycle ahead (``qp_next``).
        qp = Signal(QP_INDEX_BITS)
        qp_next = Signal(QP_INDEX_BITS)
        m.d.comb += qp_next.eq(qp)
        m.d.sync += qp.eq(qp_next)
        s_una = current(una, una_write, qp_next)
        s_nxt = current(nxt, nxt_write, qp_next)
        s_end = current(end, end_write, qp_next)
        s_positions = current(positions, positions_write, qp_next)
        s_retry = current(retry, retry_write, qp_next)
        s_peer = current(peer, peer_write, qp_next)
        s_counters = current(event_counters, event_counters_write, qp_next)
        s_error = flag_of(error, qp)
        s_retrying = flag_of(retrying, qp)
        # What the FSM writes; fields it leaves alone keep their value.
        for write, kept in ((una_write, None), (positions_write, s_positions),
                            (retry_write, s_retry), (timer_write, None),
                            (resend_psn_write, None)):
            m.d.comb += write.addr.eq(qp)
            if kept is not None:
                m.d.comb += write.data.eq(kept)
        counts = {name: Signal(name=f"count_{name}") for name in _EVENT_COUNTERS.members}

        # The sweep of the timers: one QP per cycle, its verdict registered (``expired``
        # for ``expired_qp``), and held while that verdict waits for the FSM to take it.
        sweep = Signal(qp_bits)
        sweep_next = Signal(qp_bits)
        sweep_taken = Signal()
        sweep_expired = Signal()
        expired = Signal()
        expired_qp = Signal(qp_bits)
        expired_rnr = Signal()
        # Under reset the sweep addresses QP 0: the read ports' address registers take
        # it too, so nothing downstream of them starts undefined (a 4-state simulator
        # shows X there otherwise; the FPGA's flip-flops happen to start at 0).
        m.d.comb += sweep_next.eq(Mux(ResetSignal(), 0,
                                      Mux(expired, sweep,
                                          Mux(sweep == qps - 1, 0, sweep + 1))))
        m.d.sync += sweep.eq(sweep_next)
        w_una = current(una, una_write, sweep_next)
        w_nxt = current(nxt, nxt_write, sweep_next)
        w_timer = current(timer, timer_write, sweep_next)
        w_sent_time = current(sent_time, sent_time_write, sweep_next)
        w_peer = current(peer, peer_write, sweep_next)
        w_rnr_wait = flag_of(rnr_wait, sweep)
        expired_rnr_wait = Signal()         # the timer taken is an RNR wait
        started = Mux(flag_of(from_sent, sweep) & ~w_rnr_wait, w_sent_time, w_timer.start)
        elapsed = (now - started)[:_TIME_BITS]
        rnr_delays = Array(C(rnr_delay_ticks(code), _TIME_BITS) for code in range(32))
        m.d.comb += sweep_expired.eq(~flag_of(error, sweep) & Mux(
            w_rnr_wait,
            elapsed >= rnr_delays[w_timer.rnr_code],
            (w_una != w_nxt) & (w_peer.timeout != 0)
            & (elapsed >= (C(1, _TIME_BITS) << w_peer.timeout)[:_TIME_BITS])))
        # The verdict is read from the state as it was a cycle before; it is dropped when
        # the QP's timer state is written in the cycle it is read or held (the FSM working
        # on the QP, a reset of it, a packet of it sent). So when the FSM takes it, the
        # QP's state is the one it was read from but for a packet sent in that cycle,
        # which cannot start the timer: an expired ACK timer runs with packets
        # outstanding, and an RNR wait sends nothing.
        def written(index):
            return ((~engine_idle & (qp[:qp_bits] == index))
                    | (reset_write & (reset.qp[:qp_bits] == index))
                    | (sent.valid & (sent.p.qp[:qp_bits] == index)))

        with m.If(~expired):
            m.d.sync += [expired.eq(sweep_expired & ~written(sweep)), expired_qp.eq(sweep),
                         expired_rnr.eq(w_rnr_wait)]
        with m.Elif(sweep_taken | written(expired_qp)):
            m.d.sync += expired.eq(0)

        event = Signal(ACK_TAKEN)
        # What ``una`` becomes if the acknowledgement is taken (an ACK covers its PSN, a
        # NAK the ones before it), worked out as the acknowledgement is: the ACK state
        # only compares it with ``una``.
        una_after = Signal(24)
        record = Signal(MESSAGE)
        # The oldest message's slot is read a cycle ahead; while the FSM retires messages,
        # the one after it (so that it retires one a cycle; it reads again after a stall).
        retire_slot = Signal(slot_bits + 1)
        m.d.comb += [
            retire_read.addr.eq(slot_address(qp, retire_slot)),
            status_read.addr.eq(slot_address(qp, retire_slot)),
            record.eq(retire_read.data),
        ]

        def fail(status):
            fsm_flag(error, 1)
            fsm_flag(resend, 0)
            fsm_flag(rnr_wait, 0)
            fsm_flag(retrying, 0)
            m.d.comb += [
                retry_write.en.eq(1),
                retry_write.data.error_status.eq(status),
                retry_write.data.error_reported.eq(0),
            ]

        def resend_from(psn):
            fsm_flag(resend, 1)
            fsm_flag(retrying, 1)
            m.d.comb += [resend_psn_write.en.eq(1), resend_psn_write.data.eq(psn)]

        def restart_timer(rnr_code=0):
            """The QP's timer runs from now (an RNR wait, with ``rnr_code``)."""
            fsm_flag(from_sent, 0)
            m.d.comb += [
                timer_write.en.eq(1),
                timer_write.data.start.eq(now),
                timer_write.data.rnr_code.eq(rnr_code),
            ]

        def ring_room_after(covered):
            """The ring position after the first ``covered`` packets of ``record``."""
            position = Signal(POINTER_BITS)
            with m.Switch(record.path_mtu):
                for mtu in PathMtu:
                    with m.Case(mtu):
                        m.d.comb += position.eq(
                            record.start + (covered << ((mtu.bytes >> beat_bits).bit_length() - 1)))
            return position

        # Nothing else writes what a reset writes (``i_sent``, ``i_loaded``), or works on
        # a QP's state (the resend walker).
        walker_idle = Signal()
        quiet = ~sent.valid & ~loaded.valid & walker_idle

        with m.FSM() as engine:
            with m.State("IDLE"):
                m.d.comb += self.i_reset.ready.eq(quiet)
                # While a reset waits for quiet, nothing else goes in (the views soon
                # block new packets): the other choices do not wait on ``quiet``.
                with m.If(self.i_reset.valid):
                    m.d.comb += resetting.eq(quiet)
                with m.Elif(self.i_close.valid):
                    m.d.comb += [self.i_close.ready.eq(1), qp_next.eq(self.i_close.p)]
                    with m.If(self.i_close.p < qps):
                        m.next = "CLOSE"
                # A timer expired goes first, so that acknowledgements streaming in do
                # not hold it.
                with m.Elif(expired):
                    m.d.comb += [qp_next.eq(expired_qp), sweep_taken.eq(1)]
                    m.d.sync += expired_rnr_wait.eq(expired_rnr)
                    m.next = "EXPIRE"
                with m.Elif(intake.o.valid):
                    m.d.comb += [intake.o.ready.eq(1), qp_next.eq(intake.o.p.qp)]
                    m.d.sync += [
                        event.eq(intake.o.p),
                        una_after.eq(Mux(intake.o.p.syndrome[5:7] == AETH_ACK,
                                         intake.o.p.psn + 1, intake.o.p.psn)[:24]),
                    ]
                    m.next = "ACK"

            # An acknowledgement in two steps: what it means (kept in registers), then
            # what the engine does about it.
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
                ahead = (event.psn - s_una)[:24]
                window = (s_nxt - s_una)[:24]
                advances = una_after != s_una
                retries_next = Mux(advances, s_peer.retry_count, s_retry.retries)
                rnr_retries_next = Mux(advances, s_peer.rnr_retry, s_retry.rnr_retries)
                m.d.sync += [
                    taken.eq((ahead < window) & ~s_error),
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
                # The ring slot to retire is read here already (its address does not
                # change in this state), and the writes of this state show from the next.
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
                        fsm_flag(retrying, 0)
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
                                fsm_flag(rnr_wait, 1)
                                resend_from(event.psn)
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
                                    resend_from(event.psn)
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
                    fsm_flag(rnr_wait, 0)
                with m.Else():
                    m.d.comb += counts["timeouts"].eq(1)
                    with m.If(s_retry.retries == 0):
                        fail(CompletionStatus.RETRY_EXCEEDED)
                        m.next = "RETIRE_READ"
                    with m.Else():
                        m.d.comb += [
                            retry_write.en.eq(1),
                            retry_write.data.retries.eq(s_retry.retries - 1),
                        ]
                        resend_from(s_una)

            with m.State("CLOSE"):
                with m.If(~s_error):
                    fail(CompletionStatus.FLUSHED)
                m.next = "RETIRE_READ"

            with m.State("RETIRE_READ"):
                m.next = "RETIRE"

            with m.State("RETIRE"):
                # Whether ``una`` reached the oldest message, and how far (see
                # ``_MAX_OUTSTANDING``): a message of 2^23 packets completes too.
                covered = (s_una - record.first_psn)[:24]
                reached = ~(covered[22] & covered[23])
                done = reached & (covered >= record.packets)
                completion = self.o_completion.p
                m.d.comb += [
                    completion.qp.eq(qp),
                    completion.tag.eq(record.request.tag),
                    completion.first_psn.eq(record.first_psn),
                    completion.packets.eq(record.packets),
                    completion.status.eq(Mux(done, status_read.data,
                                             Mux(s_retry.error_reported, CompletionStatus.FLUSHED,
                                                 s_retry.error_status))),
                ]
                beats = (record.request.length + self._width - 1) >> beat_bits
                with m.If(s_positions.first == s_end):
                    m.next = "IDLE"
                with m.Elif(done | s_error):
                    m.d.comb += self.o_completion.valid.eq(1)
                    with m.If(self.o_completion.ready):
                        m.d.comb += [
                            positions_write.en.eq(1),
                            positions_write.data.first.eq(s_positions.first + 1),
                            positions_write.data.head.eq(record.start + beats),
                            retry_write.en.eq(1),
                            retry_write.data.error_reported.eq(s_error),
                        ]
                        m.next = "RETIRE"
                    with m.Else():
                        m.next = "RETIRE_READ"      # read the slot again
                with m.Else():
                    m.d.comb += [
                        positions_write.en.eq(1),
                        positions_write.data.head.eq(
                            ring_room_after(Mux(reached, covered, 0))),
                    ]
                    m.next = "IDLE"

        m.d.comb += [
            engine_idle.eq(engine.ongoing("IDLE")),
            retire_slot.eq(s_positions.first + engine.ongoing("RETIRE")),
        ]

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
                positions_write.data.eq(0),
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
            for name in _PEER.members:
                m.d.comb += peer_write.data[name].eq(reset.state[name])

        # The resend walker: finds the message of a QP's resend PSN, and hands the planner
        # that message from that packet on, then every later outstanding message. It
        # reads the QP's state through ports addressed a cycle ahead (``walk_next``).
        walk = Signal(REPLAY)
        walk_psn = Signal(24)
        walk_slot = Signal(slot_bits + 1)
        walk_clear = Signal()
        walk_next = Signal(QP_INDEX_BITS)
        m.d.comb += walk_next.eq(walk_qp)
        m.d.sync += walk_qp.eq(walk_next)
        k_resend_psn = current(resend_psn, resend_psn_write, walk_next)
        k_positions = current(positions, positions_write, walk_next)
        k_end = current(end, end_write, walk_next)
        k_error = flag_of(error, walk_qp)
        walk_record = Signal(MESSAGE)
        m.d.comb += [
            walk_read.addr.eq(slot_address(walk_qp, walk_slot)),
            walk_record.eq(walk_read.data),
            self.o_replay.p.eq(walk),
        ]
        with m.FSM() as walker:
            with m.State("IDLE"):
                due = Signal(entries)
                m.d.comb += due.eq(resend & ~rnr_wait & ~error)
                any_due, first_due = lowest_set(due)
                with m.If(any_due & ~self.i_reset.valid):
                    m.d.comb += walk_next.eq(first_due)
                    m.next = "START"
            with m.State("START"):
                m.d.comb += walk_clear.eq(1)
                m.d.sync += [
                    walking.eq(1),
                    walk_psn.eq(k_resend_psn),
                    walk_slot.eq(k_positions.first),
                ]
                m.next = "READ"
            with m.State("READ"):
                m.next = "FIND"
            with m.State("FIND"):
                into = (walk_psn - walk_record.first_psn)[:24]
                with m.If((walk_slot == k_end) | k_error):
                    m.d.sync += walking.eq(0)
                    m.next = "IDLE"
                with m.Elif(into < walk_record.packets):
                    m.d.sync += [
                        walk.qp.eq(walk_qp),
                        walk.slot.eq(walk_slot[:slot_bits]),
                        walk.packet.eq(into),
                        walk.message.eq(walk_record),
                    ]
                    m.next = "ISSUE"
                with m.Else():
                    m.d.sync += walk_slot.eq(walk_slot + 1)
                    m.next = "READ"
            with m.State("ISSUE"):
                m.d.comb += self.o_replay.valid.eq(1)
                with m.If(self.o_replay.ready):
                    m.d.sync += [
                        walk_slot.eq(walk_slot + 1),
                        walk_psn.eq(walk.message.first_psn + walk.message.packets),
                    ]
                    with m.If(flag_of(resend, walk_qp) | k_error):
                        m.d.sync += walking.eq(0)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "READ"
        m.d.comb += walker_idle.eq(walker.ongoing("IDLE"))

        # The flags: each writer sets or clears one QP's bit; a later one wins.
        flag_writes = {}
        for flag, *writes in (
                (error, (*fsm_flags["error"], qp), (reset_write, 0, reset.qp)),
                (resend, (walk_clear, 0, walk_qp), (*fsm_flags["resend"], qp),
                 (reset_write, 0, reset.qp)),
                (rnr_wait, (*fsm_flags["rnr_wait"], qp), (reset_write, 0, reset.qp)),
                (retrying, (*fsm_flags["retrying"], qp), (reset_write, 0, reset.qp)),
                (from_sent, (timer_starts, 1, sent.p.qp), (*fsm_flags["from_sent"], qp),
                 (reset_write, 0, reset.qp)),
                (icrc_cleared, (icrc_error.valid, 0, icrc_error.p), (reset_write, 1, reset.qp)),
                (cnp_cleared, (cnp.valid, 0, cnp.p), (reset_write, 1, reset.qp)),
                (intake_cleared, (verdict.valid, 0, verdict.p.qp),
                 (reset_write, 1, reset.qp))):
            flag_writes[flag.name] = writes
            value = flag
            for enable, bit, index in writes:
                # One-hot as a decoder (a LUT per bit), not a shifter of a 1.
                mask = Mux(enable, Cat(index[:qp_bits] == entry for entry in range(entries)), 0)
                value = (value & ~mask) | Mux(bit, mask, 0)
            m.d.sync += flag.eq(value)

        def next_flag_of(flag, index):
            """The flag of QP ``index`` as the writes of this cycle leave it."""
            value = flag_of(flag, index)
            for enable, bit, written in flag_writes[flag.name]:
                value = Mux(enable & (written[:qp_bits] == index[:qp_bits]), bit, value)
            return value

        # Whether a QP may send, for the planner's views: registers, for the view's QP of
        # the cycle before, from the flags as this cycle's writes leave them (so a flag
        # shows in the view when the flag register itself has it); a resend looked up or
        # a reset waiting shows a cycle later.
        for view_qp, view in ((self.new_qp, self.new_view), (self.replay_qp, self.replay_view)):
            m.d.sync += [
                view.error.eq(next_flag_of(error, view_qp)),
                view.rnr_wait.eq(next_flag_of(rnr_wait, view_qp)),
                view.blocked.eq(next_flag_of(resend, view_qp) | next_flag_of(rnr_wait, view_qp)
                                | ((walking | walk_clear) & (walk_qp == view_qp))
                                | reset_waiting),
            ]

        # A QP's state for the user and the connection manager: the memories as they were
        # in the cycle of the request.
        for select, status in zip(self.status_qp, self.status, strict=True):
            shown = {}
            for name, store in (("una", una), ("nxt", nxt), ("retry", retry),
                                ("sent", sent_counters), ("events", event_counters)):
                port = store.read_port()
                m.d.comb += port.addr.eq(select)
                shown[name] = port.data
            shown_error = Signal()
            m.d.sync += shown_error.eq(flag_of(error, select))
            counters = status.counters
            m.d.comb += [
                status.error.eq(shown_error),
                status.error_status.eq(shown["retry"].error_status),
                status.outstanding.eq(shown["nxt"] - shown["una"]),
            ]
            for name in _SENT_COUNTERS.members:
                m.d.comb += counters[name].eq(shown["sent"][name])
            for name in _EVENT_COUNTERS.members:
                m.d.comb += counters[name].eq(shown["events"][name])
            # Counts kept apart, 0 while the QP was set again since their last write.
            for store, cleared, names in ((icrc_errors, icrc_cleared, ["icrc_errors"]),
                                          (cnps, cnp_cleared, ["cnps"]),
                                          (intake_counters, intake_cleared,
                                           list(_INTAKE_COUNTERS.members))):
                port = store.read_port()
                zero = Signal()
                m.d.comb += port.addr.eq(select)
                m.d.sync += zero.eq(flag_of(cleared, select))
                for name in names:
                    value = port.data[name] if len(names) > 1 else port.data
                    m.d.comb += counters[name].eq(Mux(zero, 0, value))
        return m
