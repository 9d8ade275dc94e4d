"""``python -m sim.softroce.demo``: the simulated endpoint against Linux Soft-RoCE.

Starts ``python -m sim.netdev`` (the whole core under Verilator, as a network
device on a UDP socket) and boots the Soft-RoCE guest (:mod:`sim.softroce.vm`)
with its eth0 on the other end of that socket. In the guest, ``qp-server``
(rdma_rxe through pyverbs) runs the endpoint's generator once per run of
:data:`DEFAULT_RUNS` — RDMA WRITE, WRITE with immediate, SEND and SEND with
immediate, single- and multi-packet messages at path MTU 1024 and 4096, two
QPs at once, and a close and reopen of the same host QP (``--repeat``) — and
checks every byte. Then netdev is stopped (SIGTERM) and its counters printed.

With ``--example`` netdev runs the example event source beside the core
(``python -m sim.netdev --source example``: the design of ``make bitstream
SOURCE=example``) and the guest runs ``python -m host.read_events``, which opens a
QP through the receive API, and the source writes its fragments into the ring that
OPEN_QP announced; every fragment is checked against :mod:`host.fragments`
(:data:`EXAMPLE_RUNS`).

With ``--ports 2`` netdev runs the two cores of the two-cage board top
(``python -m sim.netdev --ports 2``), the guest gets a second NIC (eth1,
10.77.1.1/24, with ``rxe1``) on port 2's frame channel, and each run of
:data:`TWO_PORT_RUNS` — a WRITE, a WRITE with immediate and a SEND — is one
``qp-server`` with both endpoints (``--endpoint 10.77.0.2 --endpoint 10.77.1.2
--device rxe0 --device rxe1``): each QP of the run on each port, both ports at
once. Every check below then holds per port, and the report gives each port's
runs and counters and the total.

The demo checks that every run (every pass of a repeated run) is ``ok`` and
that each endpoint QP's final STATUS agrees with what ``qp-server`` saw
(messages == count, bytes == count × size). With ``--faults`` (passed to
netdev: drops, duplicates, reordering, corruption on the link) it also
requires that the endpoint retransmitted. It exits 0 when all holds, 1 with the
reasons otherwise, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from boards.vcu118_top import PORT2_ADDRESS
from host.figures import Figures, figures_table
from host.protocol import generator_payload

from .image import CACHE, Image, ImageError, build_image, cached_image
from .tools import HostToolsError, ensure_host_tools
from .vm import (
    DEFAULT_IP2,
    DEFAULT_LOCAL_PORT,
    DEFAULT_LOCAL_PORT2,
    DEFAULT_REMOTE_PORT,
    DEFAULT_REMOTE_PORT2,
    QEMU,
    GuestConfig,
    GuestError,
    SecondNic,
    run_script,
)

__all__ = ["CMS", "DEFAULT_RUNS", "EXAMPLE_RUNS", "LISTEN_PORT", "TWO_PORT_RUNS", "DemoRun",
           "RunCheck", "DemoResult", "build_parser", "check_run", "example_netdev_options",
           "expected_sha256", "guest_script", "main", "port_checks", "port_totals", "run_demo",
           "simulation_figures", "guest_and_netdev", "port_free"]

_PROG = "python -m sim.softroce.demo"
ENDPOINT_IP, ENDPOINT_MAC = "10.77.0.2", "02:00:00:00:00:02"
#: The two-cage board's second port (its defaults); the guest's eth1 is in its subnet.
ENDPOINT2_IP, ENDPOINT2_MAC = PORT2_ADDRESS["ip"], PORT2_ADDRESS["mac"]
#: Each port's endpoint and the guest's RDMA device on the NIC cabled to it.
PORT_ENDPOINTS = ((ENDPOINT_IP, "rxe0"), (ENDPOINT2_IP, "rxe1"))
#: qp-server's CM reply timeout and stall limit: the simulation runs some 10,000
#: cycles per second, so a CM round trip takes tenths of a second and a run
#: with retransmissions many seconds.
QP_SERVER_OPTIONS = ("--timeout", "5", "--stall", "120")
#: qp-server in the guest spins briefly, then sleeps on the completion channel
#: (``--poll hybrid``): a vCPU that spins under TCG takes a host CPU from the simulated
#: endpoint it waits for.
GUEST_POLL = ("--poll", "hybrid")
#: Each qp-server run is stopped (SIGTERM: it closes its QPs) after this long.
RUN_LIMIT_S = 240
_UP = "is up"
_BEGIN, _RESULT, _LOG = "demo-begin", "demo-result", "demo-log"


#: The ways a run's QPs are paired: the endpoint's UDP CM (OPEN_QP), the guest's
#: rdma_cm connecting to the endpoint (``--cm rdma``), or the endpoint connecting to
#: the guest's rdma_cm listener (``--cm rdma --listen``, on :data:`LISTEN_PORT`).
CMS = ("udp", "rdma", "listen")
LISTEN_PORT = 18515


@dataclasses.dataclass(frozen=True)
class DemoRun:
    """One ``qp-server`` run in the guest, its QPs paired as ``cm`` (:data:`CMS`) says;
    ``receive_api``: ``python -m host.dump`` instead, a user of the receive API that
    writes each QP's messages to a file; ``slots``: ``python -m host.read_events``
    instead, which reads ``count`` fragments of ``size`` bytes of the example event
    source from a ring of ``slots`` slots."""
    write: bool
    immediate: bool
    size: int
    count: int
    mtu: int | None = None
    qps: int = 1
    repeat: int = 1
    receive_api: bool = False
    slots: int = 0
    cm: str = "udp"

    def __post_init__(self) -> None:
        if self.cm not in CMS:
            raise ValueError(f"cm must be one of {', '.join(CMS)}, not {self.cm!r}")
        if self.cm != "udp" and (self.receive_api or self.slots or self.repeat > 1):
            raise ValueError("an rdma_cm run is one pass of qp-server")
        if self.cm == "rdma" and self.mtu is not None:
            raise ValueError("rdma_connect takes the path MTU from the guest's port")
        if self.size < 0 or self.count < 1 or self.qps < 1 or self.repeat < 1:
            raise ValueError(f"size must be >= 0 and count, qps, repeat >= 1: {self}")
        if self.mtu not in (None, 256, 512, 1024, 2048, 4096):
            raise ValueError(f"mtu must be a path MTU (256..4096) or None, not {self.mtu!r}")
        if (self.receive_api or self.slots) and (self.mtu is not None or self.repeat > 1):
            raise ValueError("a receive-API run takes the port's MTU and one pass")
        if self.slots and (not self.write or not self.immediate or self.qps > 1
                           or self.receive_api):
            raise ValueError("the event source's fragments are WRITEs with immediate on one "
                             "QP")

    @property
    def read_events(self) -> bool:
        """The guest reads the example event source (``host.read_events``)."""
        return self.slots > 0

    @property
    def operation(self) -> str:
        return ("WRITE" if self.write else "SEND") + ("+IMM" if self.immediate else "")

    @property
    def program(self) -> str:
        """The module the guest runs."""
        if self.read_events:
            return "host.read_events"
        return "host.dump" if self.receive_api else "host.cli"

    def arguments(self) -> list[str]:
        """The program's arguments for this run (endpoint, timeouts and ``--json`` or
        ``--out`` added by :func:`guest_script`)."""
        if self.read_events:
            return ["--size", str(self.size), "--slots", str(self.slots), "--count",
                    str(self.count)]
        argv = ["--write" if self.write else "--send"]
        argv += ["--imm"] * self.immediate
        if self.cm != "udp":
            argv += ["--cm", "rdma"]
        if self.cm == "listen":
            argv += ["--listen", str(LISTEN_PORT)]
        argv += ["--size", str(self.size), "--count", str(self.count)]
        if self.mtu is not None:
            argv += ["--mtu", str(self.mtu)]
        if self.qps > 1:
            argv += ["--qps", str(self.qps)]
        if self.repeat > 1:
            argv += ["--repeat", str(self.repeat)]
        if self.program == "host.cli":
            argv += GUEST_POLL
        return argv

    def label(self) -> str:
        kind = ("read_events: " if self.read_events
                else "receive API: " if self.receive_api else "")
        return kind + " ".join(self.arguments())


#: The demo's runs: every operation, one- and multi-packet messages at path MTU
#: 1024 and 4096 (the guest's eth0 has MTU 9000, so its active MTU is 4096), two
#: QPs at once, a close and reopen of the same host QP, one pass with two QPs
#: through the receive API (``host.dump``), and QPs connected with rdma_cm both ways
#: (each disconnected at its end; the second connects again after the first).
DEFAULT_RUNS = (
    DemoRun(write=True, immediate=False, size=64, count=8),
    DemoRun(write=True, immediate=True, size=3000, count=4, mtu=1024),
    DemoRun(write=False, immediate=False, size=10000, count=3, mtu=4096),
    DemoRun(write=False, immediate=True, size=64, count=6, qps=2),
    DemoRun(write=True, immediate=False, size=10000, count=2, mtu=4096, qps=2),
    DemoRun(write=False, immediate=False, size=3000, count=3, mtu=1024),
    DemoRun(write=True, immediate=True, size=512, count=4, repeat=2),
    DemoRun(write=False, immediate=False, size=4096, count=8, qps=2, receive_api=True),
    DemoRun(write=True, immediate=True, size=3000, count=4, cm="rdma"),
    DemoRun(write=False, immediate=False, size=2000, count=3, mtu=1024, cm="listen"),
)


#: ``--example``: ``host.read_events`` reads 24 fragments of 1000 bytes (the size the
#: cocotb bench's EventCore is built with, so its Verilator build serves) from a ring of
#: 8 slots.
EXAMPLE_RUNS = (DemoRun(write=True, immediate=True, size=1000, count=24, slots=8),)


#: ``--ports 2``: a WRITE, a WRITE with immediate over three packets at path MTU 1024 and a
#: SEND of three packets at 4096, each on both ports at once.
TWO_PORT_RUNS = (
    DemoRun(write=True, immediate=False, size=64, count=8),
    DemoRun(write=True, immediate=True, size=3000, count=4, mtu=1024),
    DemoRun(write=False, immediate=False, size=10000, count=3, mtu=4096),
)


def example_netdev_options(run: DemoRun) -> list[str]:
    """netdev's options for ``run`` of ``host.read_events``: the example event source,
    with the run's fragment size, slots and count."""
    return ["--source", "example", "--fragment-bytes", str(run.size), "--slots",
            str(run.slots), "--events", str(run.count)]


