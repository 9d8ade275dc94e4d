"""The requester's Reliable Connection state: what is outstanding, what is
acknowledged, when to resend, and when a QP has failed."""

from amaranth import *
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES
from .ack import ACK_EVENT
from .descriptor import (
    MESSAGE,
    MESSAGE_END,
    MESSAGE_LOADED,
    PACKET_SENT,
    POINTER_BITS,
    QP_VIEW,
    REPLAY,
)
from .planner import TRANSMIT_CONFIG
from .requests import (
    COMPLETION,
    QP_COUNTERS,
    QP_INDEX_BITS,
    QP_STATUS,
    QP_WRITE,
    CompletionStatus,
    PathMtu,
)
from .timers import rnr_delay_ticks

__all__ = ["ReliabilityEngine", "RNR_RETRY_FOREVER", "STATUS_PORTS"]

#: Read ports of the QP status (user logic, the connection manager).
STATUS_PORTS = 2

#: An RNR retry count of 7 retries without limit (IBTA 9.7.5.2.8).
RNR_RETRY_FOREVER = 7

#: Half the PSN space: a PSN this far or farther ahead counts as behind.
_PSN_HALF = 1 << 23

#: AETH syndrome bits 6:5 (IBTA table 41).
_ACK, _RNR_NAK, _NAK = 0, 1, 3

#: NAK codes (AETH syndrome bits 4:0) and what the work request completes with.
_NAK_SEQUENCE = 0
_NAK_STATUS = {
    1: CompletionStatus.REMOTE_INVALID_REQUEST,
    2: CompletionStatus.REMOTE_ACCESS_ERROR,
    3: CompletionStatus.REMOTE_OPERATIONAL_ERROR,
    4: CompletionStatus.REMOTE_INVALID_REQUEST,     # invalid RD request
}
_NAK_COUNTERS = {1: "naks_invalid", 2: "naks_access", 3: "naks_operational", 4: "naks_invalid"}


def _lowest(flags):
    """The index of the lowest set bit of ``flags`` (0 when none is)."""
    result = C(0, QP_INDEX_BITS)
    for index in reversed(range(len(flags))):
        result = Mux(flags[index], index, result)
    return result


def _qp_state(slot_bits):
    return data.StructLayout({
        "una": 24,                  # oldest unacknowledged PSN
        "nxt": 24,                  # PSN of the next new packet
        "head": POINTER_BITS,       # ring position of the oldest unacknowledged payload
        "tail": POINTER_BITS,       # ring position of the next new payload
        "first": slot_bits + 1,     # oldest outstanding message slot (one bit more than
        "end": slot_bits + 1,       # the slots need), and the next free one
        "armed": 1,                 # the timer runs
        "timer": 32,                # ticks until it expires
        "rnr_wait": 1,              # the timer is an RNR wait, not the ACK timeout
        "resend": 1,                # a go-back-N resend from ``resend_psn`` is due
        "resend_psn": 24,
        "retries": 3,               # left before ERROR
        "rnr_retries": 3,
        "error": 1,
        "error_status": CompletionStatus,
        "error_reported": 1,        # the failed work request has completed
        # as set with the QP
        "remote_ip": 32,
        "timeout": 5,
        "retry_count": 3,
        "rnr_retry": 3,
        "counters": QP_COUNTERS,
    })


