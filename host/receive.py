"""The receive API: pair host QPs with an endpoint, then hand every landed message to
the caller in order, as a zero-copy view of the registered buffer.

::

    with CmClient("10.77.0.2") as cm, Receiver(RunConfig(write=False, size=4096,
            count=1_000_000, qps=2), PyverbsBackend(VerbsOptions()), cm) as receiver:
        for message in receiver.messages():
            use(message.qp, message.k, message.data)   # a memoryview, valid until the next

Per QP: the backend creates the host QP and its buffer, CM OPEN_QP pairs it with
an endpoint QP (the endpoint announces the path MTU), the backend connects it
(``cm="rdma"``: the backend connects it with rdma_cm instead, to the endpoint's
passive IB CM on rdma_cm port ``rdma_port``, the REQ's private data naming its
buffer; with ``listen`` the host listens on rdma_cm port ``listen`` + QP index and
the endpoint's active CM connects to it, asked by CONNECT; :meth:`Receiver.close`
ends it with ``rdma_disconnect``), receives are
posted (SEND and WRITE with immediate), and a start datagram,
confirmed by STATUS, runs the generator (``start=False``: the endpoint's user
logic sends). Then messages are found in order per QP:

* SEND, and WRITE with immediate: each completion is one message (SEND: in its
  receive buffer, ``wr_id × size``; WRITE: in ring slot ``k mod slots``).
  Releasing it re-posts its receive, so with immediate data the endpoint cannot
  reuse a slot that is still held (at most ``slots - 1`` receives are posted).
* plain WRITE: nothing completes on the host; the receiver reads the last whole
  word of the next ring slots (the buffer is filled with 0xFF first; the word
  names k and j) with numpy, and a message has landed when its word is there.
  Releasing it advances the ring. A slot that already shows a later message was
  lapped: the message is lost, reported as ``overwritten`` and skipped; a slot
  that changes while it is held is reported at its release. With ``credit`` the
  run is credited: releasing a batch sends CREDIT with the messages consumed so
  far, and the endpoint writes a slot only once the message before it there has
  been released, so nothing is overwritten however slowly the caller consumes.

Messages come in :class:`Batch` es: consecutive messages of one QP that lie back
to back in the buffer (what one poll found), so a caller can work on a whole
batch at once (the checker does). A batch is released by :meth:`Batch.release`,
at the latest when the next batch is asked for; its views must not be used after.

Problems are counted per QP (:class:`QpRun`: ``errors``, ``unchecked``,
``missing``, ``first_error``) with the same words as qp-server prints; failures
that end the run (an endpoint QP in ERROR, a host work completion error, NO_QP)
raise :class:`~host.errors.HostError`. A QP that makes no progress for ``stall`` seconds is
asked for STATUS; a run that ended with messages still missing ends that QP.
:meth:`Receiver.close` closes every endpoint QP and the backend.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from .backend import Backend, Completion, CompletionKind, PortInfo
from .checker import Checker, Landed, Mismatch
from .cm import CmClient, endpoint_error
from .errors import HostError, StartNotTaken
from .protocol import CM_PORT, PathMtu, QpInfo, Status, generator_immediate

__all__ = ["CMS", "DEFAULT_RING_LIMIT", "RunConfig", "QpRun", "Message", "Batch", "Receiver",
           "default_ring"]

#: How host QPs are paired with endpoint QPs: the UDP CM's OPEN_QP, or rdma_cm (IB CM).
CMS = ("udp", "rdma")

#: Largest default WRITE ring per QP (bytes), when ``--ring`` is not given.
DEFAULT_RING_LIMIT = 64 << 20

_FILL = 0xFF
_POLL_SLICE = 0.05
#: Bytes of plain-WRITE messages one poll of a ring hands out at most (one batch).
_RING_BATCH_BYTES = 16 << 20
_FIRST_WINDOW = 64
_IMM_RECEIVE_BYTES = 64
_WORD = 8


def default_ring(size: int, count: int, *, immediate: bool = False) -> int:
    """The WRITE ring of one QP when ``--ring`` is not given: the whole run up to
    :data:`DEFAULT_RING_LIMIT`, whole messages, at least one (two with immediate)."""
    if size == 0:
        return 0
    slots = max(1, min(count, DEFAULT_RING_LIMIT // size))
    if immediate and count > 1:
        slots = max(slots, 2)
    return slots * size


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What to run: ``--write``/``--send``, ``--imm``, ``--size``, ``--count``, the
    divider from ``--rate``, ``--ring`` (0: :func:`default_ring`), ``--qps``,
    ``--receives``, ``--mtu`` (None: the port's active MTU), ``not --no-start``,
    ``--check`` (``all``, ``sample=N``, ``none``) and ``--check-threads``; ``--cm``
    (:data:`CMS`), ``--rdma-port``, ``--listen`` (0: connect to the endpoint's
    ``--rdma-port``; else the endpoint connects to this host's rdma_cm port
    ``listen`` + QP index) and ``--rdma-timeout`` (seconds for each rdma_cm event,
    DISCONNECTED included; with ``listen`` for the whole connect)."""
    write: bool = True
    immediate: bool = False
    size: int = 4096
    count: int = 1000
    divider: int = 0
    ring: int = 0
    qps: int = 1
    receives: int = 128
    mtu: PathMtu | None = None
    start: bool = True
    stall: float = 2.0
    idle_sleep: float = 0.0
    repeat: int = 1
    check: str = "all"
    check_threads: int = 1
    reclaim: bool = False       # --reclaim: close all the host's endpoint QPs first
    credit: bool = False        # --credit: a credited run, CREDIT sent as messages are released
    cm: str = "udp"
    rdma_port: int = CM_PORT
    rdma_timeout: float = 10.0
    listen: int = 0

    def __post_init__(self) -> None:
        if self.cm not in CMS:
            raise ValueError(f"cm must be one of {', '.join(CMS)}, not {self.cm!r}")
        if self.listen and self.cm != "rdma":
            raise ValueError("--listen needs --cm rdma (the endpoint connects to this host's "
                             "rdma_cm)")
        if self.listen and not 0 < self.listen <= 0xFFFF - (self.qps - 1):
            raise ValueError(f"--listen {self.listen} with {self.qps} QPs: QP i listens on "
                             f"port {self.listen} + i, which must be 1..65535")
        if self.cm == "rdma" and self.repeat > 1:
            raise ValueError("--repeat needs --cm udp (a pass closes and reopens the QPs "
                             "through the UDP CM); run qp-server again for another rdma_cm "
                             "connection")
        if self.cm == "rdma" and not self.listen and self.mtu is not None:
            raise ValueError("--mtu needs --cm udp or --listen: rdma_connect takes the path "
                             "MTU of the route (the interface's MTU: `ip link set <netdev> "
                             "mtu 9000`)")
        if (self.size < 0 or self.count < 1 or self.qps < 1 or self.receives < 1
                or self.repeat < 1 or self.check_threads < 1):
            raise ValueError("size must be >= 0 and count, qps, receives, repeat and "
                             "check_threads >= 1")
        if self.write and self.size and self.ring and self.ring < self.size:
            raise ValueError(f"ring ({self.ring} bytes) must hold at least one message of "
                             f"{self.size} bytes")
        if self.credit and not (self.write and not self.immediate):
            raise ValueError("credit applies to plain WRITE runs (--write without --imm): "
                             "SEND and immediate data are held back by posted receives")
        self.sample    # noqa: B018 (validates ``check``)

    @property
    def sample(self) -> int:
        """Check every ``sample``-th message (k mod sample == 0); 1 checks all, 0 none."""
        if self.check == "all":
            return 1
        if self.check == "none":
            return 0
        name, _, number = self.check.partition("=")
        if name == "sample" and number.isdigit() and int(number) >= 1:
            return int(number)
        raise ValueError(f"check must be all, sample=N (N >= 1) or none, not {self.check!r}")

    @property
    def ring_bytes(self) -> int:
        """Bytes of each QP's WRITE ring (whole slots); 0 for SEND."""
        if not self.write or self.size == 0:
            return 0
        ring = self.ring or default_ring(self.size, self.count, immediate=self.immediate)
        return ring // self.size * self.size

    @property
    def slots(self) -> int:
        return self.ring_bytes // self.size if self.ring_bytes else 0

    @property
    def posted_receives(self) -> int:
        """Receives kept posted per QP: none for plain WRITE; for WRITE with
        immediate at most ``slots - 1`` so no held slot is reused."""
        if self.write and not self.immediate:
            return 0
        receives = min(self.receives, self.count)
        if self.write and self.slots:
            receives = min(receives, max(1, self.slots - 1))
        return receives

    @property
    def buffer_bytes(self) -> int:
        if self.write:
            return max(self.ring_bytes, _IMM_RECEIVE_BYTES)
        return max(self.posted_receives * self.size, _IMM_RECEIVE_BYTES)

    @property
    def uses_completions(self) -> bool:
        return not self.write or self.immediate


