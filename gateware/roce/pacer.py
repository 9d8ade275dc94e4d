"""Pacing: each rate-limited QP may start a message only once the bytes it sent have
had their time at its rate; a gate holds back the work requests of a paced QP."""

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..arith import sum_above
from ..stream import registered
from .dcqcn import INTERVAL_BITS, INTERVAL_FRACTION_BITS, RATE_UPDATE
from .deadline_scan import DeadlineScan
from .flag_memory import FlagMemory, write_flags
from .qp_context import lookup, qp_bits_of
from .requests import QP_INDEX_BITS, WORK_REQUEST, check_qp_count

__all__ = ["Pacer", "PacedGate", "PACED_BYTES", "WIRE_OVERHEAD", "PACED_LOOKUP"]

#: The bytes a packet takes on the wire besides its UDP payload: UDP 8, IPv4 20,
#: Ethernet 14, FCS 4, preamble and start delimiter 8, inter-frame gap 12.
WIRE_OVERHEAD = 8 + 20 + 14 + 4 + 8 + 12

#: Whether a QP is paced, as a gate looks it up: the QP, and a cycle later its bit.
PACED_LOOKUP = lookup(1, QP_INDEX_BITS)

#: A packet sent: its QP and wire bytes.
PACED_BYTES = data.StructLayout({"qp": QP_INDEX_BITS, "bytes": 14})

_TIME = 48 + INTERVAL_FRACTION_BITS     # clock cycles, fixed point (2^47 cycles: days)

#: Bits of the times the scan keeps, in whole cycles (modular: a QP's next turn is at most
#: two packets' time ahead, 2 × 16,383 bytes × 2^16 cycles, within half their range).
HINT_BITS = 32

_INTERVAL = data.StructLayout({"limited": 1, "interval": INTERVAL_BITS})
_TURN = data.StructLayout({"turn": _TIME, "bytes": 14})


