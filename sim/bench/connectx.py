"""The whole core against ConnectX-like peers on a 100GbE line: message rate with every
message acknowledged, and goodput under packet loss. Prints two tables and writes them,
with a plot each, to ``docs/generated/bench/connectx_{rate,goodput}.*``; ``make bench``.

The core (the tests' build, but with the board's retransmit rings of 2048 beats, 128 KiB
per QP, unless ``--retransmit-beats`` says otherwise) runs under Verilator
(sim/bench/connectx_runs.py, cocotb); its MAC side takes beats at the rate of a 100 Gb/s
line, and a responder model in ConnectX mode (sim/models/responder.py) answers every packet
that asks at once, a round trip later. All figures are counted in cycles of the
322.265625 MHz core clock.

A frame costs the line its bytes (Scapy's frame, no FCS) plus 4 of FCS, 8 of preamble
and start delimiter and 12 of inter-frame gap, at 100 Gb/s:
``line cycles = (frame + 24) * 8 / 100e9 * 322.265625e6``; a 64-byte RDMA WRITE ONLY
(138-byte frame) takes 4.18 cycles, a 64-byte SEND ONLY (122 bytes) 3.77.
"""

import argparse
import inspect
import json
import sys
import tempfile
from pathlib import Path

from gateware.core import NetworkCore
from sim.bench import report
from sim.bench.core_runs import core_design
from sim.bench.report import Column, Table
from sim.bench.roce_goodput import LINE_BYTES_PER_CYCLE, LINE_OVERHEAD, theoretical_gbps
from sim.models.responder import CLOCK_HZ, round_trip_cycles
from sim.models.rocev2 import Message, message_packets, roce_frame
from sim.runner import BUILD, run
from sim.testbench import CORE_PARAMS

#: The retransmit ring of each QP (the most of the pool it may hold) and the retransmit pool
#: in the VCU118 build (NetworkCore's defaults).
BOARD_RETRANSMIT_BEATS = inspect.signature(NetworkCore).parameters["retransmit_beats"].default
BOARD_RETRANSMIT_PAGES = inspect.signature(NetworkCore).parameters["retransmit_pages"].default
#: The core as this bench builds it by default: the tests' build with the board's rings.
CONNECTX_PARAMS = {**CORE_PARAMS, "retransmit_beats": BOARD_RETRANSMIT_BEATS,
                   "retransmit_pages": BOARD_RETRANSMIT_PAGES}
#: Messages of a message-rate row: at a 10 µs round trip some 770 are in flight, so a
#: row runs five round trips and more with the line full.
RATE_MESSAGES = 4096
#: The rows' round trips (µs), and the QP counts at each.
RATE_ROUND_TRIPS = {1: (1, 16), 2: (1, 16), 5: (1,), 10: (1,)}
RATE_TARGET = 0.99
LOSSES = (0.0, 0.0001, 0.001, 0.01)
GOODPUT_LENGTH, GOODPUT_MTU = 64 * 1024, 4096
GOODPUT_TARGETS = {0.001: 0.99, 0.01: 0.90}


def frame_length(verb, length):
    """Bytes of a one-packet message's frame, no FCS, as Scapy builds it."""
    (packet,) = message_packets(Message(verb, bytes(length)), psn=0, path_mtu=4096, rkey=0)
    return len(roce_frame(packet, src_mac="02:00:00:00:00:02", dst_mac="52:54:00:12:34:56",
                          src_ip="10.77.0.2", dst_ip="10.77.0.1", dest_qp=0x11,
                          src_port=0xC000, tos=2, ip_id=0))


def line_cycles_per_frame(frame):
    return (max(frame, 60) + LINE_OVERHEAD) / LINE_BYTES_PER_CYCLE


