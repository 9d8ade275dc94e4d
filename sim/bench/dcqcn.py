"""DCQCN convergence at a congested switch: 2, 4 and 16 QPs of the endpoint into a
bottleneck of half the line; ``make bench``.

Each QP always has 4 KiB WRITE packets to send; its rate is the DCQCN reference
model's (``sim/models/dcqcn.py``), the switch port is ``sim/models/switch.py`` and the loop
between them ``sim/models/dcqcn_loop.py`` (pure Python: no gateware here). Prints a table
per QP count: when the rates converged (every QP within 10 % of the mean, averaged
over windows long enough for 50 packets of each QP at its fair share, and stayed
there to the end), each QP's steady-state share of the bottleneck (the mean over
the last quarter of the run, as a fraction of the fair share), the utilisation of
the bottleneck, the deepest queue after convergence, drops and PFC pauses. Writes
``build/bench/dcqcn.png``: the rate of each QP and the queue depth over time; and the
table with that plot to ``docs/generated/bench/dcqcn.{md,json,svg}``.

The settings are :data:`SETTINGS` and :data:`RED` below: the DCQCN paper's
additive increase (40 Mb/s) and threshold F = 5 with a faster rate-increase timer
(15 us) and alpha period (4 us) than ConnectX's defaults, which on this
bottleneck do not settle within the run (their byte counter of 32 KiB drives the
rate back up between cuts); RED marks up to P_max 10 % between the paper's K_min
5 KB and K_max 200 KB.
"""

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from sim.bench import report
from sim.bench.report import Column, Table
from sim.models.dcqcn import DcqcnSettings, ReactionPoint
from sim.models.dcqcn_loop import LoopResult, LoopSettings, convergence, run_loop
from sim.models.responder import CLOCK_HZ, round_trip_cycles
from sim.models.switch import MIN_TIME_BETWEEN_CNPS_US, PAUSE_QUANTUM_BITS, Red, SwitchSettings

LINE_BYTES_PER_CYCLE = 100e9 / 8 / CLOCK_HZ
BOTTLENECK = LINE_BYTES_PER_CYCLE / 2
HEADERS = 14 + 20 + 8 + 12 + 16 + 4           # Ethernet, IPv4, UDP, BTH, RETH, ICRC
QP_COUNTS = (2, 4, 16)
PACKETS_PER_WINDOW = 50


@dataclass(frozen=True)
class Scenario:
    """One set of settings for the loop. ``cycles_per_us`` is DCQCN's time base
    (``DCQCN_CONFIG.cycles_per_us``): below the clock's 322 the reaction point runs
    faster than real time, and its rates count in units of 322 / ``cycles_per_us``
    Mb/s (``dcqcn.line_rate`` is then the line in those units)."""
    name: str
    dcqcn: DcqcnSettings
    red: Red
    payload: int                # bytes of each WRITE
    cycles_per_us: int
    milliseconds: float         # of each run, real time
    sample: int                 # cycles of a rate sample

    @property
    def frame(self) -> int:
        return HEADERS + self.payload

    @property
    def cnp_gap(self) -> int:
        """ConnectX's ``min_time_between_cnps`` in cycles, on the scenario's time base."""
        return MIN_TIME_BETWEEN_CNPS_US * self.cycles_per_us

    def switch(self) -> SwitchSettings:
        return SwitchSettings(rate=BOTTLENECK, buffer=4_000_000, red=self.red, xoff=1_000_000,
                              xon=900_000,
                              quantum_cycles=PAUSE_QUANTUM_BITS / 8 / LINE_BYTES_PER_CYCLE)

    def loop(self) -> LoopSettings:
        return LoopSettings(line_rate=LINE_BYTES_PER_CYCLE, frame=self.frame,
                            round_trip=round_trip_cycles(1), cnp_gap=self.cnp_gap,
                            sample=self.sample, clock_hz=self.cycles_per_us * 1e6)

    def gateware_config(self) -> dict:
        """The scenario's ``dcqcn_config`` fields (NetworkBench.configure_dcqcn)."""
        fields = ("line_rate", "rate_to_set_on_first_cnp", "clamp_tgt_rate", "rpg_time_reset",
                  "rpg_byte_reset", "rpg_threshold", "rpg_ai_rate", "rpg_hai_rate",
                  "dce_tcp_g", "dce_tcp_rtt")
        return {"cycles_per_us": self.cycles_per_us,
                **{name: getattr(self.dcqcn, name) for name in fields}}


