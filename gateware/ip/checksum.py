"""The Internet checksum (RFC 1071) as logic: one's-complement sums of 16-bit words."""

from amaranth import *

__all__ = ["ones_complement_add", "ones_complement_fold", "word_sum"]


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
    (16-bit words, or sums of them), as a balanced tree of adders: carry chains only, no
    end-around carry; :func:`ones_complement_fold` turns it into their one's-complement
    sum."""
    value = Value.cast(value)
    if len(value) % 16:
        raise ValueError(f"{len(value)} bits are not a whole number of 16-bit words")
    words = [value.word_select(index, 16) for index in range(len(value) // 16)]
    words += [Value.cast(term) for term in terms]
    if not words:
        raise ValueError("No words to sum")
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
