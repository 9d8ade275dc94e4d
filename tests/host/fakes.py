"""Stand-ins for the endpoint and the verbs stack, built from ``host.protocol``.

:class:`FakeEndpoint` is a connection manager on 127.0.0.1 (a UDP server thread)
whose generator writes ``generator_payload`` messages straight into a
:class:`FakeBackend`'s buffers, as the real endpoint would through RoCEv2.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import queue
import socket
import threading
import time

from host import protocol
from host.backend import Completion, CompletionKind, PortInfo, VerbsOptions
from host.protocol import Ack, Datagram, PathMtu, QpInfo, Request, Status
from host.rdma_connect import Rejected

HOST_IP = "127.0.0.1"
FIRST_HOST_QPN = 17


class FakeBackend:
    """:class:`host.backend.Backend` in memory: bytearrays for buffers, a queue for
    the CQ. The endpoint side calls :meth:`write`, :meth:`deliver_send` and
    :meth:`deliver_write_imm`."""

    def __init__(self, *, active_mtu: PathMtu = PathMtu.MTU_4096, ip: str = HOST_IP):
        self.active_mtu = active_mtu
        self.ip = ip
        self.options: VerbsOptions | None = None
        self.buffers: list[bytearray] = []
        self.receives: list[collections.deque] = []
        self.max_receives = 0
        self.connected: dict[int, tuple[QpInfo, PathMtu]] = {}
        self.completions: queue.Queue[Completion] = queue.Queue()
        self.closed = 0
        self.resets: list[int] = []
        self.lock = threading.Lock()
        self.endpoint: FakeEndpoint | None = None
        self.rdma_connects: list[tuple[int, str, int, float]] = []
        self.rdma_listens: list[tuple[int, int, PathMtu, float]] = []
        self.rdma_disconnects: list[int] = []
        self.reject: int | None = None      # rdma_connect: answer REJ with this reason
        self.disconnect_outcome = {"disconnect_call": "returned", "event": "DISCONNECTED",
                                   "seconds": 0.0}

    def __call__(self, options: VerbsOptions) -> FakeBackend:
        self.options = options
        return self

    def open(self, qps: int, buffer_bytes: int, receives: int) -> PortInfo:
        self.buffers = [bytearray(buffer_bytes) for _ in range(qps)]
        self.receives = [collections.deque() for _ in range(qps)]
        self.max_receives = receives
        return PortInfo(device="fake0", port=1, gid_index=1, gid=f"::ffff:{self.ip}",
                        ip=self.ip, active_mtu=self.active_mtu)

    def qp_info(self, qp: int) -> QpInfo:
        psn = 0x1000 + qp + 0x100 * self.resets.count(qp)
        return QpInfo(qpn=FIRST_HOST_QPN + qp, psn=psn, rkey=0x500 + qp,
                      base_addr=self.base(qp), ip=self.ip)

    @staticmethod
    def base(qp: int) -> int:
        return 0x7F00_0000_0000 + (qp << 32)

    def connect(self, qp: int, endpoint: QpInfo, mtu: PathMtu) -> None:
        self.connected[qp] = (endpoint, mtu)

    def rdma_connect(self, qp: int, endpoint: str, port: int,
                     timeout: float) -> tuple[QpInfo, PathMtu]:
        """rdma_cm as the endpoint's passive CM would answer: REJ ``reject``, else a QP
        of :attr:`endpoint` (REJ 3 when none is free)."""
        self.rdma_connects.append((qp, endpoint, port, timeout))
        if self.reject is not None:
            raise Rejected(f"{endpoint} port {port}", self.reject)
        assert self.endpoint is not None, "FakeEndpoint(backend) first"
        taken = self.endpoint.take(self.qp_info(qp), self.active_mtu)
        if taken is None:
            raise Rejected(f"{endpoint} port {port}", 3)
        info = QpInfo(qpn=taken.qpn, psn=self.endpoint.first_psn(taken), ip=endpoint)
        self.connected[qp] = (info, taken.mtu)
        return info, taken.mtu

    def rdma_listen(self, qp: int, cm, port: int, mtu: PathMtu,
                    timeout: float) -> tuple[QpInfo, PathMtu]:
        """CONNECT through ``cm`` to :attr:`endpoint`, which connects one of its QPs to
        this host QP as its active CM would (NAK 3 when none is free)."""
        self.rdma_listens.append((qp, port, mtu, timeout))
        reply, _ = cm.exchange(protocol.connect(self.ip, port, mtu),
                               lambda r: r.request == Request.CONNECT, "CONNECT")
        if reply.ack != Ack.ACK:
            raise Rejected(f"CONNECT to port {port}", reply.count)
        self.connected[qp] = (reply.loc, reply.txmeta.mtu)
        return reply.loc, reply.txmeta.mtu

    def rdma_disconnect(self, qp: int, timeout: float) -> dict:
        self.rdma_disconnects.append(qp)
        if self.endpoint is not None and self.disconnect_outcome.get("event"):
            self.endpoint.free(self.connected[qp][0].qpn)
        return dict(self.disconnect_outcome)

    def reset(self, qp: int) -> None:
        with self.lock:
            assert not self.receives[qp], "receives left posted at a reset"
            self.resets.append(qp)
            self.connected.pop(qp, None)

    def post_receive(self, qp: int, wr_id: int, offset: int, length: int) -> None:
        with self.lock:
            assert len(self.receives[qp]) < self.max_receives, "receive queue overflow"
            assert 0 <= offset and offset + length <= len(self.buffers[qp])
            self.receives[qp].append((wr_id, offset, length))

    def poll(self, timeout: float) -> list[Completion]:
        try:
            found = [self.completions.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                found.append(self.completions.get_nowait())
            except queue.Empty:
                return found

    def read(self, qp: int, offset: int, length: int) -> bytes:
        return bytes(self.buffers[qp][offset:offset + length])

    def buffer(self, qp: int) -> memoryview:
        return memoryview(self.buffers[qp])

    def fill(self, qp: int, value: int) -> None:
        self.buffers[qp][:] = bytes((value,)) * len(self.buffers[qp])

    def close(self) -> None:
        self.closed += 1

    def write(self, rkey: int, address: int, data: bytes) -> None:
        qp = rkey - 0x500
        offset = address - self.base(qp)
        assert 0 <= offset and offset + len(data) <= len(self.buffers[qp]), "WRITE out of range"
        self.buffers[qp][offset:offset + len(data)] = data

    def deliver_send(self, qp: int, data: bytes, imm: int | None) -> bool:
        with self.lock:
            if not self.receives[qp]:
                return False
            wr_id, offset, length = self.receives[qp].popleft()
        assert len(data) <= length, "SEND longer than the receive"
        self.buffers[qp][offset:offset + len(data)] = data
        self.completions.put(Completion(qp, wr_id, 0, CompletionKind.RECV, len(data), imm))
        return True

    def deliver_write_imm(self, qp: int, length: int, imm: int) -> bool:
        with self.lock:
            if not self.receives[qp]:
                return False
            wr_id, _, _ = self.receives[qp].popleft()
        self.completions.put(Completion(qp, wr_id, 0, CompletionKind.RECV_IMM, length, imm))
        return True


@dataclasses.dataclass
class EndpointQp:
    qpn: int
    host: QpInfo | None = None
    mtu: PathMtu = PathMtu.MTU_4096
    status: Status = Status()
    starts: list[Datagram] = dataclasses.field(default_factory=list)
    opens: int = 0
    consumed: int = 0           # the host's CREDIT count in the current run


class FakeEndpoint:
    """The endpoint's CM on 127.0.0.1 and its generator, feeding ``backend``.

    ``silent``: answer nothing. ``capacity``: runs at once. ``ignore_starts``:
    starts to drop. ``corrupt``: {(host QP index, k): offset} bytes to flip.
    ``stop_after``: messages a run sends before it stops. ``fail_with``: error
    status the QP goes to instead of running. ``message_delay``: seconds per
    message. ``stray``: send junk and a wrong-QPN reply before every reply.
    ``drop_first``: requests to ignore before answering. ``user_run``: a start
    datagram that "user logic" runs on every newly opened QP, without a start.
    ``stale_psn``: announce the same first PSN when a closed QP is opened again.
    """

    def __init__(self, backend: FakeBackend | None = None, *, qps: int = 4, capacity: int = 4,
                 silent: bool = False, ignore_starts: int = 0,
                 corrupt: dict[tuple[int, int], int] | None = None,
                 stop_after: int | None = None, fail_with: int | None = None,
                 message_delay: float = 0.0, stray: bool = False, drop_first: int = 0,
                 user_run: Datagram | None = None, stale_psn: bool = False):
        self.backend = backend
        if backend is not None:
            backend.endpoint = self
        self.qps = [EndpointQp(protocol.FIRST_QPN + i) for i in range(qps)]
        self.capacity = capacity
        self.silent = silent
        self.ignore_starts = ignore_starts
        self.corrupt = corrupt or {}
        self.stop_after = stop_after
        self.fail_with = fail_with
        self.message_delay = message_delay
        self.stray = stray
        self.drop_first = drop_first
        self.user_run = user_run
        self.stale_psn = stale_psn
        self.close_all_supported = True     # False: answers close-all as an old endpoint
        self.requests: list[Datagram] = []
        self.opened: dict[tuple[str, int], int] = {}
        self.connects: dict[tuple[str, int], int] = {}     # CONNECT: (host, port) -> QPN
        self.lock = threading.Lock()
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.settimeout(0.05)
        self.port = self.socket.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FakeEndpoint:
        self._server.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._server.join(2)
        for thread in self._threads:
            thread.join(2)
        self.socket.close()

    def cm_args(self, *, timeout: float = 0.3, retries: int = 3) -> list[str]:
        return ["--endpoint", "127.0.0.1", "--cm-port", str(self.port), "--bind",
                "127.0.0.1:0", "--timeout", str(timeout), "--retries", str(retries)]

    def qp(self, qpn: int) -> EndpointQp | None:
        index = qpn - protocol.FIRST_QPN
        return self.qps[index] if 0 <= index < len(self.qps) else None

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                raw, source = self.socket.recvfrom(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            request = Datagram.decode(raw)
            self.requests.append(request)
            if self.silent:
                continue
            if self.drop_first:
                self.drop_first -= 1
                continue
            reply = self._answer(request)
            if reply is None:
                continue
            destination = (source[0], request.reply_port or source[1])
            if self.stray:
                self.socket.sendto(b"junk", destination)
                wrong = Datagram(request.request, Ack.ACK, loc=QpInfo(qpn=4095),
                                 rem=QpInfo(qpn=4095, ip="10.9.9.9"))
                self.socket.sendto(wrong.encode(), destination)
            self.socket.sendto(reply, destination)

    def _answer(self, request: Datagram) -> bytes | None:
        if request.request == Request.OPEN_QP:
            return self._open(request)
        if request.request == Request.CONNECT:
            return self._connect(request)
        if request.request == Request.STATUS:
            qp = self.qp(request.rem.qpn)
            if qp is None:
                return protocol.reply(request, Ack.NO_QP, QpInfo(ip="127.0.0.1")).encode()
            with self.lock:
                return qp.status.reply(qp.qpn)
        if (request.request == Request.CLOSE_QP and request.rem.qpn == protocol.CLOSE_ALL_QPN
                and self.close_all_supported):
            return self._close_all(request)
        if request.request == Request.CLOSE_QP:
            qp = self.qp(request.rem.qpn)
            if qp is None or not qp.status.open:
                return protocol.reply(request, Ack.NO_QP, QpInfo(ip="127.0.0.1")).encode()
            self.free(qp.qpn)
            return protocol.reply(request, Ack.ACK, QpInfo(qpn=qp.qpn, ip="127.0.0.1")).encode()
        if request.request == Request.NULL and request.txmeta.valid and request.txmeta.start:
            self._start(request)
        elif request.request == Request.NULL and request.txmeta.encode() == 0x11:
            qp = self.qp(request.rem.qpn)
            if qp is not None:
                with self.lock:
                    qp.consumed = max(qp.consumed, request.count)
        return None

    def _close_all(self, request: Datagram) -> bytes:
        """Every QP of the host closed; on loopback, loc_ip stands for the source."""
        with self.lock:
            mine = [qp for qp in self.qps if qp.status.open and qp.host is not None
                    and qp.host.ip == request.loc.ip]
            for qp in mine:
                qp.status = Status()
            self.opened = {key: value for key, value in self.opened.items()
                           if key[0] != request.loc.ip}
        return protocol.reply(request, Ack.ACK, QpInfo(ip="127.0.0.1"), count=len(mine)).encode()

    def _open(self, request: Datagram) -> bytes:
        key = (request.loc.ip, request.loc.qpn)
        qpn = self.opened.get(key)
        if qpn is None and self.take(request.loc, request.txmeta.mtu or PathMtu.MTU_4096) is None:
            return protocol.reply(request, Ack.NO_QP, QpInfo(ip="127.0.0.1")).encode()
        qp = self.qp(self.opened[key])
        return protocol.reply(request, Ack.ACK,
                              QpInfo(qpn=qp.qpn, psn=self.first_psn(qp), ip="127.0.0.1"),
                              mtu=qp.mtu).encode()

    def _connect(self, request: Datagram) -> bytes:
        """CONNECT: a QP for the host's (address, rdma_cm port), the same one while it
        is open; the host QP is the one of the backend's latest ``rdma_listen``."""
        assert self.backend is not None, "FakeEndpoint(backend) for CONNECT"
        key = (request.loc.ip, request.length)
        qp = self.qp(self.connects.get(key, 0))
        if qp is None or not qp.status.open:
            host = self.backend.qp_info(len(self.backend.rdma_listens) - 1)
            qp = self.take(host, request.txmeta.mtu)
            if qp is None:
                return protocol.reply(request, Ack.NAK, QpInfo(ip="127.0.0.1"),
                                      count=3).encode()
            self.connects[key] = qp.qpn
        return protocol.reply(request, Ack.ACK,
                              QpInfo(qpn=qp.qpn, psn=self.first_psn(qp), ip="127.0.0.1"),
                              mtu=qp.mtu).encode()

    def take(self, host: QpInfo, mtu: PathMtu) -> EndpointQp | None:
        """The lowest free QP, opened for ``host`` (OPEN_QP, or a REQ through rdma_cm);
        None when every QP is open."""
        free = [qp for qp in self.qps if not qp.status.open]
        if not free:
            return None
        qp = free[0]
        qp.host = host
        qp.mtu = mtu
        qp.status = Status(open=True)
        qp.starts = []
        qp.opens += 1
        self.opened[(host.ip, host.qpn)] = qp.qpn
        if self.user_run is not None:
            thread = threading.Timer(0.05, self._generate, args=(qp, self.user_run))
            self._threads.append(thread)
            thread.start()
        return qp

    def free(self, qpn: int) -> None:
        """Close endpoint QP ``qpn`` (CLOSE_QP, or a DREQ through rdma_cm)."""
        qp = self.qp(qpn)
        assert qp is not None
        with self.lock:
            qp.status = Status()
            self.opened = {key: value for key, value in self.opened.items() if value != qpn}

    def first_psn(self, qp: EndpointQp) -> int:
        """The first PSN of ``qp``; ``stale_psn`` keeps it across closes."""
        return 0x2000 + qp.qpn + (0 if self.stale_psn else 0x10000 * (qp.opens - 1))

    def _start(self, request: Datagram) -> None:
        qp = self.qp(request.rem.qpn)
        if qp is None or not qp.status.open or qp.status.running:
            return
        if self.ignore_starts:
            self.ignore_starts -= 1
            return
        if sum(other.status.running for other in self.qps) >= self.capacity:
            return
        qp.starts.append(request)
        if self.fail_with is not None:
            with self.lock:
                qp.status = dataclasses.replace(qp.status, error=True,
                                                error_status=self.fail_with)
            return
        with self.lock:
            qp.status = dataclasses.replace(qp.status, running=True, messages=0,
                                            runs=qp.status.runs + 1)
            qp.consumed = 0
        thread = threading.Thread(target=self._generate, args=(qp, request), daemon=True)
        self._threads.append(thread)
        thread.start()

    def _generate(self, qp: EndpointQp, start: Datagram) -> None:
        assert self.backend is not None and qp.host is not None
        index = qp.host.qpn - FIRST_HOST_QPN
        length, count, ring = start.length, start.count, start.rem.base_addr
        slots = ring // length if ring and length else 0
        write, immediate = start.txmeta.write, start.txmeta.immediate
        sent = count if self.stop_after is None else min(count, self.stop_after)
        for k in range(sent):
            if start.txmeta.credited and not self._wait_for_credit(qp, k - slots + 1):
                return
            payload = bytearray(protocol.generator_payload(k, length))
            if (index, k) in self.corrupt:
                payload[self.corrupt[index, k]] ^= 0x40
            imm = protocol.generator_immediate(k) if immediate else None
            if write:
                address = qp.host.base_addr + (k % slots if slots else k) * length
                self.backend.write(qp.host.rkey, address, bytes(payload))
                if immediate and not self._retry(
                        qp, functools.partial(self.backend.deliver_write_imm, index, length, imm)):
                    return
            elif not self._retry(
                    qp, functools.partial(self.backend.deliver_send, index, bytes(payload), imm)):
                return
            with self.lock:
                status = qp.status
                qp.status = dataclasses.replace(
                    status, messages=k + 1, packets=status.packets + max(1, -(-length // 4096)),
                    bytes=status.bytes + length)
            if self.message_delay:
                time.sleep(self.message_delay)
        with self.lock:
            qp.status = dataclasses.replace(qp.status, running=False)

    def _wait_for_credit(self, qp: EndpointQp, consumed: int) -> bool:
        """A credited run: wait until the host has consumed ``consumed`` messages; False
        when the QP or the endpoint closes first."""
        while qp.consumed < consumed:
            if self._stop.is_set() or not qp.status.open:
                return False
            time.sleep(0.001)
        return True

    def _retry(self, qp: EndpointQp, deliver) -> bool:
        """RNR retry: deliver until a receive is posted; False when the QP or the
        endpoint closes, or after 5 s (then the QP goes to ERROR)."""
        deadline = time.monotonic() + 5
        while not deliver():
            if self._stop.is_set() or not qp.status.open:
                return False
            if time.monotonic() > deadline:
                with self.lock:
                    qp.status = dataclasses.replace(
                        qp.status, running=False, error=True,
                        error_status=protocol.ErrorStatus.RNR_RETRY_EXCEEDED)
                return False
            time.sleep(0.001)
        return True
