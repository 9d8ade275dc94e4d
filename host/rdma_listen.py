"""``python -m host.rdma_listen``: the endpoint connects to the host's rdma_cm listener.

The endpoint's active IB CM (``docs/connection-manager.md``, "Standard RDMA CM") is
asked over UDP with CONNECT (:func:`host.protocol.connect`): the host's address, the
rdma_cm port it listens on and the path MTU. The endpoint takes a free QP and sends
that port a REQ whose private data after rdma_cm's ``cma_hdr`` is version 1 and its
QPN (:data:`host.rdma_connect.ACCEPT_PRIVATE`). The host accepts with the private
data of :func:`host.rdma_connect.connect_private` (its registered buffer), the
endpoint completes with RTU and answers CONNECT/ACK (its QPN, first PSN and path
MTU); a REJ, or no REP, answers CONNECT/NAK with the REJ reason in ``count``.
CONNECT is a UDP request: :class:`Listener` resends it every
:data:`CONNECT_RESEND` seconds until it has the answer (a repeat never costs a
second QP).

The program listens, asks, accepts with an RC QP of rdma_cm's own and a registered
buffer, prints one JSON line (the endpoint's QPN from the REQ and from the ACK, its
first PSN, the path MTU), then calls ``rdma_disconnect`` and reports how it ended.
``--connect-port`` names another port in CONNECT than the one listened on, to try
the endpoint's NAK. ``qp-server --cm rdma --listen PORT`` (:mod:`host.verbs`)
connects its QPs with the same :class:`Listener` and runs the generator on them.

Exit 0 when connected, 1 with ``rdma-listen: error: <what to do>`` otherwise.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from .cm import DEFAULT_ENDPOINT, CmClient
from .errors import HostError
from .protocol import CM_PORT, FIRST_QPN, Ack, Datagram, PathMtu, Request
from .protocol import connect as connect_request
from .rdma_connect import (
    PRIVATE_VERSION,
    REJ_REASONS,
    CmId,
    Rejected,
    connect_failed,
    connect_private,
    event_error,
    parse_accept_private,
)

__all__ = ["LISTEN_PORT", "CONNECT_RESEND", "CONNECT_NAKS", "Listener", "ConnectRejected",
           "Accepted", "source_address",
           "build_parser", "main"]

_PROG = "rdma-listen"
#: The host's default rdma_cm port for the endpoint's REQ.
LISTEN_PORT = 18515
#: Seconds between the CONNECT datagrams a host sends until it has the answer.
CONNECT_RESEND = 1.5
_SLICE = 0.02


#: CONNECT/NAK reasons (``count``: a REJ reason, IBTA Vol. 1 table 112) and what to do.
CONNECT_NAKS = {
    3: REJ_REASONS[3],
    4: ("no REP", "the host's rdma_cm never answered the endpoint's REQ: is rdma_ucm loaded "
        "and the RDMA device bound to the interface that routes to the endpoint (`rdma "
        "link`)?"),
    8: ("invalid service ID", "nothing listens on that rdma_cm port of the host: listen "
        "first, and name the listened port in CONNECT"),
    26: ("invalid path MTU", "CONNECT must name a path MTU of 256 to 4096 bytes that the "
         "endpoint supports"),
    28: ("consumer reject", "the endpoint refused the accept's private data or the host "
         f"refused the REQ's: both take version {PRIVATE_VERSION}; update the host tools or "
         "the endpoint so they agree"),
}


class ConnectRejected(Rejected):
    """The endpoint answered CONNECT with NAK; ``reason`` is the REJ reason (``count``)."""

    def __init__(self, host: str, port: int, reason: int):
        self.reason = reason
        meaning, fix = CONNECT_NAKS.get(reason, ("", "check the port, the path MTU, the "
                                                     "private data, and that a QP is free"))
        HostError.__init__(self, f"the endpoint answered CONNECT to {host} rdma_cm port {port} "
                                 f"with NAK, REJ reason {reason}"
                                 + (f" ({meaning})" if meaning else "") + f": {fix}")


def source_address(endpoint: str) -> str:
    """The host's IPv4 address on the route to ``endpoint`` (the source of its datagrams)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((endpoint, CM_PORT))
        except OSError as error:
            raise HostError(f"no route to {endpoint}: {error.strerror}; check `ip route get "
                            f"{endpoint}` or --endpoint") from None
        return probe.getsockname()[0]


