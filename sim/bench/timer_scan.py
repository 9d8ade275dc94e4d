"""How late the scans of many QPs find their QPs at each QP count: the ACK timers of the
reliability engine's timer sweep, and the CNPs of the DCQCN reaction point, each block
on its own in Amaranth's simulator. Prints two tables and writes them to
``docs/generated/bench/timer_scan.md``; ``make bench``.

The timer sweep runs with its QPs' state in a model read as the engine's memories are
(the address a cycle ahead), a tick a cycle, in two cases per QP count. *One at a
time*: timers of QPs at random start one after another, each at a random point of the
scan's pass; each is taken as it is offered, and its lateness is the cycles from its
time (its timeout counted from the tick it started) to its offer: the sweep takes the
start at its next check of the QP, and finds the timer run out at a check after its
deadline. *All at once*: as many timers run out at one tick (started while the tick
count stands still), each taken as it is offered; the last one's lateness is what the
scan costs when the timers come together (a link that went down).

The reaction point runs with ConnectX's defaults: CNPs for QPs at random, one at a
time, each at a random point of the scan's pass, and the cycles from each to its QP's
rate update (the first cut); the QP is then set again (back to the line rate), so the
next CNP finds no other QP limited."""

from __future__ import annotations

import argparse
import random
import statistics
import sys

from sim.bench import report
from sim.bench.report import Column, Table

#: The QP counts measured by default.
QP_COUNTS = (16, 1024, 4096)
#: Timers run out one at a time, and timers that run out at one tick.
SINGLES, TOGETHER = 64, 256
#: The core's clock, for the lateness in µs.
CORE_MHZ = 250
#: The ACK timeouts: 2^6 ticks one at a time, 2^10 at once.
TIMEOUT_SINGLE, TIMEOUT_TOGETHER = 6, 10
#: CNPs one at a time.
CNPS = 64