@dataclasses.dataclass
class QpRun:
    """One host QP and its endpoint QP during a run: its pairing, where its run
    stands, what went wrong, and the host times its first and last message landed."""
    index: int
    host: QpInfo
    endpoint: QpInfo | None = None
    mtu: PathMtu | None = None
    started: bool = False
    live_done: bool = False
    done: bool = False
    next_k: int = 0
    credited: int = 0           # messages reported consumed (CREDIT) in this pass
    posted: int = 0
    landed: int = 0             # messages handed out (bytes in ``landed_bytes``)
    landed_bytes: int = 0
    first_landed: float | None = None
    last_landed: float | None = None
    ok: int = 0
    errors: int = 0
    unchecked: int = 0
    missing: int = 0
    first_error: str | None = None
    status: Status | None = None
    last_progress: float = 0.0
    ended: bool = False
    disconnect: dict | None = None     # rdma_cm: how rdma_disconnect ended

    @property
    def name(self) -> str:
        endpoint = f", endpoint QPN {self.endpoint.qpn}" if self.endpoint else ""
        return f"QP {self.index} (host QPN {self.host.qpn}{endpoint})"

    def fail(self, text: str) -> None:
        """Count one error; the first one is kept for the report."""
        self.errors += 1
        self.note(text)

    def note(self, text: str) -> None:
        if self.first_error is None:
            self.first_error = text


