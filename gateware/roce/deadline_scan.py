"""A scan that finds, many QPs a cycle, the QPs whose deadline has come or whose state
changed, for a part that checks one QP a cycle against its whole state."""

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .flag_memory import FlagMemory, write_flags
from .qp_context import qp_bits_of
from .requests import QP_INDEX_BITS, check_qp_count

__all__ = ["DeadlineScan", "SCAN_LANES", "scan_lanes", "scan_rows", "check_lanes", "hint",
           "hint_write"]

#: QPs the scan reads a cycle, at most.
SCAN_LANES = 32

#: Words up to which a hint memory registers its read's data, not its address (one
#: distributed RAM deep: RAM64M).
_SHALLOW = 64


def scan_lanes(qps):
    """QPs the scan of a build of ``qps`` QPs reads a cycle: :data:`SCAN_LANES`, or
    fewer where a row of them would hold more than half the QP indices."""
    return max(1, min(SCAN_LANES, (1 << qp_bits_of(qps)) // 2))


def check_lanes(qps, lanes=None):
    """The lanes of a scan of ``qps`` QPs: ``lanes``, checked, or by default
    :func:`scan_lanes`."""
    check_qp_count(qps)
    if lanes is None:
        return scan_lanes(qps)
    most = max(1, (1 << qp_bits_of(qps)) // 2)
    if not isinstance(lanes, int) or lanes < 1 or lanes & (lanes - 1) or lanes > most:
        raise ValueError(f"Lanes must be a power of two up to {most} for {qps} QPs, "
                         f"not {lanes!r}")
    return lanes


def scan_rows(qps, lanes=None):
    """Rows of a scan of ``qps`` QPs in ``lanes`` (by default :func:`scan_lanes`): the
    cycles of a pass without candidates."""
    return -(-qps // check_lanes(qps, lanes))


def hint(time_bits):
    """What the scan keeps of a QP: whether it has a deadline, and the time of it."""
    return data.StructLayout({"armed": 1, "at": time_bits})


def hint_write(time_bits):
    """A check's verdict on a QP: its new hint."""
    return data.StructLayout({"qp": QP_INDEX_BITS, "hint": hint(time_bits)})


class DeadlineScan(wiring.Component):
    """Offers (``o_candidate``) the QPs to check: those whose deadline has come and
    those whose state changed since their last check.

    For every QP the scan keeps a hint, in memories of its own, a row of ``lanes`` QPs
    a word (index = row × lanes + lane): whether the QP has a deadline and its time
    (``at``), as the QP's last check wrote them (``i_hint``), and a flag that its state
    changed since (``dirty``, set by each ``i_mark[n]``, cleared by the check's write;
    a mark in the cycle of the write wins). Times are modular: a deadline has come
    when ``i_now`` − ``at`` is less than half the range of ``time_bits`` bits, so a
    deadline must not lie further ahead than that.

    The scan reads a row a cycle and takes as candidates the QPs of it that are dirty
    or whose deadline has come; it offers them one a cycle, lowest lane first, from a
    register (no path goes from the choice among a row to the checker), and takes the
    next row's once none is left: a pass of every row takes ``rows`` cycles, one more
    per candidate and one more per row that has any. The flags are read as they were
    before the cycle's writes: a QP marked in the cycle its row is read is a candidate
    a pass later. A hint written in a cycle shows in the row read the cycle after.
    ``o_candidate.p`` keeps the last QP offered while none is.

    So a check must write a hint that is never later than the QP's deadline, and each
    change of a QP's state that can bring the deadline closer must mark it; a hint
    that comes early only makes its QP a candidate once more.
    """

    def __init__(self, *, qps, time_bits, marks, lanes=None):
        self._qps = check_qp_count(qps)
        self._lanes = check_lanes(qps, lanes)
        self._time_bits = time_bits
        super().__init__({
            "i_now": In(time_bits),
            "i_mark": In(stream.Signature(QP_INDEX_BITS, always_ready=True)).array(marks),
            "i_hint": In(stream.Signature(hint_write(time_bits), always_ready=True)),
            "o_candidate": Out(stream.Signature(QP_INDEX_BITS)),
        })

    @staticmethod
    def qp_state_bits(time_bits):
        """Bits the scan keeps per QP: its hint, and its dirty flag."""
        return {"hint": hint(time_bits).size, "dirty": 1}

    @property
    def lanes(self):
        return self._lanes

    @property
    def rows(self):
        return scan_rows(self._qps, self._lanes)

    def elaborate(self, platform):
        m = Module()
        qps, lanes, rows, time_bits = self._qps, self._lanes, self.rows, self._time_bits
        qp_bits = qp_bits_of(qps)
        lane_bits = exact_log2(lanes)
        row_bits = qp_bits - lane_bits
        written = self.i_hint

        def lane_of(qp, lane):
            """Whether QP index ``qp`` is in lane ``lane``."""
            return C(1) if lane_bits == 0 else qp[:lane_bits] == lane

        # The hints and dirty flags, a memory of each per lane. The hint memories' reads
        # are registered. A memory of ``_SHALLOW`` rows or fewer (distributed RAM, one LUT
        # deep) registers its data, as the memory was before the cycle's write, and the
        # write of the row read is registered beside it (``bypass``) and passed on: the
        # compares then start at registers, where a distributed RAM read from the row's
        # register would take their time. A deeper one (block RAM, or distributed RAM behind
        # a tree of multiplexers, too slow for an address worked out in the cycle) has its
        # address registered: its read shows the cycle's write itself.
        hints, dirty = [], []
        row = Signal(row_bits)              # the row the hint ports show
        row_next = Signal(row_bits)
        shallow = 1 << row_bits <= _SHALLOW
        if shallow:
            bypass = Signal(hint(time_bits))
            bypass_lanes = Signal(lanes)
            m.d.sync += [
                bypass.eq(written.p.hint),
                bypass_lanes.eq(Mux(written.valid
                                    & (written.p.qp[lane_bits:qp_bits] == row_next),
                                    Cat(lane_of(written.p.qp, lane) for lane in range(lanes)),
                                    0)),
            ]
        for lane in range(lanes):
            m.submodules[f"hints{lane}"] = store = memory.Memory(
                shape=hint(time_bits), depth=1 << row_bits, init=[])
            write = store.write_port()
            read = store.read_port(transparent_for=() if shallow else (write,))
            m.d.comb += [
                write.addr.eq(written.p.qp[lane_bits:qp_bits]),
                write.en.eq(written.valid & lane_of(written.p.qp, lane)),
                write.data.eq(written.p.hint),
                read.addr.eq(row_next),
            ]
            hints.append(hint(time_bits)(Mux(bypass_lanes[lane], bypass, read.data))
                         if shallow else read.data)
            m.submodules[f"dirty{lane}"] = flags = FlagMemory(
                flags=("dirty",), depth=1 << row_bits, addr_bits=row_bits,
                writers=(("check", ("dirty",)),
                         *((f"mark{n}", ("dirty",)) for n in range(len(self.i_mark)))),
                reads=("comb",))
            for writer, port, value in ((flags.w_check, written, 0),
                                        *((getattr(flags, f"w_mark{n}"), mark, 1)
                                          for n, mark in enumerate(self.i_mark))):
                qp = port.p.qp if port is written else port.p
                m.d.comb += write_flags(writer, qp[lane_bits:qp_bits],
                                        port.valid & lane_of(qp, lane), value)
            m.d.comb += flags.r[0].addr.eq(row)
            dirty.append(flags.r[0].data.dirty)

        # The candidates of a row (``candidates``, of ``candidates_row``), taken one a
        # cycle, lowest lane first, into ``pick``; once none is left, the next row's. The
        # row's are loaded as found (``loaded``: the compares reach these registers through
        # no choice, only their enable) and those offered since are struck out (``taken``).
        loaded = Signal(lanes)
        taken = Signal(lanes)
        candidates = Signal(lanes)
        candidates_row = Signal(row_bits)
        m.d.comb += candidates.eq(loaded & ~taken)
        found = Signal(lanes)
        for lane in range(lanes):
            entry = hints[lane]
            in_use = (Cat(C(lane, lane_bits), row) < qps) if lane_bits else (row < qps)
            m.d.comb += found[lane].eq(in_use & (dirty[lane] | (
                entry.armed & ~(self.i_now - entry.at)[time_bits - 1])))
        lowest = Signal(lanes)
        lane_picked = Signal(range(lanes))
        m.d.comb += [
            lowest.eq(candidates & (~candidates + 1)),
            lane_picked.eq(Cat(Cat(lowest[lane] for lane in range(lanes) if lane >> bit & 1).any()
                               for bit in range(lane_bits))),
        ]
        pick = self.o_candidate
        picking, advance = Signal(), Signal()
        m.d.comb += [
            picking.eq(~pick.valid | pick.ready),
            advance.eq(picking & (candidates == 0)),
            row_next.eq(Mux(advance, Mux(row == rows - 1, 0, row + 1), row)),
        ]
        m.d.sync += row.eq(row_next)
        with m.If(advance):
            m.d.sync += [loaded.eq(found), taken.eq(0), candidates_row.eq(row)]
        with m.Elif(picking):
            m.d.sync += taken.eq(taken | lowest)
        with m.If(picking):
            m.d.sync += pick.valid.eq(candidates.any())
            with m.If(candidates.any()):
                m.d.sync += pick.p.eq(Cat(lane_picked, candidates_row) if lane_bits
                                      else candidates_row)
        return m
