from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..headers import NetworkLayout
from ..stream import BEAT_BYTES, meta_with, packet_signature

__all__ = ["HeaderExtractor"]


class HeaderExtractor(wiring.Component):
    """Takes the header off the front of each packet.

    The header comes out as ``meta.<name>`` next to the input's meta, on every
    beat of the remaining payload. A header of ``q`` whole beats and ``k``
    more bytes: the first ``q`` input beats fill the header, the next one
    completes it, and each output beat then joins the last ``width − k`` bytes
    of one input beat with the first ``k`` bytes of the next (latency: one
    beat). A packet that ends before its header is complete is dropped and
    flagged on ``o_truncated`` for one cycle.

    Never stalls its input while its output is ready, so it can sit on a path
    with no backpressure. No idle cycle between packets.

    ``o_header`` shows each header in the cycle it is completed (``valid``
    for that cycle), the cycle before ``meta`` holds it: a parent that wants
    checks on the header in registers beside ``meta`` samples them there.
    """

    def __init__(self, name, header, meta, *, width=BEAT_BYTES):
        if not isinstance(header, NetworkLayout):
            raise TypeError(f"Header must be a NetworkLayout, not {header!r}")
        self._name = name
        self._header = header
        self._width = width
        super().__init__({
            "i": In(packet_signature(meta, width=width)),
            "o": Out(packet_signature(meta_with(meta, **{name: header}), width=width)),
            "o_truncated": Out(1),
            "o_header": Out(stream.Signature(header, always_ready=True)),
        })

    @property
    def header(self):
        return self._header

    def elaborate(self, platform):
        m = Module()
        width = self._width
        # The beat that completes the header holds its last ``tail`` bytes (1 to width).
        whole, tail = divmod(self._header.length - 1, width)
        tail += 1
        i, o = self.i, self.o

        phase = Signal(range(whole + 1))             # header-only beats taken so far
        in_payload = Signal()                        # past the beat that completes the header
        pending = Signal()                           # ``held`` is the end of a packet
        held = Signal(8 * (width - tail))
        held_keep = Signal(width - tail)
        collected = Signal(8 * width * whole)        # header-only beats
        outer = Signal(i.p.meta.shape())             # input meta, from the first beat
        meta = Signal(o.p.meta.shape())

        first_meta = Mux(phase == 0, Value.cast(i.p.meta), outer) if whole else Value.cast(i.p.meta)
        header = self._header.from_wire(Cat(collected, i.p.data[:8 * tail]))
        tail_complete = i.p.keep[tail - 1]
        spill = i.p.keep[tail] if tail < width else C(0, 1)

        m.d.comb += [
            self.o_header.p.eq(header),
            o.p.data.eq(held),
            o.p.keep.eq(held_keep),
            o.p.meta.eq(meta),
        ]
        with m.If(pending):
            m.d.comb += [
                o.valid.eq(1),
                o.p.last.eq(1),
                i.ready.eq(o.ready),
            ]
            with m.If(o.ready):
                m.d.sync += pending.eq(0)
        with m.Elif(in_payload):
            m.d.comb += [
                o.valid.eq(i.valid),
                o.p.data.eq(Cat(held, i.p.data[:8 * tail])),
                o.p.keep.eq(Cat(held_keep, i.p.keep[:tail])),
                o.p.last.eq(i.p.last & ~spill),
                i.ready.eq(o.ready),
            ]
        with m.Else():
            m.d.comb += i.ready.eq(1)

        with m.If(i.valid & i.ready):
            with m.If(in_payload):
                m.d.sync += [
                    held.eq(i.p.data[8 * tail:]),
                    held_keep.eq(i.p.keep[tail:]),
                ]
                with m.If(i.p.last):
                    m.d.sync += [
                        in_payload.eq(0),
                        pending.eq(spill),
                    ]
            with m.Elif(phase < whole):
                if whole:
                    m.d.sync += collected.word_select(phase, 8 * width).eq(i.p.data)
                with m.If(phase == 0):
                    m.d.sync += outer.eq(i.p.meta)
                with m.If(i.p.last):
                    m.d.sync += phase.eq(0)
                    m.d.comb += self.o_truncated.eq(1)
                with m.Else():
                    m.d.sync += phase.eq(phase + 1)
            with m.Else():
                m.d.sync += phase.eq(0)
                with m.If(i.p.last & ~tail_complete):
                    m.d.comb += self.o_truncated.eq(1)
                with m.Else():
                    m.d.comb += self.o_header.valid.eq(1)
                    m.d.sync += [
                        meta.eq(Cat(first_meta, Value.cast(header))),
                        held.eq(i.p.data[8 * tail:]),
                        held_keep.eq(i.p.keep[tail:]),
                        in_payload.eq(~i.p.last),
                        pending.eq(i.p.last),
                    ]

        return m
