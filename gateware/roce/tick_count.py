"""The count of IB timer ticks that the reliability engine stamps its timers with."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .qp_context import TIME_BITS

__all__ = ["TickCount"]


class TickCount(wiring.Component):
    """Counts ticks of ``i_cycles`` clock cycles each (``TRANSMIT_CONFIG.tick``) into
    ``o_now``, a free-running count of :data:`TIME_BITS` bits that wraps.

    ``o_now`` steps a cycle after the tick's last cycle. While ``i_paused`` (the link
    pauses RoCEv2 frames: PAUSE or PFC) the count stands still, so pause time counts
    against no ACK timer or RNR wait.
    """

    def __init__(self):
        super().__init__({
            "i_cycles": In(16),
            "i_paused": In(1),
            "o_now": Out(TIME_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        tick = Signal()
        tick_count = Signal(16)
        m.d.comb += tick.eq((tick_count + 1 >= self.i_cycles) & ~self.i_paused)
        with m.If(~self.i_paused):
            m.d.sync += tick_count.eq(Mux(tick, 0, tick_count + 1))
        with m.If(tick):
            m.d.sync += self.o_now.eq(self.o_now + 1)
        return m
