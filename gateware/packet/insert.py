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

    With ``lengths``, a header whose length varies per packet: only the first
    ``meta.<name>_length`` bytes of the header are sent, one of ``lengths``
    (each shorter than a beat), so a transport header with optional
    extensions is inserted in one pass.
    """

    def __init__(self, name, header, meta, *, width=BEAT_BYTES, lengths=None):
        if not isinstance(header, NetworkLayout):
            raise TypeError(f"Header must be a NetworkLayout, not {header!r}")
        if name not in meta.members or meta.members[name] != header:
            raise ValueError(f"Meta {meta!r} has no field {name!r} of the header's layout")
        outer = meta_without(meta, name)
        if lengths is None:
            lengths = (header.length,)
        else:
            lengths = tuple(lengths)
            if not lengths or any(not 0 < length < min(width, header.length + 1)
                                  for length in lengths):
                raise ValueError(f"Header lengths must lie in 1..{min(width - 1, header.length)}"
                                 f" bytes, not {lengths!r}")
            if f"{name}_length" not in meta.members:
                raise ValueError(f"Meta {meta!r} has no field {name + '_length'!r}")
            outer = meta_without(outer, f"{name}_length")
        self._name = name
        self._header = header
        self._lengths = lengths
        self._width = width
        super().__init__({
            "i": In(packet_signature(meta, width=width)),
            "o": Out(packet_signature(outer, width=width)),
        })

    @property
    def header(self):
        return self._header

    @property
    def lengths(self):
        return self._lengths

    def elaborate(self, platform):
        m = Module()
        width = self._width
        whole = self._lengths[0] // width if len(self._lengths) == 1 else 0
        tails = [length % width for length in self._lengths]
        carried = max(tails)

        i_meta = self.i.p.meta
        outer = meta_project(i_meta, self.o.p.meta.shape())
        header = self._header.to_wire(i_meta[self._name])

        first = Signal(init=1)                       # the next input beat starts a packet
        phase = Signal(range(whole + 1))             # header-only beats emitted so far
        extra = Signal()                             # one more beat holds the carried bytes
        carry = Signal(8 * carried)
        carry_keep = Signal(carried)
        meta = Signal(len(outer))

        variant = Signal(range(len(tails)))          # which length, for the packet in flight
        current = Signal.like(variant)
        if len(tails) > 1:
            chosen = Signal.like(variant)
            for index, length in enumerate(self._lengths):
                with m.If(i_meta[f"{self._name}_length"] == length):
                    m.d.comb += chosen.eq(index)
            m.d.comb += current.eq(Mux(first, chosen, variant))

        m.d.comb += self.o.p.meta.eq(Mux(first, outer, meta))
        with m.If(first & self.i.valid & self.i.ready):
            m.d.sync += [
                meta.eq(outer),
                variant.eq(current),
            ]

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
            m.d.comb += [
                self.o.valid.eq(self.i.valid),
                self.i.ready.eq(self.o.ready),
            ]
            with m.Switch(current):
                for index, tail in enumerate(tails):
                    with m.Case(index):
                        self._merge(m, tail, header[8 * width * whole:], first, carry, carry_keep,
                                    extra)
            with m.If(self.i.valid & self.i.ready):
                m.d.sync += first.eq(self.i.p.last)
                with m.If(self.i.p.last):
                    m.d.sync += phase.eq(0)

        return m

    def _merge(self, m, tail, header, first, carry, carry_keep, extra):
        """Output beat for a header ``tail`` bytes past a beat boundary: ``tail`` bytes
        of header (first beat) or carry, then the input's first ``width − tail`` bytes."""
        width = self._width
        if tail:
            head = Mux(first, header[:8 * tail], carry[:8 * tail])
            head_keep = Mux(first, C((1 << tail) - 1, tail), carry_keep[:tail])
            spill = self.i.p.keep[width - tail]
        else:
            head = head_keep = C(0, 0)
            spill = C(0, 1)
        m.d.comb += [
            self.o.p.data.eq(Cat(head, self.i.p.data[:8 * (width - tail)])),
            self.o.p.keep.eq(Cat(head_keep, self.i.p.keep[:width - tail])),
            self.o.p.last.eq(self.i.p.last & ~spill),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [
                carry.eq(self.i.p.data[8 * (width - tail):]),
                carry_keep.eq(self.i.p.keep[width - tail:]),
            ]
            with m.If(self.i.p.last):
                m.d.sync += extra.eq(spill)
