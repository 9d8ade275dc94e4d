"""The carry-chain helpers of gateware.arith against their definitions, every case at
small widths."""

import itertools

import pytest
from amaranth import Module, Signal
from amaranth.sim import Simulator

from gateware.arith import (
    difference_at_least,
    sum_above,
    sum_is_zero,
    sum_of_three,
    wrapped_before,
)


def _evaluate(function, widths, result_width=1):
    """``function`` of signals of ``widths``, simulated for every value of each: the
    cases and the results (of ``result_width`` bits)."""
    m = Module()
    inputs = [Signal(width) for width in widths]
    result = Signal(result_width)
    m.d.comb += result.eq(function(*inputs))
    cases = list(itertools.product(*(range(1 << width) for width in widths)))
    results = []

    async def testbench(ctx):
        for case in cases:
            for signal, value in zip(inputs, case, strict=True):
                ctx.set(signal, value)
            results.append(ctx.get(result))

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()
    return cases, results


@pytest.mark.parametrize("widths", [(5, 5, 5), (6, 3, 1), (1, 4, 6)])
def test_sum_of_three_is_the_sum(widths):
    """``sum_of_three``: every carry out of the widest term kept, terms of any widths."""
    cases, results = _evaluate(sum_of_three, widths, result_width=max(widths) + 2)
    assert results == [a + b + c for a, b, c in cases]


@pytest.mark.parametrize("widths", [(6, 4, 6), (5, 5, 3), (3, 5, 7)])
def test_sum_above_is_a_plus_b_above_c(widths):
    """``sum_above``: the sum carries past the widest term; c above it or below."""
    cases, results = _evaluate(sum_above, widths)
    assert results == [int(a + b > c) for a, b, c in cases]


@pytest.mark.parametrize("widths", [(5, 5, 5), (6, 6, 4), (5, 5, 1)])
def test_difference_at_least_is_the_wrapped_difference_against_c(widths):
    """``difference_at_least``: a before and after b (wrapped), a c of every width up to
    a's."""
    cases, results = _evaluate(difference_at_least, widths)
    modulus = 1 << widths[0]
    assert results == [int((a - b) % modulus >= c) for a, b, c in cases]


def test_wrapped_before_compares_the_two_distances_from_base():
    """``wrapped_before``: every a, b and base at 4 bits, each of them wrapped or not."""
    cases, results = _evaluate(wrapped_before, (4, 4, 4))
    assert results == [int((a - base) % 16 < (b - base) % 16) for a, b, base in cases]


@pytest.mark.parametrize("widths", [(5, 5), (6, 3)])
def test_sum_is_zero_is_the_wrapped_sum_against_zero(widths):
    """``sum_is_zero``: every a and b, the sum wrapping at the wider's width or not."""
    cases, results = _evaluate(sum_is_zero, widths)
    modulus = 1 << max(widths)
    assert results == [int((a + b) % modulus == 0) for a, b in cases]
