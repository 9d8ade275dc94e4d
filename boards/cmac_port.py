"""Everything of one 100G port between its CMAC and its core: the link's bring-up, the
frame gate, the clock-domain crossings, the port's status and its LEDs' signals."""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from gateware.core import CMAC_CLOCK_HZ
from gateware.counters import COUNTER_BITS
from gateware.packet.store_forward import PacketStoreForward
from gateware.stream import BEAT_BYTES, axi_stream_signature

from .async_fifo import RegisteredAsyncFIFO
from .cmac import cmac_signature
from .cmac_ip import INIT_CLOCK_MHZ
from .cmac_link import LINK_STATUS, CmacLink
from .link_recovery import RxResetWatchdog
from .qsfp_module import QsfpModule

__all__ = ["CmacPort", "PORT_STATUS", "PORT_LEDS", "RX_FIFO_DEPTH", "TX_FIFO_DEPTH",
           "STATUS_FIFO_DEPTH", "beat_layout", "blink", "stretch"]

#: Beats of the receive FIFO (CMAC clock → core clock; the core takes a beat every cycle,
#: its receive stream has no ready). While the CMAC delivers beats back to back at
#: 322.27 MHz and the core takes one each 250 MHz cycle, the FIFO grows by 1 - 0.776 =
#: 0.224 beats a CMAC cycle; over longer windows the line bounds the input to 100 Gb/s,
#: 0.606 beats a CMAC cycle, below the 0.776 drained. If the CMAC released B beats above
#: the line's rate (its own buffering, at most one maximum frame: 9600 bytes, 150 beats) the
#: FIFO peaks at 0.224 × B / (1 - 0.606) = 0.57 × B, 85 beats (146 for a 16 KiB frame);
#: 512 is three times that. An overflow (never expected) shows on the attention LED.
RX_FIFO_DEPTH = 512

#: Beats of the transmit FIFO (core clock → CMAC clock). It only carries the stream across:
#: its reader, in the faster clock, keeps it near empty; 16 covers the gray-code pointers'
#: round trip (about 4 cycles each way) so the core's bursts are not throttled.
#: :class:`PacketStoreForward` after it, in the CMAC clock, releases a frame only once
#: whole, so the CMAC is never starved inside a frame whatever the clocks' ratio.
TX_FIFO_DEPTH = 16

#: Entries of the FIFO that carries the port's status from the CMAC clock to ``init``: it is
#: written every cycle it has room and read every cycle, so a few entries are enough.
STATUS_FIFO_DEPTH = 4

#: A port's status, as the board's status line shows it: the link's (see
#: :data:`~boards.cmac_link.LINK_STATUS`) and the frames the core sent while the link was
#: down (dropped whole).
PORT_STATUS = data.StructLayout({
    **{name: field.shape for name, field in LINK_STATUS},
    "tx_dropped": COUNTER_BITS,
})

#: What a port shows on LEDs, each high to light one.
PORT_LEDS = data.StructLayout({
    "cmac_clock": 1,    # the CMAC's TX clock running: blinks about once a second
    "cmac_running": 1,  # the CMAC out of reset (TX and RX)
    "up": 1,            # the link up (frames pass)
    "module": 1,        # the QSFP28 module present; blinks while in reset or low power
    "rx": 1,            # frames received (flickers with traffic)
    "tx": 1,            # frames sent (flickers with traffic)
    "attention": 1,     # since reset: a link down after up, a bad FCS, a CMAC TX underflow
                        # or overflow, or a receive FIFO overflow
})


def blink(m, domain, cycles):
    """A signal toggling every ``cycles`` of a domain (once a second at its frequency)."""
    counter = Signal(range(cycles), name=f"{domain}_blink_counter")
    toggle = Signal(name=f"{domain}_blink")
    with m.If(counter == cycles - 1):
        m.d[domain] += [counter.eq(0), toggle.eq(~toggle)]
    with m.Else():
        m.d[domain] += counter.eq(counter + 1)
    return toggle


def stretch(m, domain, strobe, cycles, name):
    """High for ``cycles`` of a domain after each pulse of ``strobe`` (so that an LED
    shows it)."""
    remaining = Signal(range(cycles + 1), name=f"{name}_remaining")
    with m.If(strobe):
        m.d[domain] += remaining.eq(cycles)
    with m.Elif(remaining != 0):
        m.d[domain] += remaining.eq(remaining - 1)
    return remaining != 0


def beat_layout(width):
    """A beat of the CMAC's streams as it crosses a clock domain: data, keep, last and
    ``user`` (a bad FCS, with ``last``)."""
    return data.StructLayout({"data": 8 * width, "keep": width, "last": 1, "user": 1})


