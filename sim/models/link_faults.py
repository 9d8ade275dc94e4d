"""Faults on a simulated Ethernet link: frames dropped, duplicated, reordered or
corrupted at set rates, in one direction."""

from __future__ import annotations

import dataclasses
import random

__all__ = ["LinkFaults", "parse_faults"]

#: Ethernet, IPv4 and UDP headers in front of a RoCEv2 packet's BTH.
_ROCEV2_PAYLOAD_OFFSET = 14 + 20 + 8
_ROCEV2_PORT = 4791


def _is_rocev2(frame: bytes) -> bool:
    return (len(frame) > _ROCEV2_PAYLOAD_OFFSET and frame[12:14] == b"\x08\x00"
            and frame[23] == 17 and int.from_bytes(frame[36:38], "big") == _ROCEV2_PORT)


@dataclasses.dataclass
class LinkFaults:
    """Each frame is dropped with probability ``drop``, else corrupted with
    ``corrupt``, duplicated with ``duplicate``, or held back and sent after the
    next frame with ``reorder``.

    Corruption is what a receiver can see: a RoCEv2 frame gets one bit flipped
    after its UDP header (the ICRC catches it); any other frame is marked as
    having a bad FCS (:meth:`apply` returns it with ``bad_fcs`` set), which a MAC
    drops before software sees it.
    """
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    seed: int = 0
    counts: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(
        ("frames", "dropped", "duplicated", "reordered", "corrupted"), 0))

    def __post_init__(self) -> None:
        for name in ("drop", "duplicate", "reorder", "corrupt"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"the {name} rate must lie in 0..1, not {rate}")
        self._random = random.Random(self.seed)
        self._held: bytes | None = None

    @property
    def active(self) -> bool:
        return any((self.drop, self.duplicate, self.reorder, self.corrupt))

    def apply(self, frame: bytes) -> list[tuple[bytes, bool]]:
        """The frames to deliver for ``frame``, in order, each with its bad-FCS flag."""
        rng, counts = self._random, self.counts
        counts["frames"] += 1
        out: list[tuple[bytes, bool]] = []
        if rng.random() < self.drop:
            counts["dropped"] += 1
        elif rng.random() < self.corrupt:
            counts["corrupted"] += 1
            if _is_rocev2(frame):
                data = bytearray(frame)
                data[rng.randrange(_ROCEV2_PAYLOAD_OFFSET, len(data))] ^= 1 << rng.randrange(8)
                out.append((bytes(data), False))
            else:
                out.append((frame, True))
        elif rng.random() < self.reorder and self._held is None:
            counts["reordered"] += 1
            self._held = frame
            return out
        else:
            out.append((frame, False))
            if rng.random() < self.duplicate:
                counts["duplicated"] += 1
                out.append((frame, False))
        if self._held is not None:
            out.append((self._held, False))
            self._held = None
        return out

    def flush(self) -> list[tuple[bytes, bool]]:
        """A frame still held back for reordering."""
        held, self._held = self._held, None
        return [] if held is None else [(held, False)]


def parse_faults(text: str, *, seed: int = 0) -> LinkFaults:
    """``"drop=0.02,corrupt=0.001"`` → LinkFaults (empty text: none)."""
    rates: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in ("drop", "duplicate", "reorder", "corrupt") or not value:
            raise ValueError(f"not a fault rate: {item!r} (use drop=, duplicate=, reorder=, "
                             "corrupt= with a probability)")
        rates[name] = float(value)
    return LinkFaults(**rates, seed=seed)
