"""Pacing: each rate-limited QP may start a message only once the bytes it sent have
had their time at its rate; a gate holds back the work requests of a paced QP."""

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .dcqcn import INTERVAL_BITS, INTERVAL_FRACTION_BITS, RATE_UPDATE
from .requests import QP_INDEX_BITS, WORK_REQUEST, check_qp_count

__all__ = ["Pacer", "PacedGate", "PACED_BYTES", "WIRE_OVERHEAD", "QP_BITS"]

#: The bytes a packet takes on the wire besides its UDP payload: UDP 8, IPv4 20,
#: Ethernet 14, FCS 4, preamble and start delimiter 8, inter-frame gap 12.
WIRE_OVERHEAD = 8 + 20 + 14 + 4 + 8 + 12

#: One bit per possible QP index.
QP_BITS = 1 << QP_INDEX_BITS

#: A packet sent: its QP and wire bytes.
PACED_BYTES = data.StructLayout({"qp": QP_INDEX_BITS, "bytes": 14})

_TIME = 48 + INTERVAL_FRACTION_BITS     # clock cycles, fixed point (2^47 cycles: days)


class Pacer(wiring.Component):
    """Keeps, for each rate-limited QP, the time its next message may start.

    ``i_rate`` takes the reaction point's rate updates (a QP's pacing interval in
    cycles per byte, or that it is no longer limited); ``i_sent`` each packet a QP sent
    and its wire bytes. A limited QP's next start time moves on by bytes × interval from
    where it was, or from 1 µs (``cycles_per_us``) ago if that is later: a QP that
    waited longer than its debt may send a burst of 1 µs at most, and one let go late
    by the sweep below loses no time, so the long-run rate is exact. ``o_paced`` has a
    bit per QP index: the QP has a start time ahead. A packet sets it 3 cycles after
    ``i_sent`` (registered input, a registered multiply, a read-modify-write of the
    QP's time); a sweep of one QP a cycle clears it once the time has come (up to
    ``qps`` cycles late, the late start counted as above).
    """

    def __init__(self, *, qps):
        self._qps = check_qp_count(qps)
        super().__init__({
            "i_cycles_per_us": In(10),
            "i_rate": In(stream.Signature(RATE_UPDATE, always_ready=True)),
            "i_sent": In(stream.Signature(PACED_BYTES, always_ready=True)),
            "o_paced": Out(QP_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        qps = self._qps
        entries = 1 << max((qps - 1).bit_length(), 1)

        now = Signal(48)
        m.d.sync += now.eq(now + 1)
        now_fixed = Cat(C(0, INTERVAL_FRACTION_BITS), now)
        allowance = self.i_cycles_per_us << INTERVAL_FRACTION_BITS
        paced = Signal(entries)

        # Each QP's interval (cycles per byte), and whether it is limited.
        m.submodules.intervals = intervals = memory.Memory(
            shape=data.StructLayout({"limited": 1, "interval": INTERVAL_BITS}), depth=entries,
            init=[])
        interval_write = intervals.write_port()
        interval_read = intervals.read_port(domain="comb")
        rate = self.i_rate
        m.d.comb += [
            interval_write.addr.eq(rate.p.qp),
            interval_write.data.limited.eq(rate.p.limited),
            interval_write.data.interval.eq(rate.p.interval),
            interval_write.en.eq(rate.valid),
        ]

        # Packets: registered; their time at the QP's rate, registered; the QP's time.
        m.submodules.times = times = memory.Memory(shape=_TIME, depth=entries, init=[])
        time_write = times.write_port()
        time_read = times.read_port(domain="comb")
        sweep_read = times.read_port(transparent_for=(time_write,))
        sent = Signal(PACED_BYTES)
        sent_valid = Signal()
        m.d.sync += [sent.eq(self.i_sent.p), sent_valid.eq(self.i_sent.valid)]
        m.d.comb += interval_read.addr.eq(sent.qp)
        charged_qp = Signal(QP_INDEX_BITS)
        charge = Signal(14 + INTERVAL_BITS)
        charging = Signal()
        m.d.sync += [
            charged_qp.eq(sent.qp),
            charge.eq(sent.bytes * interval_read.data.interval),
            charging.eq(sent_valid & interval_read.data.limited),
        ]
        earliest = Signal(_TIME)
        last = time_read.data
        m.d.comb += [
            earliest.eq(Mux(now_fixed > allowance, now_fixed - allowance, 0)),
            time_read.addr.eq(charged_qp),
            time_write.addr.eq(charged_qp),
            time_write.data.eq(Mux(last > earliest, last, earliest) + charge),
            time_write.en.eq(charging),
        ]

        # The sweep lets a QP go once its time has come.
        swept = Signal(range(entries))
        m.d.sync += swept.eq(Mux(swept + 1 >= qps, 0, swept + 1))
        m.d.comb += sweep_read.addr.eq(swept)
        visited = Signal.like(swept)
        m.d.sync += visited.eq(swept)
        with m.If(sweep_read.data <= now_fixed):
            m.d.sync += paced.bit_select(visited, 1).eq(0)
        with m.If(rate.valid & ~rate.p.limited):
            m.d.sync += paced.bit_select(rate.p.qp, 1).eq(0)
        with m.If(charging):
            m.d.sync += paced.bit_select(charged_qp, 1).eq(1)
        m.d.comb += self.o_paced.eq(paced)
        return m


class PacedGate(wiring.Component):
    """Passes work requests, holding back one whose QP is paced (``i_paced``, a bit per
    QP index) until it is not. A request offered stays offered until taken (the stream
    rule), so a QP paced after its request was offered sends that one message more.
    Latency 0."""

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(WORK_REQUEST)),
            "o": Out(stream.Signature(WORK_REQUEST)),
            "i_paced": In(QP_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        offered = Signal()
        may = offered | ~self.i_paced.bit_select(self.i.p.qp, 1)
        m.d.comb += [
            self.o.valid.eq(self.i.valid & may),
            self.o.p.eq(self.i.p),
            self.i.ready.eq(self.o.ready & may),
        ]
        m.d.sync += offered.eq(self.o.valid & ~self.o.ready)
        return m
