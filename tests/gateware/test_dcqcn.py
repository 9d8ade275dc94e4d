"""The DCQCN reaction point and the pacer against the reference model (sim.models.dcqcn):
CNPs, timer and byte-counter events on one QP of several, the rate compared within 1 %
at sample times; the pacing interval against 8·cycles_per_us/rate. At many QPs, the
reaction point's scan: each event acted on within a pass, idle QPs left alone, a CNP
that comes during its QP's visit kept."""

import dataclasses
import random

import pytest

from gateware.roce import dcqcn
from gateware.roce.dcqcn import (
    DCQCN_CONFIG,
    DCQCN_DEFAULTS,
    INTERVAL_FRACTION_BITS,
    RATE_FRACTION_BITS,
    DcqcnReactionPoint,
    rate_interval,
)
from gateware.roce.deadline_scan import DeadlineScan, scan_rows
from gateware.roce.pacer import PacedGate, Pacer
from sim.models.dcqcn import DcqcnSettings, ReactionPoint

from .streams import run_testbenches, wait_for

#: The simulation's µs: few cycles, so the timers run in few cycles.
CYCLES_PER_US = 64
QPS = 4

#: Cycles of the reaction point's visits, from the cycle its candidate is taken to the
#: rate update: taken, state read, the decision, α, cut check, then for a first cut the
#: product, its shift and the cut, for a byte event the increase check, the increase, Rt
#: raised and the average; then the divider's start and its steps (a bit of the dividend
#: each); the update leaves in the last cycle. A reset: taken, read, decided, written.
DIVIDER = 10 + 3 + INTERVAL_FRACTION_BITS + RATE_FRACTION_BITS
FIRST_CUT_VISIT = 9 + DIVIDER
BYTE_VISIT = 10 + DIVIDER
RESET_VISIT = 3
#: From a mark to its QP's candidate taken, with nothing else waiting: the scan reads the
#: QP's row within a pass (the row read in the mark's cycle misses it), registers the
#: row's candidates, offers one. A byte event is marked 2 cycles
#: after its packet comes (the input registered, then the mark).
OFFER = 2
BYTE_MARK = 2


def config(settings, *, enable=1):
    """The gateware's settings from the model's."""
    fields = {field.name: getattr(settings, field.name)
              for field in dataclasses.fields(settings) if field.name != "rpg_min_dec_fac"}
    return DCQCN_CONFIG.const({**fields, "enable": enable, "cycles_per_us": CYCLES_PER_US})


def test_defaults_are_the_models():
    model = DcqcnSettings()
    gateware = DCQCN_DEFAULTS(322_265_625)
    for field in dataclasses.fields(model):
        if field.name != "rpg_min_dec_fac":
            assert gateware[field.name] == getattr(model, field.name), field.name


def simulate(settings, *, microseconds, cnps, packets, qp=1, other=2):
    """Run the reaction point with CNPs for ``qp`` at the µs in ``cnps`` (and some
    for ``other`` in between), and ``packets`` = (every n cycles, bytes) sent on
    ``qp``; returns the model's and the gateware's rate of ``qp`` at each µs, and the
    gateware's rate updates."""
    dut = DcqcnReactionPoint(qps=QPS)
    model = ReactionPoint(settings)
    every, length = packets
    cnp_cycles = {round(time * CYCLES_PER_US) for time in cnps}
    samples = []
    updates = []

    async def main(ctx):
        ctx.set(dut.i_config, config(settings))
        rate = settings.max_rate
        for cycle in range(microseconds * CYCLES_PER_US):
            now = cycle / CYCLES_PER_US
            model.advance(now)
            cnp = cycle in cnp_cycles
            ctx.set(dut.i_cnp.valid, cnp or cycle % 997 == 5)
            ctx.set(dut.i_cnp.p, qp if cnp else other)
            if cnp:
                model.cnp(now)
            send = every and cycle % every == 3
            ctx.set(dut.i_bytes.valid, send)
            ctx.set(dut.i_bytes.p, {"qp": qp, "bytes": length})
            if send:
                model.sent(length)
            if ctx.get(dut.o_rate.valid):
                update = ctx.get(dut.o_rate.p)
                updates.append(update)
                if update.qp == qp:
                    rate = update.rate / (1 << RATE_FRACTION_BITS) if update.limited \
                        else settings.max_rate
            if cycle % CYCLES_PER_US == CYCLES_PER_US // 2:
                samples.append((now, model.rate, rate))
            await ctx.tick()

    run_testbenches(dut, main)
    return samples, updates