def measure(qps: int, seed: int = 1) -> dict:
    """Runs both cases on a sweep of ``qps`` QPs: its lanes and rows, and the lateness
    of each timer, in cycles."""
    from amaranth.sim import Simulator

    from gateware.roce.deadline_scan import check_lanes, scan_rows
    from gateware.roce.timer_sweep import TimerSweep

    rng = random.Random(seed)
    dut = TimerSweep(qps=qps)
    rows = scan_rows(qps)
    idle = {"una": 0, "nxt": 0, "timeout": 0, "timer_started": 0}
    state = {}                                  # QP → its state, where it is not idle
    result = {"qps": qps, "lanes": check_lanes(qps), "rows": rows}

    async def bench(ctx):
        now = 0
        address = 0

        def show():
            qp = state.get(address, idle)
            ctx.set(dut.i_now, now)
            ctx.set(dut.r_una.data, qp["una"])
            ctx.set(dut.r_nxt.data, qp["nxt"])
            ctx.set(dut.r_peer.data, {"timeout": qp["timeout"]})

        async def cycle(busy=None, *, tick=True):
            """A cycle: the handler starts ``busy``'s timer (a mark), or takes the verdict
            offered and stops that QP's timer; the sweep may take a start. The tick
            count steps unless ``tick`` is false (paused). Returns the QP taken."""
            nonlocal now, address
            show()
            taken = None
            if ctx.get(dut.o_expired.valid):
                taken = ctx.get(dut.o_expired.p.qp)
                ctx.set(dut.o_expired.ready, 1)
                busy = (taken, {"una": 1, "nxt": 1})
            if busy is not None:
                ctx.set(dut.i_busy.valid, 1)
                ctx.set(dut.i_busy.p, busy[0])
                if busy[1].get("timer_started"):
                    ctx.set(dut.i_timer_restart.valid, 1)
                    ctx.set(dut.i_timer_restart.p, busy[0])
            started = ctx.get(dut.o_timer_taken.p) if ctx.get(dut.o_timer_taken.valid) \
                else None
            address = ctx.get(dut.r_una.addr)
            await ctx.tick()
            ctx.set(dut.i_busy.valid, 0)
            ctx.set(dut.i_timer_restart.valid, 0)
            ctx.set(dut.o_expired.ready, 0)
            if started is not None:
                state[started] = {**state[started], "timer_started": 0}
            if busy is not None:
                state[busy[0]] = {**state.get(busy[0], idle), **busy[1]}
            now += tick
            return taken

        async def run_out(qps_started, timeout, *, together=False):
            """Starts each QP's timer with ``timeout`` (one QP a cycle, as the handler
            would), then runs until every one was offered: their lateness, from the
            tick of each start. ``together``: the tick count stands still while the
            timers start and the sweep takes the starts (a pause), so that all run out
            at one tick."""
            due = {}
            for qp in qps_started:
                due[qp] = now + (1 << timeout)
                await cycle((qp, {"una": 0, "nxt": 1, "timeout": timeout,
                                  "timer_started": 1}), tick=not together)
            while together and any(state[qp]["timer_started"] for qp in qps_started):
                await cycle(tick=False)
            late = {}
            while len(late) < len(due):
                taken = await cycle()
                if taken is not None:
                    assert taken in due and now - 1 >= due[taken], (taken, now)
                    late[taken] = now - 1 - due[taken]
                assert now < max(due.values()) + 4 * (rows + qps) + 100, "not offered"
            return list(late.values())

        singles = []
        for qp in rng.sample(range(qps), min(SINGLES, qps)):
            for _ in range(rng.randrange(rows + 8)):        # the scan anywhere at its start
                await cycle()
            singles += await run_out([qp], TIMEOUT_SINGLE)
        result["single_mean"] = statistics.mean(singles)
        result["single_worst"] = max(singles)
        together = rng.sample(range(qps), min(TOGETHER, qps))
        result["together"] = len(together)
        result["together_last"] = max(await run_out(together, TIMEOUT_TOGETHER,
                                                    together=True))
        for key in ("single_worst", "together_last"):
            result[f"{key}_us"] = result[key] / CORE_MHZ

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    return result


def cut_visit() -> int:
    """Cycles of the reaction point's visit that makes a QP's first cut, from its
    candidate taken to the rate update: taken, state read, the decision, α, cut check, the
    product, its shift, the cut, the divider's start and its steps (a bit of the dividend
    each)."""
    from gateware.roce.dcqcn import INTERVAL_FRACTION_BITS, RATE_FRACTION_BITS

    return 9 + 10 + 3 + INTERVAL_FRACTION_BITS + RATE_FRACTION_BITS


