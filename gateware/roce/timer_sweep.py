"""The reliability engine's timer sweep: the ACK timeout and RNR wait of every QP, found
by a scan of many QPs a cycle and checked one QP a cycle."""

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out, connect

from .deadline_scan import DeadlineScan, check_lanes, hint
from .flag_memory import FlagMemory, write_flags
from .qp_context import QP_FLAGS, QP_LAYOUTS, TIME_BITS, lookup, qp_bits_of
from .requests import QP_INDEX_BITS, check_qp_count
from .timers import rnr_delay_ticks

__all__ = ["TimerSweep", "expired_timer"]


def expired_timer(qps):
    """A timer expired: its QP, and whether it is an RNR wait (else the ACK timeout)."""
    return data.StructLayout({"qp": qp_bits_of(qps), "rnr_wait": 1})


class TimerSweep(wiring.Component):
    """Finds the QPs whose timer ran out, many QPs a cycle, checks each one found
    against its state, and offers the first it finds expired (``o_expired``) until the
    ACK handler takes it.

    A QP's timer is its ACK timeout, 2^timeout ticks (IBTA 9.7.6.1.3), while packets
    are outstanding (``r_una`` ≠ ``r_nxt``) and the timeout is not 0; or, while
    ``rnr_wait``, the RNR NAK's wait (IBTA table 45, its code in ``r_rnr_code``). A QP
    in ERROR has no timer. A timer starts when a packet is sent while none was
    outstanding (``i_timer_from_sent``), and again when the handler restarts it
    (``i_timer_restart``: progress, a retry, an RNR wait, the wait's end); either sets
    the QP's flag ``started``, which the sweep keeps (a :class:`FlagMemory` of its own,
    read by the check alone). The sweep takes the start at its next check of the QP:
    the timer runs from that check, so a timer runs out no earlier than its time after
    the start, and up to the time the scan takes to come to the QP (a pass, as below)
    later. So the QP's timer state is a flag and its deadline, not a time stamp of
    every start. A reset leaves the flag: a QP with nothing outstanding has no timer,
    so the check that takes a stale start arms nothing.

    The QPs to check come from a :class:`DeadlineScan` of ``lanes`` QPs a cycle: the
    QPs whose hint has run out (whether its timer runs and the tick it runs out at, as
    its last check wrote them) and those marked since. The writes of a QP's state that
    can start its timer mark it: a packet sent when none was outstanding
    (``i_timer_from_sent``) and the handler's work on it (``i_busy``); the others only
    stop a timer (a reset, an acknowledgement, an error), which the next check of the
    QP, when its hint runs out, finds. The hint is the timer's deadline: the sweep keeps
    a copy of the hints by QP (block RAM, written as the scan's), which the check reads.

    The check, in two stages: a candidate's state, flags (of them ``error`` and
    ``rnr_wait``; and ``started``) and hint read (``r_*`` and the copy, registered and
    addressed a cycle ahead: ``"transparent"`` ports of :class:`ContextMemory` and
    :class:`QpFlags`) and its time due worked out; then the verdict registered, and a
    cycle later the hint written. A timer started (or running with no hint that says
    so) runs from the check: the hint says it runs out the time due from now, and
    ``o_timer_taken`` shows the flag cleared as the hint is written (a start written
    in the same cycle wins). Else the timer runs out
    when its hint does, and a QP whose timer runs when its hint has run out has
    expired. The verdict and the hint are dropped when the QP's timer state is
    written in a cycle of either stage or while it waits: the handler working on the
    QP (``i_busy``), a reset of it (``i_reset``), a packet of it sent (``i_sent``); it
    stays a candidate then. They are dropped too when a check of the same QP before
    writes its hint in either stage (the copy read missed it): that check's hint holds.

    Latency: a timer expires on ``o_expired`` up to a pass of the scan (``qps`` /
    ``lanes`` cycles, rounded up, and one per other candidate found on the way and per
    row that has any) and 5 cycles after its deadline, and its deadline is its time
    after the check that took its start: a marked QP is checked within a pass and 3
    cycles. While a verdict waits the scan holds; the QP checked behind it is checked
    again once the verdict is taken. Under reset the check addresses QP 0: the read
    ports' address registers take it too, so nothing downstream of them starts
    undefined (a 4-state simulator shows X there otherwise; the FPGA's flip-flops
    start at 0).
    """

    def __init__(self, *, qps, lanes=None):
        self._qps = check_qp_count(qps)
        self._lanes = check_lanes(qps, lanes)
        members = {
            "i_now": In(TIME_BITS),
            "r_flags": Out(lookup(QP_FLAGS, QP_INDEX_BITS)),
            "i_busy": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_reset": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_sent": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_timer_from_sent": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_timer_restart": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o_expired": Out(stream.Signature(expired_timer(qps))),
            "o_timer_taken": Out(stream.Signature(QP_INDEX_BITS, always_ready=True)),
        }
        for name in ("una", "nxt", "rnr_code", "peer"):
            members[f"r_{name}"] = Out(lookup(QP_LAYOUTS[name], QP_INDEX_BITS))
        super().__init__(members)

    @staticmethod
    def qp_state_bits():
        """Bits the sweep keeps per QP: its scan's (the copy of the hints by QP is not
        counted again), and the flag that a timer started."""
        return {**DeadlineScan.qp_state_bits(TIME_BITS), "started": 1}

    def elaborate(self, platform):
        m = Module()
        qps = self._qps
        qp_bits = qp_bits_of(qps)

        def written(index):
            return Cat(port.valid & (port.p[:qp_bits] == index)
                       for port in (self.i_busy, self.i_reset, self.i_sent)).any()

        m.submodules.scan = scan = DeadlineScan(qps=qps, time_bits=TIME_BITS, marks=2,
                                                lanes=self._lanes)
        m.d.comb += scan.i_now.eq(self.i_now)
        connect(m, wiring.flipped(self.i_timer_from_sent), scan.i_mark[0])
        connect(m, wiring.flipped(self.i_busy), scan.i_mark[1])

        # The hints by QP, for the check: written as the scan's are.
        m.submodules.hints = hints = memory.Memory(shape=hint(TIME_BITS), depth=1 << qp_bits,
                                                   init=[])
        hint_write = hints.write_port()
        hint_read = hints.read_port(transparent_for=(hint_write,))
        written_hint = scan.i_hint

        # Whether each QP's timer started since the check that last took a start of it.
        m.submodules.started = started = FlagMemory(
            flags=("started",), depth=1 << qp_bits, addr_bits=QP_INDEX_BITS,
            writers=(("taken", ("started",)), ("from_sent", ("started",)),
                     ("restart", ("started",))),
            reads=("transparent",))
        m.d.comb += [
            *write_flags(started.w_taken, self.o_timer_taken.p, self.o_timer_taken.valid, 0),
            *write_flags(started.w_from_sent, self.i_timer_from_sent.p,
                         self.i_timer_from_sent.valid, 1),
            *write_flags(started.w_restart, self.i_timer_restart.p,
                         self.i_timer_restart.valid, 1),
        ]
        m.d.comb += [
            hint_write.addr.eq(written_hint.p.qp),
            hint_write.data.eq(written_hint.p.hint),
            hint_write.en.eq(written_hint.valid),
        ]

        def rewritten(index):
            """Whether a hint of QP ``index`` is written this cycle."""
            return written_hint.valid & (written_hint.p.qp[:qp_bits] == index)

        # The check's two stages: the QP's state, flags and hint read (``checking``,
        # addressed a cycle ahead) and its time due worked out; then the verdict.
        checking = Signal(data.StructLayout({"valid": 1, "qp": qp_bits}))
        checked = Signal(data.StructLayout({
            "valid": 1, "qp": qp_bits, "armed": 1, "rnr_wait": 1, "written": 1,
            "started": 1, "start": 1, "hint": hint(TIME_BITS), "due": TIME_BITS}))
        expired = self.o_expired.valid
        expired_qp = self.o_expired.p.qp
        # Whether the check in the second stage is good: its verdict counts, and its hint
        # is written a cycle later (a change of the QP in that cycle marks it again, and
        # wins over the check's write).
        good = Signal()
        m.d.comb += good.eq(checked.valid & ~expired & ~checked.written
                            & ~written(checked.qp) & ~rewritten(checked.qp))
        ran_out = ~(self.i_now - checked.hint.at)[TIME_BITS - 1]
        m.d.sync += [
            written_hint.valid.eq(good),
            written_hint.p.qp.eq(checked.qp),
            written_hint.p.hint.armed.eq(checked.armed),
            written_hint.p.hint.at.eq(Mux(checked.start, self.i_now + checked.due,
                                          checked.hint.at)),
            self.o_timer_taken.valid.eq(good & checked.started),
            self.o_timer_taken.p.eq(checked.qp),
        ]

        # The scan's candidate is taken unless a verdict waits or the QP checked behind
        # one is checked again (``again``).
        again = Signal(data.StructLayout({"valid": 1, "qp": qp_bits}))
        m.d.comb += scan.o_candidate.ready.eq(~expired & ~again.valid)

        # The QP checked next: while a verdict waits, the one read now, again; then the one
        # checked behind the verdict, then the scan's pick. With none, the address stays.
        checking_next = Signal.like(checking)
        with m.If(ResetSignal()):
            m.d.comb += checking_next.eq(0)
        with m.Elif(expired):
            m.d.comb += checking_next.eq(checking)
        with m.Elif(again.valid):
            m.d.comb += checking_next.eq(again)
        with m.Else():
            m.d.comb += [checking_next.valid.eq(scan.o_candidate.valid),
                         checking_next.qp.eq(scan.o_candidate.p)]
        m.d.sync += checking.eq(checking_next)
        with m.If(expired & checked.valid):
            m.d.sync += [again.valid.eq(1), again.qp.eq(checked.qp)]
        with m.Elif(~expired):
            m.d.sync += again.valid.eq(0)

        for reader in (self.r_una, self.r_nxt, self.r_rnr_code, self.r_peer, self.r_flags):
            m.d.comb += reader.addr.eq(checking_next.qp)
        m.d.comb += [hint_read.addr.eq(checking_next.qp),
                     started.r[0].addr.eq(checking_next.qp)]
        w_una, w_nxt = self.r_una.data, self.r_nxt.data
        w_rnr_code, w_peer, w_flags = self.r_rnr_code.data, self.r_peer.data, self.r_flags.data
        w_hint = hint_read.data
        w_rnr_wait = w_flags.rnr_wait
        rnr_delays = Array(C(rnr_delay_ticks(code), TIME_BITS) for code in range(32))
        with m.If(expired):
            m.d.sync += checked.valid.eq(0)
        with m.Else():
            m.d.sync += [
                checked.valid.eq(checking.valid),
                checked.qp.eq(checking.qp),
                checked.armed.eq(~w_flags.error & (
                    w_rnr_wait | ((w_una != w_nxt) & (w_peer.timeout != 0)))),
                checked.rnr_wait.eq(w_rnr_wait),
                checked.written.eq(written(checking.qp) | rewritten(checking.qp)),
                checked.started.eq(started.r[0].data.started),
                checked.start.eq(started.r[0].data.started | ~w_hint.armed),
                checked.hint.eq(w_hint),
                checked.due.eq(Mux(w_rnr_wait, rnr_delays[w_rnr_code],
                                   (C(1, TIME_BITS) << w_peer.timeout)[:TIME_BITS])),
            ]

        with m.If(~expired):
            m.d.sync += [
                expired.eq(good & checked.armed & ~checked.start & ran_out),
                expired_qp.eq(checked.qp),
                self.o_expired.p.rnr_wait.eq(checked.rnr_wait),
            ]
        with m.Elif(self.o_expired.ready | written(expired_qp)):
            m.d.sync += expired.eq(0)
        return m
