"""The data checker: every byte of every generator message, at line rate.

Message k of a run is ``protocol.generator_payload(k, length)``: 64-bit
little-endian words, word j = (k << 32) | j, cut to the length. A WRITE run puts
message k in slot ``k mod slots`` of the host's buffer ring (slot s at byte
``s * length``); a SEND run puts each message in the next posted receive buffer;
with immediate data, the immediate of message k is k.

:meth:`Checker.check_messages` checks consecutive messages that lie back to back
in the registered buffer without copying it: the buffer is viewed as ``<u8``
words, a chunk of about a megabyte (whole messages, or part of one) minus a
cached chunk of expected words for k = 0 (``(i << 32) | j``) must equal the
constant ``k << 32`` of the chunk's first message (mod 2**64, which also drops
the bits of k above 32, as the generator does). That is one pass over the data
and two over a scratch chunk in cache; numpy releases the GIL, so ``threads``
checker threads split a batch over disjoint messages. Only a message that
fails is searched for its first differing byte. :class:`Statistics` counts what
was checked for the live progress line and the final summary.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .protocol import generator_immediate

__all__ = ["Expected", "Mismatch", "Landed", "Checker", "first_difference", "Statistics",
           "CHUNK_BYTES"]

_WORD = 8
_MASK = (1 << 64) - 1
#: Bytes per vectorised pass: a chunk and its scratch stay in the core's cache.
CHUNK_BYTES = 1 << 20
#: A batch is split over threads only in parts of at least this many bytes.
_MIN_THREAD_BYTES = 4 << 20


class Expected:
    """The expected payloads of one message length: the word indices j (a cached
    ``<u8`` array) plus ``k << 32``, as bytes cut to the length."""

    def __init__(self, length: int):
        if length < 0:
            raise ValueError(f"message length must be >= 0, not {length}")
        self.length = length
        self.words = np.arange(-(-length // _WORD), dtype="<u8")

    def __call__(self, k: int) -> bytes:
        """Message ``k``, exactly as ``protocol.generator_payload(k, length)``."""
        return (self.words + np.uint64(k << 32 & _MASK)).tobytes()[:self.length]


def first_difference(expected: bytes, got: bytes) -> int | None:
    """The offset of the first byte where ``got`` differs from ``expected`` (the
    shorter length when one is a prefix of the other), None when equal."""
    common = min(len(expected), len(got))
    want = np.frombuffer(expected, np.uint8, common)
    have = np.frombuffer(got, np.uint8, common)
    differs = np.flatnonzero(want != have)
    if differs.size:
        return int(differs[0])
    return None if len(expected) == len(got) else common


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
    no reuse); ``immediate`` asks for immediate data == k on every message;
    ``threads`` checker threads share a large batch (:meth:`close` stops them).
    """

    def __init__(self, length: int, *, slots: int = 0, immediate: bool = False,
                 threads: int = 1):
        if slots < 0:
            raise ValueError(f"slots must be >= 0, not {slots}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, not {threads}")
        self.length = length
        self.slots = slots
        self.immediate = immediate
        self.threads = threads
        self.expected = Expected(length)
        words = length // _WORD
        self._rows = max(1, CHUNK_BYTES // length) if length >= _WORD else 0
        rows = np.arange(self._rows, dtype="<u8") << np.uint64(32)
        #: Expected words of ``rows`` back-to-back messages k = 0, 1, ... (one chunk),
        #: for whole-word messages smaller than a chunk.
        self._first_chunk = (rows[:, None] + self.expected.words[None, :words]).ravel() \
            if length % _WORD == 0 and length <= CHUNK_BYTES else None
        self._pool = ThreadPoolExecutor(threads, "checker") if threads > 1 else None
        self._scratch = threading.local()

    def close(self) -> None:
        """Stop the checker threads."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def slot_offset(self, k: int) -> int:
        """Byte offset of WRITE message ``k`` in the host buffer."""
        return (k % self.slots if self.slots else k) * self.length

    def check(self, k: int, data: bytes | memoryview, *, imm: int | None = None,
              buffer_offset: int | None = None) -> Mismatch | None:
        """Message ``k`` as received (``data``; ``imm`` its immediate data), or the
        first thing wrong with it. ``buffer_offset`` is where ``data`` starts in the
        host buffer, for the report."""
        if self.immediate and imm != generator_immediate(k):
            return Mismatch(k, "immediate", expected=generator_immediate(k), got=imm)
        if len(data) == self.length and self.length % _WORD == 0:
            words = np.frombuffer(data, "<u8")
            if not self._bad_words(words, k, 1):
                return None
        return self.locate(k, data, buffer_offset)

    def locate(self, k: int, data: bytes | memoryview,
               buffer_offset: int | None = None) -> Mismatch | None:
        """The first differing byte of message ``k`` (``data``), None if it is right."""
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

    def check_messages(self, buffer: memoryview, offset: int, first_k: int,
                       count: int) -> list[Mismatch]:
        """Messages ``first_k .. first_k + count - 1`` lying back to back at byte
        ``offset`` of ``buffer`` (the registered buffer, not copied): what is wrong
        with each bad one, in order (empty when all are right)."""
        if count <= 0 or self.length == 0:
            return []
        if self.length % _WORD:
            found = (self.locate(first_k + i, buffer[offset + i * self.length:
                                                     offset + (i + 1) * self.length],
                                 offset + i * self.length) for i in range(count))
            return [mismatch for mismatch in found if mismatch is not None]
        words = np.frombuffer(buffer, "<u8", count * self.length // _WORD, offset)
        parts = self._parts(count)
        if self._pool is None or len(parts) == 1:
            bad = self._bad_words(words, first_k, count)
        else:
            per_word = self.length // _WORD
            jobs = [self._pool.submit(self._bad_words, words[lo * per_word:hi * per_word],
                                      first_k + lo, hi - lo) for lo, hi in parts]
            bad = [lo + i for (lo, _), job in zip(parts, jobs, strict=True)
                   for i in job.result()]
        return [self.locate(first_k + i, buffer[offset + i * self.length:
                                                offset + (i + 1) * self.length],
                            offset + i * self.length) for i in bad]

    def _parts(self, count: int) -> list[tuple[int, int]]:
        """Split ``count`` messages into at most ``threads`` runs of whole messages,
        each at least :data:`_MIN_THREAD_BYTES` long."""
        parts = max(1, min(self.threads, count * self.length // _MIN_THREAD_BYTES, count))
        edges = [count * part // parts for part in range(parts + 1)]
        return list(zip(edges, edges[1:], strict=False))

    def _bad_words(self, words: np.ndarray, first_k: int, count: int) -> list[int]:
        """Indices (from 0) of the bad ones among ``count`` whole-word messages
        ``first_k ..`` in ``words``; runs in any thread."""
        per_word = self.length // _WORD
        scratch = getattr(self._scratch, "words", None)
        if scratch is None:
            size = min(CHUNK_BYTES // _WORD, max(per_word, self._rows * per_word))
            scratch = self._scratch.words = np.empty(size, "<u8")
            self._scratch.equal = np.empty(size, np.bool_)
        equal = self._scratch.equal
        bad: list[int] = []
        if self._first_chunk is not None:
            rows = self._rows
            for row in range(0, count, rows):
                n = min(rows, count - row) * per_word
                chunk = words[row * per_word:row * per_word + n]
                k = np.uint64((first_k + row) << 32 & _MASK)
                np.subtract(chunk, self._first_chunk[:n], out=scratch[:n])
                np.equal(scratch[:n], k, out=equal[:n])
                if not equal[:n].all():
                    rows_ok = equal[:n].reshape(-1, per_word).all(axis=1)
                    bad += [row + int(i) for i in np.flatnonzero(~rows_ok)]
            return bad
        template = self.expected.words
        step = scratch.size
        for i in range(count):
            message = words[i * per_word:(i + 1) * per_word]
            k = np.uint64((first_k + i) << 32 & _MASK)
            for lo in range(0, per_word, step):
                hi = min(per_word, lo + step)
                np.subtract(message[lo:hi], template[lo:hi], out=scratch[:hi - lo])
                np.equal(scratch[:hi - lo], k, out=equal[:hi - lo])
                if not equal[:hi - lo].all():
                    bad.append(i)
                    break
        return bad

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
            return Landed.YES if bytes(marker) == self.expected(k) else Landed.NOT_YET
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
    """Messages, bytes and errors since :meth:`start` (``checked``: how many of the
    messages were compared byte by byte), the average rate and the current rate."""

    def __init__(self, total: int | None = None, *,
                 clock: Callable[[], float] = time.monotonic):
        self.total = total
        self.messages = 0
        self.bytes = 0
        self.errors = 0
        self.checked = 0
        self._clock = clock
        self._started: float | None = None
        self._stopped: float | None = None
        self._sample: tuple[float, int] | None = None

    def start(self) -> None:
        self._started = self._clock()
        self._stopped = None
        self._sample = (self._started, self.bytes)

    def stop(self) -> None:
        if self._started is not None and self._stopped is None:
            self._stopped = self._clock()

    def add(self, nbytes: int, *, ok: bool = True) -> None:
        """One message of ``nbytes`` checked; ``ok`` False counts an error too."""
        self.add_batch(1, nbytes, errors=0 if ok else 1)

    def add_batch(self, messages: int, nbytes: int, *, errors: int = 0,
                  checked: int | None = None) -> None:
        """``messages`` messages of ``nbytes`` in all, ``errors`` of them wrong,
        ``checked`` (default all) of them compared byte by byte."""
        self.messages += messages
        self.bytes += nbytes
        self.errors += errors
        self.checked += messages if checked is None else checked

    @property
    def elapsed(self) -> float:
        """Seconds since :meth:`start` (until :meth:`stop`)."""
        if self._started is None:
            return 0.0
        end = self._clock() if self._stopped is None else self._stopped
        return end - self._started

    @property
    def gbps(self) -> float:
        """Payload in GB/s (10**9 bytes per second) since :meth:`start`."""
        elapsed = self.elapsed
        return self.bytes / elapsed / 1e9 if elapsed > 0 else 0.0

    def current_gbps(self) -> float:
        """Payload in GB/s since the previous call (or :meth:`start`)."""
        now = self._clock()
        if self._sample is None:
            self._sample = (now, self.bytes)
            return 0.0
        then, nbytes = self._sample
        self._sample = (now, self.bytes)
        return (self.bytes - nbytes) / (now - then) / 1e9 if now > then else 0.0

    def progress_line(self) -> str:
        """One line for the terminal, e.g. ``1200/5000 messages, 4.9 MB, 1.31 GB/s now,
        1.23 GB/s average, 0 errors`` (the current rate since the previous line)."""
        done = f"{self.messages}/{self.total}" if self.total is not None else f"{self.messages}"
        return (f"{done} messages, {self.bytes / 1e6:.1f} MB, {self.current_gbps():.2f} GB/s "
                f"now, {self.gbps:.2f} GB/s average, "
                f"{self.errors} error{'' if self.errors == 1 else 's'}")

    def summary(self) -> dict[str, int | float]:
        """The final numbers, for ``--json``."""
        return {"messages": self.messages, "bytes": self.bytes, "errors": self.errors,
                "checked": self.checked, "elapsed_s": round(self.elapsed, 6),
                "gbytes_per_s": round(self.gbps, 6)}
