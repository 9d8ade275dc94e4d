"""``python -m host.rdma_connect``: open an endpoint QP with the kernel's ``rdma_connect``.

The endpoint's passive IB CM (``docs/connection-manager.md``, "Standard RDMA CM")
listens on rdma_cm's TCP port space, port :data:`ENDPOINT_PORT`. The REQ's private
data after rdma_cm's ``cma_hdr`` (:func:`connect_private`) names a registered buffer:
version 1, its rkey, address and length. The endpoint answers REP (its QPN in the
private data) and the host's rdma_cm completes the connection with RTU.

The program connects an RC QP through pyverbs (``CMID`` on an event channel), waits
for ESTABLISHED, and prints one JSON line: the endpoint's QPN from the REP private
data and from the QP's attributes (``dest_qp_num``). With ``--size`` and ``--count``
it then starts a generator WRITE run on that QP through the UDP CM
(:meth:`host.cm.CmClient.start`, from the host's address) and checks every byte of the
buffer against :func:`host.protocol.generator_payload`. Last it calls
``rdma_disconnect`` and reports how the disconnect ended (the endpoint does not answer
DREQ: the host's CM retries it and reports DISCONNECTED when it gives up).

Exit 0 when connected (and the run, if any, was byte-exact), 1 with
``rdma-connect: error: <what to do>`` otherwise.
"""

from __future__ import annotations

import argparse
import json
import signal
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any

from .cm import CmClient
from .errors import HostError
from .protocol import CM_PORT, generator_payload

__all__ = ["ENDPOINT_PORT", "CONNECT_PRIVATE", "ACCEPT_PRIVATE", "connect_private",
           "parse_accept_private", "build_parser", "main"]

_PROG = "rdma-connect"
#: The endpoint's rdma_cm port (service ID 0x0106 << 16 | port): the UDP CM's port.
ENDPOINT_PORT = CM_PORT
#: The REQ private data's user part (after the 36-byte cma_hdr that rdma_cm puts first):
#: version, 3 reserved bytes, rkey, buffer address, buffer length (big-endian).
CONNECT_PRIVATE = struct.Struct(">B3xIQQ")
#: The REP private data: version, 3 reserved bytes, the endpoint's QPN.
ACCEPT_PRIVATE = struct.Struct(">B3xI")
PRIVATE_VERSION = 1
_FILL = 0xA5


def connect_private(*, rkey: int, base: int, length: int,
                    version: int = PRIVATE_VERSION) -> bytes:
    """The private data a host gives ``rdma_connect`` to open an endpoint QP."""
    return CONNECT_PRIVATE.pack(version, rkey, base, length)


def parse_accept_private(private: bytes) -> tuple[int, int]:
    """``(version, qpn)`` of the endpoint's REP private data."""
    if len(private) < ACCEPT_PRIVATE.size:
        raise HostError(f"the REP carried {len(private)} bytes of private data, fewer than "
                        f"{ACCEPT_PRIVATE.size}: is the peer the endpoint?")
    return ACCEPT_PRIVATE.unpack_from(private)


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Timeout


