"""The Internet checksum (RFC 1071) as logic: one's-complement sums of 16-bit words."""

from amaranth import *

__all__ = ["ones_complement_add", "ones_complement_fold", "word_sum"]


def ones_complement_add(a, b):
    """16-bit one's-complement sum of two 16-bit values (end-around carry)."""
    total = Value.cast(a) + Value.cast(b)
    return (total[:16] + total[16])[:16]


def word_sum(value):
    """The plain (wide) sum of the 16-bit words of ``value`` (a header), as a balanced tree
    of adders: carry chains only, no end-around carry; :func:`ones_complement_fold`
    turns it into their one's-complement sum."""
    value = Value.cast(value)
    if len(value) == 0 or len(value) % 16:
        raise ValueError(f"{len(value)} bits are not a whole number of 16-bit words")
    words = [value.word_select(index, 16) for index in range(len(value) // 16)]
    while len(words) > 1:
        words = [words[index] + words[index + 1] if index + 1 < len(words)
                 else words[index] for index in range(0, len(words), 2)]
    return words[0]


def ones_complement_fold(total):
    """16-bit one's-complement sum of the 16-bit words whose plain sum is ``total``
    (at most 32 bits wide)."""
    total = Value.cast(total)
    if len(total) > 32:
        raise ValueError(f"A sum of {len(total)} bits does not fold in one step")
    return ones_complement_add(total[:16], total[16:])
