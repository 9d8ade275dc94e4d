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

        # The first input with a packet waiting, in order of preference: served+1,
        # served+2, ..., served (input 0, 1, ... with ``priority``). The order is a
        # constant per value of ``served``, so each bit of the choice is one function of
        # ``served`` and the valids, with no arithmetic on ``served`` before it.
        choice = Signal(range(count))

        def first_valid(order):
            for index in reversed(order):
                with m.If(self.i[index].valid):
                    m.d.comb += choice.eq(index)

        if self._priority:
            first_valid(range(count))
        else:
            with m.Switch(served):
                for last in range(count):
                    # (the last case as the default: ``served`` never goes past it)
                    with m.Case(last) if last < count - 1 else m.Default():
                        first_valid([(last + 1 + offset) % count for offset in range(count)])

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
