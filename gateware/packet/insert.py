from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..headers import NetworkLayout
from ..stream import BEAT_BYTES, meta_project, meta_without, packet_signature

__all__ = ["HeaderInserter"]


class HeaderInserter(wiring.Component):
    """Puts a header in front of each packet.

    The header is the ``meta.<name>`` field of the first input beat; the
    output carries the rest of the meta. A header of ``q`` whole beats and
    ``k`` more bytes takes ``q`` cycles before the payload starts, then every
    output beat joins ``k`` bytes held from the previous input beat with the
    first ``width − k`` bytes of the current one; a packet whose last beat
    does not fit takes one more beat. No idle cycle between packets. Valid
    and ready pass through combinationally (latency 0 cycles).
    """

    def __init__(self, name, header, meta, *, width=BEAT_BYTES):
        if not isinstance(header, NetworkLayout):
            raise TypeError(f"Header must be a NetworkLayout, not {header!r}")
        if name not in meta.members or meta.members[name] != header:
            raise ValueError(f"Meta {meta!r} has no field {name!r} of the header's layout")
        self._name = name
        self._header = header
        self._width = width
        super().__init__({
            "i": In(packet_signature(meta, width=width)),
            "o": Out(packet_signature(meta_without(meta, name), width=width)),
        })

    @property
    def header(self):
        return self._header

    def elaborate(self, platform):
        m = Module()
        width = self._width
        whole, tail = divmod(self._header.length, width)

        i_meta = self.i.p.meta
        outer = meta_project(i_meta, self.o.p.meta.shape())
        header = self._header.to_wire(i_meta[self._name])

        first = Signal(init=1)                       # the next input beat starts a packet
        phase = Signal(range(whole + 1))             # header-only beats emitted so far
        extra = Signal()                             # one more beat holds the carried bytes
        carry = Signal(8 * tail)
        carry_keep = Signal(tail)
        meta = Signal(len(outer))

        m.d.comb += self.o.p.meta.eq(Mux(first, outer, meta))
        with m.If(first & self.i.valid & self.i.ready):
            m.d.sync += meta.eq(outer)

        with m.If(extra):
            m.d.comb += [
                self.o.valid.eq(1),
                self.o.p.data.eq(carry),
                self.o.p.keep.eq(carry_keep),
                self.o.p.last.eq(1),
                self.o.p.meta.eq(meta),
            ]
            with m.If(self.o.ready):
                m.d.sync += extra.eq(0)

        with m.Elif(first & (phase < whole)):
            m.d.comb += [
                self.o.valid.eq(self.i.valid),
                self.o.p.data.eq(header.word_select(phase, 8 * width)),
                self.o.p.keep.eq(-1),
            ]
            with m.If(self.o.valid & self.o.ready):
                m.d.sync += phase.eq(phase + 1)

        with m.Else():
            if tail:
                head = Mux(first, header[8 * width * whole:], carry)
                head_keep = Mux(first, C((1 << tail) - 1, tail), carry_keep)
                spill = self.i.p.keep[width - tail]
            else:
                head = head_keep = C(0, 0)
                spill = C(0, 1)
            m.d.comb += [
                self.o.valid.eq(self.i.valid),
                self.i.ready.eq(self.o.ready),
                self.o.p.data.eq(Cat(head, self.i.p.data[:8 * (width - tail)])),
                self.o.p.keep.eq(Cat(head_keep, self.i.p.keep[:width - tail])),
                self.o.p.last.eq(self.i.p.last & ~spill),
            ]
            with m.If(self.i.valid & self.i.ready):
                m.d.sync += [
                    carry.eq(self.i.p.data[8 * (width - tail):]),
                    carry_keep.eq(self.i.p.keep[width - tail:]),
                    first.eq(self.i.p.last),
                ]
                with m.If(self.i.p.last):
                    m.d.sync += [
                        phase.eq(0),
                        extra.eq(spill),
                    ]

        return m