def guest_script(runs: Sequence[DemoRun], *, run_limit: int = RUN_LIMIT_S,
                 ports: int = 1) -> str:
    """The shell script the guest runs: qp-server (or host.dump, host.read_events) once
    per run, its JSON summary (read_events: its summary line) on one ``demo-result <n>
    <exit code> <json>`` line and its messages on ``demo-log <n>: ...`` lines. With
    ``ports`` 2 each qp-server run has both ports' endpoints, each on its own device."""
    if ports not in (1, 2):
        raise ValueError(f"ports must be 1 or 2, not {ports!r}")
    if ports == 2 and any(run.program != "host.cli" for run in runs):
        raise ValueError("two ports run qp-server only (not the receive API)")
    endpoint = ["--endpoint", ENDPOINT_IP]
    if ports == 2:
        endpoint = [option for ip, device in PORT_ENDPOINTS for option in ("--endpoint", ip)]
        endpoint += [option for ip, device in PORT_ENDPOINTS for option in ("--device", device)]
    lines = ["cd /mnt/repo 2>/dev/null || true"]
    for number, run in enumerate(runs):
        output = (["--out", f"/tmp/dump-{number}"] if run.receive_api
                  else [] if run.read_events else ["--json"])
        command = shlex.join(["timeout", "-s", "TERM", str(run_limit), "python3", "-m",
                              run.program, *endpoint, *QP_SERVER_OPTIONS,
                              *run.arguments(), *output])
        lines += [
            f"echo {_BEGIN} {number}",
            f"{command} > /tmp/run-{number}.json 2> /tmp/run-{number}.err",
            f"code=$?; sed 's/^/{_LOG} {number}: /' /tmp/run-{number}.err",
            f'echo "{_RESULT} {number} $code $(tr -d \'\\n\' < /tmp/run-{number}.json)"',
        ]
    return "\n".join(lines) + "\n"


