"""The CMAC's link bring-up, and the gate that gives it frames only while the link is up."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from gateware.counters import COUNTER_BITS, event_counter
from gateware.stream import BEAT_BYTES, packet_signature

__all__ = ["CmacLink"]


class CmacLink(wiring.Component):
    """Brings the link up as the CMAC's guide asks and passes frames only while it is up.

    Without auto-negotiation the sequence is: enable the receiver and send
    remote-fault indication (RFI) until the receiver is aligned; then stop
    RFI and enable the transmitter. When alignment is lost, back to the
    first step. All of it runs in the CMAC's TX clock domain (``sync``);
    ``i_rx_aligned`` must already be synchronous to it.

    Frames from ``i`` go to ``o`` (the CMAC's TX) while the link is up. A
    frame that would start while it is down is dropped whole and counted in
    ``o_dropped``, so that the core's transmit path never stalls on a dead
    link; a frame that has started is finished. Latency 0.
    """

    def __init__(self, *, width=BEAT_BYTES):
        super().__init__({
            "i_rx_aligned": In(1),
            "o_rx_enable": Out(1),
            "o_tx_enable": Out(1),
            "o_tx_send_rfi": Out(1),
            "o_up": Out(1),
            "i": In(packet_signature(width=width)),
            "o": Out(packet_signature(width=width)),
            "o_dropped": Out(COUNTER_BITS),
        })

    def elaborate(self, platform):
        m = Module()

        up = Signal()
        m.d.sync += up.eq(self.i_rx_aligned)
        m.d.comb += [
            self.o_up.eq(up),
            self.o_rx_enable.eq(1),
            self.o_tx_enable.eq(up),
            self.o_tx_send_rfi.eq(~up),
        ]

        # What happens to the frame at the input is decided when its first beat is offered,
        # and holds until its last beat has moved (a beat offered to the CMAC stays offered).
        decided = Signal()
        passing = Signal()
        passes = Mux(decided, passing, up)
        with m.If(self.i.valid):
            m.d.sync += [
                decided.eq(~(self.i.ready & self.i.p.last)),
                passing.eq(passes),
            ]

        m.d.comb += [
            self.o.p.eq(self.i.p),
            self.o.valid.eq(self.i.valid & passes),
            self.i.ready.eq(~passes | self.o.ready),
        ]
        dropped = self.i.valid & ~decided & ~passes
        m.d.comb += self.o_dropped.eq(event_counter(m, dropped, "dropped"))
        return m
