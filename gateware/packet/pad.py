from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES, keep_mask, packet_signature

__all__ = ["PacketPad"]


class PacketPad(wiring.Component):
    """Pads each packet with zero bytes to at least ``minimum`` bytes.

    For Ethernet's 60-byte minimum (before the FCS) on a bus of 64 byte
    lanes, that touches only a packet's single beat. ``minimum`` must not
    exceed one beat. Latency 0.
    """

    def __init__(self, meta, *, minimum, width=BEAT_BYTES):
        if not isinstance(minimum, int) or not 0 <= minimum <= width:
            raise ValueError(f"Minimum length must be between 0 and {width} bytes, not {minimum!r}")
        self._minimum = minimum
        self._width = width
        super().__init__({
            "i": In(packet_signature(meta, width=width)),
            "o": Out(packet_signature(meta, width=width)),
        })

    def elaborate(self, platform):
        m = Module()
        width = self._width

        first = Signal(init=1)
        pad = first & self.i.p.last
        lanes = Cat(self.i.p.keep | Mux(pad, keep_mask(C(self._minimum), width), 0))
        bytes_ = Cat(Mux(self.i.p.keep[lane], self.i.p.data.word_select(lane, 8), 0)
                     for lane in range(width))
        m.d.comb += [
            self.o.valid.eq(self.i.valid),
            self.i.ready.eq(self.o.ready),
            self.o.p.eq(self.i.p),
        ]
        with m.If(pad):
            m.d.comb += [
                self.o.p.data.eq(bytes_),
                self.o.p.keep.eq(lanes),
            ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += first.eq(self.i.p.last)

        return m