class Listener(CmId):
    """A listening rdma_cm ID (``listen_id``) bound to ``host_ip``, rdma_cm port
    ``port`` (RDMA_PS_TCP); :meth:`connect` has the endpoint connect to it, after
    which ``cmid`` is the connection's ID (for
    :meth:`~host.rdma_connect.CmId.disconnect`). ``timeout``: seconds for the whole
    connect and for each rdma_cm event."""

    def __init__(self, host_ip: str, port: int, timeout: float):
        import pyverbs.cm_enums as ce
        from pyverbs.cmid import AddrInfo
        from pyverbs.pyverbs_error import PyverbsError

        super().__init__(f"the endpoint's connection to {host_ip} rdma_cm port {port}",
                         timeout)
        self.host_ip = host_ip
        self.port = port
        self.listen_id: Any = self.cmid
        self.connection: Any = None
        self.req_version: int | None = None
        self.req_qpn: int | None = None
        try:
            info = AddrInfo(src=host_ip, src_service=str(port), port_space=ce.RDMA_PS_TCP,
                            flags=ce.RAI_PASSIVE)
            try:
                self.listen_id.bind_addr(info)
                self.listen_id.listen()
            finally:
                info.close()
        except PyverbsError as error:
            self.close()
            raise HostError(f"cannot listen on {host_ip} rdma_cm port {port}: {error}; is the "
                            "port taken by another listener, rdma_ucm loaded, and an RDMA "
                            "device bound to that address's interface (`rdma link`)?") from None

    @property
    def pd(self) -> Any:
        """The protection domain of the device the listener is bound to."""
        return self.listen_id.pd

    def connect(self, cm: CmClient, private: bytes, mtu: PathMtu, *, qp: Any = None,
                min_rnr_timer: int | None = None, connect_port: int | None = None) -> Datagram:
        """Send CONNECT through ``cm`` (``connect_port``, default the listened port),
        accept the endpoint's REQ with ``private`` and ``qp`` (a caller's QP in INIT on
        the same device, moved to RTS here; None: rdma_cm's own, created on the
        connection's ID), and return the CONNECT/ACK once ESTABLISHED. A NAK is
        :class:`ConnectRejected`; other failures are HostErrors naming the fix."""
        port = self.port if connect_port is None else connect_port
        request = connect_request(self.host_ip, port, mtu)

        def answers(reply: Datagram) -> bool:
            return reply.request == Request.CONNECT and reply.rem.ip == self.host_ip

        deadline = time.monotonic() + self.timeout
        resend = 0.0
        answer: Datagram | None = None
        while answer is None or not self.established:
            now = time.monotonic()
            if now > deadline:
                raise HostError(self._late(answer, cm.endpoint, port))
            if answer is None and now >= resend:
                cm.send(request)
                resend = now + CONNECT_RESEND
            if self.events.ready():
                if self.connection is None:
                    self._take_request(private, qp, min_rnr_timer)
                else:
                    event = self.events.get(f"waiting for ESTABLISHED from {cm.endpoint}",
                                            self.timeout)
                    error = event_error(event, self.where, "ESTABLISHED")
                    if error is not None:
                        raise error
                    self.established = True
            if answer is None:
                got = cm.receive(answers, _SLICE)
                if got is not None:
                    answer = got[0]
                    if answer.ack != Ack.ACK:
                        raise self._refused(answer, port)
            else:
                self.events.ready(_SLICE)
        if answer.loc.qpn != self.req_qpn:
            raise HostError(f"the endpoint's CONNECT/ACK names QP {answer.loc.qpn}, its REQ "
                            f"QP {self.req_qpn}: the endpoint's active CM mixed up two "
                            "connections; report it with the pcap")
        return answer

    def _take_request(self, private: bytes, qp: Any, min_rnr_timer: int | None) -> None:
        """Take the endpoint's REQ, check its private data, accept it."""
        import pyverbs.enums as e
        from pyverbs.cmid import ConnParam
        from pyverbs.qp import QPCap, QPInitAttr

        self.connection, event = self.events.request(
            self.listen_id, f"waiting for the endpoint's REQ on port {self.port}", self.timeout)
        self.cmid = self.connection
        self.req_version, self.req_qpn = parse_accept_private(event.private, "REQ")
        if self.req_version != PRIVATE_VERSION or self.req_qpn < FIRST_QPN:
            self.connection.reject()
            raise HostError(f"the REQ to port {self.port} carried private data version "
                            f"{self.req_version}, QPN {self.req_qpn} (this host takes version "
                            f"{PRIVATE_VERSION}, QPNs from {FIRST_QPN}): is the peer this "
                            "project's endpoint, and are the host tools and gateware of one "
                            "version?")
        if qp is None:
            cap = QPCap(max_send_wr=1, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
            self.connection.create_qp(QPInitAttr(qp_type=e.IBV_QPT_RC, cap=cap, sq_sig_all=1))
        else:
            self.to_rts(qp, min_rnr_timer)
        param = ConnParam(data_len=len(private), qp_num=0 if qp is None else qp.qp_num)
        param.set_private_data(private)
        self.connection.accept(param)

    def _refused(self, answer: Datagram, port: int) -> HostError:
        if answer.ack == Ack.NAK:
            return ConnectRejected(self.host_ip, port, answer.count)
        if answer.ack == Ack.ERROR:
            return HostError(f"the endpoint answered CONNECT with ERROR: its gateware has no "
                             f"active CM, or {self.host_ip} is not the source address of this "
                             "host's datagrams (check --endpoint and the route)")
        return HostError(f"the endpoint answered CONNECT with ack {answer.ack} (count "
                         f"{answer.count}): update the host tools or the gateware so they "
                         "agree")

    def _late(self, answer: Datagram | None, endpoint: str, port: int) -> str:
        waited = f"within {self.timeout:g} s"
        if answer is not None:
            return (f"the endpoint answered CONNECT/ACK but no ESTABLISHED came {waited}: "
                    "its RTU was lost; look at the pcap")
        if self.connection is None:
            return (f"no REQ to {self.host_ip} port {port} and no answer to CONNECT from "
                    f"{endpoint} {waited}: is the endpoint up with an active CM "
                    f"(`ping {endpoint}`, `qp-server ctrl status`)? (or wait longer: "
                    "--timeout, --rdma-timeout of qp-server)")
        return (f"accepted the REQ of endpoint QP {self.req_qpn}, but no RTU and no answer "
                f"to CONNECT came {waited}: look at the pcap for the REP and RTU")

    def close(self) -> None:
        for thing in (self.connection, self.listen_id, self.events):
            if thing is not None:
                thing.close()


class Accepted:
    """An RC QP of rdma_cm's own, with a registered buffer of ``buffer_bytes`` named
    in the accept's private data, connected by the endpoint at ``endpoint`` to this
    host's rdma_cm port ``port``."""

    def __init__(self, endpoint: str, port: int, buffer_bytes: int, mtu: PathMtu,
                 timeout: float, *, connect_port: int | None = None):
        import pyverbs.enums as e
        from pyverbs.mr import MR
        from pyverbs.pyverbs_error import PyverbsError

        self.host_ip = source_address(endpoint)
        self.listener = Listener(self.host_ip, port, timeout)
        self.mr: Any = None
        try:
            access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
            self.mr = MR(self.listener.pd, max(buffer_bytes, 64), access)
            private = connect_private(rkey=self.mr.rkey, base=self.mr.buf,
                                      length=self.mr.length)
            with CmClient(endpoint, timeout=CONNECT_RESEND) as cm:
                self.ack = self.listener.connect(cm, private, mtu, connect_port=connect_port)
            attr, _ = self.listener.cmid.query_qp(e.IBV_QP_STATE | e.IBV_QP_PATH_MTU
                                                  | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN)
        except PyverbsError as error:
            self.close()
            raise HostError(f"rdma_cm on {self.host_ip} port {port} failed: {error}; is "
                            "rdma_ucm loaded and the RDMA device bound to the interface that "
                            "routes to the endpoint (`rdma link`)?") from None
        except BaseException:
            self.close()
            raise
        self.dest_qpn = attr.dest_qp_num
        self.rq_psn = attr.rq_psn
        self.path_mtu = 128 << attr.path_mtu
        self.qp_state = attr.qp_state

    def close(self) -> None:
        if self.mr is not None:
            self.mr.close()
            self.mr = None
        self.listener.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m host.{__name__.rpartition('.')[2]}",
        description="Listen with rdma_cm, ask the endpoint with CONNECT to connect a QP to "
                    "this host (its active IB CM), accept it and print the endpoint's QPN "
                    "as JSON; then rdma_disconnect.")
    parser.add_argument("--endpoint", default=DEFAULT_ENDPOINT,
                        help=f"the endpoint's IPv4 address (default {DEFAULT_ENDPOINT})")
    parser.add_argument("--port", type=int, default=LISTEN_PORT,
                        help=f"the rdma_cm port to listen on (default {LISTEN_PORT})")
    parser.add_argument("--connect-port", type=int, default=None,
                        help="the port CONNECT names (default --port; another one tries "
                             "the endpoint's CONNECT/NAK)")
    parser.add_argument("--mtu", type=int, default=1024,
                        choices=[mtu.bytes for mtu in PathMtu if mtu],
                        help="path MTU CONNECT asks for (default 1024)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds to wait for the connection (default 30)")
    parser.add_argument("--disconnect-timeout", type=float, default=30.0,
                        help="seconds to wait for DISCONNECTED after rdma_disconnect "
                             "(default 30)")
    parser.add_argument("--buffer", type=int, default=1 << 16,
                        help="bytes of the registered buffer (default 65536)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: dict = {"endpoint": args.endpoint, "port": args.port,
                    "connect_port": args.connect_port or args.port}
    accepted: Accepted | None = None
    code = 0
    started = time.monotonic()
    try:
        accepted = Accepted(args.endpoint, args.port, args.buffer,
                            PathMtu.from_size(args.mtu), args.timeout,
                            connect_port=args.connect_port)
        ack = accepted.ack
        result.update(established=True, host_ip=accepted.host_ip,
                      req_version=accepted.listener.req_version,
                      endpoint_qpn=accepted.listener.req_qpn, ack_qpn=ack.loc.qpn,
                      ack_psn=ack.loc.psn, ack_ip=ack.loc.ip, ack_mtu=ack.txmeta.mtu.bytes
                      if isinstance(ack.txmeta.mtu, PathMtu) else int(ack.txmeta.mtu),
                      dest_qp_num=accepted.dest_qpn, rq_psn=accepted.rq_psn,
                      path_mtu=accepted.path_mtu, qp_state=accepted.qp_state,
                      connect_seconds=round(time.monotonic() - started, 2))
        print(f"{_PROG}: ESTABLISHED with endpoint QP {ack.loc.qpn}", file=sys.stderr)
        result["disconnect"] = accepted.listener.disconnect(args.disconnect_timeout)
    except (HostError, ImportError) as error:
        code = connect_failed(result, error, _PROG)
    finally:
        if accepted is not None:
            accepted.close()
    print(json.dumps(result), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
