"""Arithmetic that keeps carry chains short: a compare beside an add, not after it."""

from amaranth import *

__all__ = ["difference_at_least", "sum_above", "sum_is_zero", "sum_of_three", "wrapped_before"]


def sum_of_three(x, y, z):
    """``x + y + z`` (unsigned) from one carry chain: the terms added bit by bit first into
    a sum word and a carry word (carry-save, in the LUTs before the chain), then those
    two."""
    x, y, z = (Value.cast(term).as_unsigned() for term in (x, y, z))
    return (x ^ y ^ z) + Cat(C(0, 1), (x & y) | (x & z) | (y & z))


def sum_above(a, b, c):
    """Whether ``a + b > c`` (unsigned), from one carry chain that can run beside an add
    of ``a + b``, not after it: the sign of ``a + b + ~c`` (= a + b − c − 1) in two bits
    more than the widest."""
    width = max(len(a), len(b), len(c)) + 2
    total = sum_of_three(a, b, ~Cat(c, C(0, width - len(c))))
    return ~total[width - 1]


def sum_is_zero(a, b):
    """Whether ``(a + b) mod 2^n`` is zero (``n`` the wider's bits), without a carry chain:
    a sum's low bits are all zero exactly when each bit's carry in is the XOR of its two
    bits, and below such bits the carry out of a bit is the OR of its two; so each bit is
    checked against the bit below it, and the checks are ANDed."""
    width = max(len(a), len(b))
    a, b = (Cat(Value.cast(term).as_unsigned(), C(0, width - len(term))) for term in (a, b))
    carries = Cat(C(0, 1), (a | b)[:-1])
    return ~((a ^ b) ^ carries).any()


def difference_at_least(a, b, c):
    """Whether ``(a − b) mod 2^len(a)`` is at least ``c`` (a count that wraps, as a time
    or a PSN, and a least difference of at most as many bits), from one carry chain and
    a compare beside it, not a subtraction and then a compare: ``c > a − b`` is the sign
    of ``c + b + ~a`` (= c − (a − b) − 1); when ``a`` has wrapped past ``b`` the
    difference is 2^len(a) more, which moves the test one bit down."""
    bits = len(a)
    total = sum_of_three(c, b, ~Cat(a, C(0, 2)))
    return Mux(a < b, ~total[bits], total[bits + 1])


def wrapped_before(a, b, base):
    """Whether ``(a − base) mod 2^n`` is less than ``(b − base) mod 2^n`` (``n`` bits each):
    ``a`` comes before ``b`` counting from ``base``, as a PSN inside the window from
    ``una`` to ``nxt``. Three compares side by side, each one carry chain, and a LUT, not
    two subtractions and then a compare: past ``base`` only ``a`` has wrapped (it is
    not before), only ``b`` (it is), or both or neither (``a < b`` decides)."""
    a_wrapped, b_wrapped = a < base, b < base
    return Mux(a_wrapped == b_wrapped, a < b, b_wrapped)
