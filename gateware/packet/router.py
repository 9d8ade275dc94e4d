from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..counters import counters_layout
from ..stream import BEAT_BYTES, packet_signature

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
    """

    def __init__(self, meta, *, outputs, drop_reasons, width=BEAT_BYTES):
        if not isinstance(outputs, int) or outputs < 1:
            raise ValueError(f"A router needs at least one output, not {outputs!r}")
        drop_reasons = tuple(drop_reasons)
        if len(set(drop_reasons)) != len(drop_reasons) or not all(
                isinstance(reason, str) and reason.isidentifier() for reason in drop_reasons):
            raise ValueError(f"Drop reasons must be distinct identifiers, not {drop_reasons!r}")
        self._drop_reasons = drop_reasons
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

        first = Signal(init=1)
        route = Signal.like(self.i_route)
        drop = Signal.like(self.i_drop)
        cur_route = Mux(first, self.i_route, route)
        cur_drop = Mux(first, self.i_drop, drop)

        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [
                first.eq(self.i.p.last),
                route.eq(cur_route),
                drop.eq(cur_drop),
            ]
            with m.If(first):
                for code, reason in enumerate(self._drop_reasons, 1):
                    with m.If(self.i_drop == code):
                        counter = self.o_drops[reason]
                        m.d.sync += counter.eq(counter + 1)

        with m.If(cur_drop != 0):
            m.d.comb += self.i.ready.eq(1)
        with m.Else():
            for index, port in enumerate(self.o):
                m.d.comb += port.p.eq(self.i.p)
                with m.If(cur_route == index):
                    m.d.comb += [
                        port.valid.eq(self.i.valid),
                        self.i.ready.eq(port.ready),
                    ]

        return m
