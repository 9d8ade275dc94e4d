"""``python -m sim.bench.connect_rate``: connections per second from the Soft-RoCE guest
to the simulated endpoint, the kernel's rdma_cm against the UDP CM's OPEN_QP.

Boots the guest against netdev once (:func:`sim.softroce.connect.run_connect`) and
runs this module in it with ``--guest``: ``--count`` times an OPEN_QP (its reply
timed) then CLOSE_QP through :class:`host.cm.CmClient`, then ``--count`` times a
connect through rdma_cm (:class:`host.rdma_connect.Connection`: address and route
resolved, REQ, REP, RTU; timed to ESTABLISHED) then ``rdma_disconnect``, and
CLOSE_QP when no DISCONNECTED follows within 2 s. The table gives the time per
connect and its inverse; ``make bench`` writes it to ``docs/generated/bench``. These
are simulation figures: the core runs under Verilator at some ten thousand cycles
a second and the guest under QEMU TCG, so they compare the two ways in the same setting
and say nothing of hardware rates.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Sequence

__all__ = ["guest_measure", "main"]

_PROG = "python -m sim.bench.connect_rate"
COUNT = 5
_DISCONNECT_WAIT = 2.0


def _host_ip(endpoint: str) -> str:
    """The guest's address towards ``endpoint`` (the source the CM sees)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((endpoint, 9))
        return probe.getsockname()[0]


def _free_udp_port() -> int:
    """A UDP port of 127.0.0.1 free now (netdev's and QEMU's ends of the link)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def guest_measure(endpoint: str, count: int) -> dict[str, list[float]]:
    """Seconds of each OPEN_QP and each rdma_cm connect, run in the guest."""
    from host.cm import CmClient
    from host.protocol import PathMtu, QpInfo
    from host.rdma_connect import ENDPOINT_PORT, Connection

    ip = _host_ip(endpoint)
    times: dict[str, list[float]] = {"udp": [], "rdma": []}
    with CmClient(endpoint, timeout=5.0) as cm:
        for number in range(count):
            started = time.monotonic()
            qp, _ = cm.open_qp(QpInfo(qpn=0x1000 + number, psn=number, ip=ip), PathMtu.MTU_1024)
            times["udp"].append(time.monotonic() - started)
            cm.close_qp(qp.qpn, ip)
        for _ in range(count):
            started = time.monotonic()
            connection = Connection(endpoint, ENDPOINT_PORT, 4096, 30.0)
            times["rdma"].append(time.monotonic() - started)
            try:
                if connection.disconnect(_DISCONNECT_WAIT).get("event") != "DISCONNECTED":
                    cm.close_qp(connection.rep_qpn, ip)
            finally:
                connection.close()
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=_PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=COUNT,
                        help=f"connects of each kind (default {COUNT})")
    parser.add_argument("--guest", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.guest:
        print(json.dumps(guest_measure(args.endpoint, args.count)), flush=True)
        return 0
    return _bench(args.count)


def _bench(count: int) -> int:
    from sim.softroce.connect import Step, run_connect
    from sim.softroce.image import cached_image
    from sim.softroce.tools import HostToolsError, ensure_host_tools
    from sim.softroce.vm import QEMU

    from . import report
    from .report import Column, Table

    origin = report.provenance()
    try:
        ensure_host_tools(needed=(QEMU,))
    except HostToolsError as error:
        print(f"{_PROG}: skipped: {error}")
        return 0
    if cached_image() is None and os.geteuid() != 0:
        print(f"{_PROG}: skipped: no Soft-RoCE image cached, and building one needs root "
              "(`python -m sim.softroce.guest build` as root once)")
        return 0
    local_port, remote_port = _free_udp_port(), _free_udp_port()
    result = run_connect([Step("rate", "sim.bench.connect_rate",
                               ("--guest", "--count", str(count)))],
                         name="connect-rate", local_port=local_port, remote_port=remote_port,
                         out=lambda line: None)
    step = result["rate"]
    if step.exit_code != 0 or not step.summary:
        print(f"{_PROG}: error: the guest's measurement failed (exit {step.exit_code}): "
              + " | ".join(step.log[-5:]), file=sys.stderr)
        return 1
    table = Table("connect_rate", [
        Column("way", "connect", align="left"), Column("count", "connects"),
        Column("mean", "mean ms", ".0f"), Column("min", "min ms", ".0f"),
        Column("max", "max ms", ".0f"), Column("rate", "connects/s", ".2f")],
        caption="Connects from the Soft-RoCE guest to netdev (simulation figures: the core "
                "under Verilator, the guest under QEMU TCG; not hardware rates).")
    print(table.caption)
    print(table.header())
    names = {"udp": "UDP CM OPEN_QP", "rdma": "rdma_cm rdma_connect"}
    for way, seconds in step.summary.items():
        mean = statistics.fmean(seconds)
        print(table.add({"way": names[way], "count": len(seconds), "mean": mean * 1e3,
                         "min": min(seconds) * 1e3, "max": max(seconds) * 1e3,
                         "rate": 1 / mean}))
    cycles = (result.netdev or {}).get("cycles")
    table.note = (f"netdev ran {cycles} cycles in {result.seconds:.0f} s, the guest's boot "
                  "included.")
    print(table.note)
    report.write("connect_rate", [table], origin=origin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