class Connection:
    """One RC QP connected to the endpoint through rdma_cm (pyverbs)."""

    def __init__(self, endpoint: str, port: int, buffer_bytes: int, timeout: float):
        import pyverbs.cm_enums as ce
        import pyverbs.enums as e
        from pyverbs.cmid import CMID, AddrInfo, CMEventChannel, ConnParam
        from pyverbs.mr import MR
        from pyverbs.qp import QPCap, QPInitAttr

        self._ce = ce
        self.timeout = timeout
        self.channel = CMEventChannel()
        self.cmid = CMID(creator=self.channel)
        self.established = False
        where = f"{endpoint} port {port}"
        info = AddrInfo(dst=endpoint, dst_service=str(port), port_space=ce.RDMA_PS_TCP)
        self.cmid.resolve_addr(info, int(timeout * 1000))
        self._expect(ce.RDMA_CM_EVENT_ADDR_RESOLVED, f"resolving {endpoint}",
                     "is rdma_rxe bound to the interface that routes to it "
                     "(`rdma link`), and rdma_ucm loaded?")
        self.cmid.resolve_route(int(timeout * 1000))
        self._expect(ce.RDMA_CM_EVENT_ROUTE_RESOLVED, f"resolving the route to {endpoint}",
                     "does the endpoint answer ARP?")
        cap = QPCap(max_send_wr=1, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        self.cmid.create_qp(QPInitAttr(qp_type=e.IBV_QPT_RC, cap=cap, sq_sig_all=1))
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        self.mr = MR(self.cmid.pd, max(buffer_bytes, 64), access)
        self.mr.write(bytes((_FILL,)) * self.mr.length, self.mr.length)
        self.private = connect_private(rkey=self.mr.rkey, base=self.mr.buf,
                                       length=self.mr.length)
        param = ConnParam(data_len=len(self.private))
        param.set_private_data(self.private)
        self.cmid.connect(param)
        event = self._event(f"connecting to {where}")
        kind = event.event_type
        private = event.private_data
        event.ack_cm_event()
        if kind == ce.RDMA_CM_EVENT_REJECTED:
            raise HostError(f"{where} REJECTED the connection (pyverbs does not show the "
                            "reason; the endpoint's ib_cm.rej_* counters do): check the port "
                            "(service ID), that the REQ's private data is version 1 with a "
                            "registered buffer, the path MTU, and that a QP is free")
        if kind == ce.RDMA_CM_EVENT_UNREACHABLE:
            raise HostError(f"{where} is UNREACHABLE: the endpoint never answered the REQ "
                            "(is it up, at that address, answering ARP and MADs on QP1?)")
        if kind != ce.RDMA_CM_EVENT_ESTABLISHED:
            raise HostError(f"connecting to {where} ended in {_event_name(kind)}, not "
                            "ESTABLISHED")
        self.established = True
        self.rep_version, self.rep_qpn = parse_accept_private(private)
        attr, _ = self.cmid.query_qp(e.IBV_QP_AV | e.IBV_QP_STATE | e.IBV_QP_PATH_MTU)
        self.dest_qpn = attr.dest_qp_num
        self.path_mtu = 128 << attr.path_mtu
        self.qp_state = attr.qp_state

    def _event(self, what: str) -> Any:
        from pyverbs.cmid import CMEvent
        from pyverbs.pyverbs_error import PyverbsError

        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, self.timeout)
        try:
            return CMEvent(self.channel)
        except (_Timeout, PyverbsError) as error:
            if isinstance(error, _Timeout) or signal.getitimer(signal.ITIMER_REAL)[0] == 0:
                raise HostError(f"{what}: no rdma_cm event within {self.timeout:g} s "
                                "(raise --timeout; is the endpoint up?)") from None
            raise HostError(f"{what}: {error}") from None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def _expect(self, kind: int, what: str, fix: str) -> None:
        event = self._event(what)
        got = event.event_type
        event.ack_cm_event()
        if got != kind:
            raise HostError(f"{what}: {_event_name(got)}: {fix}")

    def read(self, offset: int, length: int) -> bytes:
        return self.mr.read(length, offset)

    def disconnect(self, timeout: float) -> dict:
        """``rdma_disconnect``, then the next event (DISCONNECTED when the DREQ is
        answered or given up) within ``timeout`` seconds."""
        started = time.monotonic()
        outcome: dict = {}
        try:
            self.cmid.disconnect()
            outcome["disconnect_call"] = "returned"
        except Exception as error:      # noqa: BLE001 -- reported, not fatal
            outcome["disconnect_call"] = f"raised {error}"
            return outcome
        self.timeout = timeout
        try:
            event = self._event("waiting for DISCONNECTED")
            outcome["event"] = _event_name(event.event_type)
            event.ack_cm_event()
        except HostError as error:
            outcome["event"] = None
            outcome["error"] = str(error)
        outcome["seconds"] = round(time.monotonic() - started, 2)
        return outcome

    def close(self) -> None:
        for name in ("mr", "cmid", "channel"):
            thing = getattr(self, name, None)
            if thing is not None:
                thing.close()