def assert_follows(samples, tolerance=0.01, settle_us=2):
    """The gateware's rate within ``tolerance`` of the model's at every sample, but for
    those within ``settle_us`` of a change of the model's rate (the sweep's delay)."""
    changes = [now for (now, rate), (_, before) in zip(
        [(s[0], s[1]) for s in samples[1:]], [(s[0], s[1]) for s in samples], strict=False)
        if rate != before]
    checked = 0
    for now, expected, got in samples:
        if any(0 <= now - change < settle_us for change in changes):
            continue
        assert got == pytest.approx(expected, rel=tolerance), f"at {now} µs"
        checked += 1
    assert checked > len(samples) // 2


def test_cuts_and_timer_recovery_follow_the_model():
    """CNPs every 20 µs for 100 µs, then recovery by the timer alone (fast recovery for 5
    stages, additive, hyper) with the timers scaled down (30 µs)."""
    settings = DcqcnSettings(rpg_time_reset=30, rpg_byte_reset=0, rpg_threshold=5,
                             rpg_ai_rate=500, rpg_hai_rate=5000)
    samples, _ = simulate(settings, microseconds=420, cnps=[10.25 + 20 * n for n in range(5)],
                          packets=(0, 0))
    assert min(rate for _, rate, _ in samples) < 20_000          # it was cut hard
    assert_follows(samples)


def test_monitor_period_and_byte_counter_follow_the_model():
    """CNPs every 2 µs (inside the 4 µs monitor period), bytes counted at 32 Gb/s so the
    byte counter raises the rate between the timer's events."""
    settings = DcqcnSettings(rpg_time_reset=40, rpg_byte_reset=32767)
    samples, _ = simulate(settings, microseconds=200, cnps=[10.25 + 2 * n for n in range(25)],
                          packets=(16, 1000))
    assert_follows(samples)


def test_a_raise_stops_at_the_maximum_rate():
    """One CNP at the line rate, then additive increases of a fifth of the line: Rt,
    still at the maximum after the cut, would pass it at each increase (and the rate,
    Rt's mean with the rate, come back faster) but for the clamp."""
    settings = DcqcnSettings(rpg_time_reset=8, rpg_byte_reset=0, rpg_threshold=0,
                             rpg_ai_rate=20_000)
    samples, _ = simulate(settings, microseconds=60, cnps=[5.25], packets=(0, 0))
    assert 0 < min(rate for _, rate, _ in samples) <= 60_000     # cut, then raised
    assert_follows(samples)


def test_minimum_rate_and_first_cnp_rate():
    settings = DcqcnSettings(rpg_min_rate=2000, rate_to_set_on_first_cnp=40_000,
                             rpg_time_reset=1000, rpg_byte_reset=0)
    samples, updates = simulate(settings, microseconds=120, cnps=[5.25 + 4 * n for n in range(26)],
                                packets=(0, 0))
    assert_follows(samples)
    assert samples[-1][2] == 2000
    for update in updates:
        if update.limited:
            assert update.interval == rate_interval(update.rate, CYCLES_PER_US)


