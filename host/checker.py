"""The data checker: every byte of every generator message, as it lands.

Message k of a run is ``protocol.generator_payload(k, length)``: 64-bit
little-endian words, word j = (k << 32) | j, cut to the length. A WRITE run puts
message k in slot ``k mod slots`` of the host's buffer ring (slot s at byte
``s * length``); a SEND run puts each message in the next posted receive buffer;
with immediate data, the immediate of message k is k.

Messages are compared whole (bytes equality); only a bad message is searched for
its first differing byte. :class:`Statistics` counts what was checked for the
live progress line and the final summary.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
import time
from collections.abc import Callable

from .protocol import generator_immediate

__all__ = ["Expected", "Mismatch", "Landed", "Checker", "first_difference", "Statistics"]

_WORD = 8


class Expected:
    """The expected payloads of one message length, built from a cached template
    (word indices j) with k written into the upper half of every word."""

    def __init__(self, length: int):
        if length < 0:
            raise ValueError(f"message length must be >= 0, not {length}")
        self.length = length
        self._words = -(-length // _WORD)
        self._template = b"".join(struct.pack("<Q", j) for j in range(self._words))

    def __call__(self, k: int) -> bytes:
        """Message ``k``, exactly as ``protocol.generator_payload(k, length)``."""
        message = bytearray(self._template)
        upper = (k & 0xFFFF_FFFF).to_bytes(4, "little")
        for lane, value in enumerate(upper):
            message[4 + lane::_WORD] = bytes((value,)) * self._words
        del message[self.length:]
        return bytes(message)


def first_difference(expected: bytes, got: bytes) -> int | None:
    """The offset of the first byte where ``got`` differs from ``expected`` (the
    shorter length when one is a prefix of the other), None when equal."""
    if expected == got:
        return None
    for offset, (want, have) in enumerate(zip(expected, got, strict=False)):
        if want != have:
            return offset
    return min(len(expected), len(got))


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """The first thing wrong with one message.

    ``what`` is ``"byte"`` (``offset`` into the message; ``expected`` or ``got``
    None past the end of a short or long message), ``"immediate"`` or
    ``"overwritten"`` (a WRITE ring slot was reused before it was checked).
    ``buffer_offset`` is where that byte sits in the host's registered buffer.
    """
    message: int
    what: str = "byte"
    offset: int | None = None
    expected: int | None = None
    got: int | None = None
    buffer_offset: int | None = None
    length: int | None = None

    def __str__(self) -> str:
        if self.what == "immediate":
            got = "none" if self.got is None else f"0x{self.got:08x}"
            return f"message {self.message}: immediate expected 0x{self.expected:08x} got {got}"
        if self.what == "overwritten":
            return (f"message {self.message} was overwritten by message {self.got} before it "
                    "was checked")
        text = f"message {self.message}, byte offset {self.offset}: "
        if self.expected is None:
            text += (f"expected the end of the message got 0x{self.got:02x} (it has "
                     f"{self.length} bytes)")
        elif self.got is None:
            text += (f"expected 0x{self.expected:02x} got nothing (it has only {self.length} "
                     "bytes)")
        else:
            text += f"expected 0x{self.expected:02x} got 0x{self.got:02x}"
        if self.buffer_offset is not None:
            text += f" (buffer offset {self.buffer_offset:#x})"
        return text


class Landed(enum.Enum):
    """What a WRITE ring slot shows when polled for message k."""
    NOT_YET = "not yet"
    YES = "yes"
    LAPPED = "lapped"           # a later message of the same slot is already there


class Checker:
    """Checks messages of ``length`` bytes of one QP's run.

    ``slots`` is the number of WRITE ring slots (0: message k at ``k * length``,
    no reuse); ``immediate`` asks for immediate data == k on every message.
    """

    def __init__(self, length: int, *, slots: int = 0, immediate: bool = False):
        if slots < 0:
            raise ValueError(f"slots must be >= 0, not {slots}")
        self.length = length
        self.slots = slots
        self.immediate = immediate
        self.expected = Expected(length)

    def slot_offset(self, k: int) -> int:
        """Byte offset of WRITE message ``k`` in the host buffer."""
        return (k % self.slots if self.slots else k) * self.length

    def check(self, k: int, data: bytes, *, imm: int | None = None,
              buffer_offset: int | None = None) -> Mismatch | None:
        """Message ``k`` as received (``data``; ``imm`` its immediate data), or the
        first thing wrong with it. ``buffer_offset`` is where ``data`` starts in the
        host buffer, for the report."""
        if self.immediate and imm != generator_immediate(k):
            return Mismatch(k, "immediate", expected=generator_immediate(k), got=imm)
        expected = self.expected(k)
        offset = first_difference(expected, data)
        if offset is None:
            return None
        return Mismatch(
            k, offset=offset,
            expected=expected[offset] if offset < len(expected) else None,
            got=data[offset] if offset < len(data) else None,
            buffer_offset=None if buffer_offset is None else buffer_offset + offset,
            length=len(data))

    def marker(self) -> tuple[int, int]:
        """(offset, length) inside a slot of the bytes that show a WRITE message has
        landed: its last whole word (it names k and j), the whole message when
        shorter than a word. Fill the buffer with 0xFF first: no message has
        j = 0xFFFFFFFF."""
        if self.length < _WORD:
            return 0, self.length
        return (self.length // _WORD - 1) * _WORD, _WORD

    def landed(self, k: int, marker: bytes) -> Landed:
        """Whether the slot of message ``k``, whose marker bytes are ``marker``,
        holds message k (then check it whole), an older message or nothing yet, or
        a later message of the same slot."""
        if self.length < _WORD:
            return Landed.YES if marker == self.expected(k) else Landed.NOT_YET
        word = int.from_bytes(marker, "little")
        if word & 0xFFFF_FFFF != self.length // _WORD - 1:
            return Landed.NOT_YET
        seen = word >> 32
        k &= 0xFFFF_FFFF
        if seen == k:
            return Landed.YES
        if self.slots and seen > k and (seen - k) % self.slots == 0:
            return Landed.LAPPED
        return Landed.NOT_YET

    def lapping(self, k: int, marker: bytes) -> int:
        """The message that lapped message ``k`` (after :meth:`landed` said LAPPED)."""
        return int.from_bytes(marker, "little") >> 32

    def final_messages(self, count: int) -> list[tuple[int, int]]:
        """(slot, k) of the message each WRITE slot holds after a run of ``count``."""
        if not self.slots:
            return [(k, k) for k in range(count)]
        return [(slot, slot + (count - 1 - slot) // self.slots * self.slots)
                for slot in range(min(self.slots, count))]


class Statistics:
    """Messages, bytes and errors checked since :meth:`start`, and the rate."""

    def __init__(self, total: int | None = None, *,
                 clock: Callable[[], float] = time.monotonic):
        self.total = total
        self.messages = 0
        self.bytes = 0
        self.errors = 0
        self._clock = clock
        self._started: float | None = None
        self._stopped: float | None = None

    def start(self) -> None:
        self._started = self._clock()
        self._stopped = None

    def stop(self) -> None:
        if self._started is not None and self._stopped is None:
            self._stopped = self._clock()

    def add(self, nbytes: int, *, ok: bool = True) -> None:
        """One message of ``nbytes`` checked; ``ok`` False counts an error too."""
        self.messages += 1
        self.bytes += nbytes
        if not ok:
            self.errors += 1

    @property
    def elapsed(self) -> float:
        """Seconds since :meth:`start` (until :meth:`stop`)."""
        if self._started is None:
            return 0.0
        end = self._clock() if self._stopped is None else self._stopped
        return end - self._started

    @property
    def gbps(self) -> float:
        """Checked payload in GB/s (10**9 bytes per second)."""
        elapsed = self.elapsed
        return self.bytes / elapsed / 1e9 if elapsed > 0 else 0.0

    def progress_line(self) -> str:
        """One line for the terminal, e.g. ``1200/5000 messages, 4.9 MB, 1.23 GB/s, 0 errors``."""
        done = f"{self.messages}/{self.total}" if self.total is not None else f"{self.messages}"
        return (f"{done} messages, {self.bytes / 1e6:.1f} MB, {self.gbps:.2f} GB/s, "
                f"{self.errors} error{'' if self.errors == 1 else 's'}")

    def summary(self) -> dict[str, int | float]:
        """The final numbers, for ``--json``."""
        return {"messages": self.messages, "bytes": self.bytes, "errors": self.errors,
                "elapsed_s": round(self.elapsed, 6), "gbytes_per_s": round(self.gbps, 6)}