@dataclasses.dataclass
class RunCheck:
    """What one run (one pass of it) showed, and what was wrong with it."""
    run: DemoRun
    number: int
    exit_code: int | None = None
    summary: dict | None = None
    log: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    lines: list[str] = dataclasses.field(default_factory=list)
    retransmitted: int = 0
    output: str = ""            # host.read_events: its summary line
    port: int = 0               # with two ports: 1 or 2, this check's part of the run

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def where(self) -> str:
        """``port N (IP)`` of a two-port run's part, else empty."""
        return f"port {self.port} ({PORT_ENDPOINTS[self.port - 1][0]})" if self.port else ""


def port_checks(check: RunCheck) -> list[RunCheck]:
    """A two-port run (qp-server's JSON: each endpoint's run and the total) as one check
    per port. A port's exit code is qp-server's, or 0 when its part was ok and another
    port's failed; its log is qp-server's lines that name its endpoint."""
    summary = check.summary or {}
    entries = {entry.get("endpoint"): entry for entry in summary.get("endpoints", [])}
    checks = []
    for port, (ip, _) in enumerate(PORT_ENDPOINTS, 1):
        entry = entries.get(ip)
        own_ok = entry is not None and entry.get("ok") is True
        exit_code = 0 if own_ok and summary.get("ok") is False else check.exit_code
        log = [line for line in check.log if f" {ip}: " in line] or check.log
        checks.append(RunCheck(check.run, check.number, exit_code=exit_code, summary=entry,
                               log=log, port=port))
    return checks


def _passes(summary: dict) -> list[dict]:
    return summary.get("passes") or [summary]


