"""The Internet checksum (RFC 1071) as logic: one's-complement sums of 16-bit words."""

from amaranth import *

__all__ = ["ones_complement_add", "ones_complement_sum", "header_checksum"]


def ones_complement_add(a, b):
    """16-bit one's-complement sum of two 16-bit values (end-around carry)."""
    total = Value.cast(a) + Value.cast(b)
    return (total[:16] + total[16])[:16]


def ones_complement_sum(words):
    """One's-complement sum of 16-bit values, as a balanced tree."""
    words = [Value.cast(word) for word in words]
    if not words:
        raise ValueError("Nothing to sum")
    while len(words) > 1:
        words = [ones_complement_add(*words[index:index + 2]) if index + 1 < len(words)
                 else words[index] for index in range(0, len(words), 2)]
    return words[0]


def header_checksum(header_bits):
    """Checksum field for a header given as its big-endian integer with the field at zero."""
    header_bits = Value.cast(header_bits)
    return ~ones_complement_sum(header_bits.word_select(index, 16)
                                for index in range(len(header_bits) // 16))[:16]
