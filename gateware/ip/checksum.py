"""The Internet checksum (RFC 1071) as logic: one's-complement sums of 16-bit words."""

from amaranth import *

from ..arith import sum_of_three

__all__ = ["header_words", "ones_complement_add", "ones_complement_fold", "folds_to_ones",
           "word_sum"]


def ones_complement_add(a, b):
    """16-bit one's-complement sum of two values of at most 16 bits (end-around carry).

    The sum and the sum plus one are worked out side by side, and the carry out of the
    first chooses: one carry chain and a multiplexer, not two chains in a row. The sum
    plus one is one adder too: a one below each operand carries into the sum's bits.
    """
    a, b = Value.cast(a), Value.cast(b)
    if len(a) > 16 or len(b) > 16:
        raise ValueError(f"Operands of {len(a)} and {len(b)} bits are wider than 16")
    a, b = Cat(a, C(0, 16 - len(a))), Cat(b, C(0, 16 - len(b)))
    total = a + b
    more = (Cat(C(1, 1), a) + Cat(C(1, 1), b))[1:]
    return Mux(total[16], more[:16], total[:16])


def word_sum(value, *terms):
    """The plain (wide) sum of the 16-bit words of ``value`` (a header) and of ``terms``
    (16-bit words, or sums of them), as a tree of three-term adders (:func:`.sum_of_three`,
    one carry chain each): carry chains only, no end-around carry, one chain per three
    times as many words; :func:`ones_complement_fold` turns it into their
    one's-complement sum."""
    value = Value.cast(value)
    if len(value) % 16:
        raise ValueError(f"{len(value)} bits are not a whole number of 16-bit words")
    words = [value.word_select(index, 16) for index in range(len(value) // 16)]
    words += [Value.cast(term) for term in terms]
    if not words:
        raise ValueError("No words to sum")
    while len(words) > 1:
        groups = [words[index:index + 3] for index in range(0, len(words), 3)]
        words = [sum_of_three(*group) if len(group) == 3 else
                 group[0] + group[1] if len(group) == 2 else group[0] for group in groups]
    return words[0]


def header_words(header, *names):
    """The 16-bit words of the header view ``header`` (as :func:`word_sum` counts them)
    that its fields ``names`` lie in, in order, as one value: the part of the header's
    sum that those fields give when its other fields in them are zero."""
    layout = header.shape()
    indices = sorted({bit // 16 for name in names
                      for bit in range(layout[name].offset,
                                       layout[name].offset + layout[name].width)})
    return Cat(Value.cast(header).word_select(index, 16) for index in indices)


def ones_complement_fold(total):
    """16-bit one's-complement sum of the 16-bit words whose plain sum is ``total``
    (at most 32 bits wide)."""
    total = Value.cast(total)
    if len(total) > 32:
        raise ValueError(f"A sum of {len(total)} bits does not fold in one step")
    return ones_complement_add(total[:16], total[16:])


def folds_to_ones(total):
    """Whether the 16-bit one's-complement sum of the 16-bit words whose plain sum is
    ``total`` (at most 32 bits wide) is 0xFFFF: what a received header's sum must be.

    Compares only, no carry chain: with ``lo`` and ``hi`` the halves of ``total``, the fold
    is 0xFFFF exactly when ``lo + hi`` is 0xFFFF (``lo`` is ``~hi``) or 0x1FFFE (both are
    0xFFFF).
    """
    total = Value.cast(total)
    if len(total) > 32:
        raise ValueError(f"A sum of {len(total)} bits does not fold in one step")
    total = Cat(total, C(0, 32 - len(total)))
    low, high = total[:16], total[16:]
    return (low == ~high) | (total == 0xFFFF_FFFF)
