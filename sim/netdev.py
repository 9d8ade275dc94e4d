"""The simulated endpoint as a network device: ``python -m sim.netdev``.

Runs the whole core (cocotb on Verilator, or Icarus with ``SIM=icarus``) and
exchanges its MAC-side frames with a UDP peer, one Ethernet frame (without FCS)
per datagram — the format of QEMU's ``-netdev dgram`` and ``-netdev socket,udp=``.
So a VM (or any program that speaks that format) sees the endpoint as a host on
its Ethernet: ARP, ping, UDP echo, the connection manager on UDP 17185 and
RoCEv2. It runs until stopped (SIGTERM or Ctrl-C, or ``--seconds``), writes a
pcap of every frame, and prints and saves its counters on exit. Until the peer's
first frame the core has nothing to send, so the simulation waits for it on the
socket (a guest that boots meanwhile does not share its CPU with idle cycles).

Example, with a QEMU guest started with ``-netdev dgram,id=n0,local.type=inet,
local.host=127.0.0.1,local.port=47001,remote.type=inet,remote.host=127.0.0.1,
remote.port=47002``::

    python -m sim.netdev --local 127.0.0.1:47002 --remote 127.0.0.1:47001 \\
        --ip 10.77.0.2 --mac 02:00:00:00:00:02 --faults drop=0.02

The core is built as the cocotb benches build it (``CORE_PARAMS``); ``--qps``,
``--retransmit-beats``, ``--messages`` and ``--message-slots`` (sim/build_options.py, as
``make bitstream`` takes QPS, RETRANSMIT_BEATS, MESSAGES and MESSAGE_SLOTS) build it
with others, each set a build of its own, cached after its first run. The startup line
and the summary say what was built.

The build has the example event source beside the core, off
(:func:`sim.bench.core_runs.core_build`). With ``--source example`` the source runs
(:class:`gateware.examples.event_core.EventCore`, the design of ``make bitstream
SOURCE=example``; the same build as without it, and tests/sim/event_source_bench.py's
unless ``--fragment-bytes`` is given another size): a host's OPEN_QP starts its run
of ``--events`` fragments of ``--fragment-bytes`` into a ring of ``--slots`` slots at
the buffer address the OPEN_QP carries, which ``python -m host.read_events`` reads.

With ``--ports 2`` it runs the two cores of the two-cage board top
(:class:`boards.vcu118_top.VCU118DualTop`): port 1 as above, port 2 with its own
addresses (``--ip2``, ``--mac2``; the board's defaults for its second port) on its
own UDP frame channel (``--local2``, ``--remote2``), with its own pcap and summary
(``-port2`` added to their names). The two cores share no logic (each has its own
CMAC, CM, QPs and counters; only their clock is common), so each runs in a
simulation of its own, from one build, in a process of its own; every other option
applies to both.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from boards.vcu118_top import PORT2_ADDRESS
from gateware.core import TOS_ECT0
from gateware.roce.requests import PathMtu
from sim.bench.core_runs import core_build
from sim.build_options import add_build_arguments, build_arguments, built_with
from sim.models.link_faults import parse_faults
from sim.runner import BUILD, Build, run, simulator
from sim.testbench import CORE_PARAMS, SOURCE_PARAMS

__all__ = ["main", "build_parser", "port_arguments", "event_core_design", "design_params"]

#: Cycles of the IB timers' 4.096 us tick in the simulation. A simulated cycle
#: takes about 0.2 ms of wall time, so with ACK timeout 12 (4096 ticks) a lost
#: packet is resent after 64k cycles, some ten seconds, which a guest under
#: software emulation answers well within.
DEFAULT_TICK = 16
DEFAULT_TIMEOUT = 12


def _address(text: str) -> str:
    host, _, port = text.rpartition(":")
    try:
        ipaddress.IPv4Address(host)
        if not 0 < int(port) < 65536:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IPv4 address and port: {text!r}") from None
    return text


def _faults(text: str) -> dict[str, float]:
    try:
        faults = parse_faults(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return {name: getattr(faults, name) for name in ("drop", "duplicate", "reorder", "corrupt")}


def _path(text: str) -> Path:
    """A file the simulation writes: absolute, as it runs in another directory."""
    return Path(text).resolve()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sim.netdev",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--local", type=_address, default="127.0.0.1:47002",
                        help="UDP address this device listens on (default %(default)s)")
    parser.add_argument("--remote", type=_address, default="127.0.0.1:47001",
                        help="UDP address of the peer, e.g. QEMU (default %(default)s)")
    parser.add_argument("--ip", default="10.77.0.2", help="the endpoint's IPv4 address")
    parser.add_argument("--netmask", default="255.255.255.0")
    parser.add_argument("--mac", default="02:00:00:00:00:02", help="the endpoint's MAC")
    parser.add_argument("--ports", type=int, choices=(1, 2), default=1,
                        help="1: one core; 2: the two-cage board's two cores, a UDP frame "
                        "channel each (default %(default)s)")
    parser.add_argument("--local2", type=_address, default="127.0.0.1:47004",
                        help="with --ports 2: port 2's UDP address (default %(default)s)")
    parser.add_argument("--remote2", type=_address, default="127.0.0.1:47003",
                        help="with --ports 2: port 2's peer (default %(default)s)")
    parser.add_argument("--ip2", default=PORT2_ADDRESS["ip"],
                        help="with --ports 2: port 2's IPv4 address (default %(default)s)")
    parser.add_argument("--mac2", default=PORT2_ADDRESS["mac"],
                        help="with --ports 2: port 2's MAC (default %(default)s)")
    parser.add_argument("--pcap", type=_path, default=BUILD / "pcap" / "netdev.pcap",
                        help="pcap of every frame in both directions (default %(default)s)")
    parser.add_argument("--summary", type=_path, default=BUILD / "netdev-summary.json",
                        help="JSON file of the counters, written on exit")
    parser.add_argument("--faults", type=_faults, default=None, metavar="RATES",
                        help="faults in both directions: drop=P,duplicate=P,reorder=P,corrupt=P")
    parser.add_argument("--faults-to-core", type=_faults, default=None, metavar="RATES",
                        help="faults on frames towards the endpoint only")
    parser.add_argument("--faults-to-host", type=_faults, default=None, metavar="RATES",
                        help="faults on frames from the endpoint only")
    parser.add_argument("--seconds", type=float, default=0,
                        help="stop after this many seconds (default: run until stopped)")
    parser.add_argument("--tick", type=int, default=DEFAULT_TICK,
                        help="cycles of the 4.096 us timer tick (default %(default)s)")
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT, choices=range(1, 32),
                        metavar="T", help="ACK timeout of the QPs the CM opens: 2^T ticks "
                        "(default %(default)s)")
    parser.add_argument("--path-mtu", type=int, default=4096,
                        choices=[mtu.bytes for mtu in PathMtu],
                        help="path MTU when OPEN_QP leaves it to the endpoint")
    parser.add_argument("--tos", type=lambda text: int(text, 0), default=TOS_ECT0,
                        help="DSCP/ECN byte of RoCEv2 packets (default %(default)#x: DSCP 26, "
                        "ECT(0))")
    add_build_arguments(parser, built_with(CORE_PARAMS))
    example = parser.add_argument_group("the example event source (--source example)")
    example.add_argument("--source", choices=("generator", "example"), default="generator",
                         help="generator: the core alone; example: the core with the example "
                         "event source on its user ports (default %(default)s)")
    example.add_argument("--fragment-bytes", type=int,
                         default=SOURCE_PARAMS["fragment_bytes"],
                         help="bytes of a fragment, a build parameter: other than the default "
                         "(%(default)s, the cocotb bench's) it takes a build of its own")
    example.add_argument("--slots", type=int, default=64,
                         help="slots of the host's ring (default %(default)s)")
    example.add_argument("--events", type=int, default=0,
                         help="fragments in a run (default 0: without end)")
    return parser


def _with(base: dict, **changes) -> dict:
    """``base`` with the ``changes`` that differ from what a build of ``base`` has, so
    that a build parameter given at its default makes the same build (and cache key)."""
    had = {**built_with(base), **base}
    return {**base, **{name: value for name, value in changes.items() if had[name] != value}}


def _source(fragment_bytes: int) -> dict:
    """The example source's build parameters with fragments of ``fragment_bytes``."""
    return {**SOURCE_PARAMS, "fragment_bytes": fragment_bytes}