@dataclasses.dataclass(frozen=True)
class Message:
    """Message ``k`` of host QP ``qp``: ``data`` is a view of the registered buffer
    at byte ``offset`` (valid until its batch is released); ``imm`` its immediate."""
    qp: int
    k: int
    data: memoryview
    offset: int
    imm: int | None = None


class Batch:
    """Messages ``first .. first + count - 1`` of host QP ``qp``, each ``length``
    bytes, back to back from byte ``offset`` of its buffer (``view``), seen at host
    time ``landed``. Iterating gives :class:`Message` s; :meth:`release` hands the
    slots back (re-posts the receives or advances the ring). ``faulty``: a message
    already counted as wrong (wrong operation or immediate), not worth checking."""

    def __init__(self, receiver: Receiver, qp: int, first: int, count: int, offset: int,
                 length: int, landed: float, imms: list[int | None] | None = None,
                 wr_ids: list[int] | None = None, faulty: bool = False):
        self.qp, self.first, self.count = qp, first, count
        self.faulty = faulty
        self.offset, self.length, self.landed = offset, length, landed
        self.imms = imms
        self.view = receiver.buffer(qp)[offset:offset + count * length]
        self._receiver = receiver
        self._wr_ids = wr_ids or []
        self.released = False

    @property
    def nbytes(self) -> int:
        return self.count * self.length

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Message]:
        for i in range(self.count):
            yield Message(self.qp, self.first + i,
                          self.view[i * self.length:(i + 1) * self.length],
                          self.offset + i * self.length,
                          self.imms[i] if self.imms else None)

    def release(self) -> None:
        """Hand the slots back (once; later calls do nothing)."""
        if not self.released:
            self.released = True
            self._receiver._release(self, self._wr_ids)