def measure_cnps(qps: int, seed: int = 1) -> dict:
    """CNPs one at a time on a reaction point of ``qps`` QPs: its scan's rows, the cycles
    from each CNP to its rate update, the bound (a pass of the rows, 2 cycles to the
    offer, the visit), and a sweep of one QP a visit's worst (3 cycles a QP at the line
    rate, and the visit)."""
    from amaranth.sim import Simulator

    from gateware.roce.dcqcn import DCQCN_CONFIG, DCQCN_DEFAULTS, DcqcnReactionPoint
    from gateware.roce.deadline_scan import scan_rows

    rng = random.Random(seed)
    dut = DcqcnReactionPoint(qps=qps)
    rows = scan_rows(qps)
    bound = rows + 2 + cut_visit()
    result = {"qps": qps, "rows": rows, "cnps": min(CNPS, qps), "bound": bound,
              "sweep_worst": 3 * qps + cut_visit()}
    latency = []

    async def bench(ctx):
        ctx.set(dut.i_config, DCQCN_CONFIG.const(DCQCN_DEFAULTS(CORE_MHZ * 1e6)))
        for qp in rng.sample(range(qps), result["cnps"]):
            for _ in range(rng.randrange(rows + 8)):        # the scan anywhere in its pass
                await ctx.tick()
            for port in (dut.i_cnp, dut.i_reset):
                ctx.set(port.valid, 1)
                ctx.set(port.p, qp)
                await ctx.tick()
                ctx.set(port.valid, 0)
                cycles = 1
                while not ctx.get(dut.o_rate.valid):
                    await ctx.tick()
                    cycles += 1
                    assert cycles < 2 * result["sweep_worst"], "no rate update"
                update = ctx.get(dut.o_rate.p)
                assert update.qp == qp and update.limited == (port is dut.i_cnp)
                if port is dut.i_cnp:
                    latency.append(cycles)
                for _ in range(rows + 16):      # its hint written; offered again at most once
                    await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    result["mean"] = statistics.mean(latency)
    result["worst"] = max(latency)
    for key in ("worst", "sweep_worst"):
        result[f"{key}_us"] = result[key] / CORE_MHZ
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.bench.timer_scan",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("qps", type=int, nargs="*", default=list(QP_COUNTS),
                        help="QP counts (default: %(default)s)")
    args = parser.parse_args(argv)
    origin = report.provenance()
    table = Table("timer_scan", [
        Column("qps", "QPs"), Column("lanes", "QPs a row"), Column("rows", "rows"),
        Column("single_mean", "one at a time: mean cycles late", ".1f"),
        Column("single_worst", "worst", "d"),
        Column("single_worst_us", f"worst µs at {CORE_MHZ} MHz", ".2f"),
        Column("together", "at once"),
        Column("together_last", "the last, cycles late", "d"),
        Column("together_last_us", "µs", ".2f")],
        caption=f"Timers found by the timer sweep: {SINGLES} timers of QPs at random run "
                f"out one at a time, then up to {TOGETHER} at one tick, each taken as "
                f"it is offered; cycles from each timer's time (its timeout after the "
                f"tick it started) to its offer:",
        note="A sweep of one QP a cycle instead of the scan would be up to the QP count "
             "and 3 cycles late: 4,099 cycles (16.4 µs) at 4,096 QPs. The "
             "shortest ACK timeout IBTA allows is 8.2 µs.")
    cnps = Table("cnp_scan", [
        Column("qps", "QPs"), Column("rows", "rows"), Column("cnps", "CNPs"),
        Column("mean", "mean cycles to the rate update", ".1f"),
        Column("worst", "worst", "d"),
        Column("worst_us", f"worst µs at {CORE_MHZ} MHz", ".2f"),
        Column("bound", "bound: rows + 2 + the visit", "d"),
        Column("sweep_worst", "a sweep of one QP a visit: worst cycles", "d"),
        Column("sweep_worst_us", "µs", ".2f")],
        caption=f"CNPs acted on by the DCQCN reaction point: up to {CNPS} CNPs for QPs at "
                f"random, one at a time, each at a random point of the scan's pass, with "
                f"ConnectX's defaults; cycles from each CNP to its QP's rate update (the "
                f"first cut, whose visit takes {cut_visit()} cycles with the divider):",
        note="The sweep's column is computed, not simulated: a sweep that visits every QP "
             "in turn, 3 cycles a QP at the line rate, reaches a QP up to a whole pass "
             "after its CNP, and then makes the same visit. With other QPs limited or "
             "marked, each of their visits on the way adds to the scan's figure.")
    print(table.header())
    for qps in args.qps:
        print(table.add(measure(qps)), flush=True)
    print()
    print(cnps.header())
    for qps in args.qps:
        print(cnps.add(measure_cnps(qps)), flush=True)
    report.write("timer_scan", [table, cnps], origin=origin)
    worst = max(table.rows, key=lambda row: row["qps"])
    return 0 if (worst["single_worst"] <= 2 * worst["rows"] + 8
                 and all(row["worst"] <= row["bound"] for row in cnps.rows)) else 1


if __name__ == "__main__":
    sys.exit(main())