def event_core_design(fragment_bytes: int = SOURCE_PARAMS["fragment_bytes"]) -> Build:
    """The build of ``--source example`` (cached after the first time): with the default
    fragment size, the benches' build (tests/sim/conftest.py's and
    tests/sim/event_source_bench.py's)."""
    return core_build(CORE_PARAMS, _source(fragment_bytes))


def design_params(args: argparse.Namespace) -> tuple[dict, dict]:
    """The parameters of the build ``args`` ask for: the core's (CORE_PARAMS with the
    build options given (:mod:`sim.build_options`) where they differ from those) and the
    example source's (SOURCE_PARAMS with ``--fragment-bytes``)."""
    return _with(CORE_PARAMS, **build_arguments(args)), _source(args.fragment_bytes)


def _design(args: argparse.Namespace) -> tuple[Build, dict]:
    """The design ``args`` ask for, built (cached after the first time), and what it is
    built with, for the summary: the source that runs, the core's parameters and the
    build options'."""
    params, source = design_params(args)
    options = built_with(params)
    shown = ", ".join(f"{option}={value}" for option, value in options.items())
    print(f"netdev: building the endpoint ({shown}) with {simulator()} (cached after the "
          "first run)", flush=True)
    return core_build(params, source), {"source": args.source, **params, **options}


