"""The GT receiver's reset, retried while the link is not aligned."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from gateware.counters import COUNTER_BITS, event_counter

__all__ = ["RxResetWatchdog"]


class RxResetWatchdog(wiring.Component):
    """Pulses ``o_reset`` (the CMAC's ``gtwiz_reset_rx_datapath``) for one cycle every
    ``interval`` cycles while ``i_aligned`` is low, and counts the pulses in ``o_resets``.

    The GT receiver adapts its equalizer and locks its clock recovery to
    whatever arrives while it comes out of reset. A QSFP28 module sends
    nothing for up to 2 s after its own reset, and a peer port may come up
    later still; a receiver reset before the signal is there may then never
    align. Resetting its datapath every 750 ms until it aligns (as corundum's
    CMAC wrapper does) makes the link come up by itself, after a late peer and
    after a cable is pulled and put back. The timer restarts whenever
    ``i_aligned`` is high, so an aligned link is never reset.

    Runs in the free-running ``sync`` domain of the CMAC's ``init_clk`` (the
    board top renames it); ``i_aligned`` must be synchronized to it.

    Parameters
    ----------
    interval : int
        Cycles between resets (750 ms at 125 MHz by default).
    """

    def __init__(self, *, interval=93_750_000):
        if interval < 2:
            raise ValueError(f"interval must be at least 2 cycles, not {interval!r}")
        self._interval = interval
        super().__init__({
            "i_aligned": In(1),
            "o_reset": Out(1),
            "o_resets": Out(COUNTER_BITS),
        })

    @property
    def interval(self):
        return self._interval

    def elaborate(self, platform):
        m = Module()
        remaining = Signal(range(self._interval), init=self._interval - 1)
        m.d.sync += self.o_reset.eq(0)
        with m.If(self.i_aligned):
            m.d.sync += remaining.eq(self._interval - 1)
        with m.Elif(remaining == 0):
            m.d.sync += [remaining.eq(self._interval - 1), self.o_reset.eq(1)]
        with m.Else():
            m.d.sync += remaining.eq(remaining - 1)
        m.d.comb += self.o_resets.eq(event_counter(m, self.o_reset, "rx_resets"))
        return m
