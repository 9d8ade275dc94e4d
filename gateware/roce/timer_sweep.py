"""The reliability engine's timer sweep: the ACK timeout and RNR wait of every QP,
checked one QP a cycle."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .qp_context import QP_FLAGS, QP_LAYOUTS, TIME_BITS, lookup, qp_bits_of
from .requests import QP_INDEX_BITS, check_qp_count
from .timers import rnr_delay_ticks

__all__ = ["TimerSweep", "expired_timer"]


def expired_timer(qps):
    """A timer expired: its QP, and whether it is an RNR wait (else the ACK timeout)."""
    return data.StructLayout({"qp": qp_bits_of(qps), "rnr_wait": 1})


class TimerSweep(wiring.Component):
    """Checks one QP's timer a cycle, round-robin, and offers the first it finds expired
    (``o_expired``) until the ACK handler takes it.

    A QP's timer is its ACK timeout, 2^timeout ticks (IBTA 9.7.6.1.3) from the start
    the ACK handler stamped (``r_timer``) or, while ``from_sent``, from the packet sent
    when none was outstanding (``r_sent_time``), and only while packets are outstanding
    (``r_una`` ≠ ``r_nxt``) and the timeout is not 0; or, while ``rnr_wait``, the RNR
    NAK's wait (IBTA table 45) from the stamped start. A QP in ERROR has no timer.

    A QP is checked in two stages: its state and flags read (``r_*``, registered and
    addressed a cycle ahead: ``"transparent"`` ports of :class:`ContextMemory` and
    :class:`QpFlags`; of the flags it reads ``error``, ``rnr_wait``, ``from_sent``) and
    its time elapsed and due worked out, then the two compared and the verdict
    registered. The
    verdict is dropped when the QP's timer state is written in a cycle of either stage
    or while it waits: the handler working on the QP (``i_busy``), a reset of it
    (``i_reset``), a packet of it sent (``i_sent``). So when the handler takes it, the
    QP's state is the one it was read from but for a packet sent in that cycle, which
    cannot start the timer: an expired ACK timer runs with packets outstanding, and an
    RNR wait sends nothing.

    Latency: a timer expires on ``o_expired`` up to ``qps`` + 3 cycles after its time;
    while a verdict waits the sweep holds, and goes on from the QP checked behind it
    (read again) once it is taken. Under reset the sweep addresses QP 0: the
    read ports' address registers take it too, so nothing downstream of them starts
    undefined (a 4-state simulator shows X there otherwise; the FPGA's flip-flops
    start at 0).
    """

    def __init__(self, *, qps):
        self._qps = check_qp_count(qps)
        members = {
            "i_now": In(TIME_BITS),
            "r_flags": Out(lookup(QP_FLAGS, QP_INDEX_BITS)),
            "i_busy": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_reset": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_sent": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o_expired": Out(stream.Signature(expired_timer(qps))),
        }
        for name in ("una", "nxt", "timer", "sent_time", "peer"):
            members[f"r_{name}"] = Out(lookup(QP_LAYOUTS[name], QP_INDEX_BITS))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        qps = self._qps
        qp_bits = qp_bits_of(qps)

        def written(index):
            return Cat(port.valid & (port.p[:qp_bits] == index)
                       for port in (self.i_busy, self.i_reset, self.i_sent)).any()

        # Two stages: the QP's state read and its time elapsed and due worked out, then
        # compared, so that no path runs from the read through two carry chains.
        checked = Signal(data.StructLayout({
            "valid": 1, "qp": qp_bits, "armed": 1, "rnr_wait": 1, "written": 1,
            "elapsed": TIME_BITS, "due": TIME_BITS}))
        sweep = Signal(qp_bits)
        sweep_next = Signal(qp_bits)
        expired = self.o_expired.valid
        expired_qp = self.o_expired.p.qp
        # While a verdict waits, the sweep goes back to the QP checked behind it.
        m.d.comb += sweep_next.eq(Mux(ResetSignal(), 0,
                                      Mux(expired, checked.qp,
                                          Mux(sweep == qps - 1, 0, sweep + 1))))
        m.d.sync += sweep.eq(sweep_next)
        for reader in (self.r_una, self.r_nxt, self.r_timer, self.r_sent_time, self.r_peer,
                       self.r_flags):
            m.d.comb += reader.addr.eq(sweep_next)
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
                checked.valid.eq(1),
                checked.qp.eq(sweep),
                checked.armed.eq(~w_flags.error & (
                    w_rnr_wait | ((w_una != w_nxt) & (w_peer.timeout != 0)))),
                checked.rnr_wait.eq(w_rnr_wait),
                checked.written.eq(written(sweep)),
                checked.elapsed.eq(self.i_now - started),
                checked.due.eq(Mux(w_rnr_wait, rnr_delays[w_timer.rnr_code],
                                   (C(1, TIME_BITS) << w_peer.timeout)[:TIME_BITS])),
            ]

        with m.If(~expired):
            m.d.sync += [
                expired.eq(checked.valid & checked.armed & (checked.elapsed >= checked.due)
                           & ~checked.written & ~written(checked.qp)),
                expired_qp.eq(checked.qp),
                self.o_expired.p.rnr_wait.eq(checked.rnr_wait),
            ]
        with m.Elif(self.o_expired.ready | written(expired_qp)):
            m.d.sync += expired.eq(0)
        return m