class ReliabilityEngine(wiring.Component):
    """Tracks every QP's outstanding packets and messages and acts on acknowledgements.

    The planner tells it of each new message (``i_loaded``: it takes the QP's
    next message slot, one of ``messages``) and each packet it sends
    (``i_sent``); it tells the planner, per QP, the next PSN, the ring room
    and whether the QP may send (``new_view``/``replay_view``), and hands it
    the messages to resend (``o_replay``).

    Acknowledgements (``i_ack``, queued ``acks`` deep; beyond that counted as
    dropped) from the QP's peer address inside the window of outstanding PSNs
    are taken: an ACK for PSN p acknowledges every packet up to p; a NAK or
    RNR NAK for p every packet before p. Others are dropped and counted. Every
    message whose last packet is acknowledged completes (``o_completion``) in
    order, with the status its payload ended with; its ring room is freed
    packet by packet.

    - NAK sequence error: resend from p (go-back-N). ACK timeout (2^timeout
      ticks after the last packet sent or the last progress, with packets
      outstanding): resend from the oldest unacknowledged packet.
      Each uses one of ``retry_count`` retries; none left: ERROR,
      RETRY_EXCEEDED.
    - RNR NAK: wait the AETH's RNR time (IBTA table 45), then resend from p;
      ``rnr_retry`` times (7: always), then ERROR, RNR_RETRY_EXCEEDED.
    - NAK invalid request, remote access or remote operational error: ERROR
      with that status.

    Progress (an acknowledgement that covers a new packet) restores both retry
    counts. A QP in ERROR sends nothing; its outstanding work requests
    complete, the failed one with the error status, the others FLUSHED, and it
    stays so until it is set again (``i_reset``, taken only when the engine is
    idle). ``status_qp`` → ``status``: a QP's state and counters, 1 cycle later.
    """

    def __init__(self, *, qps, messages=128, acks=16, width=BEAT_BYTES):
        if messages < 2 or messages & (messages - 1) or messages > 128:
            raise ValueError(f"Messages per QP must be a power of 2, 2..128, not {messages!r}")
        self._qps = qps
        self._messages = messages
        self._acks = acks
        self._width = width
        super().__init__({
            "i_reset": In(stream.Signature(QP_WRITE)),
            "i_close": In(stream.Signature(QP_INDEX_BITS)),
            "i_config": In(TRANSMIT_CONFIG),
            "i_ack": In(stream.Signature(ACK_EVENT, always_ready=True)),
            "i_icrc_error": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
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

    def elaborate(self, platform):
        m = Module()
        qps, messages = self._qps, self._messages
        slot_bits = (messages - 1).bit_length()
        qp_bits = max((qps - 1).bit_length(), 1)
        beat_bits = (self._width - 1).bit_length()
        layout = _qp_state(slot_bits)
        states = [Signal(layout, name=f"qp{index}") for index in range(qps)]
        state = Array(states)

        def slot_address(qp, slot):
            return Cat(slot[:slot_bits], qp[:qp_bits])

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
        loaded = self.i_loaded
        m.d.comb += [
            ring_write.addr.eq(slot_address(loaded.p.qp, state[loaded.p.qp].end)),
            ring_write.data.eq(loaded.p.message),
            ring_write.en.eq(loaded.valid),
            status_write.addr.eq(slot_address(self.i_message_end.p.completion.qp,
                                              self.i_message_end.p.slot)),
            status_write.data.eq(self.i_message_end.p.completion.status),
            status_write.en.eq(self.i_message_end.valid & self.i_message_end.p.tracked),
        ]

        # The planner's views.
        walking = Signal()
        walk_qp = Signal(QP_INDEX_BITS)
        for qp, view in ((self.new_qp, self.new_view), (self.replay_qp, self.replay_view)):
            s = state[qp]
            m.d.comb += [
                view.next_psn.eq(s.nxt),
                view.head.eq(s.head),
                view.tail.eq(s.tail),
                view.slot.eq(s.end[:slot_bits]),
                view.slot_free.eq((s.end - s.first)[:slot_bits + 1] != messages),
                view.error.eq(s.error),
                view.blocked.eq(s.resend | s.rnr_wait | (walking & (walk_qp == qp))),
            ]

        # The timer tick.
        tick = Signal()
        tick_count = Signal(16)
        m.d.comb += tick.eq(tick_count + 1 >= self.i_config.tick)
        m.d.sync += tick_count.eq(Mux(tick, 0, tick_count + 1))

        # Acknowledgements wait in a queue for the engine.
        m.submodules.acks = acks = fifo.SyncFIFOBuffered(width=ACK_EVENT.size, depth=self._acks)
        m.d.comb += [
            acks.w_data.eq(self.i_ack.p),
            acks.w_en.eq(self.i_ack.valid),
        ]
        overflow = self.i_ack.valid & ~acks.w_rdy

        # What the engine's FSM does to the QP ``qp`` this cycle.
        qp = Signal(QP_INDEX_BITS)
        s = state[qp]
        act = Signal(layout)            # the new values of the fields it writes
        writes = {name: Signal(name=f"write_{name}") for name in (
            "una", "head", "first", "timer", "rnr_wait", "resend", "retries", "rnr_retries",
            "error", "error_reported")}
        counts = {name: Signal(name=f"count_{name}") for name in QP_COUNTERS.members
                  if name not in ("packets", "bytes", "retransmitted", "icrc_errors")}
        resetting = Signal()

        event = Signal(ACK_EVENT)
        record = Signal(MESSAGE)
        m.d.comb += [
            retire_read.addr.eq(slot_address(qp, s.first)),
            status_read.addr.eq(slot_address(qp, s.first)),
            record.eq(retire_read.data),
        ]

        def fail(status):
            m.d.comb += [
                writes["error"].eq(1), act.error.eq(1), act.error_status.eq(status),
                writes["error_reported"].eq(1), act.error_reported.eq(0),
                writes["resend"].eq(1), act.resend.eq(0),
                writes["timer"].eq(1), act.armed.eq(0),
                writes["rnr_wait"].eq(1), act.rnr_wait.eq(0),
            ]

        def resend_from(psn):
            m.d.comb += [writes["resend"].eq(1), act.resend.eq(1), act.resend_psn.eq(psn)]

        def ring_room_after(covered):
            """The ring position after the first ``covered`` packets of ``record``."""
            position = Signal(POINTER_BITS)
            with m.Switch(record.path_mtu):
                for mtu in PathMtu:
                    with m.Case(mtu):
                        m.d.comb += position.eq(
                            record.start + (covered << ((mtu.bytes >> beat_bits).bit_length() - 1)))
            return position

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i_reset.ready.eq(1)
                expired = Cat(st.armed & (st.timer == 0) for st in states)
                with m.If(self.i_reset.valid):
                    m.d.comb += resetting.eq(1)
                with m.Elif(self.i_close.valid):
                    m.d.comb += self.i_close.ready.eq(1)
                    m.d.sync += qp.eq(self.i_close.p)
                    m.next = "CLOSE"
                with m.Elif(acks.r_rdy):
                    m.d.comb += acks.r_en.eq(1)
                    queued = data.View(ACK_EVENT, acks.r_data)
                    m.d.sync += [event.eq(queued), qp.eq(queued.qp)]
                    m.next = "ACK"
                with m.Elif(expired.any()):
                    m.d.sync += qp.eq(_lowest(expired))
                    m.next = "EXPIRE"

            with m.State("ACK"):
                kind = event.syndrome[5:7]
                code = event.syndrome[:5]
                ahead = (event.psn - s.una)[:24]
                window = (s.nxt - s.una)[:24]
                new_una = Mux(kind == _ACK, event.psn + 1, event.psn)[:24]
                taken = ((event.src_ip == s.remote_ip) & (ahead < window) & ~s.error
                         & (kind != 2))
                progress = new_una != s.una
                retries = Mux(progress, s.retry_count, s.retries)
                rnr_retries = Mux(progress, s.rnr_retry, s.rnr_retries)
                m.next = "RETIRE_READ"
                with m.If(~taken):
                    m.d.comb += counts["acks_dropped"].eq(1)
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += [
                        counts["acks"].eq(1),
                        writes["una"].eq(1), act.una.eq(new_una),
                        writes["retries"].eq(1), act.retries.eq(retries),
                        writes["rnr_retries"].eq(1), act.rnr_retries.eq(rnr_retries),
                    ]
                    with m.If(progress):
                        m.d.comb += [
                            writes["timer"].eq(1),
                            act.armed.eq((new_una != s.nxt) & (s.timeout != 0)),
                            act.timer.eq(C(1, 32) << s.timeout),
                        ]
                    with m.Switch(kind):
                        with m.Case(_RNR_NAK):
                            m.d.comb += counts["naks_rnr"].eq(1)
                            with m.If((rnr_retries == 0) & (s.rnr_retry != RNR_RETRY_FOREVER)):
                                fail(CompletionStatus.RNR_RETRY_EXCEEDED)
                            with m.Else():
                                delays = Array(C(rnr_delay_ticks(code), 32) for code in range(32))
                                m.d.comb += [
                                    counts["rnr_waits"].eq(1),
                                    act.rnr_retries.eq(Mux(s.rnr_retry == RNR_RETRY_FOREVER,
                                                           rnr_retries, rnr_retries - 1)),
                                    writes["timer"].eq(1), act.armed.eq(1),
                                    act.timer.eq(delays[code]),
                                    writes["rnr_wait"].eq(1), act.rnr_wait.eq(1),
                                ]
                                resend_from(event.psn)
                        with m.Case(_NAK):
                            with m.If(code == _NAK_SEQUENCE):
                                m.d.comb += counts["naks_sequence"].eq(1)
                                with m.If(retries == 0):
                                    fail(CompletionStatus.RETRY_EXCEEDED)
                                with m.Else():
                                    m.d.comb += act.retries.eq(retries - 1)
                                    resend_from(event.psn)
                            for nak_code, status in _NAK_STATUS.items():
                                with m.Elif(code == nak_code):
                                    m.d.comb += counts[_NAK_COUNTERS[nak_code]].eq(1)
                                    fail(status)
                            with m.Else():
                                m.d.comb += counts["naks_operational"].eq(1)
                                fail(CompletionStatus.REMOTE_OPERATIONAL_ERROR)

            with m.State("EXPIRE"):
                m.d.comb += [writes["timer"].eq(1), act.armed.eq(0)]
                m.next = "IDLE"
                with m.If(s.rnr_wait):
                    m.d.comb += [writes["rnr_wait"].eq(1), act.rnr_wait.eq(0)]
                with m.Else():
                    m.d.comb += counts["timeouts"].eq(1)
                    with m.If(s.retries == 0):
                        fail(CompletionStatus.RETRY_EXCEEDED)
                        m.next = "RETIRE_READ"
                    with m.Else():
                        m.d.comb += [writes["retries"].eq(1), act.retries.eq(s.retries - 1)]
                        resend_from(s.una)

            with m.State("CLOSE"):
                with m.If(~s.error):
                    fail(CompletionStatus.FLUSHED)
                m.next = "RETIRE_READ"

            with m.State("RETIRE_READ"):
                m.next = "RETIRE"

            with m.State("RETIRE"):
                covered = (s.una - record.first_psn)[:24]
                done = (covered >= record.packets) & (covered < _PSN_HALF)
                completion = self.o_completion.p
                m.d.comb += [
                    completion.qp.eq(qp),
                    completion.tag.eq(record.request.tag),
                    completion.first_psn.eq(record.first_psn),
                    completion.packets.eq(record.packets),
                    completion.status.eq(Mux(done, status_read.data,
                                             Mux(s.error_reported, CompletionStatus.FLUSHED,
                                                 s.error_status))),
                ]
                beats = (record.request.length + self._width - 1) >> beat_bits
                with m.If(s.first == s.end):
                    m.next = "IDLE"
                with m.Elif(done | s.error):
                    m.d.comb += self.o_completion.valid.eq(1)
                    with m.If(self.o_completion.ready):
                        m.d.comb += [
                            writes["first"].eq(1), act.first.eq(s.first + 1),
                            writes["head"].eq(1), act.head.eq(record.start + beats),
                            writes["error_reported"].eq(1), act.error_reported.eq(s.error),
                        ]
                        m.next = "RETIRE_READ"
                with m.Else():
                    m.d.comb += [
                        writes["head"].eq(1),
                        act.head.eq(ring_room_after(Mux(covered < _PSN_HALF, covered, 0))),
                    ]
                    m.next = "IDLE"

        # The resend walker: finds the message of a QP's resend PSN, and hands the planner
        # that message from that packet on, then every later outstanding message.
        walk = Signal(REPLAY)
        walk_psn = Signal(24)
        walk_slot = Signal(slot_bits + 1)
        walk_clear = Signal()
        ws = state[walk_qp]
        walk_record = Signal(MESSAGE)
        m.d.comb += [
            walk_read.addr.eq(slot_address(walk_qp, walk_slot)),
            walk_record.eq(walk_read.data),
            self.o_replay.p.eq(walk),
        ]
        with m.FSM():
            with m.State("IDLE"):
                due = Cat(st.resend & ~st.rnr_wait & ~st.error for st in states)
                with m.If(due.any()):
                    m.d.sync += walk_qp.eq(_lowest(due))
                    m.next = "START"
            with m.State("START"):
                m.d.comb += walk_clear.eq(1)
                m.d.sync += [
                    walking.eq(1),
                    walk_psn.eq(ws.resend_psn),
                    walk_slot.eq(ws.first),
                ]
                m.next = "READ"
            with m.State("READ"):
                m.next = "FIND"
            with m.State("FIND"):
                into = (walk_psn - walk_record.first_psn)[:24]
                with m.If((walk_slot == ws.end) | ws.error):
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
                    with m.If(ws.resend | ws.error):
                        m.d.sync += walking.eq(0)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "READ"

        # Every QP's state: the writes of the planner, the timers, the FSM and the walker.
        sent = self.i_sent
        reset = self.i_reset.p
        for index, st in enumerate(states):
            fsm = qp == index
            with m.If(resetting & (reset.qp == index)):
                m.d.sync += [
                    st.eq(0),
                    st.una.eq(reset.state.next_psn),
                    st.nxt.eq(reset.state.next_psn),
                    st.retries.eq(reset.state.retry_count),
                    st.rnr_retries.eq(reset.state.rnr_retry),
                    st.remote_ip.eq(reset.state.remote_ip),
                    st.timeout.eq(reset.state.timeout),
                    st.retry_count.eq(reset.state.retry_count),
                    st.rnr_retry.eq(reset.state.rnr_retry),
                ]
            with m.Else():
                with m.If(sent.valid & (sent.p.qp == index)):
                    with m.If(sent.p.replay):
                        m.d.sync += st.counters.retransmitted.eq(st.counters.retransmitted + 1)
                    with m.Else():
                        m.d.sync += [
                            st.nxt.eq(sent.p.next_psn),
                            st.tail.eq(sent.p.next_tail),
                            st.counters.packets.eq(st.counters.packets + 1),
                            st.counters.bytes.eq(st.counters.bytes + sent.p.bytes),
                        ]
                with m.If(loaded.valid & (loaded.p.qp == index)):
                    m.d.sync += st.end.eq(st.end + 1)
                with m.If(self.i_icrc_error.valid & (self.i_icrc_error.p == index)):
                    m.d.sync += st.counters.icrc_errors.eq(st.counters.icrc_errors + 1)

                # The ACK timer counts down in ticks while packets are outstanding, from
                # the last packet sent (as rxe does; a long resend does not time out).
                with m.If(st.armed):
                    with m.If(tick & (st.timer != 0)):
                        m.d.sync += st.timer.eq(st.timer - 1)
                    with m.If(~st.rnr_wait & (st.una == st.nxt)):
                        m.d.sync += st.armed.eq(0)
                with m.Elif((st.una != st.nxt) & (st.timeout != 0) & ~st.error):
                    m.d.sync += [st.armed.eq(1), st.timer.eq(C(1, 32) << st.timeout)]
                with m.If(sent.valid & (sent.p.qp == index) & ~st.rnr_wait & (st.timeout != 0)
                          & ~st.error):
                    m.d.sync += [st.armed.eq(1), st.timer.eq(C(1, 32) << st.timeout)]

                with m.If(walk_clear & (walk_qp == index)):
                    m.d.sync += st.resend.eq(0)

                for name, strobe in writes.items():
                    fields = {"timer": ("timer", "armed"), "resend": ("resend", "resend_psn"),
                              "error": ("error", "error_status")}.get(name, (name,))
                    with m.If(fsm & strobe):
                        m.d.sync += [st[field].eq(act[field]) for field in fields]
                dropped = (counts["acks_dropped"] & fsm).as_unsigned() + \
                    (overflow & (self.i_ack.p.qp == index)).as_unsigned()
                m.d.sync += st.counters.acks_dropped.eq(st.counters.acks_dropped + dropped)
                for name, strobe in counts.items():
                    if name != "acks_dropped":
                        with m.If(fsm & strobe):
                            m.d.sync += st.counters[name].eq(st.counters[name] + 1)

        # A QP's state for the user and the connection manager.
        for select, status in zip(self.status_qp, self.status, strict=True):
            shown = state[select]
            m.d.sync += [
                status.error.eq(shown.error),
                status.error_status.eq(shown.error_status),
                status.outstanding.eq(shown.nxt - shown.una),
                status.counters.eq(shown.counters),
            ]
        return m
