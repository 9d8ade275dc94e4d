"""The CMAC's link state: its bring-up controls, the gate that gives it frames only while
the link is up, and the link's status (transitions, RS-FEC)."""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from gateware.counters import COUNTER_BITS, event_counter
from gateware.stream import BEAT_BYTES, packet_signature

__all__ = ["CmacLink", "LINK_STATUS", "RSFEC_LANES"]

#: RS-FEC lanes of CAUI-4 (one alignment-marker lock per lane).
RSFEC_LANES = 4

#: What :class:`CmacLink` reports about the link.
LINK_STATUS = data.StructLayout({
    "up": 1,                          # aligned, no remote fault: frames pass
    "rx_aligned": 1,                  # the CMAC's stat_rx_aligned
    "remote_fault": 1,                # the peer signals that it does not receive us
    "rsfec_am_lock": RSFEC_LANES,     # RS-FEC alignment-marker lock, per lane
    "rsfec_aligned": 1,               # RS-FEC lane alignment
    "rsfec_hi_ser": 1,                # RS-FEC symbol error rate above threshold
    "ups": COUNTER_BITS,              # transitions down → up since reset
    "downs": COUNTER_BITS,            # transitions up → down since reset
    "rsfec_corrected": COUNTER_BITS,  # RS-FEC codewords corrected
    "rsfec_uncorrected": COUNTER_BITS,  # RS-FEC codewords with errors it could not correct
})


class CmacLink(wiring.Component):
    """Brings the link up as the CMAC's guide (PG203, bring-up without auto-negotiation)
    asks, passes frames only while it is up, and keeps the link's status.

    Bring-up: the receiver is enabled throughout; until it is aligned the
    transmitter sends remote-fault indication (RFI), telling the peer that we
    do not receive it. Once aligned, RFI stops; the transmitter is enabled
    (``o_tx_enable``, and the link is up) once the peer does not signal remote
    fault either (``i_rx_remote_fault``: it does not receive us yet). When
    either goes, back to the start. Retrying the receiver's reset while it is
    not aligned is :class:`~boards.link_recovery.RxResetWatchdog`'s job.

    Everything runs in the CMAC's TX clock domain (``sync``); the ``i_*``
    status inputs must already be synchronous to it. ``o_status``: see
    :data:`LINK_STATUS`; its flags follow the inputs a cycle later, its
    counters count the transitions of ``up`` and the RS-FEC codeword strobes.

    Frames from ``i`` go to ``o`` (the CMAC's TX) while the link is up. A
    frame that would start while it is down is dropped whole and counted in
    ``o_dropped``, so that the core's transmit path never stalls on a dead
    link; a frame that has started is finished. Latency 0.
    """

    def __init__(self, *, width=BEAT_BYTES):
        super().__init__({
            "i_rx_aligned": In(1),
            "i_rx_remote_fault": In(1),
            "i_rsfec_am_lock": In(RSFEC_LANES),
            "i_rsfec_aligned": In(1),
            "i_rsfec_hi_ser": In(1),
            "i_rsfec_corrected": In(1),
            "i_rsfec_uncorrected": In(1),
            "o_rx_enable": Out(1),
            "o_tx_enable": Out(1),
            "o_tx_send_rfi": Out(1),
            "o_up": Out(1),
            "o_status": Out(LINK_STATUS),
            "i": In(packet_signature(width=width)),
            "o": Out(packet_signature(width=width)),
            "o_dropped": Out(COUNTER_BITS),
        })

    def elaborate(self, platform):
        m = Module()

        aligned = Signal()
        remote_fault = Signal()
        up = Signal()
        becomes_up = self.i_rx_aligned & ~self.i_rx_remote_fault
        m.d.sync += [
            aligned.eq(self.i_rx_aligned),
            remote_fault.eq(self.i_rx_remote_fault),
            up.eq(becomes_up),
        ]
        m.d.comb += [
            self.o_up.eq(up),
            self.o_rx_enable.eq(1),
            self.o_tx_enable.eq(up),
            self.o_tx_send_rfi.eq(~aligned),
        ]

        status = self.o_status
        m.d.sync += [
            status.rsfec_am_lock.eq(self.i_rsfec_am_lock),
            status.rsfec_aligned.eq(self.i_rsfec_aligned),
            status.rsfec_hi_ser.eq(self.i_rsfec_hi_ser),
        ]
        m.d.comb += [
            status.up.eq(up),
            status.rx_aligned.eq(aligned),
            status.remote_fault.eq(remote_fault),
            status.ups.eq(event_counter(m, becomes_up & ~up, "link_ups")),
            status.downs.eq(event_counter(m, ~becomes_up & up, "link_downs")),
            status.rsfec_corrected.eq(event_counter(m, self.i_rsfec_corrected,
                                                    "rsfec_corrected")),
            status.rsfec_uncorrected.eq(event_counter(m, self.i_rsfec_uncorrected,
                                                      "rsfec_uncorrected")),
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
