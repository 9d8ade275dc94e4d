from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES, NO_META, packet_signature

__all__ = ["PacketGate"]


class PacketGate(wiring.Component):
    """Holds packets back at their start while ``i_hold`` is high.

    ``i_hold`` is looked at only between packets, with a packet's first beat:
    a packet that has started passes to its last beat whatever ``i_hold`` does
    meanwhile. Latency 0 (valid, payload and ready pass combinationally); no
    idle cycle between packets while ``i_hold`` is low.
    """

    def __init__(self, meta=NO_META, *, width=BEAT_BYTES):
        super().__init__({
            "i": In(packet_signature(meta, width=width)),
            "i_hold": In(1),
            "o": Out(packet_signature(meta, width=width)),
        })

    def elaborate(self, platform):
        m = Module()
        inside = Signal()           # a packet has started and its last beat has not passed
        passing = Signal()
        m.d.comb += [
            passing.eq(inside | ~self.i_hold),
            self.o.p.eq(self.i.p),
            self.o.valid.eq(self.i.valid & passing),
            self.i.ready.eq(self.o.ready & passing),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += inside.eq(~self.i.p.last)
        return m
