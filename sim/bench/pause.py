"""How soon the core obeys a PAUSE or a PFC: prints a table and writes it to
``docs/generated/bench/pause.md``; ``make bench``.

The core (the tests' build) runs under Verilator (sim/bench/pause_runs.py, cocotb)
with its MAC side at the rate of a 100 Gb/s line, one QP streaming RDMA WRITEs to a
ConnectX-like peer. A PAUSE, or a PFC for the RoCEv2 priority (3), comes in at a
different moment after a frame start each time; the response is the cycles (of the
322.265625 MHz core clock) from the pause frame's last beat in to the start of the
last frame the core sent before it held: that frame was under way, or had passed the
gate before the timer ran. Nothing starts after it until the pause ends.
"""

import argparse
import sys

from sim.bench import report
from sim.bench.connectx import frame_length
from sim.bench.core_runs import core_design, run_for_results
from sim.bench.report import Column, Table

ROWS = [{"length": 64, "messages": 400}, {"length": 1024, "messages": 80},
        {"length": 4096, "messages": 40}]
INJECTIONS = 8
HOLD = 200


def measure(design, rows):
    return run_for_results(design, "pause_runs", "pause_response", "pause", {"rows": rows})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args()
    origin = report.provenance()
    design = core_design()
    rows = [{**row, "kind": kind, "injections": INJECTIONS, "hold": HOLD}
            for kind in ("PAUSE", "PFC") for row in ROWS]
    table = Table("pause", [
        Column("kind", "pause", align="left"), Column("length", "WRITE payload"),
        Column("frame", "frame B"), Column("frame_beats", "frame beats"),
        Column("min", "response min"), Column("max", "max"), Column("mean", "mean", ".1f")],
        caption="Pause response: cycles from the pause frame's last beat in to the last "
                f"frame start out, over {INJECTIONS} pauses at successive cycles after a frame "
                "start; 1 QP of RDMA WRITEs at 100 Gb/s line rate.")
    print(table.caption)
    print(table.header())
    for row in measure(design, rows):
        frame = frame_length("RDMA_WRITE", row["length"])
        responses = row["responses"]
        print(table.add({**row, "frame": frame, "frame_beats": -(-frame // 64),
                         "min": min(responses), "max": max(responses),
                         "mean": sum(responses) / len(responses)}))
    report.write("pause", [table], origin=origin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
