"""The VCU118 top: the vendor-free core on one QSFP28 cage's CMAC, with clocks, resets,
the link bring-up, the addresses from the DIP switches and status LEDs."""

import inspect

from amaranth import *
from amaranth.lib import data, io
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer
from amaranth.lib.fifo import AsyncFIFOBuffered
from amaranth.lib.wiring import connect

from gateware.core import CMAC_CLOCK_HZ, NetworkCore
from gateware.counters import COUNTER_BITS
from gateware.examples.event_core import EventCore
from gateware.packet.store_forward import PacketStoreForward
from gateware.stream import BEAT_BYTES

from .board_address import BoardAddress
from .cmac import Cmac
from .cmac_ip import INIT_CLOCK_MHZ
from .cmac_link import LINK_STATUS, CmacLink
from .link_recovery import RxResetWatchdog
from .qsfp_module import QsfpModule
from .status_uart import StatusUart

__all__ = ["VCU118Top", "LEDS", "BOARD_STATUS", "UART_BAUD", "CORE_CLOCK_HZ", "RX_FIFO_DEPTH",
           "TX_FIFO_DEPTH"]

#: What each user LED shows, LED 0 first.
LEDS = (
    "125 MHz board clock running (blinks about once a second)",
    "CMAC TX clock running (blinks about once a second): the GTs are up",
    "CMAC out of reset",
    "link up: the receiver is aligned, the peer signals no remote fault, the transmitter is on",
    "QSFP28 module present (blinks while it is in reset or low power)",
    "frames received (flickers with traffic)",
    "frames sent (flickers with traffic)",
    "attention since reset: the link went down after being up, a frame with a bad FCS "
    "received, a CMAC TX underflow or overflow, or the receive FIFO overflowed",
)

#: The core's clock: the 125 MHz board clock × 8 / 4 through an MMCM (VCO 1 GHz). A beat
#: of 512 bits a cycle is 128 Gb/s, above the line's 100 Gb/s.
CORE_CLOCK_HZ = 250_000_000
MMCM = {"CLKIN1_PERIOD": 8.0, "CLKFBOUT_MULT_F": 8.0, "DIVCLK_DIVIDE": 1,
        "CLKOUT0_DIVIDE_F": 4.0}

#: Beats of the receive FIFO (CMAC clock → core clock; the core takes a beat every cycle,
#: its receive stream has no ready). While the CMAC delivers beats back to back at
#: 322.27 MHz and the core takes one each 250 MHz cycle, the FIFO grows by 1 - 0.776 =
#: 0.224 beats a CMAC cycle; over longer windows the line bounds the input to 100 Gb/s,
#: 0.606 beats a CMAC cycle, below the 0.776 drained. If the CMAC released B beats above
#: the line's rate (its own buffering, at most one maximum frame: 9600 bytes, 150 beats) the
#: FIFO peaks at 0.224 × B / (1 - 0.606) = 0.57 × B, 85 beats (146 for a 16 KiB frame);
#: 512 is three times that. An overflow (never expected) shows on LED 7.
RX_FIFO_DEPTH = 512

#: Beats of the transmit FIFO (core clock → CMAC clock). It only carries the stream across:
#: its reader, in the faster clock, keeps it near empty; 16 covers the gray-code pointers'
#: round trip (about 4 cycles each way) so the core's bursts are not throttled.
#: :class:`PacketStoreForward` after it, in the CMAC clock, releases a frame only once
#: whole, so the CMAC is never starved inside a frame whatever the clocks' ratio.
TX_FIFO_DEPTH = 16

#: Cycles of the board clock the init domain stays in reset after configuration (1 ms).
POWER_ON_CYCLES = INIT_CLOCK_MHZ * 1000

#: The VCU118's GPIO DIP switches (GPIO_DIP_SW0-3), added to the IP's and MAC's last octet.
ADDRESS_SWITCHES = 4

#: The status line on the USB-UART once a second: the link's (see :data:`LINK_STATUS`)
#: and the frames the core sent while the link was down (dropped whole).
BOARD_STATUS = data.StructLayout({
    **{name: field.shape for name, field in LINK_STATUS},
    "tx_dropped": COUNTER_BITS,
})

#: Baud rate of the status line.
UART_BAUD = 115_200

