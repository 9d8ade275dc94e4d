"""``python -m host.bench_checker``: the data checker's speed against a plain comparison.

Per message size, a ring of about :data:`RING_BYTES` holds generator messages
k = 0, 1, ... back to back (as a WRITE ring after one lap), built with numpy and
spot-checked against ``protocol.generator_payload``. The table gives, best of
:data:`REPEATS` rounds (each round times all three, one after the other):

* the checker's GB/s (:meth:`host.checker.Checker.check_messages` over the whole
  ring, one thread and then ``threads`` threads),
* the GB/s of ``numpy.array_equal`` of the same ring against an equal copy, both
  viewed as ``<u8`` words (one call over the whole ring: the plain comparison at
  its best, reading two buffers),
* their ratio (one checker thread against ``array_equal``).

GB/s are 10**9 bytes of payload per second. The numbers depend on the machine and
on what else runs on it; the header names the CPU. The table also goes to
``docs/generated/bench/checker.{md,json}`` (:mod:`sim.bench.report`).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

from .checker import Checker
from .protocol import generator_payload

__all__ = ["RING_BYTES", "REPEATS", "SIZES", "ring_of", "measure", "main"]

RING_BYTES = 64 << 20
REPEATS = 20
SIZES = (64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20)


def ring_of(size: int, ring_bytes: int = RING_BYTES) -> tuple[np.ndarray, int]:
    """A byte array of whole generator messages of ``size`` bytes (``size`` a multiple
    of 8), k = 0 .. count - 1 back to back, and the count."""
    count = max(1, ring_bytes // size)
    words = size // 8
    ring = (np.arange(count, dtype="<u8")[:, None] << np.uint64(32)) \
        + np.arange(words, dtype="<u8")[None, :]
    data = ring.reshape(-1).view(np.uint8)
    for k in (0, count // 2, count - 1):
        assert data[k * size:(k + 1) * size].tobytes() == generator_payload(k, size)
    return data, count


def _seconds(action: Callable[[], object]) -> float:
    begin = time.perf_counter()
    action()
    return time.perf_counter() - begin


def measure(size: int, *, threads: int, ring_bytes: int = RING_BYTES,
            repeats: int = REPEATS) -> tuple[float, float, float]:
    """(checker GB/s with one thread, with ``threads`` threads, array_equal GB/s) for
    messages of ``size`` bytes: the best of ``repeats`` rounds, each round timing
    all three one after the other, so a busy machine slows them alike."""
    data, count = ring_of(size, ring_bytes)
    buffer = memoryview(data)
    words, copy_words = data.view("<u8"), data.copy().view("<u8")
    checkers = [Checker(size, slots=count, threads=workers) for workers in (1, threads)]
    try:
        for checker in checkers:
            assert checker.check_messages(buffer, 0, 0, count) == []
        assert np.array_equal(words, copy_words)
        actions = [*(lambda checker=checker: checker.check_messages(buffer, 0, 0, count)
                     for checker in checkers),
                   lambda: np.array_equal(words, copy_words)]
        best = [float("inf")] * len(actions)
        for _ in range(repeats):
            best = [min(old, _seconds(action)) for old, action in zip(best, actions,
                                                                       strict=True)]
    finally:
        for checker in checkers:
            checker.close()
    one, many, plain = (data.nbytes / seconds / 1e9 for seconds in best)
    return one, many, plain


def machine() -> str:
    """The CPU model and core count, the Python and numpy versions."""
    model = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo", encoding="ascii", errors="replace"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{model}, {os.cpu_count()} CPUs; Python {platform.python_version()}, "
            f"numpy {np.__version__}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m host.bench_checker",
                                     description="The data checker's GB/s against "
                                                 "numpy.array_equal, per message size.")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="checker threads for the second column (default: the CPUs)")
    parser.add_argument("--ring", type=int, default=RING_BYTES, metavar="BYTES",
                        help=f"bytes of messages per size (default {RING_BYTES})")
    parser.add_argument("--repeats", type=int, default=REPEATS,
                        help=f"best of this many passes (default {REPEATS})")
    args = parser.parse_args(argv)
    from sim.bench import report
    from sim.bench.report import Column, Table

    origin = report.provenance()
    table = Table("checker", [
        Column("size", "message"), Column("one", "checker GB/s (1 thread)", ".2f"),
        Column("many", f"checker GB/s ({args.threads} threads)", ".2f"),
        Column("plain", "array_equal GB/s", ".2f"), Column("ratio", "ratio (1 thread)", ".2f")],
        caption=f"machine: {machine()}; load average {os.getloadavg()[0]:.1f} at the start; "
                f"ring {args.ring >> 20} MiB, best of {args.repeats}")
    print(table.caption)
    print(table.header())
    for size in SIZES:
        one, many, plain = measure(size, threads=args.threads, ring_bytes=args.ring,
                                   repeats=args.repeats)
        print(table.add({"size": size, "threads": args.threads, "one": one, "many": many,
                         "plain": plain, "ratio": one / plain}), flush=True)
    report.write("checker", [table], origin=origin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