def check_run(check: RunCheck) -> None:
    """Fill ``check.problems`` and ``check.lines`` from its exit code and summary."""
    run = check.run
    name = f"run {check.number} ({run.label()})" + (f" on {check.where}" if check.port else "")
    if run.read_events:
        _check_events(check, name)
        return
    if check.summary is None:
        check.problems.append(f"{name}: qp-server printed no JSON summary (exit "
                              f"{check.exit_code}); its messages: "
                              + (" | ".join(check.log[-3:]) or "none"))
        return
    if check.exit_code != 0:
        check.problems.append(f"{name}: qp-server exited {check.exit_code}: "
                              f"{check.summary.get('first_error') or check.summary.get('error')}")
    if check.summary.get("ok") is not True:
        check.problems.append(f"{name}: not ok: {check.summary.get('first_error')}")
    if run.receive_api:
        _check_dump(check, name)
        return
    passes = _passes(check.summary)
    if len(passes) != run.repeat:
        check.problems.append(f"{name}: {len(passes)} of {run.repeat} passes ran")
    endpoint_psns: dict[int, set[int]] = {}
    for one in passes:
        where = f"{name}, pass {one.get('pass', 1)}" if run.repeat > 1 else name
        qps = one.get("qp", [])
        if len(qps) != run.qps:
            check.problems.append(f"{where}: {len(qps)} of {run.qps} QPs paired")
        packets = nbytes = retransmitted = 0
        mtus = set()
        for qp in qps:
            status = qp.get("status") or {}
            label = f"{where}, endpoint QP {qp.get('endpoint_qpn')}"
            if qp.get("messages_ok") != run.count:
                check.problems.append(f"{label}: {qp.get('messages_ok')} of {run.count} "
                                      f"messages checked: {qp.get('first_error')}")
            if status.get("messages") != run.count:
                check.problems.append(f"{label}: STATUS says {status.get('messages')} "
                                      f"messages, qp-server checked {run.count}")
            if status.get("bytes") != run.count * run.size:
                check.problems.append(f"{label}: STATUS says {status.get('bytes')} bytes, "
                                      f"expected {run.count} x {run.size} = "
                                      f"{run.count * run.size}")
            if run.mtu is not None and qp.get("path_mtu") != run.mtu:
                check.problems.append(f"{label}: path MTU {qp.get('path_mtu')}, asked for "
                                      f"{run.mtu}")
            endpoint_psns.setdefault(qp.get("index", 0), set()).add(qp.get("endpoint_psn"))
            mtus.add(qp.get("path_mtu"))
            packets += status.get("packets", 0)
            nbytes += status.get("bytes", 0)
            retransmitted += status.get("retransmitted", 0)
        check.retransmitted += retransmitted
        mtu = "/".join(str(value) for value in sorted(mtus, key=str))
        repeat = f" pass {one.get('pass', 1)}/{run.repeat}" if run.repeat > 1 else ""
        verdict = "ok" if one.get("ok") else "FAILED"
        port = f"port {check.port}  " if check.port else ""
        check.lines.append(
            f"{port}{run.operation:<10} {run.size:>6} B  MTU {mtu:>4}  QPs {len(qps)}{repeat:<12}"
            f" {verdict:<6} {one.get('messages', 0):>3}/{run.count * run.qps} messages "
            f"{one.get('gbytes_per_s', 0.0):.6f} GB/s   STATUS packets {packets}, bytes "
            f"{nbytes}, retransmitted {retransmitted}")
    if run.repeat > 1:
        for index, psns in endpoint_psns.items():
            if len(psns) != len(passes):
                check.problems.append(f"{name}: QP {index}'s endpoint first PSNs over "
                                      f"{len(passes)} passes are {sorted(psns, key=str)}: "
                                      "the endpoint did not hand out a new PSN")


def expected_sha256(run: DemoRun) -> str:
    """SHA-256 of one QP's messages of ``run`` back to back, from the golden model."""
    digest = hashlib.sha256()
    for k in range(run.count):
        digest.update(generator_payload(k, run.size))
    return digest.hexdigest()


def _check_dump(check: RunCheck, name: str) -> None:
    """A receive-API run: each QP's file holds its messages in order (SHA-256 against
    the golden model), and the endpoint's STATUS agrees."""
    run, summary = check.run, check.summary
    assert summary is not None
    if summary.get("ok") is not True:
        check.problems.append(f"{name}: not ok: " + "; ".join(
            str(qp.get("first_error")) for qp in summary.get("qp", [])))
    qps = summary.get("qp", [])
    if len(qps) != run.qps:
        check.problems.append(f"{name}: {len(qps)} of {run.qps} QPs paired")
    want = expected_sha256(run)
    retransmitted = 0
    for qp in qps:
        status = qp.get("status") or {}
        label = f"{name}, endpoint QP {qp.get('endpoint_qpn')}"
        if qp.get("bytes") != run.count * run.size or qp.get("sha256") != want:
            check.problems.append(f"{label}: its file has {qp.get('bytes')} bytes, SHA-256 "
                                  f"{qp.get('sha256')}; expected {run.count * run.size} bytes, "
                                  f"{want}")
        if status.get("messages") != run.count or status.get("bytes") != run.count * run.size:
            check.problems.append(f"{label}: STATUS says {status.get('messages')} messages, "
                                  f"{status.get('bytes')} bytes; the file has {run.count}")
        retransmitted += status.get("retransmitted", 0)
    check.retransmitted += retransmitted
    figures = summary.get("figures", {})
    check.lines.append(
        f"{run.operation:<10} {run.size:>6} B  MTU    -  QPs {len(qps)} receive API "
        f"{'ok' if check.ok else 'FAILED':<6} {figures.get('messages', 0):>3}/"
        f"{run.count * run.qps} messages to files, SHA-256 "
        f"{'matches' if all(qp.get('sha256') == want for qp in qps) else 'differs'}, "
        f"retransmitted {retransmitted}")


