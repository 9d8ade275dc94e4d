"""``python -m host.dump``: write every message of a run to a file, through the receive API.

The example of user code on :class:`host.receive.Receiver`: it pairs ``--qps``
host QPs with the endpoint, starts the generator (``--no-start``: the endpoint's
user logic sends), and writes each batch of landed messages straight from the
registered buffer to ``<--out>.qp<i>`` (one ``write`` per batch of back-to-back
messages, no copy in Python), then releases the batch. Each file ends up holding
its QP's messages in order. Nothing is checked but what the receiver checks (the
order, the count, each immediate, a lapped ring).

It prints a JSON summary: per QP its file, bytes, SHA-256 and perftest-style
figures with the endpoint's final STATUS, and the total figures. Errors print
``host.dump: error: <what to do>`` and exit 1, as qp-server's.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

from .backend import BackendFactory, VerbsOptions
from .cli import parse_bytes, receiver_options
from .cm import CmClient
from .errors import HostError
from .figures import Figures
from .protocol import CM_PORT
from .receive import Receiver, RunConfig
from .run import qp_figures

__all__ = ["build_parser", "main", "dump"]

_PROG = "host.dump"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {_PROG}",
                                     description="Write every message of a generator run to "
                                                 "one file per QP, through the receive API.")
    receiver_options(parser)
    operation = parser.add_mutually_exclusive_group()
    operation.add_argument("--write", dest="write", action="store_true", default=True,
                           help="RDMA WRITE into a buffer ring (default)")
    operation.add_argument("--send", dest="write", action="store_false",
                           help="SEND into posted receives")
    parser.add_argument("--imm", action="store_true", help="with immediate data")
    parser.add_argument("--size", type=parse_bytes, default=4096, metavar="BYTES")
    parser.add_argument("--count", type=int, default=1000, metavar="N",
                        help="messages per QP (default 1000)")
    parser.add_argument("--qps", type=int, default=1, metavar="N")
    parser.add_argument("--receives", type=int, default=128, metavar="N",
                        help="receives kept posted per QP (default 128)")
    parser.add_argument("--ring", type=parse_bytes, default=0, metavar="BYTES",
                        help="WRITE ring per QP (default: the run, up to 64M)")
    parser.add_argument("--no-start", action="store_true",
                        help="only pair the QPs and write what user logic sends")
    parser.add_argument("--out", type=Path, required=True, metavar="PREFIX",
                        help="write QP i's messages to PREFIX.qp<i>")
    return parser


def dump(receiver: Receiver, files: Sequence[BinaryIO]) -> None:
    """Write every batch ``receiver`` yields to its QP's file, then release it."""
    for batch in receiver.batches():
        files[batch.qp].write(batch.view)
        batch.release()


def main(argv: Sequence[str] | None = None, *, backend: BackendFactory | None = None,
         stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run ``python -m host.dump`` with ``argv``; returns the exit code. ``backend``
    makes the verbs backend (default :class:`host.verbs.PyverbsBackend`)."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    args = build_parser().parse_args(argv)
    config = RunConfig(write=args.write, immediate=args.imm, size=args.size, count=args.count,
                       qps=args.qps, receives=args.receives, ring=args.ring,
                       start=not args.no_start, stall=args.stall, check="none")
    if backend is None:
        from .verbs import PyverbsBackend
        backend = PyverbsBackend
    address, _, port = args.endpoint.partition(":")
    paths = [args.out.with_name(f"{args.out.name}.qp{index}") for index in range(args.qps)]
    try:
        files = [path.open("wb", buffering=0) for path in paths]
        try:
            with CmClient(address, cm_port=int(port or CM_PORT), timeout=args.timeout) as cm, \
                    Receiver(config, backend(VerbsOptions(device=args.device)), cm,
                             notice=lambda text: print(f"{_PROG}: {text}", file=err)
                             ) as receiver:
                dump(receiver, files)
                qps = receiver.qps
        finally:
            for file in files:
                file.close()
    except HostError as error:
        print(f"{_PROG}: error: {error}", file=err)
        return 1
    except OSError as error:
        print(f"{_PROG}: error: cannot write {error.filename}: {error.strerror}", file=err)
        return 1
    per_qp = []
    for qp, path in zip(qps, paths, strict=True):
        per_qp.append({
            "index": qp.index, "endpoint_qpn": qp.endpoint.qpn if qp.endpoint else None,
            "file": str(path), "bytes": path.stat().st_size,
            "sha256": _sha256(path), "messages": qp.landed,
            "errors": qp.errors, "unchecked": qp.unchecked, "missing": qp.missing,
            "first_error": qp.first_error,
            "status": dataclasses.asdict(qp.status) if qp.status else None,
            "figures": qp_figures(qp).to_json()})
    ok = all(qp.landed == config.count and qp.first_error is None for qp in qps)
    print(json.dumps({"ok": ok, "operation": "write" if config.write else "send",
                      "immediate": config.immediate, "size": config.size,
                      "count": config.count, "qps": len(qps),
                      "figures": Figures.total(qp_figures(qp) for qp in qps).to_json(),
                      "qp": per_qp}), file=out)
    for qp in qps:
        if qp.first_error:
            print(f"{_PROG}: error: {qp.name}: {qp.first_error}", file=err)
    return 0 if ok else 1


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


if __name__ == "__main__":
    sys.exit(main())
