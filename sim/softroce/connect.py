"""``python -m sim.softroce.connect``: the kernel's ``rdma_connect`` against the simulated endpoint.

Starts netdev (the core under Verilator, :class:`sim.softroce.demo.Netdev`), boots
the Soft-RoCE guest, and runs ``python -m host.rdma_connect`` in it: the guest's
rdma_cm (rdma_ucm, rdma_cm, ib_cm over rxe) sends the REQ, the endpoint's passive
CM answers REP, the guest completes with RTU. With ``--size``/``--count`` the host
program then starts a generator WRITE run on that QP through the UDP CM and checks
the bytes, and last calls ``rdma_disconnect``. Prints the program's JSON summary, the
guest's CM modules and netdev's counters; exits 0 when the program did.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence

from .demo import ENDPOINT_IP, ENDPOINT_MAC, guest_and_netdev
from .image import CACHE
from .vm import DEFAULT_LOCAL_PORT, DEFAULT_REMOTE_PORT, GuestConfig, run_script

__all__ = ["ConnectResult", "guest_script", "run_connect", "main"]

_PROG = "python -m sim.softroce.connect"
_MODULES, _RESULT, _LOG = "connect-modules", "connect-result", "connect-log"
#: The kernel modules rdma_cm needs over rxe (rdma_ucm pulls in rdma_cm and ib_cm).
CM_MODULES = ("rdma_ucm", "rdma_cm", "ib_cm", "iw_cm", "rdma_rxe")


@dataclasses.dataclass
class ConnectResult:
    exit_code: int | None = None
    summary: dict | None = None
    modules: list[str] = dataclasses.field(default_factory=list)
    log: list[str] = dataclasses.field(default_factory=list)
    netdev: dict | None = None
    netdev_exit: int | None = None
    guest_exit: int | None = None
    pcap: str = ""
    seconds: float = 0.0


def guest_script(arguments: Sequence[str], *, limit: int = 300) -> str:
    """Load rdma_ucm, list the CM modules, run host.rdma_connect; its JSON on one
    ``connect-result <exit code> <json>`` line, its messages on ``connect-log`` lines."""
    command = shlex.join(["timeout", "-s", "TERM", str(limit), "python3", "-m",
                          "host.rdma_connect", "--endpoint", ENDPOINT_IP, *arguments])
    pattern = "|".join(CM_MODULES)
    return "\n".join([
        "cd /mnt/repo 2>/dev/null || true",
        "modprobe rdma_ucm",
        f"echo {_MODULES} $(lsmod | awk '{{print $1}}' | grep -xE '{pattern}' | sort | "
        "tr '\\n' ' ')",
        f"{command} > /tmp/connect.json 2> /tmp/connect.err",
        f"code=$?; sed 's/^/{_LOG} /' /tmp/connect.err",
        f'echo "{_RESULT} $code $(tr -d \'\\n\' < /tmp/connect.json)"',
    ]) + "\n"


def run_connect(arguments: Sequence[str] = (), *, name: str = "connect",
                local_port: int = DEFAULT_LOCAL_PORT, remote_port: int = DEFAULT_REMOTE_PORT,
                guest_timeout: float = 600.0, netdev_timeout: float = 900.0,
                out: Callable[[str], None] = print) -> ConnectResult:
    """Run host.rdma_connect with ``arguments`` in the guest against netdev."""
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
        elif tag == _LOG:
            result.log.append(rest)
            out(f"  guest: {rest}")
        elif tag == _RESULT:
            code, _, text = rest.partition(" ")
            result.exit_code = int(code)
            try:
                result.summary = json.loads(text) if text.strip() else None
            except json.JSONDecodeError:
                result.log.append(f"unreadable JSON: {text[:200]}")

    try:
        netdev.start(netdev_timeout)
        config = GuestConfig(local_port=local_port, remote_port=remote_port,
                             neighbour=(ENDPOINT_IP, ENDPOINT_MAC), timeout=guest_timeout)
        guest = run_script(guest_script(arguments), config, image=image,
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
    result = run_connect(arguments)
    print(f"guest CM modules loaded: {' '.join(result.modules) or 'none'}")
    print(f"host.rdma_connect exit {result.exit_code}: {json.dumps(result.summary)}")
    if result.netdev is not None:
        print("netdev counters: " + ", ".join(
            f"{key} {value}" for key, value in sorted(result.netdev.get("counters", {}).items())))
    print(f"netdev pcap {result.pcap}; {result.seconds:.0f} s")
    return 0 if result.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