class Pacer(wiring.Component):
    """Keeps, for each rate-limited QP, the time its next message may start.

    ``i_rate`` takes the reaction point's rate updates (a QP's pacing interval in
    cycles per byte, or that it is no longer limited); ``i_sent`` each packet a QP sent
    and its wire bytes. For each QP the pacer keeps when its last packet had its turn
    and its wire bytes; the next may start once those bytes had their time at the QP's
    rate *now*, as DCQCN's reaction point paces (``sim/models/dcqcn_loop.py``: a rate raised
    after a cut shortens the wait for the packet sent at the low rate; a packet charged
    at the minimum rate, 256 cycles a byte at a 32-cycle µs, would otherwise hold its
    QP for 280,000 cycles whatever the rate does meanwhile). A packet's turn is that
    due time, or 1 µs (``cycles_per_us``) ago if that is later: a QP that waited longer
    than its debt may send a burst of 1 µs at most, and one let go late by the check
    below (by less than 1 µs) loses no time, so the long-run rate is exact.

    A QP's *paced* bit (in a :class:`FlagMemory`) says it has a start time ahead; each
    gate looks it up through a port of its own (``paced[n]``, for ``readers`` gates:
    the bit as it was in the cycle of ``addr``, a cycle later). A packet sets it
    3 cycles after ``i_sent`` (registered input; the previous packet's bytes times the
    interval, registered; the new turn written). A check of one QP a cycle clears it
    once the due time has come, 3 cycles after it reads the QP (its bytes' time and
    then its due time registered). The QPs it checks come from a :class:`DeadlineScan`
    of up to 32 QPs a cycle: those whose due time, as their last check worked it out,
    has come, and those a packet or a rate update changed since; so a QP is let go up
    to a pass of the scan (``qps`` / 32 cycles, and one or two per other QP checked on
    the way) and 6 cycles late, the late start counted as above. A rate update takes effect
    a cycle after ``i_rate`` (registered input); one that ends the limit clears the
    QP's bit then. Every read of the per-QP memories is registered: a packet's QP's
    interval and last turn are read as the packet comes in.
    """

    @staticmethod
    def qp_state_bits():
        """Bits the pacer keeps per QP: its interval, its last packet's turn and bytes,
        its paced bit, and its scan's."""
        return {"interval": _INTERVAL.size, "turn": _TURN.size, "paced": 1,
                **DeadlineScan.qp_state_bits(HINT_BITS)}

    def __init__(self, *, qps, readers=1):
        self._qps = check_qp_count(qps)
        self._readers = readers
        super().__init__({
            "i_cycles_per_us": In(10),
            "i_rate": In(stream.Signature(RATE_UPDATE, always_ready=True)),
            "i_sent": In(stream.Signature(PACED_BYTES, always_ready=True)),
            "paced": In(PACED_LOOKUP).array(readers),
        })

    def elaborate(self, platform):
        m = Module()
        qps = self._qps
        entries = 1 << qp_bits_of(qps)

        now = Signal(48)
        m.d.sync += now.eq(now + 1)
        now_fixed = Cat(C(0, INTERVAL_FRACTION_BITS), now)
        # 1 µs ago (not before 0), in registers: worked out over two cycles from the count
        # two cycles ahead.
        ago = Signal(signed(50))
        earliest = Signal(_TIME)
        m.d.sync += [
            ago.eq(now + 2 - self.i_cycles_per_us),
            earliest.eq(Cat(C(0, INTERVAL_FRACTION_BITS), Mux(ago < 0, 0, ago[:48]))),
        ]
        # The paced bits. Writers, the later winning: the sweep, a rate update, a packet.
        m.submodules.paced = paced = FlagMemory(
            flags=("paced",), depth=entries, addr_bits=QP_INDEX_BITS,
            writers=(("sweep", ("paced",)), ("rate", ("paced",)), ("charge", ("paced",))),
            reads=("sync",) * self._readers)
        for port, reader in zip(self.paced, paced.r, strict=True):
            m.d.comb += [reader.addr.eq(port.addr), port.data.eq(reader.data.paced)]

        # Each QP's interval (cycles per byte), and whether it is limited.
        m.submodules.intervals = intervals = memory.Memory(shape=_INTERVAL, depth=entries,
                                                           init=[])
        interval_write = intervals.write_port()
        interval_read = intervals.read_port(transparent_for=(interval_write,))
        interval_sweep = intervals.read_port(transparent_for=(interval_write,))
        # Rate updates through a register (the reaction point's FSM does not chain with
        # the interval memory's write and the paced bits).
        rate = registered(m, self.i_rate, "rate")
        m.d.comb += [
            interval_write.addr.eq(rate.p.qp),
            interval_write.data.limited.eq(rate.p.limited),
            interval_write.data.interval.eq(rate.p.interval),
            interval_write.en.eq(rate.valid),
        ]

        # Each QP's last packet: its turn and its wire bytes.
        m.submodules.turns = turns = memory.Memory(shape=_TURN, depth=entries, init=[])
        turn_write = turns.write_port()
        turn_read = turns.read_port(transparent_for=(turn_write,))
        turn_sweep = turns.read_port(transparent_for=(turn_write,))

        # A packet: registered; the previous packet's bytes at the QP's interval,
        # registered (the previous packet is the one in the next stage if it is the same
        # QP's, not yet written); its turn and bytes written.
        sent = Signal(PACED_BYTES)
        sent_valid = Signal()
        m.d.sync += [sent.eq(self.i_sent.p), sent_valid.eq(self.i_sent.valid)]
        charged_qp = Signal(QP_INDEX_BITS)
        charged_bytes = Signal(14)
        charging = Signal()
        previous_turn = Signal(_TIME)
        previous_time = Signal(14 + INTERVAL_BITS)        # its bytes × the interval
        turn = Signal(_TIME)
        m.d.comb += turn.eq(Mux(sum_above(previous_turn, previous_time, earliest),
                                previous_turn + previous_time, earliest))
        chained = charging & (charged_qp == sent.qp)
        # (The packet's QP's interval and last turn read as it comes in: registered
        # reads that show the writes of that cycle.)
        m.d.comb += [interval_read.addr.eq(self.i_sent.p.qp),
                     turn_read.addr.eq(self.i_sent.p.qp)]
        m.d.sync += [
            charged_qp.eq(sent.qp),
            charged_bytes.eq(sent.bytes),
            charging.eq(sent_valid & interval_read.data.limited),
            previous_turn.eq(Mux(chained, turn, turn_read.data.turn)),
            previous_time.eq(Mux(chained, charged_bytes, turn_read.data.bytes)
                             * interval_read.data.interval),
        ]
        m.d.comb += [
            turn_write.addr.eq(charged_qp),
            turn_write.data.turn.eq(turn),
            turn_write.data.bytes.eq(charged_bytes),
            turn_write.en.eq(charging),
        ]

        # The QPs to check: from a scan of hints (the cycle the QP's last packet's time at
        # its interval is over, as its last check worked it out), and those a packet or a
        # rate update changed since (a rate raised brings the time closer).
        m.submodules.scan = scan = DeadlineScan(qps=qps, time_bits=HINT_BITS, marks=2)
        m.d.comb += [
            scan.i_now.eq(now[:HINT_BITS]),
            scan.i_mark[0].valid.eq(charging),
            scan.i_mark[0].p.eq(charged_qp),
            scan.i_mark[1].valid.eq(rate.valid),
            scan.i_mark[1].p.eq(rate.p.qp),
            scan.o_candidate.ready.eq(1),
        ]

        def changed(qp):
            """Whether a packet or a rate update of the QP is written this cycle."""
            return ((turn_write.en & (turn_write.addr == qp))
                    | (interval_write.en & (interval_write.addr == qp)))

        # The check: read a candidate; its last packet's time at its interval, registered;
        # its due time, registered; let it go if that is over. A turn or an interval
        # written after the read makes the verdict stale (the write marked the QP: it is
        # checked again).
        swept = scan.o_candidate.p
        m.d.comb += [turn_sweep.addr.eq(swept), interval_sweep.addr.eq(swept)]
        visited = Signal(data.StructLayout({"valid": 1, "qp": QP_INDEX_BITS}))
        judged = Signal.like(visited)
        judged_turn = Signal(_TIME)
        judged_time = Signal(14 + INTERVAL_BITS)
        stale = Signal()
        m.d.sync += [
            visited.valid.eq(scan.o_candidate.valid),
            visited.qp.eq(swept),
            judged.eq(visited),
            judged_turn.eq(turn_sweep.data.turn),
            judged_time.eq(turn_sweep.data.bytes * interval_sweep.data.interval),
            stale.eq(changed(visited.qp)),
        ]
        # The due time, registered before it is compared with the time.
        due = Signal.like(visited)
        due_time = Signal(_TIME + 1)
        due_stale = Signal()
        m.d.sync += [
            due.eq(judged),
            due_time.eq(judged_turn + judged_time),
            due_stale.eq(stale | changed(judged.qp)),
        ]
        released = Signal()
        m.d.comb += released.eq(due.valid & ~due_stale & (due_time <= now_fixed))
        # The QP's hint, a cycle later (a change in that cycle marks it again and wins).
        m.d.sync += [
            scan.i_hint.valid.eq(due.valid & ~due_stale & ~changed(due.qp)),
            scan.i_hint.p.qp.eq(due.qp),
            scan.i_hint.p.hint.armed.eq(~released),
            # The first whole cycle at or after the due time.
            scan.i_hint.p.hint.at.eq(
                (due_time + (1 << INTERVAL_FRACTION_BITS) - 1)[INTERVAL_FRACTION_BITS:]),
        ]
        for writer, qp, enable, value in (
                (paced.w_sweep, due.qp, released, 0),
                (paced.w_rate, rate.p.qp, rate.valid & ~rate.p.limited, 0),
                (paced.w_charge, charged_qp, charging, 1)):
            m.d.comb += write_flags(writer, qp, enable, value)
        return m


