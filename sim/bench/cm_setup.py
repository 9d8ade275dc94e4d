"""Connection setup through the passive IB CM (rdma_connect's REQ → REP, RTU): the
latency of a REQ and the connections per second a peer gets on all 16 QPs. Prints a
table and writes it to ``docs/generated/bench/cm_setup.{md,json}``; ``make bench``.

The core (the tests' build) runs under Verilator (sim/bench/cm_setup_runs.py, cocotb);
a peer plays the host's rdma_cm: REQs as rdma_connect sends them, and an RTU at once
for each REP. Figures are simulation figures, in cycles of the bench's clock (the
CMAC's 322.265625 MHz), and per second at the core's ``clock_hz``. Latency: from the
clock edge that takes a REQ's last beat into the core to the one that takes its REP's
first beat out. Rate: 16 connections over the cycles from the first REQ's last beat in
to the last REP's first beat out.
"""

import argparse
import sys

from gateware.core import CMAC_CLOCK_HZ
from sim.bench import report
from sim.bench.core_runs import core_design, run_for_results
from sim.bench.report import Column, Table

QPS = 16
PEERS = {
    "idle": "one REQ at a time to an idle endpoint (REP awaited, RTU, 200 idle cycles)",
    "window": "the next REQ as each REP comes (one outstanding), RTU at once",
    "back_to_back": "16 REQs back to back, RTU at once; any REQ dropped as busy (QP1's "
                    "queue full) sent again once the CM is idle, and all RTUs while one "
                    "was dropped",
}


def measure(design):
    return run_for_results(design, "cm_setup_runs", "connection_setup", "cm_setup")


def setup_table(rows, origin: report.Provenance) -> Table:
    table = Table("setup", [
        Column("peer", "peer", align="left"), Column("reqs", "REQs sent"),
        Column("rtus_again", "RTUs again"),
        Column("busy", "dropped busy"), Column("rounds", "rounds"),
        Column("min_latency", "REQ → REP min"), Column("max_latency", "max"),
        Column("cycles", "cycles for 16"), Column("cycles_per_connection", "cycles/conn", ".1f"),
        Column("connections_per_s", "conn/s", ",.0f")],
        caption=f"Connection setup through the passive IB CM, {QPS} QPs (simulation, cycles "
                f"of the core clock, per second at {CMAC_CLOCK_HZ / 1e6:g} MHz). Peers: "
                + "; ".join(f"`{name}`: {text}" for name, text in PEERS.items()) + ".",
        note="REQ → REP: cycles from the REQ's last beat into the core to the REP's first "
             "beat out. Rates: 16 connections over the cycles from the first REQ's last "
             "beat in to the last REP's first beat out (in `back_to_back`, the rounds of "
             "RTUs sent again after the last REP are not in them). Every row ends with "
             "all 16 connections established.")
    print(table.caption)
    print(table.header())
    for row in rows:
        cycles = row["cycles"]
        if row["max_latency"] is not None:
            row = {**row, "max_latency_ns": row["max_latency"] / CMAC_CLOCK_HZ * 1e9}
        if cycles is not None:
            row = {**row, "cycles_per_connection": cycles / QPS,
                   "connections_per_s": QPS / cycles * CMAC_CLOCK_HZ}
        print(table.add(row), flush=True)
    print(f"\n{table.note}")
    report.write("cm_setup", [table], origin=origin)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args()
    origin = report.provenance()
    setup_table(measure(core_design()), origin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
