"""Latency of one QP's 64-byte RDMA WRITE through the whole core: from the work request
to the first byte at the MAC, and to its completion. Prints a table and writes it to
``docs/generated/bench/latency.{md,json}``; ``make bench``.

The core (the build of ``python -m sim.bench.connectx``, and that build with 4,096 QPs
and 8,192 message slots) runs under Verilator
(sim/bench/latency_runs.py, cocotb); its MAC side takes beats at the rate of a 100 Gb/s
line, and a ConnectX-like responder model (sim/models/responder.py) acknowledges each
WRITE a round trip of 1 µs after its frame's last beat. Each measured WRITE goes while
nothing is outstanding on any QP, with one QP open and with every QP of the build open.
Figures are cycles of the 322.265625 MHz core clock, stamped where the core's ports
take a beat (valid and ready): request → MAC from the work request taken by the user
request port to the first beat of its frame taken from the MAC-side transmit stream;
request → completion to the completion taken from the completion stream. The
endpoint's share of the latter is what remains without the round trip and the frame's
time on the line.
"""

import argparse
import inspect
import sys

from gateware.core import NetworkCore
from gateware.roce.requests import QP_INDEX_BITS
from sim.bench import report
from sim.bench.connectx import CONNECTX_PARAMS, frame_length, line_cycles_per_frame
from sim.bench.core_runs import core_design, run_for_results
from sim.bench.report import Column, Table
from sim.build_options import message_slots_for
from sim.models.responder import CLOCK_HZ, round_trip_cycles

LENGTH = 64
REPETITIONS = 5
ROUND_TRIP_US = 1
#: The QPs of the builds the bench measures: the board's, and the most the core takes.
BUILD_QPS = CONNECTX_PARAMS.get("qps", inspect.signature(NetworkCore).parameters["qps"].default)
MANY_QPS = 1 << QP_INDEX_BITS
#: Each model's memory in a build of many QPs (the WRITEs of a row land in turn; the
#: board's build keeps the connectx bench's, 1 MiB).
SMALL_MEMORY = 4096


def build_params(qps: int) -> dict:
    """The build with ``qps`` QPs: the connectx bench's, with message slots for them."""
    if qps == BUILD_QPS:
        return CONNECTX_PARAMS
    return {**CONNECTX_PARAMS, "qps": qps, "message_slots": message_slots_for(qps)}


def runs(build_qps: int = BUILD_QPS) -> list[dict]:
    """The rows to measure on a build: one QP open, and every QP of the build open with
    the last one sending."""
    memory = None if build_qps == BUILD_QPS else SMALL_MEMORY
    return [{"build_qps": build_qps, "qps": qps, "qp": qps - 1, "length": LENGTH,
             "repetitions": REPETITIONS, "round_trip": round_trip_cycles(ROUND_TRIP_US),
             "memory": memory} for qps in (1, build_qps)]


def measure(design, rows):
    return run_for_results(design, "latency_runs", "write_latency", "latency", {"rows": rows})


def nanoseconds(cycles: float) -> float:
    return cycles / CLOCK_HZ * 1e9


def latency_row(measured: dict) -> dict:
    """A row of the table from a row of measurements: its ``stamps`` (the cycles of the
    request taken, its frame's first beat out, the ACK in and the completion out, for
    each repetition) give each latency's least and greatest."""
    frame = frame_length("RDMA_WRITE", measured["length"])
    line = line_cycles_per_frame(frame)
    round_trip = measured["round_trip"]
    spans = {
        "to_mac": [s["first_beat"] - s["request"] for s in measured["stamps"]],
        "to_completion": [s["completion"] - s["request"] for s in measured["stamps"]],
        "ack_to_completion": [s["completion"] - s["ack"] for s in measured["stamps"]],
    }
    spans["endpoint"] = [cycles - round_trip - line for cycles in spans["to_completion"]]
    row = {key: value for key, value in measured.items() if key != "stamps"}
    row.update(frame=frame, line_cycles=line, round_trip_us=round_trip / CLOCK_HZ * 1e6)
    for name, values in spans.items():
        row[f"{name}_min"], row[f"{name}_max"] = min(values), max(values)
    for name in ("to_mac", "to_completion"):
        row[f"{name}_ns_min"] = nanoseconds(row[f"{name}_min"])
        row[f"{name}_ns_max"] = nanoseconds(row[f"{name}_max"])
    return row


def span(name: str, title: str, spec: str = "") -> Column:
    """A column of ``name``'s least and greatest: one figure when they are equal."""
    def cell(row: dict) -> str:
        low, high = format(row[f"{name}_min"], spec), format(row[f"{name}_max"], spec)
        return low if low == high else f"{low}–{high}"
    return Column(f"{name}_min", title, cell)


def same_latency(rows: list[dict]) -> bool:
    """Whether every row measured the same request → MAC and request → completion."""
    keys = ("to_mac_min", "to_mac_max", "to_completion_min", "to_completion_max")
    return len({tuple(row[key] for key in keys) for row in rows}) <= 1


def latency_table(measured: list[dict]) -> Table:
    rows = [latency_row(row) for row in measured]
    table = Table("latency", [
        Column("build_qps", "build's QPs"), Column("qps", "QPs open"),
        Column("qp", "sending QP"),
        Column("repetitions", "WRITEs"),
        span("to_mac", "request → MAC"), span("to_mac_ns", "ns", ".1f"),
        span("to_completion", "request → completion"),
        span("to_completion_ns", "ns", ".1f"),
        Column("round_trip", "round trip"), Column("line_cycles", "frame on line", ".2f"),
        span("endpoint", "endpoint's share", ".2f"),
        span("ack_to_completion", "ACK → completion")],
        rows=rows,
        caption=f"Latency of one QP's {LENGTH}-byte RDMA WRITE with nothing outstanding, in "
                f"cycles of the {CLOCK_HZ / 1e6:g} MHz core clock (and ns), least–greatest "
                "over the WRITEs of a row, each posted after a different number of idle "
                f"cycles. The line is 100 Gb/s; the peer, ConnectX-like, acknowledges "
                f"{ROUND_TRIP_US} µs (the round trip, in cycles) after the frame's last "
                "beat.")
    table.note = (
        "Request → MAC: from the cycle the user request port takes the work request to "
        "the cycle the MAC-side transmit stream takes the first beat of its frame. "
        "Request → completion: to the cycle the completion stream gives its completion. "
        "Endpoint's share: request → completion less the round trip and the frame's time "
        "on the line (its bytes and 24 of FCS, preamble and gap at 100 Gb/s). "
        "ACK → completion: from the cycle the model's ACK is handed to the MAC-side "
        "receive stream. "
        + ("Every row measured the same: the QPs open do not change the latency."
           if same_latency(rows) else
           "The rows differ: the QPs open change the latency."))
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--qps", type=int, nargs="*", default=[BUILD_QPS, MANY_QPS],
                        help="the builds' QP counts (default: %(default)s)")
    args = parser.parse_args()
    origin = report.provenance()
    measured = []
    for qps in args.qps:
        measured += measure(core_design(build_params(qps)), runs(qps))
    table = latency_table(measured)
    print(table.markdown())
    report.write("latency", [table], origin=origin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
