"""A UDP client of the endpoint's connection manager (CM, UDP 17185).

One request at a time: send, wait ``timeout`` seconds for the matching reply
(request code and QPN; anything else is a stray datagram and ignored), resend
up to ``retries`` times in all. A generator start has no reply: :meth:`CmClient.start`
confirms it with STATUS. Every failure is a :class:`~host.errors.HostError` naming the fix.

The endpoint frees a QP that is idle or in ERROR and has heard no request from
its host for a lease (60 s by default; CM_PROTOCOL.md, "Lease"), so a crashed
host leaves nothing open for long. A long-lived holder of QPs calls
:meth:`CmClient.keep_alive` now and then: it asks STATUS of every QP this client
opened and has not named in a request for ``keepalive`` seconds.

Replies are matched by their content, not by their source address or port, so a
simulation bridge may forward them from any socket.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable

from . import protocol
from .errors import HostError, StartNotTaken
from .protocol import Ack, Datagram, ErrorStatus, PathMtu, QpInfo, Request, Status

__all__ = ["DEFAULT_ENDPOINT", "KEEPALIVE_SECONDS", "CmClient", "error_status_name",
           "endpoint_error"]

DEFAULT_ENDPOINT = "10.77.0.2"

#: Seconds between the STATUS requests that keep an open QP's lease: a sixth of the
#: endpoint's default lease of 60 s, so that a few lost requests do not cost a QP.
KEEPALIVE_SECONDS = 10.0


class CmClient:
    """Talks to the CM of the endpoint at ``endpoint``:``cm_port`` from a UDP socket
    bound to ``bind`` (address, port; port 0 picks one). Replies come back to that
    socket (requests carry reply_port 0). Use as a context manager or call :meth:`close`.
    """

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, *, cm_port: int = protocol.CM_PORT,
                 bind: tuple[str, int] = ("0.0.0.0", 0), timeout: float = 1.0,
                 retries: int = 5, keepalive: float = KEEPALIVE_SECONDS):
        self.endpoint = str(ipaddress.IPv4Address(endpoint))
        if not 0 < cm_port < 65536:
            raise ValueError(f"CM port must be 1..65535, not {cm_port}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 s, not {timeout}")
        if retries < 1:
            raise ValueError(f"retries must be >= 1, not {retries}")
        if keepalive <= 0:
            raise ValueError(f"keepalive must be > 0 s, not {keepalive}")
        self.keepalive = keepalive
        self._heard: dict[int, float] = {}     # QPs opened here: when last named in a request
        self.cm_port = cm_port
        self.timeout = timeout
        self.retries = retries
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._socket.bind(bind)
        except OSError as error:
            self._socket.close()
            raise HostError(f"cannot bind the CM socket to {bind[0]}:{bind[1]}: "
                            f"{error.strerror}; pick a free local address/port with --bind "
                            "(e.g. --bind 0.0.0.0:0)") from None

    @property
    def local_address(self) -> tuple[str, int]:
        """(address, port) the CM socket is bound to."""
        return self._socket.getsockname()

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> CmClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def exchange(self, request: Datagram, accept: Callable[[Datagram], bool], what: str,
                 *, tries: int | None = None) -> tuple[Datagram, bytes]:
        """Send ``request`` until a reply that ``accept`` takes arrives; returns it
        decoded and raw. ``what`` names the request in the error."""
        tries = self.retries if tries is None else tries
        for _ in range(tries):
            self.send(request)
            answer = self.receive(accept, self.timeout)
            if answer is not None:
                return answer
        raise HostError(
            f"endpoint {self.endpoint} did not answer {what} on UDP {self.cm_port} after "
            f"{tries} tr{'y' if tries == 1 else 'ies'} ({self.timeout:g} s each): check the "
            f"cable/IP with `ping {self.endpoint}`, or --endpoint")

    def send(self, request: Datagram) -> None:
        """Send ``request`` once, without waiting for a reply."""
        self._send(request.encode())

    def receive(self, accept: Callable[[Datagram], bool],
                timeout: float) -> tuple[Datagram, bytes] | None:
        """The first reply within ``timeout`` seconds that ``accept`` takes, decoded and
        raw; None when none came."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            self._socket.settimeout(remaining)
            try:
                raw, _ = self._socket.recvfrom(2048)
            except (TimeoutError, ConnectionRefusedError):
                continue
            try:
                reply = Datagram.decode(raw)
            except protocol.ProtocolError:
                continue
            if reply.ack is not None and accept(reply):
                return reply, raw
        return None

    def _send(self, raw: bytes) -> None:
        try:
            self._socket.sendto(raw, (self.endpoint, self.cm_port))
        except OSError as error:
            raise HostError(f"cannot send to the CM at {self.endpoint}:{self.cm_port}: "
                            f"{error.strerror}; check the route (`ip route get "
                            f"{self.endpoint}`) or --endpoint") from None

    def open_qp(self, host: QpInfo, mtu: PathMtu = PathMtu.DEFAULT) -> tuple[QpInfo, PathMtu]:
        """Pair host QP ``host`` with a free endpoint QP; returns the endpoint's QP
        (QPN, first PSN, IP) and the path MTU the host QP must use."""
        reply, _ = self.exchange(
            protocol.open_qp(host, mtu=mtu),
            lambda r: r.request == Request.OPEN_QP and r.rem.qpn == host.qpn
            and r.rem.ip == host.ip, "OPEN_QP")
        if reply.ack == Ack.NO_QP:
            raise HostError("endpoint has no free QP (NO_QP): close QPs with `qp-server ctrl "
                            "close-qp`, run with --reclaim if this host left them open, or "
                            "rebuild with more QPs")
        if reply.ack != Ack.ACK:
            raise HostError(f"endpoint refused OPEN_QP (ack {_ack_name(reply.ack)}) for host QP "
                            f"{host.qpn} at {host.ip}: check that {host.ip} is the host's "
                            "address on the endpoint's network (--gid-index)")
        endpoint_mtu = reply.txmeta.mtu
        if not isinstance(endpoint_mtu, PathMtu) or endpoint_mtu == PathMtu.DEFAULT:
            raise HostError(f"endpoint answered OPEN_QP without a valid path MTU (byte 51 "
                            f"bits 7:4 = {int(endpoint_mtu)}): update the endpoint's gateware "
                            "to one with the path-MTU extension")
        if reply.loc.qpn < protocol.FIRST_QPN:
            raise HostError(f"endpoint answered OPEN_QP with QPN {reply.loc.qpn}, below "
                            f"{protocol.FIRST_QPN}: check --endpoint and --cm-port point at "
                            "this project's endpoint")
        self._heard[reply.loc.qpn] = time.monotonic()
        return reply.loc, endpoint_mtu

    def close_qp(self, qpn: int, host_ip: str) -> Ack:
        """Close endpoint QP ``qpn`` opened by the host at ``host_ip``; ACK, or NO_QP
        when it was not open (also a retry whose first try was taken)."""
        reply, _ = self.exchange(
            protocol.close_qp(qpn, host_ip),
            lambda r: r.request == Request.CLOSE_QP
            and (r.ack != Ack.ACK or r.loc.qpn == qpn),
            "CLOSE_QP (it takes one only from the host that opened the QP: run it there)")
        if reply.ack not in (Ack.ACK, Ack.NO_QP):
            raise HostError(f"endpoint refused CLOSE_QP of QP {qpn} (ack "
                            f"{_ack_name(reply.ack)}): pass the address that opened it with "
                            "--host-ip")
        self._heard.pop(qpn, None)
        return Ack(reply.ack)

    def close_all(self, host_ip: str) -> int:
        """Close every endpoint QP whose host is this client's address (the source of
        its datagrams; ``host_ip`` fills loc_ip); returns how many were closed (a
        retry whose first try was taken counts 0)."""
        reply, _ = self.exchange(
            protocol.close_all(host_ip),
            lambda r: r.request == Request.CLOSE_QP and (r.ack != Ack.ACK or r.loc.qpn == 0),
            "CLOSE_QP of all QPs")
        if reply.ack != Ack.ACK:
            raise HostError(f"endpoint refused to close all QPs of {host_ip} (ack "
                            f"{_ack_name(reply.ack)}): its gateware predates close-all; "
                            "close QPs one by one with `qp-server ctrl close-qp`")
        self._heard.clear()
        return reply.count

    def keep_alive(self) -> None:
        """Ask STATUS of each QP opened here that no request has named for
        ``keepalive`` seconds, so that the endpoint's lease does not free it."""
        now = time.monotonic()
        for qpn, heard in list(self._heard.items()):
            if now - heard >= self.keepalive:
                self.status(qpn)

    def status(self, qpn: int) -> Status:
        """State and counters of endpoint QP ``qpn``."""
        reply, raw = self.exchange(
            protocol.status(qpn),
            lambda r: r.request == Request.STATUS and (r.ack != Ack.ACK or r.loc.qpn == qpn),
            "STATUS")
        if reply.ack != Ack.ACK:
            raise HostError(f"endpoint has no QP {qpn} (STATUS answered "
                            f"{_ack_name(reply.ack)}): endpoint QPNs start at "
                            f"{protocol.FIRST_QPN}; use the QPN qp-server printed when it "
                            "paired the QP")
        if qpn in self._heard:
            self._heard[qpn] = time.monotonic()
        return Status.from_reply(raw)

    def start(self, qpn: int, *, length: int, count: int, divider: int = 0, write: bool = True,
              immediate: bool = False, ring: int = 0, credited: bool = False,
              tries: int | None = None, poll_interval: float = 0.01) -> Status:
        """Start the generator on endpoint QP ``qpn`` and confirm it by STATUS: taken
        when the QP's run count moved. Not taken within ``timeout``: resend, ``tries``
        (default ``retries``) times in all, then raise :class:`~host.errors.StartNotTaken`.
        Returns the confirming status."""
        before = self.status(qpn)
        if not before.open:
            raise HostError(f"endpoint QP {qpn} is not open: pair a host QP with it first "
                            "(run qp-server without `ctrl`)")
        if before.error:
            raise endpoint_error(qpn, before)
        if before.running:
            raise StartNotTaken(f"endpoint QP {qpn} is still running a run: wait for it "
                                f"(`qp-server ctrl status --qpn {qpn}`) before starting another")
        request = protocol.start_run(qpn, length=length, count=count, divider=divider,
                                     write=write, immediate=immediate, ring=ring,
                                     credited=credited)
        tries = self.retries if tries is None else tries
        for _ in range(tries):
            self._send(request.encode())
            if count == 0:
                return before
            deadline = time.monotonic() + self.timeout
            while True:
                now = self.status(qpn)
                if now.error:
                    return now
                if now.runs != before.runs:
                    return now
                if time.monotonic() >= deadline:
                    break
                time.sleep(poll_interval)
        raise StartNotTaken(
            f"endpoint QP {qpn} did not take the start after {tries} "
            f"tr{'y' if tries == 1 else 'ies'} ({self.timeout:g} s each): its generator runs "
            "only a few runs at once; wait for the others to finish or use fewer --qps (and it "
            "takes a start only from the host that opened the QP)")


    def credit(self, qpn: int, consumed: int) -> None:
        """CREDIT: the first ``consumed`` messages of endpoint QP ``qpn``'s credited run
        are consumed (no reply; a lost one is made good by the next, or a repeat)."""
        self._send(protocol.credit(qpn, consumed).encode())
        if qpn in self._heard:
            self._heard[qpn] = time.monotonic()


