"""One ``qp-server`` run against one endpoint: pair host QPs with endpoint QPs, start
the generator, check what lands, close the QPs.

:class:`Runner` is a thin user of :class:`host.receive.Receiver`, which pairs,
starts and hands every landed message over in order, in batches that lie back to
back in the registered buffer. Per batch the runner checks the bytes with the
vectorised :class:`host.checker.Checker` (``--check all``), every N-th message
(``sample=N``: message k when k mod N == 0) or none (``none``: the receiver still
checks each immediate, the order and count, and detects a lapped ring), then
releases the batch. Plain WRITE: when the run is over (STATUS: not running,
nothing outstanding) every ring slot's final message is checked again, so one
that changed after its check, or never landed, is found.

With ``repeat`` > 1 the same host QPs run the check again: after a pass every
endpoint QP is closed through the CM, each host QP goes to RESET and back to INIT
(with a new first PSN) and is paired again; the endpoint must announce a new first
PSN. Each pass is checked on its own, and a failed pass ends the run. At the end,
:class:`RunResult` has the perftest-style :class:`host.figures.Figures` per QP
and in total.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from .backend import Backend, PortInfo
from .checker import Checker, Landed, Statistics
from .cm import CmClient
from .figures import Figures, figures_table
from .receive import DEFAULT_RING_LIMIT, Batch, QpRun, Receiver, RunConfig, default_ring

__all__ = ["DEFAULT_RING_LIMIT", "RunConfig", "QpRun", "RunResult", "Runner", "default_ring",
           "rate_divider", "qp_figures"]

_PROGRESS_EVERY = 0.25


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


def qp_figures(qp: QpRun) -> Figures:
    """The perftest-style figures of one QP from its landing times and final STATUS."""
    return Figures.of(qp.landed, qp.landed_bytes, qp.first_landed, qp.last_landed, qp.status)


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
            "receives": config.posted_receives, "started": config.start, "cm": config.cm,
            "listen": config.listen,
            "device": self.port.device if self.port else None,
            "host_ip": self.port.ip if self.port else None,
            **self.stats.summary(),
            "unchecked": sum(qp.unchecked for qp in self.qps),
            "missing": sum(qp.missing for qp in self.qps),
            "interrupted": self.interrupted, "error": self.error,
            "first_error": self.first_error,
            "check": config.check, "check_threads": config.check_threads,
            "figures": self.figures.to_json(),
            "qp": [_qp_json(qp) for qp in self.qps],
        }

    @property
    def figures(self) -> Figures:
        """The perftest-style figures of all QPs of this pass."""
        return Figures.total(qp_figures(qp) for qp in self.qps)

    def figures_lines(self) -> list[str]:
        """The figures table of this pass: one row per QP and the total."""
        rows = [(str(qp.index), qp_figures(qp)) for qp in self.qps]
        return figures_table([*rows, ("all", self.figures)])

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
        checked = ("checked" if config.sample == 1 else
                   f"landed, {stats.checked} checked ({config.check})")
        lines = [f"{'OK' if self.pass_ok else 'FAILED'}: {operation}, {stats.messages} of "
                 f"{config.count * len(self.qps)} messages {checked} ({config.size} bytes each), "
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
        lines += ["  " + line for line in self.figures_lines()]
        return "\n".join(lines)


def _qp_json(qp: QpRun) -> dict[str, object]:
    return {
        "index": qp.index, "host_qpn": qp.host.qpn,
        "endpoint_qpn": qp.endpoint.qpn if qp.endpoint else None,
        "host_psn": qp.host.psn, "endpoint_psn": qp.endpoint.psn if qp.endpoint else None,
        "path_mtu": qp.mtu.bytes if qp.mtu else None, "messages_ok": qp.ok,
        "errors": qp.errors, "unchecked": qp.unchecked, "missing": qp.missing,
        "first_error": qp.first_error,
        "status": dataclasses.asdict(qp.status) if qp.status else None,
        "disconnect": qp.disconnect,
        "figures": qp_figures(qp).to_json(),
    }


class Runner:
    """Runs ``config`` on ``backend`` (opened here, closed at the end) with the
    endpoint behind ``cm``. ``progress`` gets the live progress line about four
    times a second; ``notice`` gets one-off messages (pairings, warnings)."""

    def __init__(self, config: RunConfig, backend: Backend, cm: CmClient, *,
                 progress: Callable[[str], None] | None = None,
                 notice: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.receiver = Receiver(config, backend, cm, notice=notice, clock=clock)
        self._progress = progress
        self._clock = clock
        self.stats = Statistics(config.count * config.qps, clock=clock)
        self.checker = Checker(config.size, slots=config.slots, immediate=config.immediate,
                               threads=config.check_threads)
        self.earlier: list[RunResult] = []
        self._last_lap: dict[int, dict[int, bool | None]] = {}
        self._last_progress_line = 0.0

    @property
    def qps(self) -> list[QpRun]:
        return self.receiver.qps

    @property
    def port(self) -> PortInfo | None:
        return self.receiver.port

    @property
    def number(self) -> int:
        return self.receiver.number

    def run(self) -> RunResult:
        """Pair, start, check and close, ``repeat`` times over the same host QPs;
        raises :class:`HostError` on a failure that ends the run (the QPs are closed
        first), KeyboardInterrupt likewise. A pass that fails ends the run."""
        receiver = self.receiver
        try:
            while True:
                receiver.pair()
                self.stats.start()
                receiver.start()
                for batch in receiver.batches():
                    self._check(batch)
                    batch.release()
                    self._show_progress()
                self._finish()
                result = self.result()
                if not result.pass_ok or self.number == self.config.repeat:
                    return result
                self.earlier.append(result)
                receiver.reopen()
                self._last_lap = {}
                self.stats = Statistics(self.config.count * self.config.qps, clock=self._clock)
        finally:
            self.stats.stop()
            self.checker.close()
            receiver.close()

    def result(self, **fields: object) -> RunResult:
        """The result of the current pass (stopping its clock), with the earlier ones."""
        self.stats.stop()
        return RunResult(self.config, self.port, self.qps, self.stats, number=self.number,
                         earlier=list(self.earlier), **fields)  # type: ignore[arg-type]

    def _sampled(self, k: int) -> bool:
        sample = self.config.sample
        return sample != 0 and k % sample == 0

    def _check(self, batch: Batch) -> None:
        """Check ``batch`` as ``--check`` asks and count it."""
        qp = self.qps[batch.qp]
        if batch.faulty:
            self.stats.add_batch(batch.count, batch.nbytes, errors=batch.count, checked=0)
            return
        buffer = self.receiver.buffer(batch.qp)
        sample = self.config.sample
        if batch.length != self.config.size:
            ks = [batch.first] if self._sampled(batch.first) else []
            found = [self.checker.locate(batch.first, batch.view, batch.offset)] if ks else []
            mismatches = [mismatch for mismatch in found if mismatch is not None]
        elif sample == 1:
            ks = range(batch.first, batch.first + batch.count)
            mismatches = self.checker.check_messages(buffer, batch.offset, batch.first,
                                                     batch.count)
        elif sample == 0:
            ks, mismatches = [], []
        else:
            ks = range(-(-batch.first // sample) * sample, batch.first + batch.count, sample)
            mismatches = [mismatch for k in ks for mismatch in self.checker.check_messages(
                buffer, batch.offset + (k - batch.first) * batch.length, k, 1)]
        for mismatch in mismatches:
            qp.fail(str(mismatch))
        qp.ok += batch.count - len(mismatches)
        self.stats.add_batch(batch.count, batch.nbytes, errors=len(mismatches),
                             checked=len(ks))
        first_of_last_lap = self.config.count - self.config.slots
        if not self.config.uses_completions and batch.first + batch.count > first_of_last_lap:
            last_lap = self._last_lap.setdefault(batch.qp, {})
            bad = {mismatch.message for mismatch in mismatches}
            for k in ks:
                if k >= first_of_last_lap:
                    last_lap[k] = k not in bad

    def _finish(self) -> None:
        """Plain WRITE, after the run: check every slot's final message again."""
        config = self.config
        if config.uses_completions:
            return
        for qp in self.qps:
            assert qp.status is not None
            if config.size == 0:
                qp.ok = min(qp.status.messages, config.count)
                qp.missing = config.count - qp.ok
                self.stats.add_batch(qp.ok, 0)
                if qp.missing:
                    qp.note(f"the endpoint sent {qp.status.messages} of {config.count} "
                            "messages")
            else:
                self._final_ring_check(qp)

    def _final_ring_check(self, qp: QpRun) -> None:
        config = self.config
        first_of_last_lap = max(0, config.count - config.slots)
        if qp.next_k < first_of_last_lap:
            qp.unchecked += first_of_last_lap - qp.next_k
            qp.note(f"messages {qp.next_k}..{first_of_last_lap - 1} were never seen and are "
                    "overwritten now")
        buffer = self.receiver.buffer(qp.index)
        last_lap = self._last_lap.get(qp.index, {})
        marker_offset, marker_length = self.checker.marker()
        for _, k in self.checker.final_messages(config.count):
            base = self.checker.slot_offset(k)
            if k >= qp.next_k:
                if self._sampled(k):
                    mismatch = self.checker.locate(k, buffer[base:base + config.size], base)
                    text = None if mismatch is None else str(mismatch)
                else:
                    marker = buffer[base + marker_offset:base + marker_offset + marker_length]
                    text = (None if self.checker.landed(k, marker) is Landed.YES
                            else f"message {k} never landed")
                self.stats.add_batch(1, config.size, errors=int(text is not None),
                                     checked=int(self._sampled(k)))
                if text is None:
                    qp.ok += 1
                else:
                    qp.fail(text)
            elif last_lap.get(k) is True:
                mismatch = self.checker.locate(k, buffer[base:base + config.size], base)
                if mismatch is not None:
                    qp.ok -= 1
                    self.stats.errors += 1
                    qp.fail(f"{mismatch} (it changed after it was checked)")

    def _show_progress(self) -> None:
        now = self._clock()
        if self._progress and now - self._last_progress_line >= _PROGRESS_EVERY:
            self._last_progress_line = now
            self._progress(self.stats.progress_line())