def _event_name(kind: int) -> str:
    import pyverbs.cm_enums as ce

    for name in dir(ce):
        if name.startswith("RDMA_CM_EVENT_") and getattr(ce, name) == kind:
            return name.removeprefix("RDMA_CM_EVENT_")
    return f"event {kind}"


def check_run(connection: Connection, size: int, count: int, timeout: float) -> dict:
    """Wait until the buffer holds ``count`` messages of ``size`` bytes back to back
    (the generator's WRITE k lands at base + k x size), then compare each one."""
    deadline = time.monotonic() + timeout
    last = generator_payload(count - 1, size)
    while connection.read((count - 1) * size, size) != last:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    wrong = [k for k in range(count)
             if connection.read(k * size, size) != generator_payload(k, size)]
    return {"messages": count, "size": size, "messages_ok": count - len(wrong),
            "first_wrong": wrong[0] if wrong else None}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m host.{__name__.rpartition('.')[2]}",
        description="Connect an RC QP to the endpoint with rdma_connect (its passive IB CM) "
                    "and print the endpoint's QPN as JSON; optionally run a generator WRITE "
                    "run on it and check the bytes.")
    parser.add_argument("--endpoint", required=True, help="the endpoint's IPv4 address")
    parser.add_argument("--port", type=int, default=ENDPOINT_PORT,
                        help=f"its rdma_cm port (default {ENDPOINT_PORT})")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds to wait for each rdma_cm event (default 30)")
    parser.add_argument("--size", type=int, default=0,
                        help="bytes per generator WRITE message (0: connect only)")
    parser.add_argument("--count", type=int, default=1, help="messages in the run")
    parser.add_argument("--run-timeout", type=float, default=120.0,
                        help="seconds to wait for the run's bytes (default 120)")
    parser.add_argument("--disconnect-timeout", type=float, default=30.0,
                        help="seconds to wait for DISCONNECTED after rdma_disconnect "
                             "(default 30)")
    parser.add_argument("--buffer", type=int, default=1 << 16,
                        help="bytes of the registered buffer (default 65536)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.size and args.size * args.count > args.buffer:
        print(f"{_PROG}: error: {args.count} x {args.size} bytes do not fit the "
              f"{args.buffer}-byte buffer: raise --buffer", file=sys.stderr)
        return 2
    connection: Connection | None = None
    result: dict = {"endpoint": args.endpoint, "port": args.port}
    code = 0
    started = time.monotonic()
    try:
        connection = Connection(args.endpoint, args.port, args.buffer, args.timeout)
        result.update(established=True, rep_version=connection.rep_version,
                      endpoint_qpn=connection.rep_qpn, dest_qp_num=connection.dest_qpn,
                      host_qpn=connection.cmid.qpn, path_mtu=connection.path_mtu,
                      qp_state=connection.qp_state, rkey=connection.mr.rkey,
                      connect_seconds=round(time.monotonic() - started, 2))
        print(f"{_PROG}: ESTABLISHED with endpoint QP {connection.rep_qpn}", file=sys.stderr)
        if args.size:
            with CmClient(args.endpoint, timeout=5.0) as cm:
                cm.start(connection.rep_qpn, length=args.size, count=args.count)
                run = check_run(connection, args.size, args.count, args.run_timeout)
                status = cm.status(connection.rep_qpn)
                run.update(status_messages=status.messages, status_bytes=status.bytes,
                           status_error=status.error)
            result["run"] = run
            if run["messages_ok"] != args.count:
                code = 1
                print(f"{_PROG}: error: {run['messages_ok']} of {args.count} messages "
                      f"byte-exact, first wrong {run['first_wrong']}", file=sys.stderr)
        result["disconnect"] = connection.disconnect(args.disconnect_timeout)
    except HostError as error:
        result.setdefault("established", False)
        result["error"] = str(error)
        print(f"{_PROG}: error: {error}", file=sys.stderr)
        code = 1
    except ImportError as error:
        result["error"] = f"pyverbs is missing ({error}): install python3-pyverbs"
        print(f"{_PROG}: error: {result['error']}", file=sys.stderr)
        code = 1
    finally:
        if connection is not None:
            connection.close()
    print(json.dumps(result), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