def _ack_name(ack: object) -> str:
    return ack.name if isinstance(ack, Ack) else str(ack)


_ERROR_HINTS = {
    ErrorStatus.BAD_REQUEST: "the endpoint rejected the request it was given: check --size, "
                             "--count and --ring",
    ErrorStatus.PAYLOAD_SHORT: "the user logic delivered fewer payload bytes than the work "
                               "request's length",
    ErrorStatus.PAYLOAD_LONG: "the user logic delivered more payload bytes than the work "
                              "request's length",
    ErrorStatus.RETRY_EXCEEDED: "the host stopped acknowledging: check that the host QP is in "
                                "RTS, --gid-index, and that the host's IP reaches the endpoint",
    ErrorStatus.RNR_RETRY_EXCEEDED: "the host had no receive posted for too long: raise "
                                    "--receives or lower --rate",
    ErrorStatus.REMOTE_INVALID_REQUEST: "the host QP rejected a packet (path MTU or message "
                                        "length): use the path MTU the endpoint announced",
    ErrorStatus.REMOTE_ACCESS_ERROR: "the host refused a WRITE outside its registered buffer "
                                     "(rkey/address): check --ring and --size",
    ErrorStatus.REMOTE_OPERATIONAL_ERROR: "the host's RDMA device failed a request: check "
                                          "`dmesg` on the host",
    ErrorStatus.FLUSHED: "a work request was flushed after an earlier error",
}


def error_status_name(error_status: int) -> str:
    """The name of a ``Status.error_status`` number, e.g. ``RNR_RETRY_EXCEEDED``."""
    try:
        return ErrorStatus(error_status).name
    except ValueError:
        return f"error_status {error_status}"


def endpoint_error(qpn: int, status: Status) -> HostError:
    """The error for endpoint QP ``qpn`` found in ERROR: why, and what to do."""
    name = error_status_name(status.error_status)
    hint = _ERROR_HINTS.get(status.error_status, "see the endpoint's error_status numbers")
    return HostError(f"endpoint QP {qpn} went to ERROR ({name}): {hint}; then close it "
                     f"(`qp-server ctrl close-qp --qpn {qpn} --host-ip <host IP>`)")
