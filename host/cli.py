"""``qp-server``: pair host RC QPs with the endpoint, run its generator, check every byte.

Usage::

    qp-server [run] [options]                 pair, start, check, close (needs pyverbs)
    qp-server --cm rdma [options]             the same, the QPs connected with rdma_cm
    qp-server --cm rdma --listen PORT [...]   the same, the endpoint connecting to the host
    qp-server ctrl start --qpn N [options]    start a generator run on an open endpoint QP
    qp-server ctrl close-qp --qpn N --host-ip IP
    qp-server ctrl status --qpn N [--json]

``ctrl`` only talks to the connection manager (UDP), so it needs neither pyverbs
nor an RDMA device. Errors print ``qp-server: error: <what to do>`` and exit 1;
usage errors exit 2; a run exits 0 only when every message arrived byte-exact
(130 when interrupted).
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TextIO

from . import protocol
from .backend import POLL_MODES, BackendFactory, VerbsOptions
from .cm import DEFAULT_ENDPOINT, CmClient, error_status_name
from .errors import HostError
from .fleet import fleet_json, fleet_text, parse_endpoints, run_endpoints
from .numa import pin_to_node
from .protocol import PathMtu
from .receive import CMS
from .run import RunConfig, Runner, rate_divider

__all__ = ["DEFAULT_CLOCK_HZ", "build_parser", "main", "parse_bytes", "parse_bind",
           "parse_endpoint"]

#: The endpoint's core clock with the VCU118 CMAC (Hz): the unit of the divider.
DEFAULT_CLOCK_HZ = 322_265_625

_PROG = "qp-server"
_COMMANDS = ("run", "ctrl")
_MTUS = (256, 512, 1024, 2048, 4096)
_U32 = 0xFFFF_FFFF
_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_CLEAR_LINE = "\r\033[K"


def parse_bytes(text: str) -> int:
    """A byte count such as ``4096``, ``64K``, ``1M`` or ``2G`` (powers of 1024)."""
    value = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = _SUFFIXES.get(value[-1:], 1)
    if scale != 1:
        value = value[:-1]
    try:
        number = int(value, 0) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a byte count: {text!r} (use e.g. 4096, 64K, 1M)") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text}")
    return number


def parse_bind(text: str) -> tuple[str, int]:
    """``ADDR``, ``ADDR:PORT`` or ``:PORT`` of the local CM socket (port 0: any)."""
    address, _, port = text.rpartition(":") if ":" in text else (text, "", "0")
    try:
        return str(ipaddress.IPv4Address(address or "0.0.0.0")), _port(port or "0", zero=True)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(
            f"not ADDR[:PORT]: {text!r} (e.g. 0.0.0.0:0 or 127.0.0.1:17186)") from None


def _ipv4(text: str) -> str:
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IPv4 address: {text!r}") from None


def _port(text: str, *, zero: bool = False) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not (0 if zero else 1) <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a UDP port (1..65535): {text!r}")
    return port


def _count(lowest: int, highest: int = _U32):
    def parse(text: str) -> int:
        try:
            value = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not lowest <= value <= highest:
            raise argparse.ArgumentTypeError(f"must be {lowest}..{highest}, not {value}")
        return value
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 s, not {text}")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a rate in GB/s: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 GB/s, not {text}")
    return value


def parse_endpoint(text: str) -> str:
    """``IP`` or ``IP:PORT`` of an endpoint's CM (PORT: instead of ``--cm-port``)."""
    address, colon, port = text.strip().partition(":")
    try:
        return _ipv4(address) + (f":{_port(port)}" if colon else "")
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"not an endpoint IP[:PORT]: {text!r} (e.g. 10.77.0.2 or 10.77.0.2:17185)") from None


