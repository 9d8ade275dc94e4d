"""Arithmetic that keeps carry chains short: a compare beside an add, not after it."""

from amaranth import *

__all__ = ["period_over", "sum_above"]


def _three_term_sum(x, y, z):
    """``x + y + z`` from one carry chain: the terms added bit by bit first into a sum
    word and a carry word (carry-save), then those two."""
    return (x ^ y ^ z) + Cat(C(0, 1), (x & y) | (x & z) | (y & z))


def sum_above(a, b, c):
    """Whether ``a + b > c`` (unsigned), from one carry chain that can run beside an add
    of ``a + b``, not after it: the sign of ``a + b + ~c`` (= a + b − c − 1) in two bits
    more than the widest."""
    width = max(len(a), len(b), len(c)) + 2
    total = _three_term_sum(a.as_unsigned(), b.as_unsigned(), ~Cat(c, C(0, width - len(c))))
    return ~total[width - 1]


def period_over(now, since, period):
    """Whether ``(now − since) mod 2^len(now)`` is at least ``period`` (a time that
    wraps, and a period of at most as many bits), from one carry chain and a compare
    beside it, not a subtraction and then a compare: ``period > now − since`` is the
    sign of ``period + since + ~now`` (= period − (now − since) − 1); when ``now`` has
    wrapped past ``since`` the difference is 2^len(now) more, which moves the test one
    bit down."""
    bits = len(now)
    total = _three_term_sum(period.as_unsigned(), since.as_unsigned(), ~Cat(now, C(0, 2)))
    return Mux(now < since, ~total[bits], total[bits + 1])