class PacedGate(wiring.Component):
    """Passes work requests, holding back one whose QP is paced (looked up on
    ``r_paced``, a port of the :class:`Pacer`) until it is not. A request offered stays
    offered until taken (the stream rule), so a QP paced after its request was offered
    sends that one message more.

    The QP's bit is looked up a cycle before (a registered read: the lookup does not
    chain with the handshake): a request of the QP of the cycle before passes with
    latency 0 on that cycle's bit, one of a new QP a cycle later. So a QP's bit takes
    effect here a cycle after the pacer sets it.
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(WORK_REQUEST)),
            "o": Out(stream.Signature(WORK_REQUEST)),
            "r_paced": Out(PACED_LOOKUP),
        })

    def elaborate(self, platform):
        m = Module()
        offered = Signal()
        looked_up = Signal(QP_INDEX_BITS)           # the QP whose bit ``paced`` is
        paced = self.r_paced.data
        m.d.comb += self.r_paced.addr.eq(self.i.p.qp)
        m.d.sync += looked_up.eq(self.i.p.qp)
        may = offered | (~paced & (looked_up == self.i.p.qp))
        m.d.comb += [
            self.o.valid.eq(self.i.valid & may),
            self.o.p.eq(self.i.p),
            self.i.ready.eq(self.o.ready & may),
        ]
        m.d.sync += offered.eq(self.o.valid & ~self.o.ready)
        return m
