from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..counters import counters_layout
from ..stream import BEAT_BYTES, forward, meta_project, meta_with, packet_signature
from .register import PacketRegister

__all__ = ["PacketRouter"]


class PacketRouter(wiring.Component):
    """Sends each packet to one of several outputs, or drops it and counts why.

    The parent computes a verdict from the first beat (its headers are in
    ``meta``) and drives ``i_route`` and ``i_drop``: ``i_drop`` is 0 to pass
    the packet to ``o[i_route]``, or the 1-based index of a reason in
    ``drop_reasons`` to discard it. Both are sampled with the first beat. Each
    reason has a 32-bit counter in ``o_drops`` (wrapping).

    Latency 0: the chosen output sees the input's valid and payload
    combinationally, and the input sees that output's ready. No idle cycle
    between packets.

    With ``registered``, the beats and the verdict first pass a register slice
    (:class:`~.register.PacketRegister`; the verdict is still sampled with the
    first beat as it comes in): latency 1 cycle, and no path goes through the
    router, from the parent's checks to the outputs or from the outputs' ready
    to ``i.ready``. Drops are counted as the packet leaves the slice.
    """

    def __init__(self, meta, *, outputs, drop_reasons, width=BEAT_BYTES, registered=False):
        if not isinstance(outputs, int) or outputs < 1:
            raise ValueError(f"A router needs at least one output, not {outputs!r}")
        drop_reasons = tuple(drop_reasons)
        if len(set(drop_reasons)) != len(drop_reasons) or not all(
                isinstance(reason, str) and reason.isidentifier() for reason in drop_reasons):
            raise ValueError(f"Drop reasons must be distinct identifiers, not {drop_reasons!r}")
        self._drop_reasons = drop_reasons
        self._meta = meta
        self._width = width
        self._registered = registered
        super().__init__({
            "i": In(packet_signature(meta, width=width)),
            "i_route": In(range(outputs)),
            "i_drop": In(range(len(drop_reasons) + 1)),
            "o": Out(packet_signature(meta, width=width)).array(outputs),
            "o_drops": Out(counters_layout(*drop_reasons)),
        })


    @property
    def drop_reasons(self):
        return self._drop_reasons

    def drop_code(self, reason):
        """The ``i_drop`` value that drops a packet for ``reason``."""
        return self._drop_reasons.index(reason) + 1

    def elaborate(self, platform):
        m = Module()
        if self._registered:
            # Every beat carries the verdict of its cycle through the slice; only the first
            # beat's counts.
            slice_meta = meta_with(self._meta, route=self.i_route.shape(),
                                   drop=self.i_drop.shape())
            m.submodules.register = register = PacketRegister(slice_meta, width=self._width)
            m.d.comb += forward(self.i, register.i)
            for name in self._meta.members:
                m.d.comb += register.i.p.meta[name].eq(self.i.p.meta[name])
            m.d.comb += [
                register.i.p.meta.route.eq(self.i_route),
                register.i.p.meta.drop.eq(self.i_drop),
            ]
            source = register.o
            source_meta = meta_project(source.p.meta, self._meta)
            source_route, source_drop = source.p.meta.route, source.p.meta.drop
        else:
            source = self.i
            source_meta = source.p.meta
            source_route, source_drop = self.i_route, self.i_drop

        first = Signal(init=1)
        route = Signal.like(self.i_route)
        drop = Signal.like(self.i_drop)
        cur_route = Mux(first, source_route, route)
        cur_drop = Mux(first, source_drop, drop)

        with m.If(source.valid & source.ready):
            m.d.sync += [
                first.eq(source.p.last),
                route.eq(cur_route),
                drop.eq(cur_drop),
            ]
            with m.If(first):
                for code, reason in enumerate(self._drop_reasons, 1):
                    with m.If(source_drop == code):
                        counter = self.o_drops[reason]
                        m.d.sync += counter.eq(counter + 1)

        # The payload goes to every output whatever the verdict (only ``valid`` follows
        # it), so the verdict's logic does not chain with the data into the next layer.
        for port in self.o:
            m.d.comb += [
                port.p.data.eq(source.p.data),
                port.p.keep.eq(source.p.keep),
                port.p.last.eq(source.p.last),
                port.p.meta.eq(source_meta),
            ]
        with m.If(cur_drop != 0):
            m.d.comb += source.ready.eq(1)
        with m.Else():
            for index, port in enumerate(self.o):
                with m.If(cur_route == index):
                    m.d.comb += [
                        port.valid.eq(source.valid),
                        source.ready.eq(port.ready),
                    ]

        return m
