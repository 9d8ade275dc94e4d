"""``python -m sim.softroce.connect``: the kernel's ``rdma_connect`` against the simulated endpoint.

Starts netdev (the core under Verilator, :class:`sim.softroce.demo.Netdev`), boots
the Soft-RoCE guest, and runs host programs that connect through the guest's
rdma_cm (rdma_ucm, rdma_cm, ib_cm over rxe) one after the other
(:class:`Step`): by default ``python -m host.rdma_connect`` once, which sends the
REQ, gets the endpoint's REP and completes with RTU; with ``--size``/``--count`` it
then starts a generator WRITE run on that QP through the UDP CM and checks the bytes,
and last calls ``rdma_disconnect``. ``qp-server --cm rdma`` runs as a step the same
way, and so does the endpoint's active side: ``python -m host.rdma_listen``
(:func:`listen_step`: the guest listens, asks with CONNECT, accepts the endpoint's
REQ, disconnects) and ``qp-server --cm rdma --listen PORT``. Prints each program's
JSON summary, the guest's CM modules and netdev's counters; exits 0 when every
program did.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence

from .demo import ENDPOINT_IP, ENDPOINT_MAC, GUEST_POLL, QP_SERVER_OPTIONS, guest_and_netdev
from .image import CACHE
from .vm import DEFAULT_LOCAL_PORT, DEFAULT_REMOTE_PORT, GuestConfig, run_script

__all__ = ["Step", "StepResult", "ConnectResult", "connect_step", "listen_step",
           "qp_server_step",
           "guest_script", "run_connect", "main"]

_PROG = "python -m sim.softroce.connect"
_MODULES, _RESULT, _LOG = "connect-modules", "connect-result", "connect-log"
#: The kernel modules rdma_cm needs over rxe (rdma_ucm pulls in rdma_cm and ib_cm).
CM_MODULES = ("rdma_ucm", "rdma_cm", "ib_cm", "iw_cm", "rdma_rxe")


@dataclasses.dataclass(frozen=True)
class Step:
    """One program run in the guest: ``python3 -m <module> --endpoint <endpoint>
    <arguments>``; its JSON summary is the last line of its standard output."""
    name: str
    module: str
    arguments: tuple[str, ...] = ()

    def command(self, limit: int) -> str:
        return shlex.join(["timeout", "-s", "TERM", str(limit), "python3", "-m", self.module,
                           "--endpoint", ENDPOINT_IP, *self.arguments])


def connect_step(name: str, *arguments: str) -> Step:
    """``host.rdma_connect`` with ``arguments``."""
    return Step(name, "host.rdma_connect", arguments)


def listen_step(name: str, *arguments: str) -> Step:
    """``host.rdma_listen`` with ``arguments``."""
    return Step(name, "host.rdma_listen", arguments)


def qp_server_step(name: str, *arguments: str) -> Step:
    """``qp-server --cm rdma --json`` with the demo's CM timeouts and ``arguments``."""
    return Step(name, "host.cli", ("--cm", "rdma", *QP_SERVER_OPTIONS, *GUEST_POLL, "--json",
                                   *arguments))


@dataclasses.dataclass
class StepResult:
    exit_code: int | None = None
    summary: dict | None = None
    log: list[str] = dataclasses.field(default_factory=list)
    seconds: float | None = None


@dataclasses.dataclass
class ConnectResult:
    steps: dict[str, StepResult] = dataclasses.field(default_factory=dict)
    modules: list[str] = dataclasses.field(default_factory=list)
    netdev: dict | None = None
    netdev_exit: int | None = None
    guest_exit: int | None = None
    pcap: str = ""
    seconds: float = 0.0

    def __getitem__(self, name: str) -> StepResult:
        return self.steps.setdefault(name, StepResult())


