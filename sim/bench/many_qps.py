"""Many QPs at once: every QP of a 1,024-QP core opened through the connection manager
(OPEN_QP, one host, a responder model as each host QP), then 64-byte WRITEs on all of
them, QP after QP, round after round. Prints a table and writes it to
``docs/generated/bench/many_qps.{md,json}``; ``make bench``.

The core runs under Verilator (sim/bench/many_qps_runs.py, cocotb), built with the
tests' parameters but for the QPs, a ring of 128 beats (8 KiB) a QP and 8 messages a QP
(its Verilator build takes some 6 minutes and 3 GB, cached after the first run). The
run checks every message: completed SUCCESS in order on its QP, and in its host's
memory. Figures are simulation cycles of the bench's clock (the CMAC's 322 MHz).
"""

import argparse
import sys

from sim.bench import report
from sim.bench.core_runs import core_design, run_for_results
from sim.bench.report import Column, Table
from sim.testbench import CORE_PARAMS

#: The goal: every message completes, and the QP that completed fewest got 0.9 of the most.
FAIRNESS = 0.9


def params(qps: int) -> dict:
    return {**CORE_PARAMS, "qps": qps, "retransmit_beats": 128, "messages": 8}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--qps", type=int, default=1024, help="QPs of the core (default 1024)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="WRITEs on each QP (default 2)")
    args = parser.parse_args()
    origin = report.provenance()
    design = core_design(params(args.qps))
    row = run_for_results(design, "many_qps_runs", "many_qps", "many_qps",
                          {"qps": args.qps, "rounds": args.rounds})
    row = {**row, "open_per_qp": row["open_cycles"] / row["opened"],
           "fairness": row["fewest"] / row["most"],
           "cycles_per_message": row["write_cycles"] / row["messages"]}
    table = Table("many_qps", [
        Column("qps", "QPs"), Column("opened", "opened"),
        Column("open_per_qp", "cycles per OPEN_QP", ".0f"),
        Column("messages", "WRITEs"), Column("completed", "completed"),
        Column("lost", "lost"), Column("fewest", "fewest a QP"), Column("most", "most a QP"),
        Column("fairness", "fewest / most", ".2f"),
        Column("cycles_per_message", "cycles per WRITE", ".1f")],
        caption=f"Every QP of a {args.qps}-QP core opened through the connection manager "
                f"(OPEN_QP, each answered before the next), then {args.rounds} rounds of "
                f"64-byte WRITEs, one on every QP per round (simulation, cycles of the core "
                f"clock):",
        note="Each OPEN_QP: from the datagram into the core to its ACK out, and the "
             "responder model attached. Cycles per WRITE: from the first work request to "
             "the last completion, over the WRITEs; the bench's Python posts the work "
             "requests. Every WRITE was checked in its host's memory; a further OPEN_QP "
             "was refused NO_QP.")
    print(table.caption)
    print(table.header())
    print(table.add(row))
    print(f"\n{table.note}")
    report.write("many_qps", [table], origin=origin)
    return 0 if row["lost"] == 0 and row["fairness"] >= FAIRNESS and row["opened"] == args.qps \
        else 1


if __name__ == "__main__":
    sys.exit(main())
