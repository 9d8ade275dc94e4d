"""DCQCN convergence at a congested switch: 2, 4 and 16 QPs of the endpoint into a
bottleneck of half the line; ``make bench``.

Each QP always has 4 KiB WRITE packets to send; its rate is the DCQCN reference
model's (``sim/dcqcn.py``), the switch port is ``sim/switch.py`` and the loop
between them ``sim/dcqcn_loop.py`` (pure Python: no gateware here). Prints a table
per QP count: when the rates converged (every QP within 10 % of the mean, averaged
over windows long enough for 50 packets of each QP at its fair share, and stayed
there to the end), each QP's steady-state share of the bottleneck (the mean over
the last quarter of the run, as a fraction of the fair share), the utilisation of
the bottleneck, the deepest queue after convergence, drops and PFC pauses. Writes
``build/bench/dcqcn.png``: the rate of each QP and the queue depth over time.

The settings are :data:`SETTINGS` and :data:`RED` below: the DCQCN paper's
additive increase (40 Mb/s) and threshold F = 5 with a faster rate-increase timer
(15 us) and alpha period (4 us) than ConnectX's defaults, which on this
bottleneck do not settle within the run (their byte counter of 32 KiB drives the
rate back up between cuts); RED marks up to P_max 10 % between the paper's K_min
5 KB and K_max 200 KB.
"""

import argparse
import sys
from pathlib import Path

from sim.dcqcn import DcqcnSettings, ReactionPoint
from sim.dcqcn_loop import LoopResult, LoopSettings, convergence, run_loop
from sim.responder import CLOCK_HZ, round_trip_cycles
from sim.switch import MIN_TIME_BETWEEN_CNPS_US, PAUSE_QUANTUM_BITS, Red, SwitchSettings

LINE_BYTES_PER_CYCLE = 100e9 / 8 / CLOCK_HZ
FRAME = 14 + 20 + 8 + 12 + 4096 + 4          # Ethernet, IPv4, UDP, BTH, payload, ICRC
WIRE = FRAME + 24                             # FCS, preamble, inter-frame gap

SETTINGS = DcqcnSettings(rpg_time_reset=15, rpg_byte_reset=10_000_000, rpg_threshold=5,
                         rpg_ai_rate=40, rpg_hai_rate=400, dce_tcp_g=1020, dce_tcp_rtt=4)
RED = Red(k_min=5_000, k_max=200_000, p_max=0.1)
BOTTLENECK = LINE_BYTES_PER_CYCLE / 2
SWITCH = SwitchSettings(rate=BOTTLENECK, buffer=4_000_000, red=RED, xoff=1_000_000,
                        xon=900_000, quantum_cycles=PAUSE_QUANTUM_BITS / 8 / LINE_BYTES_PER_CYCLE)
QP_COUNTS = (2, 4, 16)
SAMPLE = 8000                                 # cycles of a rate sample, about 25 us
PACKETS_PER_WINDOW = 50


def loop_settings() -> LoopSettings:
    return LoopSettings(line_rate=LINE_BYTES_PER_CYCLE, frame=FRAME,
                        round_trip=round_trip_cycles(1),
                        cnp_gap=round_trip_cycles(MIN_TIME_BETWEEN_CNPS_US),
                        sample=SAMPLE, clock_hz=CLOCK_HZ)


def run(qps: int, cycles: int) -> LoopResult:
    points = [ReactionPoint(SETTINGS) for _ in range(qps)]
    return run_loop(points, SWITCH, loop_settings(), cycles)


def summary(qps: int, result: LoopResult) -> dict:
    """The table's row of a run (times in microseconds)."""
    window_cycles = PACKETS_PER_WINDOW * WIRE * qps / BOTTLENECK
    window = max(1, round(window_cycles / SAMPLE))
    converged, shares = convergence(result, window=window)
    fair = BOTTLENECK / qps
    after = [depth for time, depth in zip(result.times, result.depths, strict=True)
             if converged is not None and time > converged + window * SAMPLE]
    return {
        "qps": qps,
        "converged_us": None if converged is None else converged * 1e6 / CLOCK_HZ,
        "share_min": min(shares) / fair,
        "share_max": max(shares) / fair,
        "utilisation": sum(shares) / BOTTLENECK,
        "queue_after_kb": max(after) / 1000 if after else None,
        "max_queue_kb": result.max_depth / 1000,
        "dropped": result.dropped,
        "pauses": result.pauses,
    }


def print_table(rows: list[dict], milliseconds: float) -> None:
    print(f"DCQCN reference model x N QPs into a bottleneck of half the line "
          f"({milliseconds:g} ms each; RED K_min {RED.k_min // 1000} KB, K_max "
          f"{RED.k_max // 1000} KB, P_max {RED.p_max:g})")
    print("| QPs | source | converged after | steady-state share (of fair) | utilisation "
          "| queue after convergence | deepest queue | drops | PFC pauses |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        converged = "no" if row["converged_us"] is None else f"{row['converged_us']:,.0f} us"
        after = "-" if row["queue_after_kb"] is None else f"{row['queue_after_kb']:.0f} KB"
        print(f"| {row['qps']} | reference model | {converged} | "
              f"{row['share_min']:.3f}-{row['share_max']:.3f} | {row['utilisation']:.1%} | "
              f"{after} | {row['max_queue_kb']:.0f} KB | {row['dropped']} | {row['pauses']} |")


def plot(runs: list[tuple[int, LoopResult]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(len(runs), 1, figsize=(9, 3.2 * len(runs)), sharex=True)
    for axis, (qps, result) in zip(axes, runs, strict=True):
        times = [time * 1e3 / CLOCK_HZ for time in result.times]
        for qp, rates in enumerate(result.rates):
            axis.plot(times, [rate * 8 * CLOCK_HZ / 1e9 for rate in rates], lw=0.8,
                      label=f"QP {qp}" if qps <= 4 else None)
        axis.set_ylabel("rate (Gb/s)")
        axis.set_title(f"{qps} QPs into 50 Gb/s (reference model)")
        depth = axis.twinx()
        depth.plot(times, [value / 1000 for value in result.depths], color="black", lw=0.6,
                   alpha=0.5, label="queue")
        depth.axhline(RED.k_max / 1000, color="red", lw=0.6, ls="--", label="K_max")
        depth.set_ylabel("queue (KB)")
        if qps <= 4:
            axis.legend(loc="upper left", fontsize=7)
        depth.legend(loc="upper right", fontsize=7)
    axes[-1].set_xlabel("time (ms)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--milliseconds", type=float, default=30.0,
                        help="simulated time of each run (default 30)")
    parser.add_argument("--qps", type=int, nargs="*", default=list(QP_COUNTS))
    parser.add_argument("--plot", type=Path, default=Path("build/bench/dcqcn.png"))
    args = parser.parse_args()
    cycles = round(args.milliseconds * 1e-3 * CLOCK_HZ)
    runs = [(qps, run(qps, cycles)) for qps in args.qps]
    print_table([summary(qps, result) for qps, result in runs], args.milliseconds)
    plot(runs, args.plot)
    print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
