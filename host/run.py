"""One ``qp-server`` run: pair host QPs with endpoint QPs, start the generator, check
every byte as it lands, close the QPs.

Per QP: the backend creates the host QP and its buffer, CM OPEN_QP pairs it with
an endpoint QP (the endpoint announces the path MTU), the backend connects it,
receives are posted (SEND and WRITE with immediate), and a start datagram,
confirmed by STATUS, runs the generator. Then:

* SEND, and WRITE with immediate: each completion is one message, checked at once
  (SEND: its receive buffer; WRITE: its ring slot; immediate == k). Receives are
  re-posted after the check, so with immediate data the endpoint cannot reuse a
  slot that is not checked yet (at most ``slots - 1`` receives are posted).
* plain WRITE: nothing completes on the host, so the run polls the ring slot of
  the next message for its last whole word (the buffer is filled with 0xFF first),
  checks the message when it has landed, and at the end waits for STATUS (not
  running, nothing outstanding) and checks every slot's final message again.

With ``repeat`` > 1 the same host QPs run the check again: after a pass every
endpoint QP is closed through the CM, each host QP goes to RESET and back to INIT
(with a new first PSN) and is paired again; the endpoint must announce a new first
PSN. Each pass is checked on its own, and a failed pass ends the run.

A QP that makes no progress for ``stall`` seconds is asked for STATUS: an endpoint
QP in ERROR ends the run with the reason; a finished run with messages still
missing ends that QP's check. Endpoint QPs are closed in every case (``finally``),
host QPs destroyed.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable

from .backend import Backend, Completion, CompletionKind, PortInfo
from .checker import Checker, Landed, Mismatch, Statistics
from .cm import CmClient, endpoint_error
from .errors import HostError, StartNotTaken
from .protocol import PathMtu, QpInfo, Status

__all__ = ["DEFAULT_RING_LIMIT", "RunConfig", "QpRun", "RunResult", "Runner", "default_ring",
           "rate_divider"]

#: Largest default WRITE ring per QP (bytes), when ``--ring`` is not given.
DEFAULT_RING_LIMIT = 64 << 20

_FILL = 0xFF
_POLL_SLICE = 0.05
_PROGRESS_EVERY = 0.25
_RING_BUDGET = 256
_IMM_RECEIVE_BYTES = 64


def default_ring(size: int, count: int, *, immediate: bool = False) -> int:
    """The WRITE ring of one QP when ``--ring`` is not given: the whole run up to
    :data:`DEFAULT_RING_LIMIT`, whole messages, at least one (two with immediate)."""
    if size == 0:
        return 0
    slots = max(1, min(count, DEFAULT_RING_LIMIT // size))
    if immediate and count > 1:
        slots = max(slots, 2)
    return slots * size


def rate_divider(rate: float, size: int, clock_hz: float) -> int:
    """The generator's divider (clock cycles between message starts) for a payload
    rate of ``rate`` GB/s (10**9 bytes/s) with ``size``-byte messages at
    ``clock_hz``; 0 (as fast as possible) for rate 0."""
    if rate < 0:
        raise ValueError(f"rate must be >= 0 GB/s, not {rate}")
    if rate == 0:
        return 0
    divider = max(1, round(clock_hz * size / (rate * 1e9)))
    if divider > 0xFFFF_FFFF:
        raise ValueError(f"{rate} GB/s with {size}-byte messages needs a divider of {divider} "
                         "cycles, above 2**32 - 1: raise --rate or --size")
    return divider


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What to run: ``--write``/``--send``, ``--imm``, ``--size``, ``--count``, the
    divider from ``--rate``, ``--ring`` (0: :func:`default_ring`), ``--qps``,
    ``--receives``, ``--mtu`` (None: the port's active MTU), ``not --no-start``."""
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
    reclaim: bool = False       # --reclaim: close all the host's endpoint QPs first

    def __post_init__(self) -> None:
        if (self.size < 0 or self.count < 1 or self.qps < 1 or self.receives < 1
                or self.repeat < 1):
            raise ValueError("size must be >= 0 and count, qps, receives and repeat >= 1")
        if self.write and self.size and self.ring and self.ring < self.size:
            raise ValueError(f"ring ({self.ring} bytes) must hold at least one message of "
                             f"{self.size} bytes")

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
        immediate at most ``slots - 1`` so no unchecked slot is reused."""
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
    """One host QP and its endpoint QP during a run."""
    index: int
    host: QpInfo
    endpoint: QpInfo | None = None
    mtu: PathMtu | None = None
    started: bool = False
    live_done: bool = False
    done: bool = False
    next_k: int = 0
    posted: int = 0
    ok: int = 0
    errors: int = 0
    unchecked: int = 0
    missing: int = 0
    first_error: str | None = None
    status: Status | None = None
    last_progress: float = 0.0
    ended: bool = False
    last_lap: dict[int, bool | None] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        endpoint = f", endpoint QPN {self.endpoint.qpn}" if self.endpoint else ""
        return f"QP {self.index} (host QPN {self.host.qpn}{endpoint})"

    def to_json(self) -> dict[str, object]:
        return {
            "index": self.index, "host_qpn": self.host.qpn,
            "endpoint_qpn": self.endpoint.qpn if self.endpoint else None,
            "host_psn": self.host.psn,
            "endpoint_psn": self.endpoint.psn if self.endpoint else None,
            "path_mtu": self.mtu.bytes if self.mtu else None, "messages_ok": self.ok,
            "errors": self.errors, "unchecked": self.unchecked, "missing": self.missing,
            "first_error": self.first_error,
            "status": dataclasses.asdict(self.status) if self.status else None,
        }


@dataclasses.dataclass
class RunResult:
    """What a run checked, per QP and in total; ``error`` is the failure that ended
    it early, if any. With ``--repeat`` this is the last pass (``number`` counts
    from 1) and ``earlier`` holds the passes before it."""
    config: RunConfig
    port: PortInfo | None
    qps: list[QpRun]
    stats: Statistics
    interrupted: bool = False
    error: str | None = None
    number: int = 1
    earlier: list[RunResult] = dataclasses.field(default_factory=list)

    @property
    def pass_ok(self) -> bool:
        """Every message of every QP of this pass arrived byte-exact."""
        return (not self.interrupted and self.error is None
                and len(self.qps) == self.config.qps
                and all(qp.ok == self.config.count and not qp.errors for qp in self.qps))

    @property
    def ok(self) -> bool:
        """Every pass ran, and every message of every QP arrived byte-exact."""
        return (self.pass_ok and self.number == self.config.repeat
                and all(earlier.pass_ok for earlier in self.earlier))

    @property
    def passes(self) -> list[RunResult]:
        return [*self.earlier, self]

    @property
    def first_error(self) -> str | None:
        for result in self.passes:
            where = f"pass {result.number}: " if self.config.repeat > 1 else ""
            for qp in result.qps:
                if qp.first_error:
                    return f"{where}{qp.name}: {qp.first_error}"
            if result.error:
                return f"{where}{result.error}"
        if not self.interrupted and self.number < self.config.repeat:
            return f"only {self.number} of {self.config.repeat} passes ran"
        return None

    def to_json(self) -> dict[str, object]:
        """One JSON object; with ``--repeat`` above 1 the last pass's fields, ``ok``
        for all passes, and ``passes`` with each pass's own object."""
        fields = self._pass_json()
        if self.config.repeat > 1:
            fields["ok"] = self.ok
            fields["repeat"] = self.config.repeat
            fields["passes"] = [result._pass_json() for result in self.passes]
        return fields

    def _pass_json(self) -> dict[str, object]:
        config = self.config
        return {
            "ok": self.pass_ok, "pass": self.number,
            "operation": "write" if config.write else "send",
            "immediate": config.immediate, "size": config.size, "count": config.count,
            "divider": config.divider, "ring": config.ring_bytes, "qps": len(self.qps),
            "receives": config.posted_receives, "started": config.start,
            "device": self.port.device if self.port else None,
            "host_ip": self.port.ip if self.port else None,
            **self.stats.summary(),
            "unchecked": sum(qp.unchecked for qp in self.qps),
            "missing": sum(qp.missing for qp in self.qps),
            "interrupted": self.interrupted, "error": self.error,
            "first_error": self.first_error,
            "qp": [qp.to_json() for qp in self.qps],
        }

    def summary_text(self) -> str:
        if self.config.repeat == 1:
            return self._pass_text()
        lines = [f"pass {result.number} of {self.config.repeat}: {result._pass_text()}"
                 for result in self.passes]
        if not self.ok:
            lines.append(f"FAILED: {self.first_error or 'not every pass ran'}")
        return "\n".join(lines)

    def _pass_text(self) -> str:
        config, stats = self.config, self.stats
        operation = ("WRITE" if config.write else "SEND") + (" with immediate" * config.immediate)
        lines = [f"{'OK' if self.pass_ok else 'FAILED'}: {operation}, {stats.messages} of "
                 f"{config.count * len(self.qps)} messages checked ({config.size} bytes each), "
                 f"{stats.bytes} bytes in {stats.elapsed:.3f} s, {stats.gbps:.3f} GB/s, "
                 f"{stats.errors} error{'' if stats.errors == 1 else 's'}"]
        for qp in self.qps:
            line = f"  {qp.name}: {qp.ok}/{config.count} ok"
            for label, value in (("wrong", qp.errors), ("unchecked", qp.unchecked),
                                 ("missing", qp.missing)):
                if value:
                    line += f", {value} {label}"
            if qp.first_error:
                line += f"; first: {qp.first_error}"
            lines.append(line)
        if self.interrupted:
            lines.append("  interrupted")
        return "\n".join(lines)