def _check_events(check: RunCheck, name: str) -> None:
    """A ``host.read_events`` run: exit 0, every fragment intact, no error."""
    run = check.run
    intact = f"{run.count} of {run.count} fragments intact"
    if check.exit_code != 0 or not check.output.startswith(intact) \
            or not check.output.endswith(", 0 errors"):
        check.problems.append(f"{name}: exit {check.exit_code}, {check.output!r}; its "
                              "messages: " + (" | ".join(check.log[-3:]) or "none"))
    check.lines.append(f"{run.operation:<10} {run.size:>6} B  read_events "
                       f"{'ok' if check.ok else 'FAILED':<6} {check.output}")


def simulation_figures(checks: Sequence[RunCheck]) -> list[str]:
    """The perftest-style table of every run (the last pass), and per QP of the
    receive-API runs, from the summaries' figures."""
    rows = []
    for check in checks:
        if check.summary is None or "figures" not in check.summary:
            continue
        label = (f"run {check.number} {check.run.operation} {check.run.size} B"
                 + (f" port {check.port}" if check.port else ""))
        if check.run.receive_api:
            for qp in check.summary.get("qp", []):
                rows.append((f"{label} QP {qp.get('index')}",
                             Figures.from_json(qp.get("figures", {}))))
        rows.append((label + (" all" if check.run.qps > 1 else ""),
                     Figures.from_json(check.summary["figures"])))
    return figures_table(rows, title="run") if rows else []


def port_totals(checks: Sequence[RunCheck]) -> list[str]:
    """Each port's runs, messages and bytes (every message byte-exact, its STATUS
    agreeing, when its runs are ok), and both ports' together."""
    lines = []
    groups = {check.where: [other for other in checks if other.where == check.where]
              for check in checks}
    for label, mine in [*groups.items(), ("both ports", list(checks))]:
        passes = [one for check in mine if check.summary for one in _passes(check.summary)]
        messages = sum(one.get("messages", 0) for one in passes)
        nbytes = sum(one.get("bytes", 0) for one in passes)
        ok = sum(check.ok for check in mine)
        lines.append(f"{label}: {ok} of {len(mine)} runs ok, {messages} messages, {nbytes} "
                     "bytes" + (", every byte checked and every STATUS agreeing"
                                if ok == len(mine) else ""))
    return lines


@dataclasses.dataclass
class DemoResult:
    checks: list[RunCheck]
    netdev: dict | None
    problems: list[str]
    seconds: float
    netdev2: dict | None = None     # with two ports: port 2's netdev summary

    @property
    def ok(self) -> bool:
        return not self.problems


