"""A QSFP28 module's reset and low-power pins, sequenced from its presence."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["QsfpModule"]


class QsfpModule(wiring.Component):
    """Takes a QSFP28 module out of reset and then into high-power mode, in that order.

    While no module is present (``i_present`` low) and after the domain's
    reset, the module is held in reset (``o_reset``) and in low-power mode
    (``o_lpmode``). Once present: reset for ``reset_cycles`` more (the
    management interface's t_reset_init is at least 10 us), then released;
    low power for ``init_cycles`` more (t_init: a module may take 2 s to
    initialize after its reset), then high power, where optical modules turn
    their lasers on. A module pulled out returns to the start, so a module
    plugged in later goes through the same sequence. ``o_ready`` is high in
    high-power mode. Active-high outputs (the platform inverts ResetL).

    Parameters
    ----------
    reset_cycles, init_cycles : int
        Default: 1 ms and 2 s at 125 MHz (the board top's ``init`` domain).
    """

    def __init__(self, *, reset_cycles=125_000, init_cycles=250_000_000):
        for name, value in [("reset_cycles", reset_cycles), ("init_cycles", init_cycles)]:
            if value < 1:
                raise ValueError(f"{name} must be at least 1, not {value!r}")
        self._reset_cycles = reset_cycles
        self._init_cycles = init_cycles
        super().__init__({
            "i_present": In(1),
            "o_reset": Out(1, init=1),
            "o_lpmode": Out(1, init=1),
            "o_ready": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        # Cycles since the module appeared, up to the end of its sequence. The outputs are
        # registered: a glitch on ResetL could reset the module.
        total = self._reset_cycles + self._init_cycles
        since = Signal(range(total + 1))
        with m.If(~self.i_present):
            m.d.sync += since.eq(0)
        with m.Elif(since != total):
            m.d.sync += since.eq(since + 1)
        m.d.sync += [
            self.o_reset.eq(~self.i_present | (since < self._reset_cycles)),
            self.o_lpmode.eq(~self.i_present | (since < total)),
        ]
        m.d.comb += self.o_ready.eq(~self.o_lpmode)
        return m
