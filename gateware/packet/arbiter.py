from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES, packet_signature

__all__ = ["PacketArbiter"]


class PacketArbiter(wiring.Component):
    """Merges several packet streams into one, a whole packet at a time.

    Between packets it grants the first input with a packet waiting, in
    round-robin order starting after the input it served last (``priority``:
    always from input 0, for a control path that must not wait behind bulk
    data). The choice is made in the cycle the packet's first beat is first
    offered on ``o`` and holds from then until its last beat is taken, so a
    beat offered and not yet taken never changes, even when an input that
    would be preferred becomes valid meanwhile. Latency 0 (``o`` follows the
    granted input combinationally), no idle cycle between packets.
    """

    def __init__(self, meta, *, inputs, priority=False, width=BEAT_BYTES):
        if not isinstance(inputs, int) or inputs < 1:
            raise ValueError(f"An arbiter needs at least one input, not {inputs!r}")
        self._inputs = inputs
        self._priority = bool(priority)
        super().__init__({
            "i": In(packet_signature(meta, width=width)).array(inputs),
            "o": Out(packet_signature(meta, width=width)),
        })

    def elaborate(self, platform):
        m = Module()
        count = self._inputs

        free = Signal(init=1)              # between packets, nothing offered yet: may choose
        grant = Signal(range(count))       # input of the packet in flight
        served = Signal(range(count))      # input served last, for round-robin

        # Candidates in order of preference: served+1, served+2, ..., served.
        choice = Signal(range(count))
        order = range(count) if self._priority else None
        for offset in reversed(range(count)):
            if order is not None:
                index = C(offset, range(count))
            else:
                index = Signal(range(count), name=f"candidate{offset}")
                m.d.comb += index.eq(Mux(served + 1 + offset >= count,
                                         served + 1 + offset - count, served + 1 + offset))
            with m.If(Array(port.valid for port in self.i)[index]):
                m.d.comb += choice.eq(index)

        current = Mux(free, choice, grant)
        for index, port in enumerate(self.i):
            with m.If(current == index):
                m.d.comb += [
                    self.o.valid.eq(port.valid),
                    self.o.p.eq(port.p),
                    port.ready.eq(self.o.ready),
                ]

        with m.If(self.o.valid):
            m.d.sync += grant.eq(current)
            with m.If(self.o.ready):
                m.d.sync += [
                    free.eq(self.o.p.last),
                    served.eq(current),
                ]
            with m.Else():
                m.d.sync += free.eq(0)

        return m
