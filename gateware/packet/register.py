from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES, packet_signature

__all__ = ["StreamRegister", "PacketRegister"]


class StreamRegister(wiring.Component):
    """A register slice (skid buffer) for any :class:`stream.Signature`, to cut long paths.

    Everything it drives comes straight from flip-flops: ``o.valid`` and
    ``o.p`` from the output register, ``i.ready`` from the (empty) state of a
    second, skid register. Nothing passes combinationally from ``i`` to ``o``
    or from ``o.ready`` to ``i.ready``, so the paths on either side end here.

    A payload taken from ``i`` goes to the output register when that is empty
    or being emptied in the same cycle; otherwise (``o`` stalled) it waits in
    the skid register, and ``i.ready`` goes low until the stall ends and the
    skid payload moves on. One payload per cycle while ``o`` is ready,
    unchanged and in order. Latency 1 cycle from ``i`` to ``o``; ``i.ready``
    follows ``o.ready`` one cycle later.
    """

    def __init__(self, signature):
        if not isinstance(signature, stream.Signature):
            raise TypeError(f"A stream register needs a stream.Signature, not {signature!r}")
        if signature.always_ready:
            raise ValueError("A stream without backpressure (always_ready) needs no skid "
                             "buffer")
        self._signature = signature
        super().__init__({
            "i": In(signature),
            "o": Out(signature),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o

        skid = Signal(self._signature.members["payload"].shape)
        skid_valid = Signal()

        # The payload registers load whatever ``i`` shows when they may take it, valid or
        # not (a payload means nothing while its valid is low): so ``i.valid``, which may
        # come late, reaches only the valid registers, not the payload's enables.
        m.d.comb += i.ready.eq(~skid_valid)
        with m.If(o.ready | ~o.valid):
            with m.If(skid_valid):
                m.d.sync += [
                    o.valid.eq(1),
                    o.payload.eq(skid),
                    skid_valid.eq(0),
                ]
            with m.Else():
                m.d.sync += [o.valid.eq(i.valid), o.payload.eq(i.payload)]
        with m.Elif(~skid_valid):
            m.d.sync += [
                skid.eq(i.payload),
                skid_valid.eq(i.valid),
            ]

        return m


class PacketRegister(StreamRegister):
    """A :class:`StreamRegister` for a packet stream: beats, ``keep``, ``last`` and
    ``meta`` pass unchanged, one beat per cycle while ``o`` is ready. Latency 1 cycle
    from ``i`` to ``o``; ``i.ready`` follows ``o.ready`` one cycle later.
    """

    def __init__(self, meta, *, width=BEAT_BYTES):
        self._meta = meta
        self._width = width
        super().__init__(packet_signature(meta, width=width))   # checks meta and width

    @property
    def meta(self):
        return self._meta

    @property
    def width(self):
        return self._width