#: The DCQCN paper's additive increase (40 Mb/s) and threshold F = 5, with a faster
#: rate-increase timer (15 us) and alpha period (4 us) than ConnectX's defaults, which
#: on this bottleneck do not settle within the run (their 32 KiB byte counter drives
#: the rate back up between cuts); RED up to P_max 10 % between the paper's K_min
#: 5 KB and K_max 200 KB; 4 KiB WRITEs.
REAL_TIME = Scenario(
    name="real time", payload=4096, cycles_per_us=round(CLOCK_HZ / 1e6), milliseconds=30,
    sample=8000, red=Red(k_min=5_000, k_max=200_000, p_max=0.1),
    dcqcn=DcqcnSettings(rpg_time_reset=15, rpg_byte_reset=10_000_000, rpg_threshold=5,
                        rpg_ai_rate=40, rpg_hai_rate=400, dce_tcp_g=1020, dce_tcp_rtt=4))

_SCALED_LINE = round(LINE_BYTES_PER_CYCLE * 32 * 8)

#: Acceptance (d) (tests/sim/switch_bench.py): ten times faster than real time, so a
#: run fits in 250,000 cycles of Verilator: DCQCN counts 32 cycles a "us", the
#: switch's thresholds and the CNP gap shrink alike (K_min 500 B, K_max 20 KB); RED's
#: marking rises to 100 % at K_max (with 50 % the model's queue reached 18.7 KB in
#: the second half of a 4-QP run, of four seeds; with 100 % at most 11 KB, and all
#: four converged); the target rate clamped at each cut, the byte counter off, a timer
#: event every 15 us, the first CNP sets 20 % of the line; 1 KiB WRITEs.
SCALED = Scenario(
    name="10x time (switch_bench)", payload=1024, cycles_per_us=32, milliseconds=0.776,
    sample=2000, red=Red(k_min=500, k_max=20_000, p_max=1.0),
    dcqcn=DcqcnSettings(line_rate=_SCALED_LINE, rate_to_set_on_first_cnp=_SCALED_LINE // 5,
                        clamp_tgt_rate=1, rpg_time_reset=15, rpg_byte_reset=0, rpg_threshold=1,
                        rpg_ai_rate=4, rpg_hai_rate=40, dce_tcp_g=1020, dce_tcp_rtt=1))


def run(scenario: Scenario, qps: int) -> LoopResult:
    points = [ReactionPoint(scenario.dcqcn) for _ in range(qps)]
    cycles = round(scenario.milliseconds * 1e-3 * CLOCK_HZ)
    return run_loop(points, scenario.switch(), scenario.loop(), cycles)


def summary(scenario: Scenario, qps: int, result: LoopResult) -> dict:
    """The table's row of a run (times in microseconds of real time)."""
    wire = scenario.frame + scenario.loop().overhead
    window = max(1, round(PACKETS_PER_WINDOW * wire * qps / BOTTLENECK / scenario.sample))
    converged, shares = convergence(result, window=window)
    fair = BOTTLENECK / qps
    after = [depth for time, depth in zip(result.times, result.depths, strict=True)
             if converged is not None and time > converged + window * scenario.sample]
    return {
        "scenario": scenario.name,
        "qps": qps,
        "converged_us": None if converged is None else converged * 1e6 / CLOCK_HZ,
        "share_min": min(shares) / fair,
        "share_max": max(shares) / fair,
        "utilisation": sum(shares) / BOTTLENECK,
        "queue_after_kb": max(after) / 1000 if after else None,
        "max_queue_kb": result.max_depth / 1000,
        "k_max_kb": scenario.red.k_max / 1000,
        "dropped": result.dropped,
        "pauses": result.pauses,
    }