class Receiver:
    """Pairs ``config.qps`` host QPs of ``backend`` with the endpoint behind ``cm``
    and yields what lands. ``notice`` gets one-off messages (pairings, warnings).
    As a context manager it opens, pairs and starts, and closes at the end."""

    def __init__(self, config: RunConfig, backend: Backend, cm: CmClient, *,
                 notice: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.backend = backend
        self.cm = cm
        self._notice = notice or (lambda text: None)
        self._clock = clock
        self.qps: list[QpRun] = []
        self.port: PortInfo | None = None
        self.number = 1
        self.checker = Checker(config.size, slots=config.slots, immediate=config.immediate)
        self._buffers: list[memoryview] = []
        self._pending: list[QpRun] = []
        self._previous_psns: dict[int, int] = {}
        self._held: Batch | None = None
        self._waiting: dict[int, list[Completion]] = {}
        #: Set from another thread to end :meth:`batches` with KeyboardInterrupt.
        self.stop = threading.Event()

    def __enter__(self) -> Receiver:
        try:
            self.pair()
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def buffer(self, qp: int) -> memoryview:
        """The whole registered buffer of host QP ``qp`` (no copy)."""
        return self._buffers[qp]

    # Pairing and starting

    def pair(self) -> None:
        """Open the backend (the first time), pair every host QP with an endpoint QP
        and post its receives."""
        config = self.config
        if self.port is None:
            port = self.port = self.backend.open(config.qps, config.buffer_bytes,
                                                 config.posted_receives)
            self._buffers = [self.backend.buffer(index) for index in range(config.qps)]
            numa = "" if port.numa_node is None else f", NUMA node {port.numa_node}"
            self._notice(f"using {port.device} port {port.port}, GID index {port.gid_index} "
                         f"({port.ip}), active MTU {port.active_mtu.bytes}{numa}")
            if config.reclaim:
                closed = self.cm.close_all(port.ip)
                self._notice(f"closed {closed} endpoint QP{'' if closed == 1 else 's'} "
                             f"left open by {port.ip} (--reclaim)")
        port = self.port
        mtu = config.mtu or port.active_mtu
        if mtu.bytes > port.active_mtu.bytes:
            raise HostError(f"--mtu {mtu.bytes} is above the active MTU {port.active_mtu.bytes} "
                            f"of port {port.port} of {port.device}: raise the interface MTU "
                            f"(`ip link set <netdev> mtu 9000`) or use --mtu "
                            f"{port.active_mtu.bytes} or less")
        for index in range(config.qps):
            qp = QpRun(index, self.backend.qp_info(index))
            self.qps.append(qp)
            if config.write and not config.immediate:
                self.backend.fill(index, _FILL)
            if config.listen:
                qp.endpoint, qp.mtu = self.backend.rdma_listen(
                    index, self.cm, config.listen + index, mtu, config.rdma_timeout)
                qp.host = self.backend.qp_info(index)
            elif config.cm == "rdma":
                qp.endpoint, qp.mtu = self.backend.rdma_connect(
                    index, self.cm.endpoint, config.rdma_port, config.rdma_timeout)
                qp.host = self.backend.qp_info(index)
            else:
                qp.endpoint, qp.mtu = self.cm.open_qp(qp.host, mtu)
            if self._previous_psns.get(index) == qp.endpoint.psn:
                raise HostError(f"endpoint QP {qp.endpoint.qpn} announced first PSN "
                                f"{qp.endpoint.psn:#08x} again after the close of pass "
                                f"{self.number - 1}: a stale PSN survived CLOSE_QP")
            if qp.mtu.bytes > port.active_mtu.bytes:
                raise HostError(f"endpoint QP {qp.endpoint.qpn} uses path MTU {qp.mtu.bytes}, "
                                f"above the active MTU {port.active_mtu.bytes} of "
                                f"{port.device} port {port.port}: raise the interface MTU "
                                "(`ip link set <netdev> mtu 9000`) or rebuild the endpoint "
                                "with a smaller default path MTU")
            if config.cm == "udp":
                self.backend.connect(index, qp.endpoint, qp.mtu)
            for wr_id in range(config.posted_receives):
                self._post(qp, wr_id)
            how = (f" through rdma_cm (the endpoint connected to port {config.listen + index})"
                   if config.listen else " through rdma_cm" if config.cm == "rdma" else "")
            self._notice(f"paired host QPN {qp.host.qpn} ({qp.host.ip}) with endpoint QPN "
                         f"{qp.endpoint.qpn} ({qp.endpoint.ip}){how}, path MTU {qp.mtu.bytes}, "
                         f"first PSNs {qp.host.psn:#08x} (host) and {qp.endpoint.psn:#08x} "
                         "(endpoint)")

    def _post(self, qp: QpRun, wr_id: int) -> None:
        if self.config.write:
            self.backend.post_receive(qp.index, wr_id, 0, _IMM_RECEIVE_BYTES)
        else:
            self.backend.post_receive(qp.index, wr_id, wr_id * self.config.size,
                                      self.config.size)
        qp.posted += 1

    def start(self) -> None:
        """Start the generator on every endpoint QP (those the generator cannot take
        yet start when another run ends)."""
        now = self._clock()
        for qp in self.qps:
            qp.last_progress = now
            if not self.config.start:
                qp.started = True
            elif not self._start(qp, retry_later=any(other.started for other in self.qps)):
                self._pending.append(qp)

    def _start(self, qp: QpRun, *, retry_later: bool) -> bool:
        config = self.config
        assert qp.endpoint is not None
        try:
            status = self.cm.start(qp.endpoint.qpn, length=config.size, count=config.count,
                                   divider=config.divider, write=config.write,
                                   immediate=config.immediate, ring=config.ring_bytes,
                                   credited=config.credit,
                                   tries=1 if retry_later else None)
        except StartNotTaken:
            if retry_later:
                return False
            raise
        if status.error:
            raise endpoint_error(qp.endpoint.qpn, status)
        qp.started = True
        qp.last_progress = self._clock()
        return True

    def _start_pending(self) -> None:
        while self._pending:
            running = any(qp.started and not qp.done for qp in self.qps)
            if not self._start(self._pending[0], retry_later=running):
                return
            self._pending.pop(0)

    def reopen(self) -> None:
        """Close every endpoint QP through the CM, move every host QP to RESET and back
        to INIT, and pair and start again (the next pass of ``--repeat``)."""
        self._release_held()
        for qp in self.qps:
            endpoint = qp.endpoint
            assert endpoint is not None
            self.cm.close_qp(endpoint.qpn, qp.host.ip)
            self._previous_psns[qp.index] = endpoint.psn
            self._notice(f"closed endpoint QPN {endpoint.qpn} after pass {self.number}")
        for qp in self.qps:
            self.backend.reset(qp.index)
        self.number += 1
        self.qps = []
        self._pending = []
        self._waiting = {}

    # Receiving

    @property
    def done(self) -> bool:
        """Every QP's run is over (all its messages seen, or it ended without them)."""
        return bool(self.qps) and all(qp.done for qp in self.qps)

    def messages(self) -> Iterator[Message]:
        """Every landed message, in order per QP. Use its ``data`` before asking for
        the next message: its slot is handed back with its batch, at the latest
        when a message of the next batch is asked for."""
        for batch in self.batches():
            yield from batch

    def batches(self) -> Iterator[Batch]:
        """Batches of landed messages, in order per QP, until every QP is done. The
        previous batch is released (if the caller did not) before the next is found."""
        while not self.done:
            if self.stop.is_set():
                raise KeyboardInterrupt
            found = self.poll()
            for batch in found:
                self._held = batch
                yield batch
                self._release_held()
            self.tend()

    def poll(self) -> list[Batch]:
        """The batches that landed now (or within a short wait for completions)."""
        config = self.config
        found: list[Batch] = []
        if config.uses_completions:
            completions = self.backend.poll(_POLL_SLICE)
            for completion in completions:
                self._waiting.setdefault(completion.qp, []).append(completion)
            for index in list(self._waiting):
                found += self._completions(index, self._waiting.pop(index))
        else:
            for qp in self.qps:
                batch = self._poll_ring(qp)
                if batch is not None:
                    found.append(batch)
            if not found and config.idle_sleep:
                time.sleep(config.idle_sleep)
        return found

    def tend(self) -> None:
        """Between polls: finish QPs whose messages are all in, ask STATUS of stalled
        ones, start runs waiting for the generator."""
        now = self._clock()
        for qp in self.qps:
            if qp.started and not qp.done:
                if qp.live_done:
                    qp.status = self._quiescent(qp)
                    qp.done = True
                elif now - qp.last_progress > self.config.stall:
                    self._stalled(qp)
        if self._pending and any(qp.done for qp in self.qps):
            self._start_pending()
        self.cm.keep_alive()

    def _landed(self, qp: QpRun, count: int, nbytes: int) -> float:
        now = self._clock()
        if qp.first_landed is None:
            qp.first_landed = now
        qp.last_landed = now
        qp.landed += count
        qp.landed_bytes += nbytes
        qp.last_progress = now
        return now

    def _completions(self, index: int, completions: list[Completion]) -> list[Batch]:
        """Completions of host QP ``index`` in order, as batches of back-to-back
        messages."""
        if not 0 <= index < len(self.qps):
            return []
        config = self.config
        qp = self.qps[index]
        expected = CompletionKind.RECV_IMM if config.write else CompletionKind.RECV
        batches: list[Batch] = []
        run: list[Completion] = []
        first = qp.next_k

        def flush() -> None:
            if run:
                batches.append(self._completion_batch(qp, first, run))

        for completion in completions:
            k = qp.next_k
            if not completion.ok:
                raise HostError(
                    f"host {qp.name} went to ERROR: work completion {completion.status_name} "
                    f"at message {k}{_WC_HINTS.get(completion.status_name, '')}")
            if k >= config.count:
                qp.fail(f"message {k} arrived, beyond --count {config.count}")
                continue
            qp.next_k += 1
            if qp.next_k == config.count:
                qp.live_done = True
            problem = None
            if completion.kind != expected:
                problem = (f"message {k} arrived as {_KIND_TEXT[completion.kind]}, expected "
                           f"{_KIND_TEXT[expected]}")
            elif config.immediate and completion.imm != generator_immediate(k):
                problem = str(Mismatch(k, "immediate", expected=generator_immediate(k),
                                       got=completion.imm))
            offset, length = self._place(k, completion)
            if problem is not None or (run and (
                    length != config.size
                    or offset != self._place(k - 1, run[-1])[0] + config.size)):
                flush()
                run, first = [], k
            if problem is not None:
                qp.fail(problem)
                batches.append(self._completion_batch(qp, k, [completion], faulty=True))
                first = k + 1
                continue
            run.append(completion)
            if length != config.size:
                flush()
                run, first = [], k + 1
        flush()
        return batches

    def _place(self, k: int, completion: Completion) -> tuple[int, int]:
        """(offset, length) in the buffer of message ``k`` delivered by ``completion``."""
        if completion.kind == CompletionKind.OTHER:
            return 0, 0
        if self.config.write:
            return self.checker.slot_offset(k), self.config.size
        return completion.wr_id * self.config.size, completion.byte_len

    def _completion_batch(self, qp: QpRun, first: int, run: list[Completion], *,
                          faulty: bool = False) -> Batch:
        offset, length = self._place(first, run[0])
        now = self._landed(qp, len(run), length * len(run))
        return Batch(self, qp.index, first, len(run), offset, length, now,
                     imms=[completion.imm for completion in run],
                     wr_ids=[completion.wr_id for completion in run], faulty=faulty)

    def _poll_ring(self, qp: QpRun) -> Batch | None:
        """The plain-WRITE messages of ``qp`` that have landed from ``next_k`` on, up
        to the ring's end, as one batch; a lapped slot is counted and skipped."""
        config = self.config
        if not qp.started or qp.live_done:
            return None
        if config.size == 0:
            qp.live_done = True
            return None
        while qp.next_k < config.count:
            k = qp.next_k
            slot = k % config.slots
            limit = min(config.count - k, config.slots - slot,
                        max(1, _RING_BATCH_BYTES // config.size))
            count = self._landed_run(qp, k, limit)
            if count:
                batch = Batch(self, qp.index, k, count, slot * config.size, config.size,
                              self._landed(qp, count, count * config.size))
                qp.next_k += count
                if qp.next_k == config.count:
                    qp.live_done = True
                return batch
            marker_offset, marker_length = self.checker.marker()
            base = self.checker.slot_offset(k)
            marker = self.buffer(qp.index)[base + marker_offset:
                                           base + marker_offset + marker_length]
            if self.checker.landed(k, marker) is not Landed.LAPPED:
                return None
            qp.unchecked += 1
            qp.note(str(Mismatch(k, "overwritten", got=self.checker.lapping(k, marker))))
            qp.next_k += 1
            qp.last_progress = self._clock()
        qp.live_done = True
        return None

    def _landed_run(self, qp: QpRun, k: int, limit: int) -> int:
        """How many of messages ``k .. k + limit - 1`` (consecutive slots) have landed,
        from their marker words, read with numpy in windows that grow by 4 from
        :data:`_FIRST_WINDOW` while every marker of a window is there (an idle poll
        reads one window)."""
        size = self.config.size
        marker_offset, marker_length = self.checker.marker()
        base = self.checker.slot_offset(k) + marker_offset
        buffer = self.buffer(qp.index)
        if size % _WORD or size < _WORD:
            count = 0
            while count < limit:
                at = base + count * size
                if self.checker.landed(k + count, buffer[at:at + marker_length]) \
                        is not Landed.YES:
                    break
                count += 1
            return count
        count, window = 0, _FIRST_WINDOW
        last_word = np.uint64(size // _WORD - 1)
        while count < limit:
            n = min(window, limit - count)
            markers = np.ndarray((n,), "<u8", buffer, base + count * size, (size,))
            expected = (np.arange(k + count, k + count + n, dtype="<u8") << np.uint64(32)) \
                | last_word
            landed = markers == expected
            if not landed.all():
                return count + int(np.argmin(landed))
            count += n
            window *= 4
        return count

    def _release_held(self) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None

    def _release(self, batch: Batch, wr_ids: list[int]) -> None:
        """Hand ``batch``'s slots back: re-post its receives; for plain WRITE, report a
        slot that a later message overwrote while it was held."""
        qp = self.qps[batch.qp] if batch.qp < len(self.qps) else None
        if qp is None:
            return
        if self.config.uses_completions:
            for wr_id in wr_ids:
                if qp.posted < self.config.count:
                    self._post(qp, wr_id)
            return
        if self.config.credit and qp.endpoint is not None:
            qp.credited = batch.first + batch.count
            self.cm.credit(qp.endpoint.qpn, qp.credited)
        if self.config.slots and self.config.count > self.config.slots:
            last = batch.first + batch.count - 1
            marker_offset, marker_length = self.checker.marker()
            at = batch.offset + (batch.count - 1) * batch.length + marker_offset
            marker = self.buffer(qp.index)[at:at + marker_length]
            if self.checker.landed(last, marker) is Landed.LAPPED:
                qp.note(f"message {last} was overwritten by message "
                        f"{self.checker.lapping(last, marker)} before it was released")

    def _stalled(self, qp: QpRun) -> None:
        """No progress on ``qp`` for ``stall`` seconds: ask the endpoint why."""
        assert qp.endpoint is not None
        qp.last_progress = self._clock()
        status = qp.status = self.cm.status(qp.endpoint.qpn)
        if status.error:
            raise endpoint_error(qp.endpoint.qpn, status)
        if self.config.credit and status.running:
            self.cm.credit(qp.endpoint.qpn, qp.credited)       # in case the last was lost
        if not self.config.start or status.running or status.outstanding:
            return
        if not self.config.uses_completions:
            qp.live_done = True
        elif qp.ended:
            qp.missing = self.config.count - qp.next_k
            qp.note(f"message {qp.next_k} never arrived: the endpoint ended the run after "
                    f"{status.messages} messages and every packet was acknowledged")
            qp.done = True
        else:
            qp.ended = True

    def _quiescent(self, qp: QpRun) -> Status:
        """STATUS of ``qp``'s endpoint QP once it is neither running nor waiting for
        acknowledgements."""
        assert qp.endpoint is not None
        limit = max(5.0, 5 * self.cm.timeout)
        deadline = self._clock() + limit
        while True:
            status = self.cm.status(qp.endpoint.qpn)
            if status.error:
                raise endpoint_error(qp.endpoint.qpn, status)
            if not status.running and status.outstanding == 0:
                return status
            if self._clock() > deadline:
                still = ("is still running" if status.running
                         else f"still has {status.outstanding} unacknowledged packets")
                raise HostError(f"endpoint QP {qp.endpoint.qpn} {still} {limit:g} s after the "
                                f"last message landed: look at `qp-server ctrl status --qpn "
                                f"{qp.endpoint.qpn}`")
            time.sleep(0.01)

    # Closing

    def close(self) -> None:
        """Close every paired endpoint QP (CLOSE_QP, or ``rdma_disconnect`` for QPs
        connected through rdma_cm) and the backend; Ctrl-C is ignored meanwhile."""
        self._held = None
        self._buffers = []
        self.checker.close()
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            for qp in self.qps:
                if qp.endpoint is None:
                    continue
                if self.config.cm == "rdma":
                    self._disconnect(qp)
                    continue
                try:
                    self.cm.close_qp(qp.endpoint.qpn, qp.host.ip)
                except HostError as error:
                    self._notice(f"could not close endpoint QP {qp.endpoint.qpn}: {error}")
            try:
                self.backend.close()
            except Exception as error:
                self._notice(f"could not close the verbs backend: {error}")
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)


    def _disconnect(self, qp: QpRun) -> None:
        """``rdma_disconnect`` of ``qp``; when no DISCONNECTED (the endpoint's DREP) came in
        time, CLOSE_QP frees the endpoint QP, with a notice."""
        assert qp.endpoint is not None
        timeout = self.config.rdma_timeout
        try:
            qp.disconnect = self.backend.rdma_disconnect(qp.index, timeout)
        except HostError as error:
            qp.disconnect = {"event": None, "error": str(error)}
        if qp.disconnect.get("event") == "DISCONNECTED":
            return
        why = qp.disconnect.get("error") or f"got {qp.disconnect.get('event')}"
        try:
            ack = self.cm.close_qp(qp.endpoint.qpn, qp.host.ip)
            qp.disconnect["close_qp"] = ack.name
            done = "closed it with CLOSE_QP"
        except HostError as error:
            done = (f"CLOSE_QP failed too ({error}): the endpoint frees it at the end of its "
                    "lease, or `qp-server --reclaim` closes it")
        self._notice(f"endpoint QP {qp.endpoint.qpn}: no DISCONNECTED within {timeout:g} s of "
                     f"rdma_disconnect ({why}); {done}")


_KIND_TEXT = {
    CompletionKind.RECV: "a SEND",
    CompletionKind.RECV_IMM: "an RDMA WRITE with immediate",
    CompletionKind.OTHER: "a completion that is no receive",
}

_WC_HINTS = {
    "IBV_WC_LOC_LEN_ERR": ": a SEND was longer than the posted receive; check --size",
    "IBV_WC_WR_FLUSH_ERR": ": the QP was already in ERROR (an earlier failure)",
    "IBV_WC_REM_INV_REQ_ERR": ": the endpoint sent an invalid request; check the path MTU",
    "IBV_WC_LOC_PROT_ERR": ": a receive buffer is outside the registered memory",
    "IBV_WC_LOC_QP_OP_ERR": ": the endpoint's packet did not fit the QP (path MTU, opcode)",
}
