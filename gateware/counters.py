"""Event counters: 32-bit, wrapping, one per reason a layer drops or does something."""

from amaranth import *
from amaranth.lib import data

__all__ = ["COUNTER_BITS", "counters_layout", "event_counter"]

COUNTER_BITS = 32


def counters_layout(*names):
    """A StructLayout of one counter per name."""
    return data.StructLayout({name: unsigned(COUNTER_BITS) for name in names})


def event_counter(m, strobe, name):
    """A counter that adds one on every cycle ``strobe`` is high."""
    counter = Signal(COUNTER_BITS, name=f"count_{name}")
    with m.If(strobe):
        m.d.sync += counter.eq(counter + 1)
    return counter