class Netdev:
    """``python -m sim.netdev`` as a subprocess; its output goes to ``log_path``, its
    ``netdev:`` lines up to "is up" also to ``show``."""

    def __init__(self, arguments: Sequence[str], log_path: Path, *,
                 show: Callable[[str], None], ports: int = 1) -> None:
        self._arguments = list(arguments)
        self._ports = ports           # "is up" lines to wait for: one per port
        self._ups = 0
        self._log_path = log_path
        self._show = show
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._up = threading.Event()
        self._lines: list[str] = []

    def start(self, timeout: float) -> None:
        """Start netdev and wait until the endpoint is up (the first start converts and
        compiles the design: minutes)."""
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "sim.netdev", *self._arguments], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True, name="netdev-output")
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not self._up.wait(0.5):
            if self._process.poll() is not None:
                self._reader.join(5)
                raise RuntimeError(f"netdev exited (code {self._process.returncode}) before "
                                   f"the endpoint was up; its log {self._log_path}:\n"
                                   + "\n".join(self._lines[-15:]))
            if time.monotonic() > deadline:
                raise RuntimeError(f"netdev did not bring the endpoint up within {timeout:g} s;"
                                   f" its log {self._log_path}")

    def stop(self, timeout: float = 120.0) -> int | None:
        """SIGTERM (netdev writes its summary and exits); SIGKILL after ``timeout``."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._reader is not None:
            self._reader.join(10)
        return process.returncode

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        with self._log_path.open("w", encoding="utf-8") as log:
            for line in self._process.stdout:
                line = line.rstrip("\n")
                log.write(line + "\n")
                log.flush()
                self._lines = [*self._lines[-99:], line]
                if line.startswith("netdev:") and not self._up.is_set():
                    self._show(line)        # after "is up", the report has the counters
                    self._ups += _UP in line
                    if self._ups == self._ports:
                        self._up.set()


def port_free(port: int) -> bool:
    """Whether UDP ``port`` on 127.0.0.1 is free to bind."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def guest_and_netdev(name: str, local_port: int, remote_port: int,
                     netdev_options: Sequence[str], out: Callable[[str], None], *,
                     port_hint: str = "", port2: tuple[int, int] | None = None
                     ) -> tuple[Image, Netdev, Path, Path]:
    """The guest's image (built first if none is cached: root) and a netdev, not yet
    started, that plays the endpoint to a guest on ``local_port``/``remote_port`` (both
    checked free; ``port_hint`` ends the error), with ``netdev_options``; its summary and
    pcap are ``build/softroce/<name>-netdev-summary.json`` and ``<name>-netdev.pcap``.
    With ``port2`` (the guest's eth1's local and remote ports) netdev runs both ports
    of the two-cage board, port 2 on that channel (its summary and pcap with
    ``-port2`` added to their names). Returns (image, netdev, summary path, pcap path)."""
    two_ports = []
    if port2 is not None:
        two_ports = ["--ports", "2", "--local2", f"127.0.0.1:{port2[1]}", "--remote2",
                     f"127.0.0.1:{port2[0]}"]
    summary_path = CACHE / f"{name}-netdev-summary.json"
    pcap_path = CACHE / f"{name}-netdev.pcap"
    arguments = ["--local", f"127.0.0.1:{remote_port}", "--remote", f"127.0.0.1:{local_port}",
                 "--ip", ENDPOINT_IP, "--mac", ENDPOINT_MAC, "--summary", str(summary_path),
                 "--pcap", str(pcap_path), *two_ports, *netdev_options]
    image = cached_image()
    if image is None:
        def log(line: str) -> None:
            out(f"  image: {line}")
        if os.geteuid() == 0:
            # The first time, the image and netdev's model take minutes each: the image
            # (downloads and unpacking, much of it waiting) is built beside the model,
            # which the cocotb tests that run beside (make test) wait for.
            from sim.netdev import build_design
            out(f"{_PROG}: building the guest's image beside netdev's model of the endpoint")
            with ThreadPoolExecutor(1) as pool:
                building = pool.submit(build_image, log=log)
                build_design(arguments)
                image = building.result()
        else:
            image = build_image(log=log)    # (which names the fix: it needs root)
    ensure_host_tools(needed=(QEMU,))
    for port in (local_port, remote_port, *(port2 or ())):
        if not port_free(port):
            raise RuntimeError(f"UDP 127.0.0.1:{port} is taken (another demo or guest?)"
                               + port_hint)
    netdev = Netdev(arguments, CACHE / f"{name}-netdev.log", show=out,
                    ports=2 if port2 else 1)
    return image, netdev, summary_path, pcap_path


