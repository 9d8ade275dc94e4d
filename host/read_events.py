"""``python -m host.read_events``: read the example event source's fragments from the
host's ring through the receive API, and check each against :mod:`host.fragments`.

The endpoint runs the example source (``make bitstream SOURCE=example``, or
``python -m sim.netdev --source example`` in simulation): once this program has opened
a QP through the CM, whose OPEN_QP carries the ring's address and rkey, the source
writes event ``k``'s fragment into ring slot ``k mod slots`` with an RDMA WRITE with
immediate ``k``. Each completion hands over one
fragment (:class:`host.receive.Receiver` with ``start=False``: the generator is not
started); it is checked against the format by its immediate, and its receive is
re-posted (so the source, which keeps at most ``slots`` fragments in flight, never
overwrites a slot still being read). It prints one line per ``--every`` events and a
summary; the exit code is 0 only when all ``--count`` fragments arrived intact.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from typing import TextIO

from . import fragments
from .backend import BackendFactory, VerbsOptions
from .cli import parse_bytes, receiver_options
from .cm import CmClient
from .errors import HostError
from .protocol import CM_PORT
from .receive import Receiver, RunConfig

__all__ = ["read_events", "build_parser", "main"]

_PROG = "host.read_events"


def read_events(receiver: Receiver) -> Iterator[tuple[int, fragments.Fragment]]:
    """Every fragment that lands, in order per QP, as ``(qp, header)`` once it has been
    checked byte for byte against the fragment of the event its immediate names; one
    that differs is counted as an error of its QP (``receiver.qps[qp]``) and skipped."""
    for message in receiver.messages():
        qp = receiver.qps[message.qp]
        event = message.k if message.imm is None else message.imm
        try:
            header = fragments.check(message.data, event)
        except fragments.FragmentError as error:
            qp.fail(f"fragment of event {event} (slot at byte {message.offset}): {error}")
            continue
        yield message.qp, header


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {_PROG}",
                                     description="Read and check the example event source's "
                                                 "fragments from a ring, through the receive "
                                                 "API.")
    receiver_options(parser)
    parser.add_argument("--size", type=parse_bytes, default=4096, metavar="BYTES",
                        help="bytes of a fragment, as the source was built (default 4096)")
    parser.add_argument("--slots", type=int, default=64, metavar="N",
                        help="fragments the ring holds, as the source was told (default 64)")
    parser.add_argument("--count", type=int, default=1000, metavar="N",
                        help="fragments to read (default 1000)")
    parser.add_argument("--every", type=int, default=0, metavar="N",
                        help="print every N-th event's header (default: none)")
    return parser


def main(argv: Sequence[str] | None = None, *, backend: BackendFactory | None = None,
         stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run ``python -m host.read_events`` with ``argv``; returns the exit code."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        fragments.check_size(args.size)
        config = RunConfig(write=True, immediate=True, size=args.size, count=args.count,
                           ring=args.slots * args.size, start=False, stall=args.stall,
                           check="none")
    except ValueError as error:
        print(f"{_PROG}: error: {error}", file=err)
        return 2
    if backend is None:
        from .verbs import PyverbsBackend
        backend = PyverbsBackend
    address, _, port = args.endpoint.partition(":")
    seen, first, last = 0, None, None
    try:
        with CmClient(address, cm_port=int(port or CM_PORT), timeout=args.timeout) as cm, \
                Receiver(config, backend(VerbsOptions(device=args.device)), cm,
                         notice=lambda text: print(f"{_PROG}: {text}", file=err)) as receiver:
            print(f"{_PROG}: the ring is at {receiver.qps[0].host.base_addr:#x} (OPEN_QP told "
                  f"the endpoint)", file=err)
            for _, header in read_events(receiver):
                seen += 1
                first = header if first is None else first
                last = header
                if args.every and header.event % args.every == 0:
                    print(f"event {header.event}: timestamp {header.timestamp}, "
                          f"{header.size} bytes", file=out)
            qp = receiver.qps[0]
    except HostError as error:
        print(f"{_PROG}: error: {error}", file=err)
        return 1
    span = "" if first is None else (f", events {first.event}-{last.event}, timestamps "
                                     f"{first.timestamp}-{last.timestamp}")
    print(f"{seen} of {args.count} fragments intact{span}, {qp.errors} errors", file=out)
    if qp.first_error:
        print(f"{_PROG}: error: {qp.first_error}", file=err)
    return 0 if seen == args.count and qp.first_error is None else 1


if __name__ == "__main__":
    sys.exit(main())