def receiver_options(parser: argparse.ArgumentParser) -> None:
    """The options of a program on the receive API: ``--endpoint``, ``--timeout``,
    ``--stall`` and ``--device``."""
    parser.add_argument("--endpoint", type=parse_endpoint, default=DEFAULT_ENDPOINT,
                        metavar="IP[:PORT]", help=f"the endpoint (default {DEFAULT_ENDPOINT})")
    parser.add_argument("--timeout", type=float, default=1.0, metavar="SECONDS",
                        help="wait for each CM reply (default 1.0)")
    parser.add_argument("--stall", type=float, default=2.0, metavar="SECONDS",
                        help="ask STATUS after this long without progress (default 2)")
    parser.add_argument("--device", default=None, help="RDMA device (default: the first)")


def _check_mode(text: str) -> str:
    try:
        RunConfig(check=text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _cm_options(*, many: bool = False) -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("connection manager")
    if many:
        group.add_argument("--endpoint", type=parse_endpoint, action="append", default=None,
                           metavar="IP[:PORT]",
                           help=f"an endpoint's IPv4 address (default {DEFAULT_ENDPOINT}), "
                                "optionally with its CM port; give it several times to read "
                                "out several endpoints at once")
        group.add_argument("--endpoints-file", type=argparse.FileType("r"), default=None,
                           metavar="FILE",
                           help="more endpoints, one IP[:PORT] a line (# comments)")
    else:
        group.add_argument("--endpoint", type=_ipv4, default=DEFAULT_ENDPOINT, metavar="IP",
                           help=f"the endpoint's IPv4 address (default {DEFAULT_ENDPOINT})")
    group.add_argument("--cm-port", type=_port, default=protocol.CM_PORT, metavar="PORT",
                       help=f"the endpoint's CM UDP port (default {protocol.CM_PORT})")
    group.add_argument("--bind", type=parse_bind, default=("0.0.0.0", 0), metavar="ADDR[:PORT]",
                       help="local address and UDP port of the CM socket (default 0.0.0.0:0)")
    group.add_argument("--timeout", type=_seconds, default=1.0, metavar="SECONDS",
                       help="wait for each CM reply (default 1.0)")
    group.add_argument("--retries", type=_count(1, 1000), default=5, metavar="N",
                       help="CM tries per request (default 5)")
    return parent


def _generator_options(parser: argparse.ArgumentParser, *, default_size: int | None,
                       default_count: int | None) -> None:
    group = parser.add_argument_group("generator run")
    operation = group.add_mutually_exclusive_group()
    operation.add_argument("--write", dest="write", action="store_true", default=True,
                           help="RDMA WRITE into the host's buffer ring (default)")
    operation.add_argument("--send", dest="write", action="store_false",
                           help="SEND into posted receives")
    group.add_argument("--imm", action="store_true",
                       help="with immediate data (message k carries k)")
    group.add_argument("--size", type=parse_bytes, default=default_size,
                       required=default_size is None, metavar="BYTES",
                       help="bytes per message, K/M/G suffixes allowed"
                            + _default_text(default_size))
    group.add_argument("--count", type=_count(1), default=default_count,
                       required=default_count is None, metavar="N",
                       help="messages per QP" + _default_text(default_count))
    group.add_argument("--rate", type=_rate, default=0.0, metavar="GBPS",
                       help="payload rate per QP in GB/s (10**9 bytes/s), converted to the "
                            "generator's divider; 0: as fast as possible (default)")
    group.add_argument("--clock-hz", type=float, default=DEFAULT_CLOCK_HZ, metavar="HZ",
                       help=f"the endpoint's core clock for --rate (default {DEFAULT_CLOCK_HZ})")
    group.add_argument("--ring", type=parse_bytes, default=None, metavar="BYTES",
                       help="WRITE buffer ring per QP: message k lands in slot k mod "
                            "(ring // size) (default: the whole run, up to 64M)")


def _default_text(default: int | None) -> str:
    return "" if default is None else f" (default {default})"


def build_parser() -> argparse.ArgumentParser:
    """The ``qp-server`` argument parser (``run`` is the default command)."""
    cm = _cm_options()
    parser = argparse.ArgumentParser(
        prog=_PROG, usage=f"{_PROG} [run] [options] | {_PROG} ctrl {{start,close-qp,status}} ...",
        description="Pair host RC QPs with the RoCEv2 endpoint over its connection manager, "
                    "run its traffic generator and check every byte that lands.")
    commands = parser.add_subparsers(dest="command", metavar="{run,ctrl}")

    run = commands.add_parser(
        "run", parents=[_cm_options(many=True)], prog=f"{_PROG} [run]",
        help="pair, start, check and close (the default; needs pyverbs and an RDMA device)")
    verbs = run.add_argument_group("verbs")
    verbs.add_argument("--device", action="append", default=None,
                       help="RDMA device (default: the first); with several --endpoint, "
                            "give it once for all or once per endpoint, in their order (a "
                            "host with a NIC port cabled to each of a board's two cages)")
    verbs.add_argument("--ib-port", type=_count(1, 255), default=1, metavar="N",
                       help="port of the device (default 1)")
    verbs.add_argument("--gid-index", type=_count(0, 0xFFFF), default=None, metavar="N",
                       help="GID index (default: the port's IPv4 RoCEv2 GID ::ffff:a.b.c.d)")
    verbs.add_argument("--mtu", type=int, choices=_MTUS, default=None,
                       help="path MTU to ask for (default: the port's active MTU)")
    verbs.add_argument("--qps", type=_count(1, 1 << 16), default=1, metavar="N",
                       help="QP pairs, each running the same generator run (default 1)")
    verbs.add_argument("--receives", type=_count(1, 1 << 20), default=128, metavar="N",
                       help="receives kept posted per QP for --send and --imm (default 128)")
    verbs.add_argument("--poll", choices=POLL_MODES, default="busy",
                       help="wait for completions by spinning, on the completion channel, "
                            "or spinning briefly then sleeping (default busy)")
    verbs.add_argument("--numa-node", type=_count(0, 4095), default=None, metavar="N",
                       help="run on this NUMA node's CPUs; buffers are allocated after "
                            "pinning, so they land on its memory")
    rdma = run.add_argument_group("rdma_cm")
    rdma.add_argument("--cm", choices=CMS, default="udp",
                      help="pair the QPs with the UDP CM's OPEN_QP (default), or connect "
                           "them with rdma_cm (rdma_connect to the endpoint's IB CM; runs "
                           "are still started over UDP; rdma_disconnect at the end)")
    rdma.add_argument("--rdma-port", type=_port, default=protocol.CM_PORT, metavar="PORT",
                      help=f"the endpoint's rdma_cm port with --cm rdma (default "
                           f"{protocol.CM_PORT})")
    rdma.add_argument("--listen", type=_port, default=0, metavar="PORT",
                      help="with --cm rdma: listen on this rdma_cm port of the host (QP i "
                           "on PORT + i) and ask the endpoint with CONNECT to connect to it "
                           "(its active IB CM) instead of connecting to the endpoint; --mtu "
                           "is the path MTU CONNECT asks for")
    rdma.add_argument("--rdma-timeout", type=_seconds, default=10.0, metavar="SECONDS",
                      help="with --cm rdma: wait this long for each rdma_cm event (with "
                           "--listen: for the whole connect), and for DISCONNECTED after "
                           "rdma_disconnect (default 10)")
    _generator_options(run, default_size=4096, default_count=1000)
    behaviour = run.add_argument_group("run")
    behaviour.add_argument("--no-start", action="store_true",
                           help="only pair the QPs and check what user logic sends")
    behaviour.add_argument("--stall", type=_seconds, default=2.0, metavar="SECONDS",
                           help="ask STATUS after this long without progress (default 2)")
    behaviour.add_argument("--repeat", type=_count(1, 1 << 16), default=1, metavar="N",
                           help="run N passes over the same host QPs: after each, close the "
                                "endpoint QPs, reset the host QPs and pair them again "
                                "(default 1)")
    behaviour.add_argument("--reclaim", action="store_true",
                           help="first close every endpoint QP this host left open (CLOSE_QP "
                                "of all its QPs): use it after a qp-server on this host "
                                "crashed or was killed, when the endpoint answers NO_QP; the "
                                "endpoint also frees such QPs itself once idle for its lease "
                                "(60 s by default). Closes QPs of other programs on this host "
                                "too")
    behaviour.add_argument("--credit", action="store_true",
                           help="a credited run (plain --write into a ring): the endpoint "
                                "writes a slot only after this host has reported the message "
                                "before it in that slot consumed (CREDIT), so a slow host "
                                "never has a message overwritten")
    behaviour.add_argument("--check", type=_check_mode, default="all",
                           metavar="all|sample=N|none",
                           help="compare every byte (default), every N-th message's bytes "
                                "(k mod N == 0), or none; the immediate, the order, the count "
                                "and a lapped ring are checked in every case")
    behaviour.add_argument("--check-threads", type=_count(1, 256), default=1, metavar="N",
                           help="checker threads per endpoint sharing each batch of messages "
                                "(default 1)")
    behaviour.add_argument("--json", action="store_true",
                           help="print the summary as one JSON object")

    ctrl = commands.add_parser(
        "ctrl", prog=f"{_PROG} ctrl",
        help="talk to the connection manager only (no pyverbs or device needed)")
    actions = ctrl.add_subparsers(dest="action", metavar="{start,close-qp,status}",
                                  required=True)
    start = actions.add_parser("start", parents=[cm], prog=f"{_PROG} ctrl start",
                               help="start a run on an open endpoint QP")
    start.add_argument("--qpn", type=_count(0, (1 << 24) - 1), required=True,
                       help="endpoint QPN")
    _generator_options(start, default_size=None, default_count=None)
    close = actions.add_parser("close-qp", parents=[cm], prog=f"{_PROG} ctrl close-qp",
                               help="close an endpoint QP")
    close.add_argument("--qpn", type=_count(0, (1 << 24) - 1), required=True,
                       help="endpoint QPN")
    close.add_argument("--host-ip", type=_ipv4, required=True, metavar="IP",
                       help="the host address that opened it (the endpoint takes a close "
                            "only from that address: run this on that host)")
    status = actions.add_parser("status", parents=[cm], prog=f"{_PROG} ctrl status",
                                help="print an endpoint QP's state and counters")
    status.add_argument("--qpn", type=_count(0, (1 << 24) - 1), required=True,
                        help="endpoint QPN")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _with_command(argv: Sequence[str]) -> list[str]:
    argv = list(argv)
    if not argv or argv[0] not in (*_COMMANDS, "-h", "--help"):
        argv.insert(0, "run")
    return argv


def _divider(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.size > _U32:
        parser.error(f"--size must be at most {_U32} bytes")
    try:
        return rate_divider(args.rate, args.size, args.clock_hz)
    except ValueError as error:
        parser.error(f"--rate: {error}")


def _ring(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.ring is None:
        return 0
    if not args.write:
        parser.error("--ring applies to --write only (SEND lands in posted receives)")
    if args.size and args.ring < args.size:
        parser.error(f"--ring {args.ring} must hold at least one message of --size {args.size}")
    if args.size and args.imm and args.count > 1 and args.ring < 2 * args.size:
        parser.error("--ring must hold at least two messages with --imm (one is being "
                     "written while the other is checked)")
    if args.ring > _U32:
        parser.error(f"--ring must be at most {_U32} bytes (the start datagram's field)")
    return args.ring


def _cm(args: argparse.Namespace, endpoint: str | None = None) -> CmClient:
    """The CM client of ``endpoint`` (``IP[:PORT]``; default ``--endpoint``)."""
    address, _, port = (endpoint or args.endpoint).partition(":")
    return CmClient(address, cm_port=int(port) if port else args.cm_port, bind=args.bind,
                    timeout=args.timeout, retries=args.retries)


def _endpoints(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """``--endpoint`` (repeated) and the ``--endpoints-file`` lines, in order."""
    endpoints = list(args.endpoint or [])
    if args.endpoints_file is not None:
        with args.endpoints_file as file:
            for line in parse_endpoints(file.read()):
                try:
                    endpoints.append(parse_endpoint(line))
                except argparse.ArgumentTypeError as error:
                    parser.error(f"--endpoints-file: {error}")
    endpoints = endpoints or [DEFAULT_ENDPOINT]
    if len(set(endpoints)) != len(endpoints):
        parser.error(f"an endpoint is given twice: {' '.join(endpoints)}")
    if len(endpoints) > 1 and args.bind[1] != 0:
        parser.error("--bind with a fixed port needs a single --endpoint (each endpoint has "
                     "its own CM socket)")
    return endpoints


def main(argv: Sequence[str] | None = None, *, backend: BackendFactory | None = None,
         stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run ``qp-server`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    ``backend`` makes the verbs backend (default :class:`host.verbs.PyverbsBackend`);
    tests pass a fake with the :class:`host.backend.Backend` methods.
    """
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = build_parser()
    args = parser.parse_args(_with_command(sys.argv[1:] if argv is None else argv))
    try:
        if args.command == "ctrl":
            return _ctrl(parser, args, out)
        return _run(parser, args, backend, out, err)
    except HostError as error:
        print(f"{_PROG}: error: {error}", file=err)
        return 1


def _ctrl(parser: argparse.ArgumentParser, args: argparse.Namespace, out: TextIO) -> int:
    with _cm(args) as cm:
        if args.action == "status":
            status = cm.status(args.qpn)
            fields = {"qpn": args.qpn, **dataclasses.asdict(status),
                      "error_status_name": error_status_name(status.error_status)}
            if args.json:
                print(json.dumps(fields), file=out)
            else:
                for name, value in fields.items():
                    print(f"{name}: {value}", file=out)
            return 0
        if args.action == "close-qp":
            ack = cm.close_qp(args.qpn, args.host_ip)
            print(f"closed endpoint QP {args.qpn}" if ack == protocol.Ack.ACK
                  else f"endpoint QP {args.qpn} was not open (NO_QP)", file=out)
            return 0
        status = cm.start(args.qpn, length=args.size, count=args.count,
                          divider=_divider(parser, args), write=args.write, immediate=args.imm,
                          ring=_ring(parser, args))
        state = "in ERROR" if status.error else "running" if status.running else "done"
        print(f"started endpoint QP {args.qpn}: {state}, {status.messages} messages, "
              f"{status.packets} packets so far", file=out)
        return 1 if status.error else 0


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace,
         backend: BackendFactory | None, out: TextIO, err: TextIO) -> int:
    try:
        config = RunConfig(
            write=args.write, immediate=args.imm, size=args.size, count=args.count,
            divider=_divider(parser, args), ring=_ring(parser, args), qps=args.qps,
            receives=args.receives, mtu=PathMtu.from_size(args.mtu) if args.mtu else None,
            start=not args.no_start, stall=args.stall, repeat=args.repeat,
            reclaim=args.reclaim, credit=args.credit,
            idle_sleep=0.0 if args.poll == "busy" else 1e-3, check=args.check,
            check_threads=args.check_threads, cm=args.cm, rdma_port=args.rdma_port,
            rdma_timeout=args.rdma_timeout, listen=args.listen)
    except ValueError as error:
        parser.error(str(error))
    endpoints = _endpoints(parser, args)
    live = err.isatty()
    clear = _CLEAR_LINE if live else ""

    def notice(text: str) -> None:
        print(f"{clear}{_PROG}: {text}", file=err)

    def progress(line: str) -> None:
        err.write(f"{_CLEAR_LINE}{line}")
        err.flush()

    if args.numa_node is not None:
        cpus = pin_to_node(args.numa_node)
        notice(f"pinned to NUMA node {args.numa_node} (CPUs {_cpu_text(cpus)})")
    if backend is None:
        from .verbs import PyverbsBackend
        backend = PyverbsBackend
    devices = _endpoint_devices(parser, args.device, endpoints)
    options = [VerbsOptions(device=device, ib_port=args.ib_port, gid_index=args.gid_index,
                            poll=args.poll) for device in devices]
    if len(endpoints) > 1:
        return _run_many(args, config, endpoints, backend, options, out, err)
    verbs = backend(options[0])
    with _cm(args, endpoints[0]) as cm, _terminate_as_interrupt():
        runner = Runner(config, verbs, cm, progress=progress if live else None, notice=notice)
        try:
            result = runner.run()
        except KeyboardInterrupt:
            result = runner.result(interrupted=True)
        except HostError as error:
            if args.json:
                failed = runner.result(error=str(error))
                print(json.dumps(failed.to_json()), file=out)
            raise
        finally:
            err.write(clear)
    print(json.dumps(result.to_json()) if args.json else result.summary_text(), file=out)
    if result.interrupted:
        print(f"{_PROG}: interrupted; the QPs are closed", file=err)
        return 130
    if not result.ok:
        print(f"{_PROG}: error: {result.first_error or 'not every message was checked'}",
              file=err)
        return 1
    return 0


def _endpoint_devices(parser: argparse.ArgumentParser, devices: list[str] | None,
                     endpoints: list[str]) -> list[str | None]:
    """The RDMA device of each endpoint: ``--device`` given never (the first device),
    once (that one for all) or once per endpoint (paired in order)."""
    devices = devices or [None]
    if len(devices) == 1:
        return devices * len(endpoints)
    if len(devices) != len(endpoints):
        parser.error(f"--device is given {len(devices)} times for {len(endpoints)} "
                     "endpoints: give it once for all or once per endpoint")
    return devices


def _run_many(args: argparse.Namespace, config: RunConfig, endpoints: list[str],
              backend: BackendFactory, options: list[VerbsOptions], out: TextIO,
              err: TextIO) -> int:
    """One run per endpoint (each with its ``options``), in parallel; the table per
    endpoint and in total."""
    live = err.isatty()
    clear = _CLEAR_LINE if live else ""

    def notice_for(endpoint: str) -> Callable[[str], None]:
        def notice(text: str) -> None:
            print(f"{clear}{_PROG}: {endpoint}: {text}", file=err)
        return notice

    def progress(line: str) -> None:
        err.write(f"{_CLEAR_LINE}{line}")
        err.flush()

    clients: list[CmClient] = []
    try:
        runners = []
        for endpoint, verbs_options in zip(endpoints, options, strict=True):
            clients.append(_cm(args, endpoint))
            runners.append((endpoint, Runner(config, backend(verbs_options), clients[-1],
                                             notice=notice_for(endpoint))))
        with _terminate_as_interrupt():
            try:
                outcomes = run_endpoints(runners, progress=progress if live else None)
            except KeyboardInterrupt:
                print(f"{clear}{_PROG}: interrupted; the QPs are closed", file=err)
                return 130
            finally:
                err.write(clear)
    finally:
        for client in clients:
            client.close()
    print(json.dumps(fleet_json(outcomes)) if args.json else fleet_text(outcomes), file=out)
    failed = [outcome for outcome in outcomes if not outcome.ok]
    for outcome in failed:
        reason = outcome.error or (outcome.result.first_error if outcome.result else None)
        print(f"{_PROG}: error: endpoint {outcome.endpoint}: "
              f"{reason or 'not every message was checked'}", file=err)
    return 1 if failed else 0


class _terminate_as_interrupt:
    """SIGTERM raises KeyboardInterrupt while a run is active, so QPs get closed."""

    def __enter__(self) -> None:
        self._installed = threading.current_thread() is threading.main_thread()
        if self._installed:
            self._previous = signal.signal(signal.SIGTERM, _raise_interrupt)

    def __exit__(self, *exc_info: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous or signal.SIG_DFL)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _cpu_text(cpus: set[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))


if __name__ == "__main__":
    sys.exit(main())