def run_demo(runs: Sequence[DemoRun], *, faults: Sequence[str] = (),
             local_port: int = DEFAULT_LOCAL_PORT, remote_port: int = DEFAULT_REMOTE_PORT,
             guest_timeout: float = 900.0, netdev_timeout: float = 900.0,
             require_retransmissions: bool = False, out: Callable[[str], None] = print,
             verbose: bool = False, name: str = "demo",
             netdev_options: Sequence[str] = (),
             port2: tuple[int, int] | None = None) -> DemoResult:
    """Run ``runs`` in the guest against netdev; see the module's description.

    ``faults`` are netdev's fault options (``--faults RATES`` etc.), ``netdev_options``
    its others (:func:`example_netdev_options`). With ``port2`` (the guest's eth1's
    local and remote UDP ports) both ports of the two-cage board run, each run on both,
    and the result has a check per run and port. Raises
    :class:`HostToolsError`, :class:`ImageError` or :class:`GuestError` when the
    guest cannot run at all, RuntimeError when netdev cannot.
    """
    started = time.monotonic()
    image, netdev, summary_path, pcap_path = guest_and_netdev(
        name, local_port, remote_port, (*faults, *netdev_options), out,
        port_hint=": pick free ports with --local-port/--remote-port (--local-port2/"
                  "--remote-port2)", port2=port2)
    ports = 2 if port2 else 1
    script = guest_script(runs, ports=ports)
    checks = [RunCheck(run, number) for number, run in enumerate(runs)]
    guest_failure: str | None = None
    exit_code: int | None = None
    try:
        out(f"{_PROG}: starting netdev (the endpoint {ENDPOINT_IP}"
            + (f" and the second port's {ENDPOINT2_IP}" if port2 else "")
            + " under Verilator)" + (f" with {' '.join(faults)}" if faults else ""))
        netdev.start(netdev_timeout)

        def on_line(line: str, script_line: bool) -> None:
            if not script_line:
                return
            tag, _, rest = line.partition(" ")
            if tag == _BEGIN:
                check = checks[int(rest)]
                run = check.run
                out(f"run {check.number}: " + (f"qp-server {run.label()}"
                                               if run.program == "host.cli" else
                                               f"python -m {run.program} "
                                               + " ".join(run.arguments())))
            elif tag == _LOG:
                number, _, text = rest.partition(": ")
                checks[int(number)].log.append(text)
                if verbose:
                    out(f"  {text}")
            elif tag == _RESULT:
                number, code, text = (rest.split(" ", 2) + [""])[:3]
                check = checks[int(number)]
                check.exit_code = int(code)
                if check.run.read_events:
                    check.output = text.strip()
                    return
                try:
                    check.summary = json.loads(text) if text.strip() else None
                except json.JSONDecodeError:
                    check.log.append(f"unreadable JSON: {text[:200]}")
            elif verbose:
                out(f"  guest: {line}")

        eth1 = None if port2 is None else SecondNic(
            local_port=port2[0], remote_port=port2[1], ip=DEFAULT_IP2,
            neighbour=(ENDPOINT2_IP, ENDPOINT2_MAC))
        config = GuestConfig(local_port=local_port, remote_port=remote_port,
                             neighbour=(ENDPOINT_IP, ENDPOINT_MAC), timeout=guest_timeout,
                             eth1=eth1)
        out(f"{_PROG}: booting the Soft-RoCE guest (10.77.0.1, rxe0"
            + (f"; {DEFAULT_IP2.partition('/')[0]}, rxe1" if port2 else "")
            + ") under QEMU TCG")
        try:
            result = run_script(script, config, image=image,
                                log_path=CACHE / f"{name}-console.log", on_line=on_line)
            out(f"{_PROG}: guest {result.timing_text()}; console log {result.log_path}")
            if result.exit_code != 0:
                guest_failure = f"the guest script exited {result.exit_code}"
        except GuestError as error:
            guest_failure = f"the guest failed: {error}"
    finally:
        exit_code = netdev.stop()
    problems: list[str] = []
    if guest_failure:
        problems.append(guest_failure)
    if port2:
        checks = [part for check in checks for part in port_checks(check)]
    for check in checks:
        check_run(check)
        problems += check.problems
    netdev_summary = None
    if exit_code != 0:
        problems.append(f"netdev exited {exit_code}; its log {CACHE / f'{name}-netdev.log'}")
    summaries: list[dict | None] = []
    paths = [summary_path] + [summary_path.with_name(f"{summary_path.stem}-port2.json")
                              ] * (ports == 2)
    for path in paths:
        try:
            summaries.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            summaries.append(None)
            problems.append(f"netdev wrote no summary ({path})")
    netdev_summary = summaries[0]
    retransmitted = sum(check.retransmitted for check in checks)
    if require_retransmissions and retransmitted == 0:
        problems.append("faults were injected but no endpoint QP retransmitted anything "
                        "(sum of STATUS retransmitted is 0)")
    return DemoResult(checks, netdev_summary, problems, time.monotonic() - started,
                      netdev2=summaries[1] if port2 else None)


