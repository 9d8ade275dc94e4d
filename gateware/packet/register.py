from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES, packet_signature

__all__ = ["PacketRegister"]


class PacketRegister(wiring.Component):
    """A register slice (skid buffer) for a packet stream, to cut long paths.

    Everything it drives comes straight from flip-flops: ``o.valid`` and
    ``o.p`` from the output register, ``i.ready`` from the (empty) state of a
    second, skid register. Nothing passes combinationally from ``i`` to ``o``
    or from ``o.ready`` to ``i.ready``, so the paths on either side end here.

    A beat taken from ``i`` goes to the output register when that is empty or
    being emptied in the same cycle; otherwise (``o`` stalled) it waits in the
    skid register, and ``i.ready`` goes low until the stall ends and the skid
    beat moves on. One beat per cycle while ``o`` is ready; beats, ``keep``,
    ``last`` and ``meta`` pass unchanged. Latency 1 cycle from ``i`` to ``o``;
    ``i.ready`` follows ``o.ready`` one cycle later.
    """

    def __init__(self, meta, *, width=BEAT_BYTES):
        signature = packet_signature(meta, width=width)    # checks meta and width
        self._meta = meta
        self._width = width
        super().__init__({
            "i": In(signature),
            "o": Out(signature),
        })

    @property
    def meta(self):
        return self._meta

    @property
    def width(self):
        return self._width

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o

        skid = Signal(i.p.shape())
        skid_valid = Signal()

        m.d.comb += i.ready.eq(~skid_valid)
        with m.If(o.ready | ~o.valid):
            with m.If(skid_valid):
                m.d.sync += [
                    o.valid.eq(1),
                    o.p.eq(skid),
                    skid_valid.eq(0),
                ]
            with m.Else():
                m.d.sync += o.valid.eq(i.valid)
                with m.If(i.valid):
                    m.d.sync += o.p.eq(i.p)
        with m.Elif(i.valid & i.ready):
            m.d.sync += [
                skid.eq(i.p),
                skid_valid.eq(1),
            ]

        return m
