"""The event fragment of the example data source (``gateware/examples/event_source.py``),
in plain Python: what the gateware sends, what the host reader checks, and the tests'
golden model.

A fragment is ``size`` bytes (a multiple of 8, at least :data:`HEADER_BYTES`) of
little-endian 64-bit words; byte 0 is the first byte on the wire and the lowest
address in the ring slot:

====== ======== =============================================================
word   bytes    field
====== ======== =============================================================
0      0-3      magic, :data:`MAGIC` (the bytes ``EVT1``)
0      4-7      the fragment's size in bytes (u32)
1      8-15     event number (u64; the example source counts it in 32 bits)
2      16-23    timestamp: the source's clock cycle count when its request was offered
3 …    24 …     payload word ``j`` = ``(event mod 2^32) << 32 | j`` (``j``: word index)
====== ======== =============================================================
"""

from __future__ import annotations

import dataclasses
import struct

__all__ = ["MAGIC", "HEADER", "HEADER_BYTES", "Fragment", "FragmentError", "fragment",
           "check_size", "parse", "check"]

#: The first 32-bit word of every fragment: b"EVT1" read as a little-endian u32.
MAGIC = int.from_bytes(b"EVT1", "little")

#: magic, size, event number, timestamp.
HEADER = struct.Struct("<IIQQ")
#: Bytes of the header.
HEADER_BYTES = HEADER.size
_WORD_BYTES = 8


@dataclasses.dataclass(frozen=True)
class Fragment:
    """A fragment's header fields."""
    event: int
    timestamp: int
    size: int


class FragmentError(ValueError):
    """A fragment that is not what the format says; ``offset`` is the first bad byte."""

    def __init__(self, text: str, offset: int):
        super().__init__(f"{text} (byte {offset})")
        self.offset = offset


def check_size(size: int) -> int:
    """``size`` when it is a fragment size (a multiple of 8, header included, under
    2^31 bytes), else ``ValueError``."""
    if (isinstance(size, bool) or not isinstance(size, int) or size < HEADER_BYTES
            or size % _WORD_BYTES or size >= 1 << 31):
        raise ValueError(f"Fragment size must be a multiple of 8 bytes from {HEADER_BYTES} "
                         f"to 2^31 - 8, not {size!r}")
    return size


def _payload(event: int, size: int) -> bytes:
    first = HEADER_BYTES // _WORD_BYTES
    high = (event & 0xFFFF_FFFF) << 32
    words = size // _WORD_BYTES
    return struct.pack(f"<{words - first}Q", *(high | j for j in range(first, words)))


def fragment(event: int, timestamp: int, size: int) -> bytes:
    """The ``size`` bytes of event ``event`` made at ``timestamp``."""
    check_size(size)
    return HEADER.pack(MAGIC, size, event, timestamp) + _payload(event, size)


def parse(data: bytes | memoryview) -> Fragment:
    """The header of a fragment; ``FragmentError`` when the magic or the size is wrong."""
    if len(data) < HEADER_BYTES:
        raise FragmentError(f"{len(data)} bytes, shorter than the header", len(data))
    magic, size, event, timestamp = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FragmentError(f"magic {magic:#010x}, expected {MAGIC:#010x}", 0)
    if size != len(data):
        raise FragmentError(f"size field {size}, the fragment has {len(data)} bytes", 4)
    return Fragment(event, timestamp, size)


def check(data: bytes | memoryview, event: int) -> Fragment:
    """The header of ``data``, after checking that it is event ``event``'s fragment byte
    for byte (its timestamp is what the header says); ``FragmentError`` names the first
    byte that differs."""
    header = parse(data)
    if header.event != event:
        raise FragmentError(f"event {header.event}, expected {event}", 8)
    expected = fragment(event, header.timestamp, header.size)
    got = bytes(data)
    if got != expected:
        offset = next(i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b)
        raise FragmentError(f"payload {got[offset]:#04x}, expected {expected[offset]:#04x}",
                            offset)
    return header