def goodput_messages(loss):
    """Messages of a goodput row: the packets are whole blocks of the loss pattern,
    with 16 losses at 1%, 4 at 0.1% and 1 at 0.01% (10,000 packets)."""
    messages = {0.0: 100, 0.0001: 625, 0.001: 250, 0.01: 100}[loss]
    packets = messages * -(-GOODPUT_LENGTH // GOODPUT_MTU)
    assert not loss or packets % round(1 / loss) == 0, (loss, packets)
    return messages


def measure(design, table, rows):
    with tempfile.TemporaryDirectory() as directory:
        results = Path(directory) / f"{table}.json"
        run(design, module="connectx_runs", test_dir=Path(__file__).parent,
            testcase={"rate": "message_rate", "goodput": "goodput_under_loss"}[table],
            params={"pcap": str(BUILD / "pcap" / f"bench-connectx-{table}.pcap"),
                    table: rows, "results": {table: str(results)}})
        return json.loads(results.read_text())


def rate_table(design, origin: report.Provenance) -> bool:
    rows = [{"verb": verb, "qps": qps, "messages": RATE_MESSAGES,
             "round_trip": round_trip_cycles(us)}
            for us, counts in RATE_ROUND_TRIPS.items() for qps in counts
            for verb in ("RDMA_WRITE", "SEND")]
    table = Table("rate", [
        Column("verb", "verb", align="left"), Column("qps", "QPs"),
        Column("round_trip", "round trip"), Column("frame", "frame B"),
        Column("line_cycles_per_message", "line cycles/msg", ".2f"),
        Column("line_cycles", "cycles", ".0f"), Column("mmsg_per_s", "Mmsg/s", ".1f"),
        Column("line_mmsg_per_s", "line Mmsg/s", ".1f"), Column("of_line", "of line", ".2%"),
        Column("retransmitted", "resent"), Column("timeouts", "timeouts"),
        Column("acks_dropped", "ACKs dropped"), Column("tail", "last ACK → completion")],
        caption="Message rate: 64-byte messages back to back, each acknowledged by its peer "
                f"(ConnectX-like, round trip in cycles); {RATE_MESSAGES} messages per row.")
    print(table.caption)
    print(table.header())
    worst = 1.0
    for row in measure(design, "rate", rows):
        frame = frame_length(row["verb"], 64)
        per_message = line_cycles_per_frame(frame)
        fraction = row["messages"] * per_message / row["line_cycles"]
        worst = min(worst, fraction)
        print(table.add({**row, "round_trip_us": round(row["round_trip"] / CLOCK_HZ * 1e6),
                         "frame": frame, "line_cycles_per_message": per_message,
                         "mmsg_per_s": row["messages"] / row["line_cycles"] * CLOCK_HZ / 1e6,
                         "line_mmsg_per_s": CLOCK_HZ / per_message / 1e6,
                         "of_line": fraction}), flush=True)
    table.note = (f"Worst fraction of the line: {worst:.2%} (target ≥ {RATE_TARGET:.0%} in "
                  "every row).")
    print(f"\n{table.note}")
    report.write("connectx_rate", [table], origin=origin, figures={
        "connectx_rate.svg": (rate_figure(table), "64-byte message rate against round trip")})
    return worst >= RATE_TARGET


def rate_figure(table: Table):
    """Message rate against the round trip, per verb and QP count, with the line's."""
    figure, axis = report.figure()
    for verb, marker in (("RDMA_WRITE", "o"), ("SEND", "s")):
        for qps, style in ((1, "-"), (16, "--")):
            rows = [row for row in table.rows if row["verb"] == verb and row["qps"] == qps]
            axis.plot([row["round_trip_us"] for row in rows],
                      [row["mmsg_per_s"] for row in rows], marker + style,
                      label=f"{verb}, {qps} QP{'s' if qps > 1 else ''}")
        line = next((row["line_mmsg_per_s"] for row in table.rows if row["verb"] == verb),
                    None)
        if line is not None:
            axis.axhline(line, color="grey", lw=0.6, ls=":")
    axis.set_xticks(sorted({row["round_trip_us"] for row in table.rows}))
    axis.set_xlabel("round trip (µs)")
    axis.set_ylabel("messages (M/s)")
    axis.set_title("64-byte messages, each acknowledged (dotted: the line's rate)")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    return figure


def goodput_table(design, params, seed, losses, origin: report.Provenance) -> bool:
    round_trip = round_trip_cycles(2)
    rows = [{"length": GOODPUT_LENGTH, "path_mtu": GOODPUT_MTU, "loss": loss,
             "messages": goodput_messages(loss), "round_trip": round_trip, "seed": seed}
            for loss in losses]
    theory = theoretical_gbps(GOODPUT_LENGTH, GOODPUT_MTU)
    table = Table("goodput", [
        Column("loss", "loss", ".2%"), Column("messages", "messages"),
        Column("packets", "packets"), Column("lost", "lost"), Column("frames", "frames sent"),
        Column("naks", "NAKs"), Column("timeouts", "timeouts"),
        Column("line_cycles", "cycles", ".0f"), Column("gbps", "Gb/s", ".2f"),
        Column("of_theory", "of theory", ".2%")],
        caption=f"Goodput under loss: one QP, {GOODPUT_LENGTH // 1024} KiB RDMA WRITEs, path "
                f"MTU {GOODPUT_MTU}, round trip {round_trip} cycles (2 µs); packets lost on the "
                f"way to the peer in a seeded pattern (seed {seed}): one at a drawn position in "
                "each block of 1/rate packets. The retransmit pool: "
                f"{params['retransmit_pages']} pages of 4 KiB "
                f"({params['retransmit_pages'] * 4 // 1024} MiB), up to "
                f"{params['retransmit_beats'] * 64 // 1024} KiB a QP. Theory: payload over "
                f"line bytes at 100 Gb/s, {theory:.2f} Gb/s.",
        note="Targets: ≥ 99% of theory at 0.1% loss, ≥ 90% at 1%.")
    print(f"\n{table.caption}")
    print(table.header())
    ok = True
    for row in measure(design, "goodput", rows):
        gbps = row["messages"] * row["length"] * 8 / (row["line_cycles"] / CLOCK_HZ) / 1e9
        target = GOODPUT_TARGETS.get(row["loss"])
        ok = ok and (target is None or gbps / theory >= target)
        print(table.add({**row, "gbps": gbps, "theory_gbps": theory,
                         "of_theory": gbps / theory}), flush=True)
    print(f"\n{table.note}")
    report.write("connectx_goodput", [table], origin=origin, figures={
        "connectx_goodput.svg": (loss_figure(table), "64 KiB WRITE goodput under loss")})
    return ok


def loss_figure(table: Table):
    """Goodput against the loss rate, with the theory and the targets."""
    figure, axis = report.figure()
    positions = range(len(table.rows))
    axis.plot(positions, [row["gbps"] for row in table.rows], "o-", label="measured")
    if table.rows:
        axis.axhline(table.rows[0]["theory_gbps"], color="black", ls=":", label="theory")
    targets = [(index, GOODPUT_TARGETS[row["loss"]] * row["theory_gbps"])
               for index, row in enumerate(table.rows) if row["loss"] in GOODPUT_TARGETS]
    if targets:
        axis.plot(*zip(*targets, strict=True), "v", color="red", label="target")
    axis.set_xticks(list(positions), [f"{row['loss']:.2%}" for row in table.rows])
    axis.set_xlabel("packets lost")
    axis.set_ylabel("goodput (Gb/s)")
    axis.set_title(f"One QP, {GOODPUT_LENGTH // 1024} KiB RDMA WRITEs, 2 µs round trip")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    return figure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", nargs="*", default=["rate", "goodput"],
                        choices=["rate", "goodput"])
    parser.add_argument("--seed", type=int, default=1, help="seed of the loss pattern")
    parser.add_argument("--losses", type=float, nargs="*", default=LOSSES, choices=LOSSES,
                        help="loss rates of the goodput rows (default: all)")
    parser.add_argument("--retransmit-beats", type=int, default=BOARD_RETRANSMIT_BEATS,
                        help="beats of each QP's retransmit ring (default: the board's)")
    parser.add_argument("--retransmit-pages", type=int, default=BOARD_RETRANSMIT_PAGES,
                        help="4 KiB pages of the retransmit pool (default: the board's)")
    args = parser.parse_args()
    origin = report.provenance()
    params = {**CONNECTX_PARAMS, "retransmit_beats": args.retransmit_beats,
              "retransmit_pages": args.retransmit_pages}
    design = core_design(params)
    ok = True
    if "rate" in args.tables:
        ok = rate_table(design, origin) and ok
    if "goodput" in args.tables:
        ok = goodput_table(design, params, args.seed, args.losses, origin) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
