from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES, keep_mask, packet_signature

__all__ = ["PacketTrim"]


class PacketTrim(wiring.Component):
    """Cuts each packet to ``i_length`` bytes (sampled with the first beat).

    The bytes past the length (Ethernet padding, say) are discarded; the beat
    holding the last kept byte is marked ``last``. A packet shorter than
    ``i_length`` passes whole. Latency 0.
    """

    def __init__(self, meta, *, length_bits=16, width=BEAT_BYTES):
        self._width = width
        super().__init__({
            "i": In(packet_signature(meta, width=width)),
            "i_length": In(length_bits),
            "o": Out(packet_signature(meta, width=width)),
        })

    def elaborate(self, platform):
        m = Module()
        width = self._width

        first = Signal(init=1)
        remaining = Signal.like(self.i_length)     # bytes of the packet still to pass
        discarding = Signal()
        left = Mux(first, self.i_length, remaining)
        ends_here = left <= width

        m.d.comb += [
            self.o.p.eq(self.i.p),
            self.o.p.keep.eq(self.i.p.keep & keep_mask(left, width)),
            self.o.p.last.eq(self.i.p.last | ends_here),
        ]
        with m.If(discarding):
            m.d.comb += self.i.ready.eq(1)
        with m.Else():
            m.d.comb += [
                self.o.valid.eq(self.i.valid),
                self.i.ready.eq(self.o.ready),
            ]

        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [
                first.eq(self.i.p.last),
                remaining.eq(Mux(ends_here, 0, left - width)),
                discarding.eq(~self.i.p.last & (discarding | ends_here)),
            ]

        return m