def test_disabled_limits_nothing():
    dut = DcqcnReactionPoint(qps=QPS)

    async def main(ctx):
        ctx.set(dut.i_config, config(DcqcnSettings(), enable=0))
        for cycle in range(2000):
            ctx.set(dut.i_cnp.valid, cycle % 50 == 0)
            ctx.set(dut.i_cnp.p, cycle % QPS)
            assert not (ctx.get(dut.o_rate.valid) and ctx.get(dut.o_rate.p.limited))
            await ctx.tick()

    run_testbenches(dut, main)


@pytest.fixture
def scans(monkeypatch):
    """The :class:`DeadlineScan` of each reaction point built in the test, to watch which
    QPs it offers (a visit starts in the cycle its candidate is taken)."""
    made = []

    class Watched(DeadlineScan):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            made.append(self)

    monkeypatch.setattr(dcqcn, "DeadlineScan", Watched)
    return made


def taken(ctx, scan):
    """The QP whose candidate the scan hands over this cycle, or None."""
    candidate = scan.o_candidate
    if ctx.get(candidate.valid) and ctx.get(candidate.ready):
        return ctx.get(candidate.p)
    return None


@pytest.mark.parametrize(("qps", "trials"), [(1024, 12), (4096, 6)])
def test_each_event_is_acted_on_within_a_pass_of_the_scan(qps, trials):
    """QPs at random, each at a random point of the scan's pass: a CNP (the first cut), a
    packet that fills the byte counter (a rate increase), a reset (back to the line
    rate). The α period and the timer are long, so only the events' marks bring the QP's
    visit. Each rate update comes within a pass of the scan's rows, the offer and the
    visit; a sweep of every QP in turn took 3 cycles a QP with nothing to do."""
    settings = DcqcnSettings(dce_tcp_rtt=1000, rpg_time_reset=1000, rpg_byte_reset=1000)
    dut = DcqcnReactionPoint(qps=qps)
    rows = scan_rows(qps)
    bounds = {"cnp": rows + OFFER + FIRST_CUT_VISIT,
              "bytes": BYTE_MARK + rows + OFFER + BYTE_VISIT,
              "reset": rows + OFFER + RESET_VISIT}
    sweep = 3 * qps                     # the sweep: up to a pass of 3 cycles a QP
    rng = random.Random(qps)
    latency = {event: [] for event in bounds}

    async def main(ctx):
        ctx.set(dut.i_config, config(settings))

        async def act(event, qp):
            """The event for ``qp`` in one cycle; the cycles to its rate update."""
            for _ in range(rng.randrange(rows + 8)):        # anywhere in the scan's pass
                await ctx.tick()
            port = {"cnp": dut.i_cnp, "bytes": dut.i_bytes, "reset": dut.i_reset}[event]
            ctx.set(port.valid, 1)
            ctx.set(port.p, {"qp": qp, "bytes": 1000} if event == "bytes" else qp)
            await ctx.tick()
            ctx.set(port.valid, 0)
            for cycles in range(1, bounds[event] + 1):
                if ctx.get(dut.o_rate.valid):
                    update = ctx.get(dut.o_rate.p)
                    assert update.qp == qp and update.limited == (event != "reset")
                    latency[event].append(cycles)
                    await ctx.tick()
                    return
                await ctx.tick()
            raise AssertionError(f"no rate update for QP {qp} within {bounds[event]} cycles "
                                 f"of a {event}")

        for qp in rng.sample(range(qps), trials):
            for event in ("cnp", "bytes", "reset"):
                await act(event, qp)

    run_testbenches(dut, main)
    print(f"{qps} QPs: cycles to the rate update, worst (bound): "
          + ", ".join(f"{event} {max(cycles)} ({bounds[event]})"
                      for event, cycles in latency.items())
          + f"; a sweep of the QPs in turn: up to {sweep} and the visit")
    for event in bounds:
        assert bounds[event] < sweep / 10
    assert max(latency["cnp"]) - min(latency["cnp"]) > rows // 2     # the scan was anywhere