def report(result: DemoResult, out: Callable[[str], None] = print) -> None:
    """Print one line per run (pass), netdev's counters, and the verdict."""
    out("")
    out("runs (operation, size, path MTU, QPs, verdict, messages, GB/s, the endpoint's "
        "STATUS summed over QPs):")
    for check in result.checks:
        for line in check.lines or [f"{check.run.operation:<10} {check.run.size:>6} B  "
                                    f"no result ({check.run.label()})"]:
            out(f"  {line}")
    summaries = [("netdev", result.netdev)]
    if result.netdev2 is not None:
        summaries = [("netdev port 1", result.netdev), ("netdev port 2", result.netdev2)]
    for who, summary in summaries:
        if summary is None:
            continue
        out(f"{who}: {summary.get('cycles')} cycles in {summary.get('seconds')} s; frames "
            f"{summary.get('frames')}")
        out(f"{who}: faults to the core {summary.get('faults_to_core')}, to the host "
            f"{summary.get('faults_to_host')}")
        out(f"{who}: counters that moved: " + ", ".join(
            f"{name} {value}" for name, value in sorted(summary.get("counters", {}).items())))
        out(f"{who}: pcap {summary.get('pcap')}")
        if summary.get("source"):
            out(f"{who}: the event source: {summary['source']}")
    table = simulation_figures(result.checks)
    if table:
        out("simulation figures, perftest-style (host landing times, first message to last; "
            "the simulated endpoint runs some ten thousand cycles per second, so these are the "
            "simulation's rates, not the board's):")
        for line in table:
            out(f"  {line}")
    if any(check.port for check in result.checks):
        for line in port_totals(result.checks):
            out(line)
    retransmitted = sum(check.retransmitted for check in result.checks)
    out(f"retransmitted packets (STATUS, all runs): {retransmitted}; demo "
        f"{result.seconds:.0f} s")
    if result.ok:
        if all(check.run.read_events for check in result.checks):
            out(f"OK: {len(result.checks)} run{'s' * (len(result.checks) != 1)}, every "
                "fragment intact")
        elif result.netdev2 is not None:
            out(f"OK: {len(result.checks) // 2} runs on each of the two ports, every message "
                "byte-exact and every STATUS agrees with qp-server, per port")
        else:
            out(f"OK: {len(result.checks)} runs, every message byte-exact and every STATUS "
                "agrees with qp-server")
    else:
        out(f"FAILED ({len(result.problems)} problem{'s' * (len(result.problems) != 1)}):")
        for problem in result.problems:
            out(f"  {problem}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG, description="The simulated endpoint (netdev, Verilator) against Linux "
                                "Soft-RoCE in a QEMU guest: qp-server runs every operation "
                                "and checks every byte.")
    parser.add_argument("--faults", default=None, metavar="RATES",
                        help="netdev's link faults both ways, e.g. drop=0.02,corrupt=0.005; "
                             "then retransmissions are required too")
    parser.add_argument("--faults-to-core", default=None, metavar="RATES",
                        help="faults on frames towards the endpoint only")
    parser.add_argument("--faults-to-host", default=None, metavar="RATES",
                        help="faults on frames from the endpoint only")
    parser.add_argument("--local-port", type=int, default=DEFAULT_LOCAL_PORT,
                        help=f"QEMU's UDP port (default {DEFAULT_LOCAL_PORT})")
    parser.add_argument("--remote-port", type=int, default=DEFAULT_REMOTE_PORT,
                        help=f"netdev's UDP port (default {DEFAULT_REMOTE_PORT})")
    parser.add_argument("--quick", action="store_true",
                        help="three runs instead of the full list")
    parser.add_argument("--example", action="store_true",
                        help="the example event source instead of the generator: "
                             "host.read_events reads its fragments through the receive API")
    parser.add_argument("--ports", type=int, choices=(1, 2), default=1,
                        help="2: the two-cage board's two cores (netdev --ports 2) and the "
                             "guest with a second NIC (eth1, rxe1) cabled to port 2; each "
                             "run of a WRITE, a WRITE with immediate and a SEND on both ports "
                             "at once (default %(default)s)")
    parser.add_argument("--local-port2", type=int, default=DEFAULT_LOCAL_PORT2,
                        help=f"with --ports 2: QEMU's UDP port of eth1 (default "
                             f"{DEFAULT_LOCAL_PORT2})")
    parser.add_argument("--remote-port2", type=int, default=DEFAULT_REMOTE_PORT2,
                        help=f"with --ports 2: netdev's UDP port of port 2 (default "
                             f"{DEFAULT_REMOTE_PORT2})")
    parser.add_argument("--verbose", action="store_true",
                        help="show qp-server's messages and the guest's other output")
    return parser


#: ``--quick``: one WRITE with immediate over the close and reopen, one multi-packet
#: SEND at MTU 1024, one plain WRITE on two QPs.
QUICK_RUNS = (
    DemoRun(write=True, immediate=True, size=256, count=3, repeat=2),
    DemoRun(write=False, immediate=False, size=3000, count=2, mtu=1024),
    DemoRun(write=True, immediate=False, size=64, count=4, qps=2),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.ports == 2 and (args.example or args.quick):
        parser.error("--ports 2 has its own runs: leave out --example and --quick")
    faults = []
    for option in ("faults", "faults_to_core", "faults_to_host"):
        value = getattr(args, option)
        if value is not None:
            faults += [f"--{option.replace('_', '-')}", value]
    signal.signal(signal.SIGTERM, _interrupt)

    def out(line: str) -> None:
        print(line, flush=True)

    try:
        runs = (TWO_PORT_RUNS if args.ports == 2 else EXAMPLE_RUNS if args.example
                else QUICK_RUNS if args.quick else DEFAULT_RUNS)
        result = run_demo(runs, faults=faults, local_port=args.local_port,
                          remote_port=args.remote_port, require_retransmissions=bool(faults),
                          out=out, verbose=args.verbose,
                          netdev_options=example_netdev_options(EXAMPLE_RUNS[0])
                          if args.example else (),
                          port2=(args.local_port2, args.remote_port2)
                          if args.ports == 2 else None)
    except (HostToolsError, ImageError) as error:
        print(f"{_PROG}: cannot run here: {error}", file=sys.stderr)
        return 1
    except (GuestError, RuntimeError) as error:
        print(f"{_PROG}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted; netdev and QEMU stopped", file=sys.stderr)
        return 130
    report(result, out)
    return 0 if result.ok else 1


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