class Runner:
    """Runs ``config`` on ``backend`` (opened here, closed at the end) with the
    endpoint behind ``cm``. ``progress`` gets the live progress line about four
    times a second; ``notice`` gets one-off messages (pairings, warnings)."""

    def __init__(self, config: RunConfig, backend: Backend, cm: CmClient, *,
                 progress: Callable[[str], None] | None = None,
                 notice: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.backend = backend
        self.cm = cm
        self._progress = progress
        self._notice = notice or (lambda text: None)
        self._clock = clock
        self.qps: list[QpRun] = []
        self.port: PortInfo | None = None
        self.stats = Statistics(config.count * config.qps, clock=clock)
        self.checker = Checker(config.size, slots=config.slots, immediate=config.immediate)
        self.number = 1
        self.earlier: list[RunResult] = []
        self._pending: list[QpRun] = []
        self._last_progress_line = 0.0
        self._previous_psns: dict[int, int] = {}

    def run(self) -> RunResult:
        """Pair, start, check and close, ``repeat`` times over the same host QPs;
        raises :class:`HostError` on a failure that ends the run (the QPs are closed
        first), KeyboardInterrupt likewise. A pass that fails ends the run."""
        try:
            while True:
                self._pair()
                self._start_all()
                self._check()
                result = self.result()
                if not result.pass_ok or self.number == self.config.repeat:
                    return result
                self.earlier.append(result)
                self._reopen()
        finally:
            self.stats.stop()
            self._close()

    def result(self, **fields: object) -> RunResult:
        """The result of the current pass (stopping its clock), with the earlier ones."""
        self.stats.stop()
        return RunResult(self.config, self.port, self.qps, self.stats, number=self.number,
                         earlier=list(self.earlier), **fields)  # type: ignore[arg-type]

    # Pairing and starting

    def _reopen(self) -> None:
        """Close every endpoint QP through the CM, move every host QP to RESET and back
        to INIT, and begin the next pass."""
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
        self.stats = Statistics(self.config.count * self.config.qps, clock=self._clock)

    def _pair(self) -> None:
        config = self.config
        if self.port is None:
            port = self.port = self.backend.open(config.qps, config.buffer_bytes,
                                                 config.posted_receives)
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
            self.backend.connect(index, qp.endpoint, qp.mtu)
            for wr_id in range(config.posted_receives):
                self._post(qp, wr_id)
            self._notice(f"paired host QPN {qp.host.qpn} ({qp.host.ip}) with endpoint QPN "
                         f"{qp.endpoint.qpn} ({qp.endpoint.ip}), path MTU {qp.mtu.bytes}, "
                         f"first PSNs {qp.host.psn:#08x} (host) and {qp.endpoint.psn:#08x} "
                         "(endpoint)")

    def _post(self, qp: QpRun, wr_id: int) -> None:
        if self.config.write:
            self.backend.post_receive(qp.index, wr_id, 0, _IMM_RECEIVE_BYTES)
        else:
            self.backend.post_receive(qp.index, wr_id, wr_id * self.config.size,
                                      self.config.size)
        qp.posted += 1

    def _start_all(self) -> None:
        self.stats.start()
        now = self._clock()
        for qp in self.qps:
            qp.last_progress = now
            if not self.config.start:
                qp.started = True
            elif not self._start(qp, retry_later=any(other.started for other in self.qps)):
                self._pending.append(qp)

    def _start(self, qp: QpRun, *, retry_later: bool) -> bool:
        """Start ``qp``'s run; False when not taken and ``retry_later`` allows waiting
        for another run to finish."""
        config = self.config
        assert qp.endpoint is not None
        try:
            status = self.cm.start(qp.endpoint.qpn, length=config.size, count=config.count,
                                   divider=config.divider, write=config.write,
                                   immediate=config.immediate, ring=config.ring_bytes,
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

    # Checking

    def _check(self) -> None:
        config = self.config
        while not all(qp.done for qp in self.qps):
            progressed = False
            if config.uses_completions:
                for completion in self.backend.poll(_POLL_SLICE):
                    self._completion(completion)
                    progressed = True
            else:
                for qp in self.qps:
                    progressed |= self._poll_ring(qp)
                if not progressed and config.idle_sleep:
                    time.sleep(config.idle_sleep)
            now = self._clock()
            for qp in self.qps:
                if qp.started and not qp.done:
                    if qp.live_done:
                        self._finish(qp)
                    elif now - qp.last_progress > config.stall:
                        self._stalled(qp)
            if self._pending and any(qp.done for qp in self.qps):
                self._start_pending()
            self.cm.keep_alive()
            self._show_progress(now)

    def _record(self, qp: QpRun, mismatch: Mismatch | None, nbytes: int) -> bool:
        self.stats.add(nbytes, ok=mismatch is None)
        if mismatch is None:
            qp.ok += 1
            return True
        qp.errors += 1
        if qp.first_error is None:
            qp.first_error = str(mismatch)
        return False

    def _fail(self, qp: QpRun, text: str) -> None:
        if qp.first_error is None:
            qp.first_error = text

    def _completion(self, completion: Completion) -> None:
        if not 0 <= completion.qp < len(self.qps):
            return
        config = self.config
        qp = self.qps[completion.qp]
        k = qp.next_k
        if not completion.ok:
            raise HostError(
                f"host {qp.name} went to ERROR: work completion {completion.status_name} at "
                f"message {k}{_WC_HINTS.get(completion.status_name, '')}")
        if k >= config.count:
            qp.errors += 1
            self.stats.errors += 1
            self._fail(qp, f"message {k} arrived, beyond --count {config.count}")
            return
        expected = CompletionKind.RECV_IMM if config.write else CompletionKind.RECV
        if completion.kind != expected:
            qp.errors += 1
            self.stats.add(0, ok=False)
            self._fail(qp, f"message {k} arrived as {_KIND_TEXT[completion.kind]}, expected "
                           f"{_KIND_TEXT[expected]}")
        else:
            if config.write:
                offset, length = self.checker.slot_offset(k), config.size
            else:
                offset, length = completion.wr_id * config.size, completion.byte_len
            data = self.backend.read(qp.index, offset, length) if length else b""
            mismatch = self.checker.check(k, data, imm=completion.imm, buffer_offset=offset)
            self._record(qp, mismatch, len(data))
        qp.next_k += 1
        qp.last_progress = self._clock()
        if qp.posted < config.count:
            self._post(qp, completion.wr_id)
        if qp.next_k == config.count:
            qp.live_done = True

    def _poll_ring(self, qp: QpRun) -> bool:
        """Check the plain-WRITE messages of ``qp`` that have landed; True if any."""
        config = self.config
        if not qp.started or qp.live_done:
            return False
        if config.size == 0:
            qp.live_done = True
            return False
        last_lap = config.count - config.slots
        marker_offset, marker_length = self.checker.marker()
        progressed = False
        for _ in range(_RING_BUDGET):
            k = qp.next_k
            if k >= config.count:
                break
            base = self.checker.slot_offset(k)
            marker = self.backend.read(qp.index, base + marker_offset, marker_length)
            landed = self.checker.landed(k, marker)
            if landed is Landed.NOT_YET:
                break
            verdict: bool | None
            if landed is Landed.LAPPED:
                qp.unchecked += 1
                verdict = None
                self._fail(qp, str(Mismatch(k, "overwritten",
                                            got=self.checker.lapping(k, marker))))
            else:
                data = self.backend.read(qp.index, base, config.size)
                verdict = self._record(qp, self.checker.check(k, data, buffer_offset=base),
                                       len(data))
            if k >= last_lap:
                qp.last_lap[k] = verdict
            qp.next_k += 1
            progressed = True
        if progressed:
            qp.last_progress = self._clock()
        if qp.next_k == config.count:
            qp.live_done = True
        return progressed

    def _stalled(self, qp: QpRun) -> None:
        """No progress on ``qp`` for ``stall`` seconds: ask the endpoint why."""
        assert qp.endpoint is not None
        qp.last_progress = self._clock()
        status = qp.status = self.cm.status(qp.endpoint.qpn)
        if status.error:
            raise endpoint_error(qp.endpoint.qpn, status)
        if not self.config.start or status.running or status.outstanding:
            return
        if not self.config.uses_completions:
            qp.live_done = True
        elif qp.ended:
            qp.missing = self.config.count - qp.next_k
            self._fail(qp, f"message {qp.next_k} never arrived: the endpoint ended the run "
                           f"after {status.messages} messages and every packet was "
                           "acknowledged")
            qp.done = True
        else:
            qp.ended = True

    def _finish(self, qp: QpRun) -> None:
        """All messages of ``qp`` seen (or its run ended): wait until the endpoint has
        nothing in flight, then (plain WRITE) check every slot's final message."""
        qp.status = self._quiescent(qp)
        config = self.config
        if config.write and not config.immediate:
            if config.size == 0:
                qp.ok = min(qp.status.messages, config.count)
                qp.missing = config.count - qp.ok
                for _ in range(qp.ok):
                    self.stats.add(0)
                if qp.missing:
                    self._fail(qp, f"the endpoint sent {qp.status.messages} of {config.count} "
                                   "messages")
            else:
                self._final_ring_check(qp)
        qp.done = True

    def _final_ring_check(self, qp: QpRun) -> None:
        config = self.config
        first_of_last_lap = max(0, config.count - config.slots)
        if qp.next_k < first_of_last_lap:
            qp.unchecked += first_of_last_lap - qp.next_k
            self._fail(qp, f"messages {qp.next_k}..{first_of_last_lap - 1} were never seen "
                           "and are overwritten now")
        for _, k in self.checker.final_messages(config.count):
            base = self.checker.slot_offset(k)
            data = self.backend.read(qp.index, base, config.size)
            mismatch = self.checker.check(k, data, buffer_offset=base)
            if k not in qp.last_lap:
                self._record(qp, mismatch, len(data))
            elif qp.last_lap[k] is True and mismatch is not None:
                qp.ok -= 1
                qp.errors += 1
                self.stats.errors += 1
                self._fail(qp, f"{mismatch} (it changed after it was checked)")

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

    def _show_progress(self, now: float) -> None:
        if self._progress and now - self._last_progress_line >= _PROGRESS_EVERY:
            self._last_progress_line = now
            self._progress(self.stats.progress_line())

    # Closing

    def _close(self) -> None:
        """Close every paired endpoint QP and the backend; Ctrl-C is ignored meanwhile."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            for qp in self.qps:
                if qp.endpoint is None:
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
