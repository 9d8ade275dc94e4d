"""The reliability engine's timer sweep: the ACK timeout and RNR wait of every QP, found
by a scan of many QPs a cycle and checked one QP a cycle."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out, connect

from .deadline_scan import DeadlineScan, check_lanes
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

    A QP's timer is its ACK timeout, 2^timeout ticks (IBTA 9.7.6.1.3) from the start
    the ACK handler stamped (``r_timer``) or, while ``from_sent``, from the packet sent
    when none was outstanding (``r_sent_time``), and only while packets are outstanding
    (``r_una`` ≠ ``r_nxt``) and the timeout is not 0; or, while ``rnr_wait``, the RNR
    NAK's wait (IBTA table 45) from the stamped start. A QP in ERROR has no timer.

    The QPs to check come from a :class:`DeadlineScan` of ``lanes`` QPs a cycle: the
    QPs whose hint has run out (whether its timer runs and the tick it runs out at, as
    its last check wrote them) and those marked since. A write of a QP's state that can
    bring its timer closer marks it: a packet sent when none was outstanding
    (``i_timer_from_sent``, which starts the ACK timer) and the handler's work on it
    (``i_busy``, which stamps an RNR wait); the other writes only put a timer off or
    stop it (a reset, a packet sent behind others), and a hint that runs out early only
    makes its QP a candidate once more.

    The check, in two stages: a candidate's state and flags read
    (``r_*``, registered and addressed a cycle ahead: ``"transparent"`` ports of
    :class:`ContextMemory` and :class:`QpFlags`; of the flags it reads ``error``,
    ``rnr_wait``, ``from_sent``) and its time elapsed and due worked out, then the two
    compared and the verdict registered, and a cycle later the hint written. The
    verdict and the hint are dropped when the QP's timer state is written in a cycle of
    either stage or while it waits: the handler working on the QP (``i_busy``), a reset
    of it (``i_reset``), a packet of it sent (``i_sent``); it stays a candidate then. So
    when the handler takes it, the QP's state is the one it was read from but for a
    packet sent in that cycle, which cannot start the timer: an expired ACK timer runs
    with packets outstanding, and an RNR wait sends nothing.

    Latency: a timer expires on ``o_expired`` up to a pass of the scan (``qps`` /
    ``lanes`` cycles, rounded up, and one per other candidate found on the way and per
    row that has any) and 5 cycles after its time.
    While a verdict waits the scan holds; the QP checked behind it is checked again
    once the verdict is taken. Under reset the check addresses QP 0: the read ports'
    address registers take it too, so nothing downstream of them starts undefined (a
    4-state simulator shows X there otherwise; the FPGA's flip-flops start at 0).
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
            "o_expired": Out(stream.Signature(expired_timer(qps))),
        }
        for name in ("una", "nxt", "timer", "sent_time", "peer"):
            members[f"r_{name}"] = Out(lookup(QP_LAYOUTS[name], QP_INDEX_BITS))
        super().__init__(members)

    @staticmethod
    def qp_state_bits():
        """Bits the sweep keeps per QP: its scan's."""
        return DeadlineScan.qp_state_bits(TIME_BITS)

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

        # The check's two stages: the QP's state read (``checking``, addressed a cycle
        # ahead) and its time elapsed and due worked out, then compared.
        checking = Signal(data.StructLayout({"valid": 1, "qp": qp_bits}))
        checked = Signal(data.StructLayout({
            "valid": 1, "qp": qp_bits, "armed": 1, "rnr_wait": 1, "written": 1,
            "started": TIME_BITS, "elapsed": TIME_BITS, "due": TIME_BITS}))
        expired = self.o_expired.valid
        expired_qp = self.o_expired.p.qp
        # Whether the check in the second stage is good: its verdict counts, and its hint
        # is written a cycle later (a change of the QP in that cycle marks it again, and
        # wins over the check's write).
        good = Signal()
        m.d.comb += good.eq(checked.valid & ~expired & ~checked.written
                            & ~written(checked.qp))
        m.d.sync += [
            scan.i_hint.valid.eq(good),
            scan.i_hint.p.qp.eq(checked.qp),
            scan.i_hint.p.hint.armed.eq(checked.armed),
            scan.i_hint.p.hint.at.eq(checked.started + checked.due),
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

        for reader in (self.r_una, self.r_nxt, self.r_timer, self.r_sent_time, self.r_peer,
                       self.r_flags):
            m.d.comb += reader.addr.eq(checking_next.qp)
        w_una, w_nxt = self.r_una.data, self.r_nxt.data
        w_timer, w_sent_time, w_peer = self.r_timer.data, self.r_sent_time.data, self.r_peer.data
        w_flags = self.r_flags.data
        w_rnr_wait = w_flags.rnr_wait
        started = Mux(w_flags.from_sent & ~w_rnr_wait, w_sent_time, w_timer.start)
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
                checked.written.eq(written(checking.qp)),
                checked.started.eq(started),
                checked.elapsed.eq(self.i_now - started),
                checked.due.eq(Mux(w_rnr_wait, rnr_delays[w_timer.rnr_code],
                                   (C(1, TIME_BITS) << w_peer.timeout)[:TIME_BITS])),
            ]

        with m.If(~expired):
            m.d.sync += [
                expired.eq(good & checked.armed & (checked.elapsed >= checked.due)),
                expired_qp.eq(checked.qp),
                self.o_expired.p.rnr_wait.eq(checked.rnr_wait),
            ]
        with m.Elif(self.o_expired.ready | written(expired_qp)):
            m.d.sync += expired.eq(0)
        return m