def build_design(argv: list[str]) -> Build:
    """Builds (or finds in the cache) the design ``python -m sim.netdev`` runs with
    ``argv``, without running it."""
    design, _ = _design(build_parser().parse_args(argv))
    return design


def _port2(path: Path) -> Path:
    return path.with_name(f"{path.stem}-port2{path.suffix}")


def port_arguments(argv: list[str], args: argparse.Namespace) -> list[list[str]]:
    """The command lines (after ``python -m sim.netdev``) of the two ports' simulations
    under ``--ports 2``: ``argv`` (parsed as ``args``) with each port's own options
    last (the last of an option counts)."""
    return [
        [*argv, "--ports", "1"],
        [*argv, "--ports", "1", "--local", args.local2, "--remote", args.remote2,
         "--ip", args.ip2, "--mac", args.mac2, "--pcap", str(_port2(args.pcap)),
         "--summary", str(_port2(args.summary))],
    ]


def _two_ports(argv: list[str], args: argparse.Namespace) -> int:
    """Both ports' simulations at once, stopped together; the worse exit status."""
    _design(args)
    ports = [subprocess.Popen([sys.executable, "-m", "sim.netdev", *arguments])
             for arguments in port_arguments(argv, args)]

    def stop(signum, frame):
        for port in ports:
            port.send_signal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return max(port.wait() for port in ports)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.source == "example" and args.ports == 2:
        parser.error("--source example runs one port")
    if args.source == "example" and not 1 <= args.slots < 1 << 16:
        parser.error(f"--slots must be 1 … 65535, not {args.slots}")
    if args.ports == 2:
        return _two_ports(argv, args)
    args.pcap.parent.mkdir(parents=True, exist_ok=True)
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    args.summary.unlink(missing_ok=True)
    stop_file = Path(tempfile.gettempdir()) / f"netdev-stop-{os.getpid()}"
    stop_file.unlink(missing_ok=True)

    def stop(signum, frame):
        stop_file.touch()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    design, built = _design(args)
    os.environ.setdefault("COCOTB_LOG_LEVEL", "WARNING")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    both = args.faults or {}
    params = {
        "local": args.local, "remote": args.remote, "ip": args.ip, "mac": args.mac,
        "netmask": args.netmask, "pcap": str(args.pcap), "summary": str(args.summary),
        "stop_file": str(stop_file), "seconds": args.seconds, "tick": args.tick,
        "timeout": args.timeout, "path_mtu": PathMtu.from_bytes(args.path_mtu).value,
        "tos": args.tos, "build": built,
        "faults_to_core": args.faults_to_core or both,
        "faults_to_host": args.faults_to_host or both,
        "source": None if args.source == "generator" else {
            "slot_bytes": args.fragment_bytes, "slots": args.slots, "period": 0,
            "count": args.events},
    }
    try:
        run(design, module="netdev_bench", test_dir=Path(__file__).parent, params=params)
    except AssertionError as error:
        print(f"netdev: the simulation failed: {error}", file=sys.stderr)
        return 1
    finally:
        stop_file.unlink(missing_ok=True)
    if not args.summary.exists():
        print("netdev: the simulation ended without a summary", file=sys.stderr)
        return 1
    summary = json.loads(args.summary.read_text())
    print(f"netdev: pcap {summary['pcap']}, summary {args.summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
