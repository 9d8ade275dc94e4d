"""``python -m sim.softroce.guest``: build the Soft-RoCE guest image, or run a script in it.

Usage::

    python -m sim.softroce.guest build [--rebuild]
    python -m sim.softroce.guest run --script FILE [--local-port A] [--remote-port B]
                                     [--mac MAC] [--ip IP/PREFIX] [--mtu N]
                                     [--neighbour IP=MAC] [--cpus N] [--memory MIB]
                                     [--timeout SECONDS] [--log FILE] [--quiet]

``build`` needs root the first time (1-2.5 minutes); afterwards it only
prints where the cached image is. ``run`` boots the guest under QEMU (TCG),
prints the console as it arrives (``--quiet``: only the script's output), and
exits with the script's exit code; 124 when the timeout killed QEMU, 1 when the
guest failed before the script ended.
"""

from __future__ import annotations

import argparse
import ipaddress
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .image import ImageError, build_image, cached_image
from .tools import HostToolsError
from .vm import (
    DEFAULT_IP,
    DEFAULT_LOCAL_PORT,
    DEFAULT_MAC,
    DEFAULT_REMOTE_PORT,
    GuestConfig,
    GuestError,
    GuestTimeout,
    run_script,
)

__all__ = ["build_parser", "main"]

_PROG = "python -m sim.softroce.guest"
_EXIT_TIMEOUT = 124


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a UDP port (1..65535): {text!r}")
    return port


def _neighbour(text: str) -> tuple[str, str]:
    address, _, mac = text.partition("=")
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not IP=MAC: {text!r} (e.g. 10.77.0.2=02:00:00:00:00:02)") from None
    return address, mac


def build_parser() -> argparse.ArgumentParser:
    """The command's argument parser."""
    parser = argparse.ArgumentParser(
        prog=_PROG, description="A Debian guest with Linux Soft-RoCE (rdma_rxe) under QEMU, "
                                "as a real RoCEv2 peer for the endpoint.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{build,run}")
    build = commands.add_parser("build", help="build the guest image, or reuse the cached one")
    build.add_argument("--rebuild", action="store_true", help="build even if cached")

    run = commands.add_parser("run", help="boot the guest and run a shell script in it")
    run.add_argument("--script", type=Path, required=True, metavar="FILE",
                     help="shell script to run in the guest (cwd: the repository)")
    network = run.add_argument_group("network (-netdev dgram on 127.0.0.1)")
    network.add_argument("--local-port", type=_port, default=DEFAULT_LOCAL_PORT, metavar="A",
                         help=f"QEMU's UDP port (default {DEFAULT_LOCAL_PORT})")
    network.add_argument("--remote-port", type=_port, default=DEFAULT_REMOTE_PORT, metavar="B",
                         help=f"the network's UDP port, frames go there "
                              f"(default {DEFAULT_REMOTE_PORT})")
    network.add_argument("--mac", default=DEFAULT_MAC, help=f"eth0's MAC (default {DEFAULT_MAC})")
    network.add_argument("--ip", default=DEFAULT_IP, metavar="IP/PREFIX",
                         help=f"eth0's IPv4 address (default {DEFAULT_IP})")
    network.add_argument("--mtu", type=int, default=9000, help="eth0's MTU (default 9000)")
    network.add_argument("--neighbour", type=_neighbour, default=None, metavar="IP=MAC",
                         help="static ARP entry, e.g. the endpoint's 10.77.0.2=02:00:00:00:00:02")
    machine = run.add_argument_group("machine")
    machine.add_argument("--cpus", type=int, default=1, help="vCPUs (default 1)")
    machine.add_argument("--memory", type=int, default=1024, metavar="MIB",
                         help="memory in MiB (default 1024)")
    machine.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                         help="kill QEMU after this long (default 300)")
    run.add_argument("--log", type=Path, default=None, metavar="FILE",
                     help="console log (default build/softroce/console-<local port>.log)")
    run.add_argument("--quiet", action="store_true", help="print only the script's output")
    run.set_defaults(parser=run)
    return parser


def _build(args: argparse.Namespace) -> int:
    cached = None if args.rebuild else cached_image()
    if cached is not None:
        info = cached.info
        print(f"cached image: {cached.directory}\n  kernel {info['kernel_release']}, "
              f"rootfs {info['rootfs_used_bytes'] / 1e6:.0f} MB used, "
              f"built {info['built']} in {info['build_seconds']:.0f} s")
        return 0
    started = time.monotonic()
    image = build_image(rebuild=args.rebuild, log=lambda line: print(f"  {line}", flush=True))
    print(f"built image: {image.directory} in {time.monotonic() - started:.0f} s "
          f"(rootfs {image.info['rootfs_used_bytes'] / 1e6:.0f} MB used)")
    return 0


def _run(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.parser
    try:
        script = args.script.read_text()
    except OSError as error:
        parser.error(f"--script: cannot read {args.script}: {error.strerror}")
    try:
        config = GuestConfig(local_port=args.local_port, remote_port=args.remote_port,
                             mac=args.mac, ip=args.ip, mtu=args.mtu, neighbour=args.neighbour,
                             memory_mib=args.memory, cpus=args.cpus, timeout=args.timeout)
    except ValueError as error:
        parser.error(str(error))

    def show(line: str, script_line: bool) -> None:
        if script_line or not args.quiet:
            print(line, flush=True)

    print(f"{_PROG}: booting under TCG (ready in about 10-20 s); frames on "
          f"127.0.0.1:{config.local_port} <-> 127.0.0.1:{config.remote_port}",
          file=sys.stderr, flush=True)
    try:
        image = build_image(log=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
        result = run_script(script, config, image=image, log_path=args.log, on_line=show)
    except GuestTimeout as error:
        print(f"{_PROG}: error: {error}", file=sys.stderr)
        return _EXIT_TIMEOUT
    print(f"{_PROG}: exit {result.exit_code}; {result.timing_text()}; console log "
          f"{result.log_path}", file=sys.stderr)
    return result.exit_code


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    SIGTERM and SIGHUP act like Ctrl-C: QEMU or mmdebstrap is stopped and the
    temporary files are removed.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    try:
        if args.command == "build":
            return _build(args)
        return _run(args)
    except (HostToolsError, ImageError, GuestError) as error:
        print(f"{_PROG}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted; stopped and cleaned up", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