class CmacPort(wiring.Component):
    """One port between its CMAC (``cmac``, the ports of :class:`~boards.cmac.Cmac`
    flipped) and its core (``o_rx``, ``i_tx``: the core's ``rx`` and ``tx``), vendor-free.

    Domains: ``init`` (free-running, the CMAC's init clock), ``cmac`` (the
    CMAC's TX user clock, ``cmac.tx_clk``) and ``sync`` (the core's clock);
    the parent defines them, one ``cmac`` and ``sync`` per port, so that
    nothing here is shared with another port.

    Bring-up: :class:`~boards.qsfp_module.QsfpModule` takes the module out
    of reset (``o_module_reset``), then out of low power (``o_lpmode``), once
    it is present (``i_present``, the pin, synchronized here);
    :class:`~boards.link_recovery.RxResetWatchdog` resets the GT receive
    datapath every 750 ms until the receiver aligns;
    :class:`~boards.cmac_link.CmacLink` enables the transmitter once aligned
    and the peer signals no remote fault, and keeps the link's status.

    Receive: CMAC → receive FIFO (:data:`RX_FIFO_DEPTH`, ``cmac`` → ``sync``)
    → ``o_rx``. Transmit: ``i_tx`` → transmit FIFO (:data:`TX_FIFO_DEPTH`,
    ``sync`` → ``cmac``) → :class:`~gateware.packet.store_forward.PacketStoreForward`
    (the CMAC aborts a frame that pauses) → :class:`~boards.cmac_link.CmacLink`
    (frames only while the link is up; others dropped whole, so ``i_tx`` never
    stalls on a dead link) → CMAC.

    ``o_status`` (:data:`PORT_STATUS`) is in ``init``: it crosses from
    ``cmac`` through an asynchronous FIFO written and read every cycle, a few
    cycles old. ``o_leds`` (:data:`PORT_LEDS`) are levels from several
    domains, for LEDs only.

    Parameters
    ----------
    rsfec : bool
        Clause 91 RS-FEC on (it must match the peer's setting).
    width : int
        Bytes of a beat (the CMAC's: 64).
    init_hz, cmac_hz : int
        The ``init`` and ``cmac`` clocks' frequencies, for the bring-up's timers and the
        LEDs' blinking.
    rx_fifo_depth, tx_fifo_depth : int
        Beats of the two frame FIFOs.
    """

    def __init__(self, *, rsfec=True, width=BEAT_BYTES, init_hz=INIT_CLOCK_MHZ * 1_000_000,
                 cmac_hz=CMAC_CLOCK_HZ, rx_fifo_depth=RX_FIFO_DEPTH, tx_fifo_depth=TX_FIFO_DEPTH):
        if init_hz < 1000:
            raise ValueError(f"init_hz must be at least 1000 (the module's reset is 1 ms), "
                             f"not {init_hz!r}")
        if cmac_hz < 20:
            raise ValueError(f"cmac_hz must be at least 20 (an activity LED's flash is 50 ms), "
                             f"not {cmac_hz!r}")
        self._rsfec = bool(rsfec)
        self._width = width
        self._init_hz = init_hz
        self._cmac_hz = cmac_hz
        self._rx_fifo_depth = rx_fifo_depth
        self._tx_fifo_depth = tx_fifo_depth
        super().__init__({
            "cmac": In(cmac_signature(width=width)),
            "o_rx": Out(axi_stream_signature(width=width, ready=False)),
            "i_tx": In(axi_stream_signature(width=width)),
            "i_present": In(1),
            "o_module_reset": Out(1),
            "o_lpmode": Out(1),
            "o_status": Out(PORT_STATUS),
            "o_leds": Out(PORT_LEDS),
        })

    @property
    def rsfec(self):
        return self._rsfec

    def elaborate(self, platform):
        m = Module()
        cmac = self.cmac
        init_hz = self._init_hz

        # The module: out of reset, then at full power, once present.
        present = Signal()
        m.submodules.present_sync = FFSynchronizer(self.i_present, present, o_domain="init")
        m.submodules.module = module = DomainRenamer("init")(QsfpModule(
            reset_cycles=init_hz // 1000, init_cycles=2 * init_hz))
        m.d.comb += [
            module.i_present.eq(present),
            self.o_module_reset.eq(module.o_reset),
            self.o_lpmode.eq(module.o_lpmode),
        ]
        # The GT receiver reset again every 750 ms until it aligns.
        rx_aligned = Signal()
        m.submodules.rx_aligned_sync = FFSynchronizer(cmac.rx_aligned, rx_aligned,
                                                      o_domain="init")
        m.submodules.rx_watchdog = rx_watchdog = DomainRenamer("init")(
            RxResetWatchdog(interval=init_hz * 3 // 4))
        m.d.comb += [
            rx_watchdog.i_aligned.eq(rx_aligned),
            cmac.rx_datapath_reset.eq(rx_watchdog.o_reset),
        ]

        # The frames, each way through an asynchronous FIFO.
        beat = beat_layout(self._width)
        m.submodules.rx_fifo = rx_fifo = RegisteredAsyncFIFO(
            width=beat.size, depth=self._rx_fifo_depth, w_domain="cmac", r_domain="sync")
        m.submodules.tx_fifo = tx_fifo = RegisteredAsyncFIFO(
            width=beat.size, depth=self._tx_fifo_depth, w_domain="sync", r_domain="cmac")
        m.submodules.tx_buffer = tx_buffer = DomainRenamer("cmac")(
            PacketStoreForward(width=self._width))
        m.submodules.link = link = DomainRenamer("cmac")(CmacLink(width=self._width))
        rx_in, rx_out = Signal(beat), Signal(beat)
        tx_in, tx_out = Signal(beat), Signal(beat)
        rx_overflow = Signal()
        m.d.comb += [
            rx_in.data.eq(cmac.rx.tdata),
            rx_in.keep.eq(cmac.rx.tkeep),
            rx_in.last.eq(cmac.rx.tlast),
            rx_in.user.eq(cmac.rx.tuser),
            rx_fifo.w_data.eq(rx_in),
            rx_fifo.w_en.eq(cmac.rx.tvalid),
            rx_overflow.eq(cmac.rx.tvalid & ~rx_fifo.w_rdy),
            rx_out.eq(rx_fifo.r_data),
            rx_fifo.r_en.eq(1),
            self.o_rx.tvalid.eq(rx_fifo.r_rdy),
            self.o_rx.tdata.eq(rx_out.data),
            self.o_rx.tkeep.eq(rx_out.keep),
            self.o_rx.tlast.eq(rx_out.last),
            self.o_rx.tuser.eq(rx_out.user),

            tx_in.data.eq(self.i_tx.tdata),
            tx_in.keep.eq(self.i_tx.tkeep),
            tx_in.last.eq(self.i_tx.tlast),
            tx_fifo.w_data.eq(tx_in),
            tx_fifo.w_en.eq(self.i_tx.tvalid),
            self.i_tx.tready.eq(tx_fifo.w_rdy),
            tx_out.eq(tx_fifo.r_data),
            tx_buffer.i.valid.eq(tx_fifo.r_rdy),
            tx_buffer.i.p.data.eq(tx_out.data),
            tx_buffer.i.p.keep.eq(tx_out.keep),
            tx_buffer.i.p.last.eq(tx_out.last),
            tx_fifo.r_en.eq(tx_buffer.i.ready),
            link.i.valid.eq(tx_buffer.o.valid),
            link.i.payload.eq(tx_buffer.o.payload),
            tx_buffer.o.ready.eq(link.i.ready),
            cmac.tx.tvalid.eq(link.o.valid),
            cmac.tx.tdata.eq(link.o.p.data),
            cmac.tx.tkeep.eq(link.o.p.keep),
            cmac.tx.tlast.eq(link.o.p.last),
            cmac.tx.tuser.eq(0),
            link.o.ready.eq(cmac.tx.tready),
        ]

        # The link's controls and status.
        m.d.comb += [
            cmac.rx_enable.eq(link.o_rx_enable),
            cmac.tx_enable.eq(link.o_tx_enable),
            cmac.tx_send_rfi.eq(link.o_tx_send_rfi),
            cmac.rsfec.eq(self._rsfec),
            link.i_rx_aligned.eq(cmac.rx_aligned),
            link.i_rx_remote_fault.eq(cmac.rx_remote_fault),
            link.i_rsfec_am_lock.eq(cmac.rsfec_am_lock),
            link.i_rsfec_aligned.eq(cmac.rsfec_aligned),
            link.i_rsfec_hi_ser.eq(cmac.rsfec_hi_ser),
            link.i_rsfec_corrected.eq(cmac.rsfec_corrected),
            link.i_rsfec_uncorrected.eq(cmac.rsfec_uncorrected),
        ]

        # The status, from the CMAC's clock to init.
        m.submodules.status_fifo = status_fifo = RegisteredAsyncFIFO(
            width=PORT_STATUS.size, depth=STATUS_FIFO_DEPTH, w_domain="cmac", r_domain="init")
        status = Signal(PORT_STATUS)
        m.d.comb += [
            *[status[name].eq(link.o_status[name]) for name, _ in LINK_STATUS],
            status.tx_dropped.eq(link.o_dropped),
            status_fifo.w_data.eq(status),
            status_fifo.w_en.eq(1),
            status_fifo.r_en.eq(1),
        ]
        with m.If(status_fifo.r_rdy):
            m.d.init += self.o_status.eq(status_fifo.r_data)

        # The LEDs' signals.
        attention = Signal()
        with m.If(cmac.rx_bad_fcs | cmac.tx_underflow | cmac.tx_overflow | rx_overflow
                  | (link.o_status.downs != 0)):
            m.d.cmac += attention.eq(1)
        activity = self._cmac_hz // 20
        leds = self.o_leds
        m.d.comb += [
            leds.cmac_clock.eq(blink(m, "cmac", self._cmac_hz)),
            leds.cmac_running.eq(~ResetSignal("cmac") & ~cmac.rx_reset),
            leds.up.eq(link.o_up),
            leds.module.eq(present & (module.o_ready | blink(m, "init", init_hz // 4))),
            leds.rx.eq(stretch(m, "cmac", cmac.rx.tvalid & cmac.rx.tlast, activity,
                               "rx_activity")),
            leds.tx.eq(stretch(m, "cmac", cmac.tx.tvalid & cmac.tx.tready & cmac.tx.tlast,
                               activity, "tx_activity")),
            leds.attention.eq(attention),
        ]
        return m
