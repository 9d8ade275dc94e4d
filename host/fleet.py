"""Many endpoints at once: one :class:`host.run.Runner` per endpoint, each with its
own verbs backend (device context, CQ, QPs, buffers) and CM socket, each in its
own thread; the checker's numpy passes release the GIL, so the threads overlap.

:func:`run_endpoints` runs them in parallel, shows one progress line for all
(per endpoint and in total) and returns each endpoint's outcome; a failure of one
endpoint (a :class:`HostError`) ends only that endpoint's run. Ctrl-C stops every
run; each closes its QPs.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence

from .errors import HostError
from .figures import Figures, figures_table
from .run import Runner, RunResult

__all__ = ["EndpointOutcome", "run_endpoints", "fleet_json", "fleet_text", "parse_endpoints"]

_PROGRESS_EVERY = 0.25


def parse_endpoints(text: str) -> list[str]:
    """The endpoint addresses of an endpoints file: one per line, ``#`` comments."""
    return [line.split("#", 1)[0].strip() for line in text.splitlines()
            if line.split("#", 1)[0].strip()]


@dataclasses.dataclass
class EndpointOutcome:
    """What one endpoint's run gave: its result (None if it never got far enough),
    the error that ended it, whether Ctrl-C stopped it."""
    endpoint: str
    runner: Runner
    result: RunResult | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.result is not None and self.result.ok


def run_endpoints(runners: Sequence[tuple[str, Runner]], *,
                  progress: Callable[[str], None] | None = None) -> list[EndpointOutcome]:
    """Run every ``(endpoint, runner)`` in its own thread until all end."""
    outcomes = [EndpointOutcome(endpoint, runner) for endpoint, runner in runners]
    threads = [threading.Thread(target=_run_one, args=(outcome,), daemon=True,
                                name=f"endpoint {outcome.endpoint}") for outcome in outcomes]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(_PROGRESS_EVERY)
                if progress:
                    progress(_progress_line(outcomes))
    except KeyboardInterrupt:
        for outcome in outcomes:
            outcome.runner.receiver.stop.set()
        for thread in threads:
            thread.join()
        raise
    return outcomes


def _run_one(outcome: EndpointOutcome) -> None:
    runner = outcome.runner
    try:
        outcome.result = runner.run()
    except KeyboardInterrupt:
        outcome.result = runner.result(interrupted=True)
    except HostError as error:
        outcome.error = str(error)
        outcome.result = runner.result(error=str(error))


def _progress_line(outcomes: Sequence[EndpointOutcome]) -> str:
    parts, messages, nbytes, now = [], 0, 0, 0.0
    for outcome in outcomes:
        stats = outcome.runner.stats
        rate = stats.current_gbps()
        parts.append(f"{outcome.endpoint} {stats.messages} msgs {rate:.2f} GB/s")
        messages += stats.messages
        nbytes += stats.bytes
        now += rate
    return " | ".join([*parts, f"total {messages} msgs {nbytes / 1e6:.1f} MB {now:.2f} GB/s"])


def _figures(outcome: EndpointOutcome) -> Figures:
    return outcome.result.figures if outcome.result is not None else Figures()


def fleet_text(outcomes: Sequence[EndpointOutcome]) -> str:
    """Each endpoint's summary, then a table of the endpoints and their total."""
    lines = []
    for outcome in outcomes:
        lines.append(f"endpoint {outcome.endpoint}:")
        if outcome.result is not None:
            lines += ["  " + line for line in outcome.result.summary_text().splitlines()]
        if outcome.error:
            lines.append(f"  error: {outcome.error}")
    total = Figures.total(_figures(outcome) for outcome in outcomes)
    rows = [(outcome.endpoint, _figures(outcome)) for outcome in outcomes]
    lines += figures_table([*rows, ("all", total)], title="endpoint")
    ok = all(outcome.ok for outcome in outcomes)
    lines.append(f"{'OK' if ok else 'FAILED'}: {sum(o.ok for o in outcomes)} of "
                 f"{len(outcomes)} endpoints ok")
    return "\n".join(lines)


def fleet_json(outcomes: Sequence[EndpointOutcome]) -> dict[str, object]:
    """One object: ``ok`` for all, the total figures, and each endpoint's run."""
    total = Figures.total(_figures(outcome) for outcome in outcomes)
    return {
        "ok": all(outcome.ok for outcome in outcomes),
        "figures": total.to_json(),
        "endpoints": [{"endpoint": outcome.endpoint, "error": outcome.error,
                       **(outcome.result.to_json() if outcome.result else {"ok": False})}
                      for outcome in outcomes],
    }