def test_a_qp_at_the_line_rate_is_not_visited(scans):
    """Two QPs cut: one reset at once, one back at the line rate by its timer (fast
    recovery, 2 µs a step). While limited it is visited in every α period (1 µs), not in
    every pass of the scan; once both are at the line rate no QP is visited again."""
    settings = DcqcnSettings(rpg_time_reset=2, rpg_byte_reset=0)
    qps = 256
    rows = scan_rows(qps)
    dut = DcqcnReactionPoint(qps=qps)
    visits = {}

    async def main(ctx):
        scan, = scans
        ctx.set(dut.i_config, config(settings))
        cycle = 0
        limited = {}

        async def tick():
            nonlocal cycle
            qp = taken(ctx, scan)
            if qp is not None:
                visits.setdefault(qp, []).append(cycle)
            if ctx.get(dut.o_rate.valid):
                update = ctx.get(dut.o_rate.p)
                limited[update.qp] = update.limited
            await ctx.tick()
            cycle += 1

        for qp in (100, 200):
            ctx.set(dut.i_cnp.valid, 1)
            ctx.set(dut.i_cnp.p, qp)
            await tick()
            ctx.set(dut.i_cnp.valid, 0)
            cut = cycle + rows + OFFER + FIRST_CUT_VISIT
            while not limited.get(qp):
                await tick()
                assert cycle <= cut, f"QP {qp} not cut"
        ctx.set(dut.i_reset.valid, 1)
        ctx.set(dut.i_reset.p, 100)
        await tick()
        ctx.set(dut.i_reset.valid, 0)
        start = cycle
        while limited[100] or limited[200]:
            await tick()
            assert cycle < start + 200 * CYCLES_PER_US, "not back at the line rate"
        recovered = cycle
        # While limited, QP 200 was visited in every α period (its hint at the end of the
        # period: found within a pass, and perhaps after a visit under way), and at most
        # three times a period (a visit longer than a pass may be offered once more).
        seen = [at for at in visits[200] if start <= at < recovered]
        gaps = [later - earlier for earlier, later in zip(seen, seen[1:], strict=False)]
        assert max(gaps) <= CYCLES_PER_US + rows + OFFER + FIRST_CUT_VISIT, gaps
        assert len(seen) <= 3 * (recovered - start) / CYCLES_PER_US
        # Then no visit in 50 passes of the scan, once the last hint is written.
        await ctx.tick().repeat(10)
        before = {qp: len(cycles) for qp, cycles in visits.items()}
        for _ in range(50 * rows):
            await tick()
        assert {qp: len(cycles) for qp, cycles in visits.items()} == before

    run_testbenches(dut, main)


@pytest.mark.parametrize("lead", range(16))
def test_a_cnp_during_its_qps_visit_is_kept(scans, lead):
    """A limited QP visited at the end of its α period (2 µs; nothing else to do: the
    monitor period since its cut is over), and a CNP for it ``lead`` cycles after the
    visit starts: in the visit's first cycle the visit takes it; from its second, where
    it reads the QP's events, to the write of its hint, 4 cycles after its last, the CNP
    is marked while the visit goes on. It is cut once the scan finds it after the
    visit, not at its next α period."""
    settings = DcqcnSettings(dce_tcp_rtt=2, rate_reduce_monitor_period=2, rpg_time_reset=1000,
                             rpg_byte_reset=0)
    qps = 1024
    rows = scan_rows(qps)
    qp = 37 * lead + 5
    dut = DcqcnReactionPoint(qps=qps)

    async def main(ctx):
        scan, = scans
        ctx.set(dut.i_config, config(settings))
        ctx.set(dut.i_cnp.valid, 1)
        ctx.set(dut.i_cnp.p, qp)
        await ctx.tick()
        ctx.set(dut.i_cnp.valid, 0)
        await wait_for(ctx, lambda: ctx.get(dut.o_rate.valid), rows + OFFER + FIRST_CUT_VISIT)
        first = ctx.get(dut.o_rate.p)
        assert first.qp == qp and first.limited
        # Its α visit, at least a µs after the cut (whose rate update is 42 cycles
        # after it); not the visit offered again as the cut's ended.
        for cycles in range(3 * CYCLES_PER_US):
            await ctx.tick()
            assert not ctx.get(dut.o_rate.valid)
            if taken(ctx, scan) == qp and cycles >= CYCLES_PER_US - FIRST_CUT_VISIT:
                break
        else:
            raise AssertionError("QP not visited at the end of its α period")
        for _ in range(lead):
            await ctx.tick()
        ctx.set(dut.i_cnp.valid, 1)
        ctx.set(dut.i_cnp.p, qp)
        await ctx.tick()
        ctx.set(dut.i_cnp.valid, 0)
        cycles = 1
        while not ctx.get(dut.o_rate.valid):
            await ctx.tick()
            cycles += 1
            assert cycles <= rows + OFFER + FIRST_CUT_VISIT, "the CNP was lost"
        cut = ctx.get(dut.o_rate.p)
        assert cut.qp == qp and cut.limited and cut.rate < first.rate

    run_testbenches(dut, main)


