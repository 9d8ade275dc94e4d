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
``rdma_disconnect`` and reports how the disconnect ended: DISCONNECTED when the
endpoint answered the DREQ with DREP (or the host's CM gave the DREQ up), and after
how many seconds.

The rdma_cm events are read with librdmacm itself (:class:`EventChannel`, through
ctypes on pyverbs' event channel), since pyverbs' ``CMEvent`` does not show an
event's status: a REJECTED event's status is the REJ reason, which
:class:`Rejected` carries and the JSON line reports as ``rej_reason``.
``qp-server --cm rdma`` (:mod:`host.verbs`) connects its QPs with the same
:class:`CmLink`.

Exit 0 when connected (and the run, if any, was byte-exact), 1 with
``rdma-connect: error: <what to do>`` otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import select
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any

from .cm import CmClient
from .errors import HostError
from .protocol import CM_PORT, generator_payload

__all__ = ["ENDPOINT_PORT", "CONNECT_PRIVATE", "ACCEPT_PRIVATE", "REJ_REASONS", "CmEvent",
           "EventChannel", "CmId", "CmLink", "Rejected", "NoEvent", "connect_private",
           "connect_failed", "parse_accept_private", "event_error", "build_parser", "main"]

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
_RDMA_CM_DEVICE = "/dev/infiniband/rdma_cm"

#: librdmacm's ``enum rdma_cm_event_type``, in order.
EVENT_NAMES = (
    "ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED", "ROUTE_ERROR", "CONNECT_REQUEST",
    "CONNECT_RESPONSE", "CONNECT_ERROR", "UNREACHABLE", "REJECTED", "ESTABLISHED",
    "DISCONNECTED", "DEVICE_REMOVAL", "MULTICAST_JOIN", "MULTICAST_ERROR", "ADDR_CHANGE",
    "TIMEWAIT_EXIT",
)

#: REJ reasons (IBTA Vol. 1 table 112) the endpoint sends, and what to do about each.
REJ_REASONS = {
    3: ("no QP available", "every endpoint QP is in use: close some (`qp-server --reclaim` "
        "on their host) or wait for the endpoint's lease to free idle ones"),
    8: ("invalid service ID", "nothing listens on that rdma_cm port: give the endpoint's "
        f"port (default {ENDPOINT_PORT})"),
    26: ("invalid path MTU", "use a path MTU the endpoint supports (set the interface MTU)"),
    28: ("consumer reject", "the endpoint refused the REQ's private data: it takes version "
         f"{PRIVATE_VERSION} (rkey, base, length of a registered buffer); update the host "
         "tools or the endpoint so they agree"),
}


def connect_private(*, rkey: int, base: int, length: int,
                    version: int = PRIVATE_VERSION) -> bytes:
    """The private data a host gives ``rdma_connect`` to open an endpoint QP."""
    return CONNECT_PRIVATE.pack(version, rkey, base, length)


def parse_accept_private(private: bytes, message: str = "REP") -> tuple[int, int]:
    """``(version, qpn)`` of the endpoint's REP private data (or of the user part of
    its REQ's, ``message`` "REQ", when the endpoint is the active side)."""
    if len(private) < ACCEPT_PRIVATE.size:
        raise HostError(f"the {message} carried {len(private)} bytes of private data, fewer "
                        f"than {ACCEPT_PRIVATE.size}: is the peer the endpoint?")
    return ACCEPT_PRIVATE.unpack_from(private)


@dataclasses.dataclass(frozen=True)
class CmEvent:
    """One rdma_cm event: its type, status (a REJECTED event's: the REJ reason) and
    private data."""
    kind: int
    status: int = 0
    private: bytes = b""

    @property
    def name(self) -> str:
        return EVENT_NAMES[self.kind] if 0 <= self.kind < len(EVENT_NAMES) \
            else f"event {self.kind}"


class Rejected(HostError):
    """The endpoint answered the REQ with REJ; ``reason`` is the REJ reason."""

    def __init__(self, where: str, reason: int):
        self.reason = reason
        meaning, fix = REJ_REASONS.get(reason, ("", "check the port, the private data, the "
                                                    "path MTU, and that a QP is free"))
        super().__init__(f"{where} REJECTED the connection with reason {reason}"
                         + (f" ({meaning})" if meaning else "") + f": {fix}")


def event_error(event: CmEvent, where: str, expected: str) -> HostError | None:
    """None when ``event`` is the ``expected`` one after ``rdma_connect``, else the
    error that says what happened and what to do."""
    if event.name == expected:
        return None
    if event.name == "REJECTED":
        return Rejected(where, event.status)
    if event.name == "UNREACHABLE":
        return HostError(f"{where} is UNREACHABLE: the endpoint never answered the REQ "
                         "(is it up, at that address, answering ARP and MADs on QP1?)")
    if event.name == "CONNECT_ERROR":
        return HostError(f"connecting to {where} ended in CONNECT_ERROR (status "
                         f"{event.status}): the REP could not be applied to the host QP "
                         "(path MTU, device)")
    return HostError(f"connecting to {where} ended in {event.name} (status {event.status}), "
                     f"not {expected}")


class NoEvent(HostError):
    """No rdma_cm event came within the time allowed."""


class _Channel(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int)]


class _ConnParam(ctypes.Structure):
    _fields_ = [("private_data", ctypes.c_void_p), ("private_data_len", ctypes.c_uint8),
                ("responder_resources", ctypes.c_uint8), ("initiator_depth", ctypes.c_uint8),
                ("flow_control", ctypes.c_uint8), ("retry_count", ctypes.c_uint8),
                ("rnr_retry_count", ctypes.c_uint8), ("srq", ctypes.c_uint8),
                ("qp_num", ctypes.c_uint32)]


class _Event(ctypes.Structure):
    """``struct rdma_cm_event`` up to ``param.conn`` (librdmacm allocates it)."""
    _fields_ = [("id", ctypes.c_void_p), ("listen_id", ctypes.c_void_p),
                ("event", ctypes.c_int), ("status", ctypes.c_int), ("conn", _ConnParam)]


def _rdma_cm_fds() -> set[int]:
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == _RDMA_CM_DEVICE:
                fds.add(int(name))
        except OSError:
            continue
    return fds


class EventChannel:
    """A pyverbs ``CMEventChannel`` (``channel``, for ``CMID``) whose events
    :meth:`get` reads with librdmacm's ``rdma_get_cm_event`` through ctypes (the
    library pyverbs itself uses), waiting on its file descriptor with a timeout."""

    def __init__(self) -> None:
        from pyverbs.cmid import CMEventChannel

        before = _rdma_cm_fds()
        self.channel = CMEventChannel()
        new = _rdma_cm_fds() - before
        if len(new) != 1:
            self.channel.close()
            raise HostError(f"cannot find the descriptor of the rdma_cm event channel "
                            f"({_RDMA_CM_DEVICE}): is rdma_ucm loaded?")
        self.fd = new.pop()
        self._lib = ctypes.CDLL("librdmacm.so.1", use_errno=True)
        self._lib.rdma_get_cm_event.argtypes = [ctypes.POINTER(_Channel),
                                                ctypes.POINTER(ctypes.POINTER(_Event))]
        self._lib.rdma_ack_cm_event.argtypes = [ctypes.POINTER(_Event)]

    def ready(self, timeout: float = 0.0) -> bool:
        """Whether an event is waiting, or comes within ``timeout`` seconds."""
        readable, _, _ = select.select([self.fd], [], [], timeout)
        return bool(readable)

    def _wait(self, what: str, timeout: float) -> None:
        if not self.ready(timeout):
            raise NoEvent(f"{what}: no rdma_cm event within {timeout:g} s: is the endpoint "
                            "up? (or wait longer: --timeout of rdma_connect and "
                            "rdma_listen, --rdma-timeout of qp-server)")

    def get(self, what: str, timeout: float) -> CmEvent:
        """The next event, within ``timeout`` seconds (else a HostError naming ``what``)."""
        self._wait(what, timeout)
        event = ctypes.POINTER(_Event)()
        if self._lib.rdma_get_cm_event(ctypes.byref(_Channel(self.fd)), ctypes.byref(event)):
            raise HostError(f"{what}: rdma_get_cm_event failed: "
                            f"{os.strerror(ctypes.get_errno())}")
        got = event.contents
        conn = got.conn
        private = (ctypes.string_at(conn.private_data, conn.private_data_len)
                   if conn.private_data and conn.private_data_len else b"")
        result = CmEvent(got.event, got.status, private)
        self._lib.rdma_ack_cm_event(event)
        return result

    def request(self, listen_id: Any, what: str, timeout: float) -> tuple[Any, CmEvent]:
        """The next event, within ``timeout`` seconds, as a CONNECT_REQUEST on the
        listening ``listen_id``: the pyverbs ``CMID`` of the new connection and the
        event (its private data: the REQ's after rdma_cm's ``cma_hdr``). Read with
        pyverbs' ``CMEvent``, since only that makes a ``CMID`` of the new ID; any other
        event is a HostError naming it."""
        from pyverbs.cmid import CMID, CMEvent

        self._wait(what, timeout)
        event = CMEvent(self.channel)
        try:
            got = CmEvent(event.event_type)
            if got.name != "CONNECT_REQUEST":
                raise HostError(f"{what}: {got.name}, not CONNECT_REQUEST: did another "
                                "program bind the same rdma_cm port?")
            got = CmEvent(event.event_type, 0, event.private_data)
            return CMID(creator=event, listen_id=listen_id), got
        finally:
            event.close()

    def close(self) -> None:
        self.channel.close()


class CmId:
    """One rdma_cm ID (``cmid``) on its own :class:`EventChannel` (``events``), with
    what both sides of a connection do: move a caller's QP to RTS, disconnect, close.
    ``where`` names the peer in errors; ``timeout``: seconds for each event."""

    def __init__(self, where: str, timeout: float):
        from pyverbs.cmid import CMID

        self.timeout = timeout
        self.where = where
        self.events = EventChannel()
        self.cmid = CMID(creator=self.events.channel)
        self.established = False

    def _expect(self, name: str, what: str, fix: str) -> None:
        event = self.events.get(what, self.timeout)
        if event.name != name:
            raise HostError(f"{what}: {event.name} (status {event.status}): {fix}")

    def to_rts(self, qp: Any, min_rnr_timer: int | None = None) -> None:
        """Move the caller's ``qp`` to RTR and RTS with the attributes rdma_cm took from
        the REQ or REP (``min_rnr_timer``: the RNR timer ``qp`` announces instead of
        rdma_cm's)."""
        import pyverbs.enums as e

        for state in (e.IBV_QPS_RTR, e.IBV_QPS_RTS):
            attr, mask = self.cmid.init_qp_attr(state)
            if state == e.IBV_QPS_RTR and min_rnr_timer is not None:
                attr.min_rnr_timer = min_rnr_timer
            qp.modify(attr, mask)

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
        try:
            outcome["event"] = self.events.get("waiting for DISCONNECTED", timeout).name
        except NoEvent:
            outcome["event"] = None
            outcome["error"] = (f"no rdma_cm event within {timeout:g} s: the endpoint did not "
                                "answer the DREQ with DREP")
        except HostError as error:
            outcome["event"] = None
            outcome["error"] = str(error)
        outcome["seconds"] = round(time.monotonic() - started, 2)
        return outcome

    def close(self) -> None:
        for thing in (self.cmid, self.events):
            thing.close()


class CmLink(CmId):
    """An rdma_cm ID towards ``endpoint``, rdma_cm port ``port``, with its address
    and route resolved; :meth:`connect` then connects a QP: the ID's own
    (``cmid.create_qp``) or ``qp``, a QP created by the caller on the same device
    (rdma_cm gives its RTR and RTS attributes and this sends RTU with
    ``rdma_establish``)."""

    def __init__(self, endpoint: str, port: int, timeout: float):
        import pyverbs.cm_enums as ce
        from pyverbs.cmid import AddrInfo

        super().__init__(f"{endpoint} port {port}", timeout)
        info = AddrInfo(dst=endpoint, dst_service=str(port), port_space=ce.RDMA_PS_TCP)
        self.cmid.resolve_addr(info, int(timeout * 1000))
        self._expect("ADDR_RESOLVED", f"resolving {endpoint}",
                     "is rdma_rxe bound to the interface that routes to it "
                     "(`rdma link`), and rdma_ucm loaded?")
        self.cmid.resolve_route(int(timeout * 1000))
        self._expect("ROUTE_RESOLVED", f"resolving the route to {endpoint}",
                     "does the endpoint answer ARP?")

    def connect(self, private: bytes, qp: Any = None, *,
                min_rnr_timer: int | None = None) -> bytes:
        """``rdma_connect`` with ``private``; the REP's private data once connected,
        :class:`Rejected` or another HostError otherwise. ``min_rnr_timer``: the RNR
        timer the caller's ``qp`` announces instead of rdma_cm's."""
        from pyverbs.cmid import ConnParam

        param = ConnParam(data_len=len(private), qp_num=0 if qp is None else qp.qp_num)
        param.set_private_data(private)
        self.cmid.connect(param)
        expected = "ESTABLISHED" if qp is None else "CONNECT_RESPONSE"
        event = self.events.get(f"connecting to {self.where}", self.timeout)
        error = event_error(event, self.where, expected)
        if error is not None:
            raise error
        if qp is not None:
            self.ready(qp, min_rnr_timer)
        self.established = True
        return event.private

    def ready(self, qp: Any, min_rnr_timer: int | None = None) -> None:
        """Move the caller's ``qp`` to RTR and RTS with the attributes rdma_cm took from
        the REP, then send RTU."""
        self.to_rts(qp, min_rnr_timer)
        self.cmid.establish()


class Connection(CmLink):
    """One RC QP of rdma_cm's own (``cmid.create_qp``) connected to the endpoint, with
    a registered buffer of ``buffer_bytes`` named in the REQ's private data
    (``version`` other than 1 only to try the endpoint's check)."""

    def __init__(self, endpoint: str, port: int, buffer_bytes: int, timeout: float, *,
                 version: int = PRIVATE_VERSION):
        import pyverbs.enums as e
        from pyverbs.mr import MR
        from pyverbs.qp import QPCap, QPInitAttr

        super().__init__(endpoint, port, timeout)
        cap = QPCap(max_send_wr=1, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        self.cmid.create_qp(QPInitAttr(qp_type=e.IBV_QPT_RC, cap=cap, sq_sig_all=1))
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        self.mr = MR(self.cmid.pd, max(buffer_bytes, 64), access)
        self.mr.write(bytes((_FILL,)) * self.mr.length, self.mr.length)
        self.private = connect_private(rkey=self.mr.rkey, base=self.mr.buf,
                                       length=self.mr.length, version=version)
        self.rep_version, self.rep_qpn = parse_accept_private(self.connect(self.private))
        attr, _ = self.cmid.query_qp(e.IBV_QP_AV | e.IBV_QP_STATE | e.IBV_QP_PATH_MTU)
        self.dest_qpn = attr.dest_qp_num
        self.path_mtu = 128 << attr.path_mtu
        self.qp_state = attr.qp_state

    def read(self, offset: int, length: int) -> bytes:
        return self.mr.read(length, offset)

    def close(self) -> None:
        mr = getattr(self, "mr", None)
        if mr is not None:
            mr.close()
        super().close()


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


def connect_failed(result: dict, error: HostError | ImportError, prog: str) -> int:
    """The JSON ``result`` of a connect program that ``error`` stopped: the error (with a
    REJ's reason), also printed as ``prog: error: ...``; the exit code, 1."""
    if isinstance(error, ImportError):
        result["error"] = f"pyverbs is missing ({error}): install python3-pyverbs"
    else:
        result.setdefault("established", False)
        if isinstance(error, Rejected):
            result["rej_reason"] = error.reason
        result["error"] = str(error)
    print(f"{prog}: error: {result['error']}", file=sys.stderr)
    return 1


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
    parser.add_argument("--private-version", type=int, default=PRIVATE_VERSION,
                        choices=range(256), metavar="N",
                        help=f"the version byte of the REQ's private data (default "
                             f"{PRIVATE_VERSION}; another one tries the endpoint's REJ)")
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
        connection = Connection(args.endpoint, args.port, args.buffer, args.timeout,
                                version=args.private_version)
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
    except (HostError, ImportError) as error:
        code = connect_failed(result, error, _PROG)
    finally:
        if connection is not None:
            connection.close()
    print(json.dumps(result), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
