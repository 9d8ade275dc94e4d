"""What building the core costs at each QP count: seconds and peak memory to elaborate
the :class:`~gateware.core.NetworkCore` and convert it to RTLIL (what ``make bitstream``
and every simulator build start with), the RTLIL's size, and its largest parts. Prints
a table and writes it to ``docs/generated/bench/elaboration.md``; ``make bench``.

Each QP count is built in a Python process of its own, so its peak memory is its own.
The core has its build defaults but for the QPs and, from 4,096 QPs on, twice the
QPs in message slots (each QP holds one, and the pool keeps a few back)."""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections import Counter

from sim.bench import report
from sim.bench.report import Column, Table

#: The QP counts measured by default.
QP_COUNTS = (16, 256, 1024, 4096)
#: What building the largest core may cost here (the goal the design is held to).
LIMIT_SECONDS, LIMIT_GB = 600, 8.0
#: The parts shown per row.
LARGEST = 3


def build_parameters(qps: int) -> dict:
    from sim.build_options import message_slots_for
    return {"qps": qps, "message_slots": message_slots_for(qps)}


def measure_one(qps: int) -> dict:
    """Builds and converts the core in this process: its figures."""
    from amaranth.back import rtlil

    from gateware.core import NetworkCore
    start = time.monotonic()
    text = rtlil.convert(NetworkCore(**build_parameters(qps)), name="top")
    seconds = time.monotonic() - start
    sizes = Counter()
    for chunk in text.split("\nmodule ")[1:]:
        name, _, body = chunk.partition("\n")
        sizes[name.strip().removeprefix("\\top.").removeprefix("\\")] = len(body)
    return {
        "qps": qps,
        "seconds": seconds,
        "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
        "rtlil_mb": len(text) / 1e6,
        "largest": [(name, size / 1e6) for name, size in sizes.most_common(LARGEST)],
    }


def _largest(row: dict) -> str:
    return ", ".join(f"`{name}` {size:.1f}" for name, size in row["largest"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.bench.elaboration",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("qps", type=int, nargs="*", default=list(QP_COUNTS),
                        help="QP counts to build (default: %(default)s)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure_one(args.one)))
        return 0

    origin = report.provenance()
    table = Table("elaboration", [
        Column("qps", "QPs"), Column("message_slots", "message slots"),
        Column("seconds", "seconds", ".0f"), Column("peak_gb", "peak GB", ".2f"),
        Column("rtlil_mb", "RTLIL MB", ".1f"),
        Column("largest", "largest parts (MB of RTLIL)", _largest, align="left")],
        caption="Elaborating the core and converting it to RTLIL, each build in a Python "
                "of its own (build defaults but for the QPs and the message slots):",
        note=f"The goal for the largest build: at most {LIMIT_SECONDS // 60} minutes and "
             f"{LIMIT_GB:.0f} GB. The retransmit pool's 2 MiB of initial zeros are "
             f"about 17 MB of every build's RTLIL (`roce_tx.buffer`).")
    print(table.header())
    for qps in args.qps:
        done = subprocess.run([sys.executable, "-m", "sim.bench.elaboration", "--one", str(qps)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        row = json.loads(done.stdout.splitlines()[-1])
        row["message_slots"] = build_parameters(qps)["message_slots"]
        print(table.add(row), flush=True)
    report.write("elaboration", [table], origin=origin)
    largest = max(table.rows, key=lambda row: row["qps"])
    return 0 if largest["seconds"] <= LIMIT_SECONDS and largest["peak_gb"] <= LIMIT_GB else 1


if __name__ == "__main__":
    sys.exit(main())