#: What drives the core's user request ports: nothing (the built-in generator, started
#: through the CM, is the only RoCE source), or the example event source
#: (:class:`~gateware.examples.event_core.EventCore`).
SOURCES = {"generator": NetworkCore, "example": EventCore}

#: The core's address parameters, which :class:`BoardAddress` also takes.
ADDRESS_PARAMETERS = ("mac", "ip", "netmask", "gateway")


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


class VCU118Top(Elaboratable):
    """The endpoint on QSFP28 cage ``qsfp`` of a VCU118.

    Domains: ``init`` runs on the 125 MHz board clock (the CMAC's init and
    DRP clock); it is reset for 1 ms after configuration and while CPU_RESET
    (SW5) is pressed, and its reset resets the CMAC. ``cmac`` is the CMAC's
    TX user clock (322.265625 MHz), in which its receive side runs too (see
    :class:`~boards.cmac.Cmac`); the link's bring-up, the frame gate, the
    status line and the LEDs' activity are there. ``sync``, where the core
    runs, is 250 MHz from an MMCM on the board clock (:data:`CORE_CLOCK_HZ`:
    a 512-bit beat a cycle is 128 Gb/s, above the line), as other 100G NICs
    run their cores (corundum: 250 MHz behind FIFOs at the MAC). Frames cross
    between the two in asynchronous FIFOs (:data:`RX_FIFO_DEPTH`,
    :data:`TX_FIFO_DEPTH`); the other crossings (the module-present pin and
    ``stat_rx_aligned`` into ``init``, resets, the DIP switches) go through
    :mod:`amaranth.lib.cdc` synchronizers.

    Link bring-up: :class:`~boards.qsfp_module.QsfpModule` takes the module
    out of reset, then out of low power, once it is present;
    :class:`~boards.link_recovery.RxResetWatchdog` resets the GT receive
    datapath every 750 ms until the receiver aligns;
    :class:`~boards.cmac_link.CmacLink` enables the transmitter once aligned
    and the peer signals no remote fault, and keeps the link's status.
    ``cmac`` and ``sync`` are reset until the CMAC's TX user reset falls
    (``sync`` also until its MMCM locks); the RX user reset
    (asserted again when the receive GTs lose the signal) does not reset the
    core, whose QPs survive a pulled cable.

    Receive: CMAC → receive FIFO → core. Transmit: core → transmit FIFO →
    :class:`~gateware.packet.store_forward.PacketStoreForward`
    (the CMAC aborts a frame that pauses) → :class:`~boards.cmac_link.CmacLink`
    (frames only while the link is up) → CMAC. With ``source="generator"`` the
    built-in generator is the only source of RoCE traffic: the user
    work-request port is idle and completions are drained; with
    ``source="example"`` the example event source drives it (see
    :data:`SOURCES`). The addresses are the build-time ones with the
    GPIO DIP switches (GPIO_DIP_SW0-3, read at reset) added to the last octet of the IP
    and MAC address (:class:`~boards.board_address.BoardAddress`). LEDs: see
    :data:`LEDS`; the link's status (:data:`BOARD_STATUS`) is a line of text
    once a second on the USB-UART (:class:`~boards.status_uart.StatusUart`,
    115,200 baud, 8N1).

    Parameters
    ----------
    qsfp : int
        The cage: 1 or 2.
    rsfec : bool
        Clause 91 RS-FEC on (it must match the peer's setting).
    source : str
        A key of :data:`SOURCES`: what drives the core's user request ports.
    **core :
        Build parameters of :class:`~gateware.core.NetworkCore` (addresses, QPs, ...),
        and with ``source="example"`` those of :class:`EventCore`.
    """

    def __init__(self, *, qsfp=1, rsfec=True, source="generator", **core):
        if qsfp not in (1, 2):
            raise ValueError(f"The VCU118 has QSFP28 cages 1 and 2, not {qsfp!r}")
        if source not in SOURCES:
            raise ValueError(f"Source must be one of {', '.join(SOURCES)}, not {source!r}")
        self.qsfp = qsfp
        self.rsfec = bool(rsfec)
        self.source = source
        self.core = SOURCES[source](clock_hz=CORE_CLOCK_HZ, **core)
        defaults = inspect.signature(NetworkCore).parameters
        self.address = BoardAddress(
            switches=ADDRESS_SWITCHES,
            **{name: core.get(name, defaults[name].default) for name in ADDRESS_PARAMETERS})

    def elaborate(self, platform):
        m = Module()
        init_hz = INIT_CLOCK_MHZ * 1_000_000

        # The init domain: board clock; power-on and button reset.
        m.submodules.clk125 = clk125 = io.Buffer("i", platform.request("clk125", 0, dir="-"))
        m.submodules.button = button = io.Buffer("i", platform.request("cpu_reset", 0, dir="-"))
        m.domains.init = ClockDomain("init")
        m.domains.power_on = ClockDomain("power_on", reset_less=True)
        m.submodules.init_bufg = Instance("BUFG", i_I=clk125.i, o_O=ClockSignal("init"))
        m.d.comb += ClockSignal("power_on").eq(ClockSignal("init"))
        powering_on = Signal(range(POWER_ON_CYCLES + 1), init=POWER_ON_CYCLES)
        with m.If(powering_on != 0):
            m.d.power_on += powering_on.eq(powering_on - 1)
        m.submodules.init_reset = ResetSynchronizer(
            arst=button.i | (powering_on != 0), domain="init")

        # The CMAC, and the cmac domain on its TX user clock.
        cage = platform.request("qsfp", self.qsfp, dir="-")
        refclk = platform.request("qsfp_refclk", 0, dir="-")
        m.submodules.cmac = cmac = Cmac(rx_pins=cage.rx, tx_pins=cage.tx, refclk_pins=refclk)
        m.domains.cmac = ClockDomain("cmac")
        m.d.comb += ClockSignal("cmac").eq(cmac.tx_clk)
        # The receive side's reset (its GTs lose lock when the cable goes) leaves the core
        # and its QPs alone: the CMAC delivers no frames meanwhile.
        m.submodules.cmac_reset = ResetSynchronizer(
            arst=cmac.tx_reset | ResetSignal("init"), domain="cmac")

        # The sync domain, where the core runs: 250 MHz from the board clock's MMCM,
        # reset until it locks and while the CMAC's domain is.
        core_clk, feedback, locked = Signal(), Signal(), Signal()
        m.submodules.core_mmcm = Instance(
            "MMCME4_BASE", **{f"p_{name}": value for name, value in MMCM.items()},
            i_CLKIN1=ClockSignal("init"), i_CLKFBIN=feedback, o_CLKFBOUT=feedback,
            o_CLKOUT0=core_clk, o_LOCKED=locked, i_RST=0, i_PWRDWN=0)
        m.domains.sync = ClockDomain("sync")
        m.submodules.core_bufg = Instance("BUFG", i_I=core_clk, o_O=ClockSignal("sync"))
        m.submodules.sync_reset = ResetSynchronizer(
            arst=~locked | cmac.tx_reset | ResetSignal("init"), domain="sync")
        # The module: selected; out of reset, then at full power, once present.
        m.submodules.modsel = modsel = io.Buffer("o", cage.modsel)
        m.submodules.module_reset = module_reset = io.Buffer("o", cage.reset)
        m.submodules.lpmode = lpmode = io.Buffer("o", cage.lpmode)
        m.submodules.present = present_pin = io.Buffer("i", cage.present)
        present = Signal()
        m.submodules.present_sync = FFSynchronizer(present_pin.i, present, o_domain="init")
        m.submodules.module = module = DomainRenamer("init")(QsfpModule())
        m.d.comb += [
            module.i_present.eq(present),
            modsel.o.eq(1),
            module_reset.o.eq(module.o_reset),
            lpmode.o.eq(module.o_lpmode),
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

        # The core between the CMAC's streams, each through an asynchronous FIFO.
        m.submodules.core = core = self.core
        beat = beat_layout(BEAT_BYTES)
        m.submodules.rx_fifo = rx_fifo = AsyncFIFOBuffered(
            width=beat.size, depth=RX_FIFO_DEPTH, w_domain="cmac", r_domain="sync")
        m.submodules.tx_fifo = tx_fifo = AsyncFIFOBuffered(
            width=beat.size, depth=TX_FIFO_DEPTH, w_domain="sync", r_domain="cmac")
        m.submodules.tx_buffer = tx_buffer = DomainRenamer("cmac")(PacketStoreForward())
        m.submodules.link = link = DomainRenamer("cmac")(CmacLink())
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

            tx_in.data.eq(core.tx.tdata),
            tx_in.keep.eq(core.tx.tkeep),
            tx_in.last.eq(core.tx.tlast),
            tx_fifo.w_data.eq(tx_in),
            tx_fifo.w_en.eq(core.tx.tvalid),
            core.tx.tready.eq(tx_fifo.w_rdy),
            tx_out.eq(tx_fifo.r_data),
        ]
        m.d.comb += [
            cmac.rx_enable.eq(link.o_rx_enable),
            cmac.tx_enable.eq(link.o_tx_enable),
            cmac.tx_send_rfi.eq(link.o_tx_send_rfi),
            cmac.rsfec.eq(self.rsfec),
            link.i_rx_aligned.eq(cmac.rx_aligned),
            link.i_rx_remote_fault.eq(cmac.rx_remote_fault),
            link.i_rsfec_am_lock.eq(cmac.rsfec_am_lock),
            link.i_rsfec_aligned.eq(cmac.rsfec_aligned),
            link.i_rsfec_hi_ser.eq(cmac.rsfec_hi_ser),
            link.i_rsfec_corrected.eq(cmac.rsfec_corrected),
            link.i_rsfec_uncorrected.eq(cmac.rsfec_uncorrected),

            core.rx.tvalid.eq(rx_fifo.r_rdy),
            core.rx.tdata.eq(rx_out.data),
            core.rx.tkeep.eq(rx_out.keep),
            core.rx.tlast.eq(rx_out.last),
            core.rx.tuser.eq(rx_out.user),

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
        if self.source == "generator":
            # No user logic: the generator's completions come out of the user completion
            # port (the example source takes them itself).
            m.d.comb += core.completion.ready.eq(1)

        # The addresses, from the switches.
        m.submodules.address = address = self.address
        switches = Signal(ADDRESS_SWITCHES)
        for n in range(ADDRESS_SWITCHES):
            m.submodules[f"switch{n}"] = switch = io.Buffer(
                "i", platform.request("switch", n, dir="-"))
            m.d.comb += switches[n].eq(switch.i)
        m.submodules.switches_sync = FFSynchronizer(switches, address.i_switches,
                                                    o_domain="sync")
        connect(m, address.o_config, core.config)

        # The status line on the USB-UART.
        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_tx = uart_tx = io.Buffer("o", uart.tx)
        m.submodules.uart_rts = uart_rts = io.Buffer("o", uart.rts)
        m.submodules.status_uart = status_uart = DomainRenamer("cmac")(StatusUart(
            BOARD_STATUS, divisor=CMAC_CLOCK_HZ // UART_BAUD, interval=CMAC_CLOCK_HZ))
        m.d.comb += [
            *[status_uart.i[name].eq(link.o_status[name]) for name, _ in LINK_STATUS],
            status_uart.i.tx_dropped.eq(link.o_dropped),
            uart_tx.o.eq(status_uart.o_tx),
            uart_rts.o.eq(0),
        ]

        # Status LEDs.
        attention = Signal()
        with m.If(cmac.rx_bad_fcs | cmac.tx_underflow | cmac.tx_overflow | rx_overflow
                  | (link.o_status.downs != 0)):
            m.d.cmac += attention.eq(1)
        activity = CMAC_CLOCK_HZ // 20
        leds = [
            blink(m, "init", init_hz),
            blink(m, "cmac", CMAC_CLOCK_HZ),
            ~ResetSignal("cmac") & ~cmac.rx_reset,
            link.o_up,
            present & (module.o_ready | blink(m, "init", init_hz // 4)),
            stretch(m, "cmac", cmac.rx.tvalid & cmac.rx.tlast, activity, "rx_activity"),
            stretch(m, "cmac", cmac.tx.tvalid & cmac.tx.tready & cmac.tx.tlast, activity,
                    "tx_activity"),
            attention,
        ]
        for index, value in enumerate(leds):
            m.submodules[f"led{index}"] = led = io.Buffer("o", platform.request("led", index,
                                                                                dir="-"))
            m.d.comb += led.o.eq(value)
        return m