def test_a_byte_event_behind_a_timer_event_is_not_left_waiting(scans):
    """A QP cut, and a packet that fills its byte counter just before its rate-increase
    timer runs out: one visit finds both, makes the timer's event and leaves the byte
    counter's waiting; its hint is due at once, so the next pass makes that event too,
    not the timer's next period. At 4,096 QPs a pass is longer than a visit: the QP is
    not offered again for the visit's own mark."""
    period = 4
    settings = DcqcnSettings(dce_tcp_rtt=1000, rpg_time_reset=period, rpg_byte_reset=1000)
    qps = 4096
    rows = scan_rows(qps)
    qp = 1234
    dut = DcqcnReactionPoint(qps=qps)

    async def main(ctx):
        scan, = scans
        ctx.set(dut.i_config, config(settings))
        cycle = 0
        updates = []

        async def tick():
            nonlocal cycle
            if ctx.get(dut.o_rate.valid):
                updates.append((cycle, ctx.get(dut.o_rate.p)))
            await ctx.tick()
            cycle += 1

        ctx.set(dut.i_cnp.valid, 1)
        ctx.set(dut.i_cnp.p, qp)
        await tick()
        ctx.set(dut.i_cnp.valid, 0)
        while taken(ctx, scan) != qp:
            await tick()
            assert cycle <= rows + OFFER
        # The cut's µs (its check is 3 cycles into the visit; a µs is a count of cycles
        # from 0): the timer runs out `period` µs later.
        runs_out = ((cycle + 3) // CYCLES_PER_US + period) * CYCLES_PER_US
        while cycle < runs_out - BYTE_MARK - 1:
            await tick()
        ctx.set(dut.i_bytes.valid, 1)
        ctx.set(dut.i_bytes.p, {"qp": qp, "bytes": 1000})
        await tick()
        ctx.set(dut.i_bytes.valid, 0)
        while len(updates) < 3 and cycle < runs_out + 2 * period * CYCLES_PER_US:
            await tick()
        (_, cut), (timer, _), (byte, _) = updates[:3]
        assert cut.limited and timer >= runs_out
        assert byte - timer <= 4 + rows + OFFER + BYTE_VISIT, (timer, byte)

    run_testbenches(dut, main)


def test_back_to_back_packets_count_every_byte():
    """A QP cut, then pairs of 500-byte packets on consecutive cycles (the second read
    while the first is written), a pair every 200 cycles: with a byte counter of 1000
    bytes, each pair makes one rate increase, the first pair after the cut too (which
    starts the count again)."""
    settings = DcqcnSettings(dce_tcp_rtt=1000, rpg_time_reset=1000, rpg_byte_reset=1000)
    dut = DcqcnReactionPoint(qps=QPS)
    pairs = 4

    async def main(ctx):
        ctx.set(dut.i_config, config(settings))
        ctx.set(dut.i_cnp.valid, 1)
        ctx.set(dut.i_cnp.p, 1)
        await ctx.tick()
        ctx.set(dut.i_cnp.valid, 0)
        await wait_for(ctx, lambda: ctx.get(dut.o_rate.valid), 200)
        await ctx.tick()
        increases = 0
        for _ in range(pairs):
            for cycle in range(200):
                ctx.set(dut.i_bytes.valid, cycle < 2)
                ctx.set(dut.i_bytes.p, {"qp": 1, "bytes": 500})
                if ctx.get(dut.o_rate.valid):
                    assert ctx.get(dut.o_rate.p.qp) == 1
                    increases += 1
                await ctx.tick()
        assert increases == pairs

    run_testbenches(dut, main)

def test_pacer_spaces_a_limited_qps_messages_at_its_rate():
    """A QP limited to 10 Gb/s (at 64 cycles per µs: 0.0512 cycles a bit): each
    message may start once its predecessors' wire bytes had their time; QP 0, not
    limited, is never paced; a QP back at the line rate is let go at once."""
    dut = Pacer(qps=QPS, readers=2)
    rate = 10_000 << RATE_FRACTION_BITS
    interval = rate_interval(rate, CYCLES_PER_US)

    async def main(ctx):
        for qp, reader in enumerate(dut.paced):         # QP 0's bit, QP 1's bit
            ctx.set(reader.addr, qp)
        ctx.set(dut.i_cycles_per_us, CYCLES_PER_US)
        ctx.set(dut.i_rate.valid, 1)
        ctx.set(dut.i_rate.p, {"qp": 1, "limited": 1, "rate": rate, "interval": interval})
        await ctx.tick()
        ctx.set(dut.i_rate.valid, 0)
        starts = []
        for cycle in range(6000):
            assert not ctx.get(dut.paced[0].data)
            # QP 1 sends a 1000-byte packet whenever it may; QP 0 every cycle.
            send = not ctx.get(dut.paced[1].data) and (not starts or cycle - starts[-1] > 4)
            if send:
                starts.append(cycle)
            ctx.set(dut.i_sent.valid, 1)
            ctx.set(dut.i_sent.p, {"qp": 1 if send else 0, "bytes": 1000})
            await ctx.tick()
        ctx.set(dut.i_sent.valid, 0)
        # 1000 bytes at 10 Gb/s: 0.8 µs = 51.2 cycles.
        spacing = (starts[-1] - starts[1]) / (len(starts) - 2)
        assert spacing == pytest.approx(51.2, rel=0.01)
        ctx.set(dut.i_rate.valid, 1)
        ctx.set(dut.i_rate.p, {"qp": 1, "limited": 0})
        await ctx.tick()
        ctx.set(dut.i_rate.valid, 0)
        await ctx.tick().repeat(2)
        assert not ctx.get(dut.paced[1].data)

    run_testbenches(dut, main)


def test_pacer_waits_for_the_last_packet_at_the_rate_of_now():
    """A packet sent at 10 Mb/s (0.8 ms for 1000 bytes: 51,200 cycles) and the rate
    then raised to 10 Gb/s: the QP is let go once the packet had its time at 10 Gb/s
    (51.2 cycles from its turn, 1 µs ago at most), as DCQCN's pacing counts it
    (sim/models/dcqcn_loop.py); a QP cut from 1 Gb/s to 500 Mb/s after a packet waits for
    the packet's time at 500 Mb/s. The bits are looked up as a gate does (a cycle
    late)."""
    dut = Pacer(qps=QPS, readers=2)

    def update(ctx, qp, megabits):
        rate = megabits << RATE_FRACTION_BITS
        ctx.set(dut.i_rate.p, {"qp": qp, "limited": 1, "rate": rate,
                               "interval": rate_interval(rate, CYCLES_PER_US)})

    def paced(ctx, qp):
        return ctx.get(dut.paced[qp - 2].data)

    async def main(ctx):
        for qp, reader in zip((2, 3), dut.paced, strict=True):
            ctx.set(reader.addr, qp)
        ctx.set(dut.i_cycles_per_us, CYCLES_PER_US)
        ctx.set(dut.i_rate.valid, 1)
        for _ in range(200):                    # past the first µs's allowance
            update(ctx, 2, 10)
            await ctx.tick()
        update(ctx, 3, 1_000)
        await ctx.tick()
        ctx.set(dut.i_rate.valid, 0)
        for qp in (2, 3):                       # a packet each, on consecutive cycles
            ctx.set(dut.i_sent.valid, 1)
            ctx.set(dut.i_sent.p, {"qp": qp, "bytes": 1000})
            await ctx.tick()
        ctx.set(dut.i_sent.valid, 0)
        await ctx.tick().repeat(40)             # each checked at its first rate
        assert paced(ctx, 2) and paced(ctx, 3)
        ctx.set(dut.i_rate.valid, 1)
        update(ctx, 2, 10_000)
        await ctx.tick()
        update(ctx, 3, 500)
        await ctx.tick()
        ctx.set(dut.i_rate.valid, 0)
        since_packet = 43                       # cycles since QP 3's packet
        released = {}
        while len(released) < 2 and since_packet < 100_000:
            for qp in (2, 3):
                if qp not in released and not paced(ctx, qp):
                    released[qp] = since_packet
            await ctx.tick()
            since_packet += 1
        # Both turns were 1 µs (64 cycles) before the packets. QP 2: 51.2 cycles at
        # 10 Gb/s are over: let go once the rate update's mark is checked (a pass of the
        # scan's rows, and 6 cycles). QP 3: 16 µs (1024 cycles) at 500 Mb/s, 960 after
        # its packet (at 1 Gb/s it would be 448), let go once its hint has come (as
        # late). Each seen a cycle later through the lookup.
        late = scan_rows(QPS) + 6 + 1
        assert released[2] <= 43 + late, released
        assert 960 <= released[3] <= 960 + late, released

    run_testbenches(dut, main)


def test_gate_holds_a_paced_qps_request_and_keeps_an_offered_one():
    """The QP's bit counts from the cycle after it changes (a register); a request of a
    new QP waits a cycle for its bit to be looked up."""
    dut = PacedGate()
    paced = set()

    async def tick(ctx):
        """A cycle, the lookup answered at its end, as the pacer's registered read."""
        looked_up = ctx.get(dut.r_paced.addr)
        await ctx.tick()
        ctx.set(dut.r_paced.data, looked_up in paced)

    async def main(ctx):
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.i.p.qp, 3)
        paced.add(3)
        ctx.set(dut.o.ready, 1)
        for _ in range(3):
            assert not ctx.get(dut.o.valid) and not ctx.get(dut.i.ready)
            await tick(ctx)
        paced.clear()
        ctx.set(dut.o.ready, 0)
        assert not ctx.get(dut.o.valid)              # the bit of the cycle before
        await tick(ctx)
        assert ctx.get(dut.o.valid)
        await tick(ctx)
        paced.add(3)                                 # paced once offered: stays offered
        assert ctx.get(dut.o.valid)
        ctx.set(dut.o.ready, 1)
        assert ctx.get(dut.i.ready)
        await tick(ctx)
        assert not ctx.get(dut.o.valid)
        ctx.set(dut.i.p.qp, 4)                       # not paced, but not looked up yet
        assert not ctx.get(dut.o.valid)
        await tick(ctx)
        assert ctx.get(dut.o.valid) and ctx.get(dut.i.ready)
        await tick(ctx)
        assert ctx.get(dut.o.valid)                  # the same QP: no cycle lost

    run_testbenches(dut, main)
