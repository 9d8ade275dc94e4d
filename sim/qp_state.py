"""The state the endpoint keeps per QP, in bits, from the design's own layouts:
``python -m sim.qp_state`` prints the table, and the QP's transport state (the
reliability engine's and the acknowledgement intake's, but for the counters, and the
timer sweep's flag that a timer started) against
its goal of 32 bytes, and writes them to ``docs/generated/bench/qp_state.md``;
``make bench``. It fails (exit status 1) when the transport state is over its goal."""

from __future__ import annotations

import argparse
import inspect
import sys

from amaranth import Shape

from gateware.cm.manager import CM_ENTRY
from gateware.core import NetworkCore
from gateware.roce.ack_intake import AckIntake
from gateware.roce.dcqcn import DcqcnReactionPoint
from gateware.roce.pacer import Pacer
from gateware.roce.page_pool import PAGE_BYTES, PagePool
from gateware.roce.qp_table import QP_PATH
from gateware.roce.reliability import ReliabilityEngine
from gateware.roce.requests import CompletionStatus
from gateware.roce.slot_pool import slot_entry
from gateware.roce.timer_sweep import TimerSweep
from gateware.stream import BEAT_BYTES
from sim.bench import report
from sim.bench.report import Column, Table

#: The generator pool keeps the message count of each QP's last run.
GENERATOR_BITS = 32
COUNTERS = ("sent_counters", "event_counters", "intake_counters", "icrc_errors", "cnps")
#: The goal for the transport state, in bits: 32 bytes.
TRANSPORT_GOAL_BITS = 256


Row = tuple[str, str, int]


def engine_bits(messages: int, message_slots: int) -> tuple[int, int]:
    """Bits the reliability engine keeps per QP: its state but the counters, and its
    counters."""
    engine = ReliabilityEngine.qp_state_bits(messages, message_slots)
    counters = sum(engine[name] for name in COUNTERS)
    return sum(engine.values()) - counters, counters


def transport_bits(messages: int, message_slots: int) -> int:
    """Bits of a QP's transport state: the reliability engine's but its counters, the
    acknowledgement intake's, and the timer sweep's flag that the QP's timer started
    (the sweep's deadlines are its scan's, as the DCQCN reaction point's and the
    pacer's)."""
    return (engine_bits(messages, message_slots)[0] + sum(AckIntake.qp_state_bits().values())
            + TimerSweep.qp_state_bits()["started"])


def rows(messages: int, message_slots: int, ring_beats: int,
         pages: int) -> tuple[list[Row], list[Row]]:
    """The QP context, and the queues: (where, what, bits) each."""
    state, counters = engine_bits(messages, message_slots)
    pool = PagePool(qps=2, pages=pages, ring_beats=ring_beats)
    ring_pages = ring_beats * BEAT_BYTES // PAGE_BYTES
    context = [
        ("QP table (`roce/qp_table.py`)",
         "path: remote QPN, rkey, remote IPv4, path MTU, UDP source port", QP_PATH.size),
        ("reliability engine (`roce/reliability.py`)",
         "PSNs, ring and slot positions, RNR code, retries, error, settings, flags", state),
        ("reliability engine", "14 counters (STATUS bytes 13-60)", counters),
        ("acknowledgement intake (`roce/ack_intake.py`)",
         "newest ACK and NAK (PSN, syndrome), flags", sum(AckIntake.qp_state_bits().values())),
        ("timer sweep (`roce/timer_sweep.py`)",
         "its scan's hint (whether a timer runs, when it runs out) and flag, "
         "whether a timer started",
         sum(TimerSweep.qp_state_bits().values())),
        ("DCQCN reaction point (`roce/dcqcn.py`)",
         "Rc, Rt, α, stages, period starts, byte count, flags, its scan's hint and flag",
         sum(DcqcnReactionPoint.qp_state_bits().values())),
        ("pacer (`roce/pacer.py`)",
         "interval, last packet's turn and bytes, paced, its scan's hint and flag",
         sum(Pacer.qp_state_bits().values())),
        ("connection manager (`cm/manager.py`)",
         "open, the host's IPv4 and QPN, first PSN, path MTU, buffer address, runs",
         CM_ENTRY.size),
        ("generator pool", "messages of the last run", GENERATOR_BITS),
        ("retransmit page pool (`roce/page_pool.py`)", "the first page of its ring it holds",
         pool.vpage_bits),
    ]
    slot = (Shape.cast(slot_entry((message_slots - 1).bit_length())).width
            + Shape.cast(CompletionStatus).width)
    queues = [
        ("message slot pool (send queues of all QPs)",
         f"{message_slots} slots × {slot} bits; a QP up to {messages}",
         message_slots * slot),
        ("page table (each QP)", f"{ring_pages} pages of its ring × {pool.page_bits} bits",
         ring_pages * pool.page_bits),
        ("retransmit pool (the payload of all QPs)", f"{pages} pages × {PAGE_BYTES} bytes; "
         f"a QP up to {ring_beats * BEAT_BYTES // 1024} KiB", pages * PAGE_BYTES * 8),
    ]
    return context, queues


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.qp_state",
                                     description=__doc__.split("\n")[0])
    defaults = inspect.signature(NetworkCore).parameters
    parser.add_argument("--messages", type=int, default=defaults["messages"].default)
    parser.add_argument("--message-slots", type=int,
                        default=defaults["message_slots"].default)
    parser.add_argument("--ring-beats", type=int,
                        default=defaults["retransmit_beats"].default)
    parser.add_argument("--retransmit-pages", type=int,
                        default=defaults["retransmit_pages"].default)
    args = parser.parse_args(argv)
    origin = report.provenance()
    context, queues = rows(args.messages, args.message_slots, args.ring_beats,
                           args.retransmit_pages)
    table = Table("qp_state", [Column("where", "kept in", align="left"),
                               Column("what", "what", align="left"),
                               Column("shown", "bits")],
                  caption=f"The state kept per QP, in bits, from the design's layouts "
                          f"({args.messages} messages a QP, {args.message_slots} message "
                          f"slots, rings of {args.ring_beats} beats, "
                          f"{args.retransmit_pages} retransmit pages):")
    for where, what, bits in context:
        table.add({"where": where, "what": what, "bits": bits, "shown": str(bits)})
    total = sum(bits for _, _, bits in context)
    table.add({"where": "**QP context**", "what": "", "bits": total,
               "shown": f"**{total} bits = {total / 8:.0f} bytes**"})
    for where, what, bits in queues:
        table.add({"where": where, "what": what, "bits": bits,
                   "shown": f"{bits} ({bits // 8:,} bytes)"})
    transport = transport_bits(args.messages, args.message_slots)
    summary = Table("transport", [
        Column("bits", "transport state: bits"), Column("bytes", "bytes", ".1f"),
        Column("goal_bytes", "goal: bytes at most"), Column("within", "within")],
        caption="A QP's transport state: the reliability engine's, but its counters, "
                "the acknowledgement intake's, and whether its timer started:")
    summary.add({"bits": transport, "bytes": transport / 8,
                 "goal_bytes": TRANSPORT_GOAL_BITS // 8,
                 "within": "yes" if transport <= TRANSPORT_GOAL_BITS else "no"})
    for shown in (table, summary):
        print(shown.markdown(), end="\n\n")
    report.write("qp_state", [table, summary], origin=origin)
    return 0 if transport <= TRANSPORT_GOAL_BITS else 1


if __name__ == "__main__":
    sys.exit(main())