def table(rows: list[dict]) -> Table:
    def converged(row: dict) -> str:
        return "no" if row["converged_us"] is None else f"{row['converged_us']:,.0f} us"

    def after(row: dict) -> str:
        queue = "-" if row["queue_after_kb"] is None else f"{row['queue_after_kb']:.0f} KB"
        return f"{queue} ({row['k_max_kb']:g} KB)"

    return Table("convergence", [
        Column("scenario", "settings", align="left"), Column("qps", "QPs", align="left"),
        Column("converged_us", "converged after", converged, align="left"),
        Column("share", "steady-state share (of fair)",
               lambda row: f"{row['share_min']:.3f}-{row['share_max']:.3f}", align="left"),
        Column("utilisation", "utilisation", ".1%", align="left"),
        Column("queue_after_kb", "queue after convergence (K_max)", after, align="left"),
        Column("max_queue_kb", "deepest queue", lambda row: f"{row['max_queue_kb']:.0f} KB",
               align="left"),
        Column("dropped", "drops", align="left"), Column("pauses", "PFC pauses", align="left")],
        rows=rows,
        caption="DCQCN reference model (sim/models/dcqcn.py) x N QPs into a switch port of "
                "half the line (sim/models/switch.py, sim/models/dcqcn_loop.py)")


def plot(runs: list[tuple[Scenario, int, LoopResult]]):
    """Each run's QP rates and queue depth over time, one panel a run."""
    figure, axes = report.figure(len(runs), 1, size=(9, 3 * len(runs)))
    axes = axes if len(runs) > 1 else [axes]
    for axis, (scenario, qps, result) in zip(axes, runs, strict=True):
        times = [time * 1e3 / CLOCK_HZ for time in result.times]
        for qp, rates in enumerate(result.rates):
            axis.plot(times, [rate * 8 * CLOCK_HZ / 1e9 for rate in rates], lw=0.8,
                      label=f"QP {qp}" if qps <= 4 else None)
        axis.set_ylabel("rate (Gb/s)")
        axis.set_title(f"{qps} QPs into 50 Gb/s, {scenario.name}")
        depth = axis.twinx()
        depth.plot(times, [value / 1000 for value in result.depths], color="black", lw=0.6,
                   alpha=0.5, label="queue")
        depth.axhline(scenario.red.k_max / 1000, color="red", lw=0.6, ls="--", label="K_max")
        depth.set_ylabel("queue (KB)")
        if qps <= 4:
            axis.legend(loc="upper left", fontsize=7)
        depth.legend(loc="upper right", fontsize=7)
    axes[-1].set_xlabel("time (ms)")
    figure.tight_layout()
    return figure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qps", type=int, nargs="*", default=list(QP_COUNTS))
    parser.add_argument("--plot", type=Path, default=Path("build/bench/dcqcn.png"))
    args = parser.parse_args()
    origin = report.provenance()
    runs = [(scenario, qps, run(scenario, qps))
            for scenario in (REAL_TIME, SCALED) for qps in args.qps]
    convergence_table = table([summary(*each) for each in runs])
    print(convergence_table.caption)
    print(convergence_table.markdown().split("\n\n", 1)[1])
    figure = plot([each for each in runs if each[0] is REAL_TIME or each[1] == 4])
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.plot, dpi=110)
    print(f"wrote {args.plot}")
    report.write("dcqcn", [convergence_table], origin=origin, figures={
        "dcqcn.svg": (figure, "DCQCN convergence: each QP's rate and the queue over time")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
