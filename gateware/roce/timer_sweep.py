"""The reliability engine's timer sweep: the ACK timeout and RNR wait of every QP, found
by a scan of many QPs a cycle and checked one QP a cycle."""

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .flag_memory import FlagMemory, write_flags
from .qp_context import QP_FLAGS, QP_LAYOUTS, TIME_BITS, lookup, qp_bits_of
from .requests import QP_INDEX_BITS, check_qp_count
from .timers import rnr_delay_ticks

__all__ = ["TimerSweep", "expired_timer", "sweep_lanes", "SWEEP_LANES", "HINT"]

#: QPs the scan reads a cycle, at most.
SWEEP_LANES = 32

#: What the scan keeps of a QP: whether its timer runs, and the tick it runs out at.
HINT = data.StructLayout({"armed": 1, "at": TIME_BITS})


def sweep_lanes(qps):
    """QPs the scan of a build of ``qps`` QPs reads a cycle: :data:`SWEEP_LANES`, or
    fewer where a row of them would hold more than half the QP indices."""
    return max(1, min(SWEEP_LANES, (1 << qp_bits_of(qps)) // 2))


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

    The scan. The QPs are in rows of ``lanes`` (index = row × lanes + lane), and for
    each the sweep keeps a hint in memories of its own, a row a word: whether its timer
    runs and the tick it runs out at, as its last check found them, and a flag that
    its state changed since (``dirty``). The scan reads a row a cycle and takes as
    candidates the QPs of it that are dirty or whose hint has run out; the check takes
    them one a cycle, so a row without candidates costs one cycle. A write of a QP's
    state that can bring its timer closer marks it dirty: a packet sent when none was
    outstanding (``i_timer_from_sent``, which starts the ACK timer) and the handler's
    work on it (``i_busy``, which stamps an RNR wait); the other writes only put a
    timer off or stop it (a reset, a packet sent behind others), and a hint that runs
    out early only makes its QP a candidate once more.

    The check, in two stages as before the hints: a candidate's state and flags read
    (``r_*``, registered and addressed a cycle ahead: ``"transparent"`` ports of
    :class:`ContextMemory` and :class:`QpFlags`; of the flags it reads ``error``,
    ``rnr_wait``, ``from_sent``) and its time elapsed and due worked out, then the two
    compared, the verdict registered, and its hint written and dirty flag cleared. The
    verdict and the hint are dropped when the QP's timer state is written in a cycle of
    either stage or while it waits: the handler working on the QP (``i_busy``), a reset
    of it (``i_reset``), a packet of it sent (``i_sent``); it stays a candidate then. So
    when the handler takes it, the QP's state is the one it was read from but for a
    packet sent in that cycle, which cannot start the timer: an expired ACK timer runs
    with packets outstanding, and an RNR wait sends nothing.

    Latency: a timer expires on ``o_expired`` up to a scan of every row (``qps`` /
    ``lanes`` cycles, rounded up), one cycle per other candidate found on the way and 4
    cycles after its time. While a verdict waits the scan holds; the QP checked behind
    it is checked again once the verdict is taken. Under reset the check addresses QP
    0: the read ports' address registers take it too, so nothing downstream of them
    starts undefined (a 4-state simulator shows X there otherwise; the FPGA's
    flip-flops start at 0).
    """

    def __init__(self, *, qps, lanes=None):
        self._qps = check_qp_count(qps)
        most = sweep_lanes(qps) if lanes is None else max(1, (1 << qp_bits_of(qps)) // 2)
        if lanes is None:
            lanes = most
        if not isinstance(lanes, int) or lanes < 1 or lanes & (lanes - 1) or lanes > most:
            raise ValueError(f"Lanes must be a power of two up to {most} for {qps} QPs, "
                             f"not {lanes!r}")
        self._lanes = lanes
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

    @property
    def lanes(self):
        return self._lanes

    @property
    def rows(self):
        return -(-self._qps // self._lanes)

    def elaborate(self, platform):
        m = Module()
        qps, lanes, rows = self._qps, self._lanes, self.rows
        qp_bits = qp_bits_of(qps)
        lane_bits = exact_log2(lanes)
        row_bits = qp_bits - lane_bits

        def written(index):
            return Cat(port.valid & (port.p[:qp_bits] == index)
                       for port in (self.i_busy, self.i_reset, self.i_sent)).any()

        def lane_of(qp, lane):
            """Whether QP index ``qp`` is in lane ``lane``."""
            return C(1) if lane_bits == 0 else qp[:lane_bits] == lane

        # The check's two stages: the QP's state read (``checking``, addressed a cycle
        # ahead) and its time elapsed and due worked out, then compared.
        checking = Signal(data.StructLayout({"valid": 1, "qp": qp_bits}))
        checked = Signal(data.StructLayout({
            "valid": 1, "qp": qp_bits, "armed": 1, "rnr_wait": 1, "written": 1,
            "started": TIME_BITS, "elapsed": TIME_BITS, "due": TIME_BITS}))
        expired = self.o_expired.valid
        expired_qp = self.o_expired.p.qp
        # Whether the check in the second stage is good: its verdict counts, and its hint
        # is written a cycle later (``settled``: a change of the QP in that cycle marks it
        # dirty again, and wins over the check's clearing).
        good = Signal()
        m.d.comb += good.eq(checked.valid & ~expired & ~checked.written
                            & ~written(checked.qp))
        settled = Signal(data.StructLayout({"valid": 1, "qp": qp_bits, "hint": HINT}))
        m.d.sync += [
            settled.valid.eq(good),
            settled.qp.eq(checked.qp),
            settled.hint.armed.eq(checked.armed),
            settled.hint.at.eq(checked.started + checked.due),
        ]

        # The hints and dirty flags, a memory of each per lane.
        hints, dirty = [], []
        row = Signal(row_bits)              # the row the hint ports show
        row_next = Signal(row_bits)
        for lane in range(lanes):
            m.submodules[f"hints{lane}"] = store = memory.Memory(shape=HINT, depth=1 << row_bits,
                                                                 init=[])
            write = store.write_port()
            read = store.read_port(transparent_for=(write,))
            m.d.comb += [
                write.addr.eq(settled.qp[lane_bits:]),
                write.en.eq(settled.valid & lane_of(settled.qp, lane)),
                write.data.eq(settled.hint),
                read.addr.eq(row_next),
            ]
            hints.append(read.data)
            # A change marks a QP dirty; the check clears it, and a change in the same
            # cycle wins. The scan reads the flags as they were before the cycle's writes:
            # a QP marked as its row is read is a candidate a pass later (its timer runs
            # out two ticks after the change at the earliest).
            m.submodules[f"dirty{lane}"] = flags = FlagMemory(
                flags=("dirty",), depth=1 << row_bits, addr_bits=row_bits,
                writers=(("check", ("dirty",)), ("timer_from_sent", ("dirty",)),
                         ("busy", ("dirty",))),
                reads=("comb",))
            for writer, port, value in ((flags.w_check, None, 0),
                                        (flags.w_timer_from_sent, self.i_timer_from_sent, 1),
                                        (flags.w_busy, self.i_busy, 1)):
                if port is None:
                    qp, enable = settled.qp, settled.valid
                else:
                    qp, enable = port.p[:qp_bits], port.valid
                m.d.comb += write_flags(writer, qp[lane_bits:], enable & lane_of(qp, lane),
                                        value)
            m.d.comb += flags.r[0].addr.eq(row)
            dirty.append(flags.r[0].data.dirty)

        # The scan: the candidates of a row (``candidates``, of ``candidates_row``) are
        # picked one a cycle, lowest lane first, into a register (``pick``: no path goes
        # from the choice among a row to the memories' addresses); with the last picked,
        # the next row's come. The scan picks unless a verdict waits or the QP checked
        # behind one is checked again (``again``).
        candidates = Signal(lanes)
        candidates_row = Signal(row_bits)
        found = Signal(lanes)
        for lane in range(lanes):
            hint = hints[lane]
            in_use = (Cat(C(lane, lane_bits), row) < qps) if lane_bits else (row < qps)
            m.d.comb += found[lane].eq(in_use & (dirty[lane] | (
                hint.armed & ~(self.i_now - hint.at)[TIME_BITS - 1])))
        lowest = Signal(lanes)
        lane_picked = Signal(range(lanes))
        m.d.comb += [
            lowest.eq(candidates & (~candidates + 1)),
            lane_picked.eq(Cat(Cat(lowest[lane] for lane in range(lanes) if lane >> bit & 1).any()
                               for bit in range(lane_bits))),
        ]
        pick = Signal(data.StructLayout({"valid": 1, "qp": qp_bits}))
        again = Signal(data.StructLayout({"valid": 1, "qp": qp_bits}))
        picking, advance = Signal(), Signal()
        m.d.comb += [
            picking.eq(~expired & ~again.valid),
            advance.eq(picking & ((candidates & (candidates - 1))[:lanes] == 0)),
            row_next.eq(Mux(advance, Mux(row == rows - 1, 0, row + 1), row)),
        ]
        m.d.sync += row.eq(row_next)
        with m.If(advance):
            m.d.sync += [candidates.eq(found), candidates_row.eq(row)]
        with m.Elif(picking):
            m.d.sync += candidates.eq(candidates & (candidates - 1))
        with m.If(picking):
            m.d.sync += pick.valid.eq(candidates.any())
            with m.If(candidates.any()):
                m.d.sync += pick.qp.eq(Cat(lane_picked, candidates_row) if lane_bits
                                       else candidates_row)

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
            m.d.comb += checking_next.eq(pick)
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
