"""The end-of-run figures, as perftest prints them: bytes, messages, average bandwidth
(Gb/s and GB/s) and message rate (Mmsg/s) from the host's own landing times, first
message to last, with the endpoint's STATUS counters beside them.

The host times a message when it sees it land (its completion, or its ring slot's
last word), so a run of n messages spans n - 1 gaps: like perftest, the rate is
the bytes over the time from the first landing to the last (0 when all were seen
at once, e.g. a short plain-WRITE run found whole in one poll of the ring).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from .protocol import Status

__all__ = ["Figures", "figures_table"]


@dataclasses.dataclass(frozen=True)
class Figures:
    """What landed on one QP (or several, summed), between host times ``first`` and
    ``last`` (seconds, None when nothing landed), and the endpoint's counters."""
    messages: int = 0
    bytes: int = 0
    first: float | None = None
    last: float | None = None
    retransmitted: int = 0
    naks: int = 0
    timeouts: int = 0

    @classmethod
    def of(cls, messages: int, nbytes: int, first: float | None, last: float | None,
           status: Status | None) -> Figures:
        """One QP's figures; NAKs are every NAK the endpoint took (sequence, RNR,
        invalid request, access, operational)."""
        if status is None:
            return cls(messages, nbytes, first, last)
        naks = (status.naks_sequence + status.naks_rnr + status.naks_invalid
                + status.naks_access + status.naks_operational)
        return cls(messages, nbytes, first, last, status.retransmitted, naks, status.timeouts)

    @classmethod
    def total(cls, parts: Iterable[Figures]) -> Figures:
        """Sums, from the earliest first landing to the latest last one."""
        parts = list(parts)
        firsts = [part.first for part in parts if part.first is not None]
        lasts = [part.last for part in parts if part.last is not None]
        return cls(sum(part.messages for part in parts), sum(part.bytes for part in parts),
                   min(firsts, default=None), max(lasts, default=None),
                   sum(part.retransmitted for part in parts), sum(part.naks for part in parts),
                   sum(part.timeouts for part in parts))

    @classmethod
    def from_json(cls, fields: dict) -> Figures:
        """Back from :meth:`to_json` (the span as first 0 and last ``seconds``)."""
        if not fields.get("messages"):
            return cls()
        return cls(fields["messages"], fields["bytes"], 0.0, fields.get("seconds", 0.0),
                   fields.get("retransmitted", 0), fields.get("naks", 0),
                   fields.get("timeouts", 0))

    @property
    def seconds(self) -> float:
        if self.first is None or self.last is None:
            return 0.0
        return self.last - self.first

    @property
    def gbytes_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def gbits_per_s(self) -> float:
        return 8 * self.gbytes_per_s

    @property
    def mmsgs_per_s(self) -> float:
        return self.messages / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, int | float]:
        """The figures, the rates to six significant digits (a simulation's are small)."""
        return {"messages": self.messages, "bytes": self.bytes,
                "seconds": round(self.seconds, 9), "gbits_per_s": _significant(self.gbits_per_s),
                "gbytes_per_s": _significant(self.gbytes_per_s),
                "mmsgs_per_s": _significant(self.mmsgs_per_s),
                "retransmitted": self.retransmitted, "naks": self.naks,
                "timeouts": self.timeouts}


_HEADINGS = ("messages", "bytes", "seconds", "Gb/s", "GB/s", "Mmsg/s", "retransmitted", "NAKs",
             "timeouts")


def _significant(value: float) -> float:
    return float(f"{value:.6g}")


def _rate(value: float) -> str:
    """``value`` to four significant digits, without an exponent."""
    if value <= 0:
        return "0"
    return f"{value:.{max(0, 3 - math.floor(math.log10(value)))}f}"


def figures_table(rows: Sequence[tuple[str, Figures]], *, title: str = "QP") -> list[str]:
    """A right-aligned text table, one row per (label, figures); rates to four
    significant digits (a board's 97.68 Gb/s and a simulation's 0.0008798 alike)."""
    cells = [[label, str(row.messages), str(row.bytes), f"{row.seconds:.6f}",
              _rate(row.gbits_per_s), _rate(row.gbytes_per_s), _rate(row.mmsgs_per_s),
              str(row.retransmitted), str(row.naks), str(row.timeouts)] for label, row in rows]
    headings = [title, *_HEADINGS]
    widths = [max(len(line[column]) for line in [headings, *cells])
              for column in range(len(headings))]
    return ["  ".join(cell.rjust(width) if column else cell.ljust(width)
                      for column, (cell, width) in enumerate(zip(line, widths, strict=True)))
            for line in [headings, *cells]]