def guest_script(steps: Sequence[Step], *, limit: int = 300) -> str:
    """Load rdma_ucm, list the CM modules, run each step; its JSON on one
    ``connect-result <name> <exit code> <seconds> <json>`` line, its messages on
    ``connect-log <name> ...`` lines."""
    pattern = "|".join(CM_MODULES)
    lines = [
        "cd /mnt/repo 2>/dev/null || true",
        "modprobe rdma_ucm",
        f"echo {_MODULES} $(lsmod | awk '{{print $1}}' | grep -xE '{pattern}' | sort | "
        "tr '\\n' ' ')",
    ]
    for step in steps:
        lines += [
            "started=$(date +%s.%N)",
            f"{step.command(limit)} > /tmp/{step.name}.json 2> /tmp/{step.name}.err",
            f"code=$?; sed 's/^/{_LOG} {step.name} /' /tmp/{step.name}.err",
            'took=$(echo "$(date +%s.%N) $started" | awk \'{printf "%.2f", $1 - $2}\')',
            f'echo "{_RESULT} {step.name} $code $took $(tail -n 1 /tmp/{step.name}.json)"',
        ]
    return "\n".join(lines) + "\n"


def run_connect(steps: Sequence[Step] = (), *, name: str = "connect",
                local_port: int = DEFAULT_LOCAL_PORT, remote_port: int = DEFAULT_REMOTE_PORT,
                guest_timeout: float = 600.0, netdev_timeout: float = 900.0,
                out: Callable[[str], None] = print) -> ConnectResult:
    """Run ``steps`` in one guest against one netdev."""
    started = time.monotonic()
    image, netdev, summary_path, pcap_path = guest_and_netdev(name, local_port, remote_port,
                                                              (), out)
    result = ConnectResult(pcap=str(pcap_path))

    def on_line(line: str, script_line: bool) -> None:
        if not script_line:
            return
        tag, _, rest = line.partition(" ")
        if tag == _MODULES:
            result.modules = rest.split()
            return
        step, _, rest = rest.partition(" ")
        if tag == _LOG:
            result[step].log.append(rest)
            out(f"  guest {step}: {rest}")
        elif tag == _RESULT:
            code, seconds, text = (rest.split(" ", 2) + ["", ""])[:3]
            result[step].exit_code = int(code)
            result[step].seconds = float(seconds) if seconds else None
            try:
                result[step].summary = json.loads(text) if text.strip() else None
            except json.JSONDecodeError:
                result[step].log.append(f"unreadable JSON: {text[:200]}")

    try:
        netdev.start(netdev_timeout)
        config = GuestConfig(local_port=local_port, remote_port=remote_port,
                             neighbour=(ENDPOINT_IP, ENDPOINT_MAC), timeout=guest_timeout)
        guest = run_script(guest_script(steps), config, image=image,
                           log_path=CACHE / f"{name}-console.log", on_line=on_line)
        result.guest_exit = guest.exit_code
        out(f"{_PROG}: guest {guest.timing_text()}")
    finally:
        result.netdev_exit = netdev.stop()
    try:
        result.netdev = json.loads(summary_path.read_text())
    except (OSError, json.JSONDecodeError):
        result.netdev = None
    result.seconds = time.monotonic() - started
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=_PROG, description=__doc__.splitlines()[0])
    parser.add_argument("arguments", nargs=argparse.REMAINDER,
                        help="host.rdma_connect's options (after --), e.g. -- --size 4096 "
                             "--count 4")
    args = parser.parse_args(argv)
    arguments = [a for a in args.arguments if a != "--"]
    result = run_connect([connect_step("connect", *arguments)])
    step = result["connect"]
    print(f"guest CM modules loaded: {' '.join(result.modules) or 'none'}")
    print(f"host.rdma_connect exit {step.exit_code}: {json.dumps(step.summary)}")
    if result.netdev is not None:
        print("netdev counters: " + ", ".join(
            f"{key} {value}" for key, value in sorted(result.netdev.get("counters", {}).items())))
    print(f"netdev pcap {result.pcap}; {result.seconds:.0f} s")
    return 0 if step.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
