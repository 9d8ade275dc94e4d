"""The VCU118 tops: the vendor-free core on one QSFP28 cage's CMAC (:class:`VCU118Top`), or
a core on each of the two cages (:class:`VCU118DualTop`), with the board's clocks, resets,
the addresses from the DIP switches, the status line and the LEDs."""

from amaranth import *
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer

from .cmac_ip import INIT_CLOCK_MHZ, cmac_ip_name
from .cmac_port import PORT_STATUS, RX_FIFO_DEPTH, TX_FIFO_DEPTH, blink
from .status_uart import PortStatusUart, StatusUart
from .vcu118_port import ADDRESS_SWITCHES, CORE_CLOCK_HZ, VCU118Port

__all__ = ["VCU118Top", "VCU118DualTop", "LEDS", "DUAL_LEDS", "BOARD_STATUS", "UART_BAUD",
           "CORE_CLOCK_HZ", "RX_FIFO_DEPTH", "TX_FIFO_DEPTH", "PORT2_ADDRESS", "PORT2_REFCLK"]

#: What each user LED shows, LED 0 first (:class:`VCU118Top`).
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

#: What each user LED shows, LED 0 first (:class:`VCU118DualTop`).
DUAL_LEDS = (
    "125 MHz board clock running (blinks about once a second)",
    "port 1 (QSFP1) link up",
    "port 2 (QSFP2) link up",
    "port 1's QSFP28 module present (blinks while it is in reset or low power)",
    "port 2's QSFP28 module present (blinks while it is in reset or low power)",
    "port 1 frames received or sent (flickers with traffic)",
    "port 2 frames received or sent (flickers with traffic)",
    "attention since reset on either port (as LED 7 of the single-port top)",
)

#: The core's clock: the 125 MHz board clock × 8 / 4 through an MMCM (VCO 1 GHz).
MMCM = {"CLKIN1_PERIOD": 8.0, "CLKFBOUT_MULT_F": 8.0, "DIVCLK_DIVIDE": 1,
        "CLKOUT0_DIVIDE_F": 4.0}

#: Cycles of the board clock the init domain stays in reset after configuration (1 ms).
POWER_ON_CYCLES = INIT_CLOCK_MHZ * 1000

#: The status line on the USB-UART once a second (for each port): the link's (see
#: :data:`~boards.cmac_link.LINK_STATUS`) and the frames the core sent while the link was
#: down (dropped whole).
BOARD_STATUS = PORT_STATUS

#: Baud rate of the status line.
UART_BAUD = 115_200

#: The default addresses of the dual top's second port (QSFP2), beside the core's defaults
#: (02:00:00:00:00:02, 10.77.0.2) on the first: its own MAC address and a subnet of its own,
#: so that a host with a NIC port cabled to each cage routes each subnet to its own port.
PORT2_ADDRESS = {"mac": "02:00:00:00:01:02", "ip": "10.77.1.2"}

#: The reference clock of the dual top's QSFP2 CMAC: quad 232's own MGTREFCLK0 (R9/R8, from
#: U104), as corundum's two-CMAC VCU118 design takes it (fpga/mqnic/VCU118/fpga_100g/fpga.xdc
#: and rtl/fpga.v at commit 1bb5d8ab: ``qsfp2_mgt_refclk_0`` into ``cmac_usplus_1``). Each
#: CMAC IP buffers its reference clock itself (its own IBUFDS_GTE4), so two cannot share
#: quad 231's pins, which the single-port top uses for either cage.
PORT2_REFCLK = 1


class _Board(Elaboratable):
    """The board around one or more :class:`~boards.vcu118_port.VCU118Port`: the clocks,
    resets, DIP switches, status line and LEDs. Subclasses name the ports and map the LEDs.

    Domains: ``init`` runs on the 125 MHz board clock (the CMAC's init and DRP
    clock); it is reset for 1 ms after configuration and while CPU_RESET (SW5)
    is pressed, and its reset resets the CMACs; the status line runs there.
    The core's clock is 250 MHz from an MMCM on the board clock
    (:data:`CORE_CLOCK_HZ`), as other 100G NICs run their cores (corundum:
    250 MHz behind FIFOs at the MAC). Each port has two domains of its own,
    renamed from its ``cmac`` and ``sync``: one on its CMAC's TX user clock
    (322.265625 MHz, in which the CMAC's receive side runs too), reset until
    that CMAC's TX user reset falls, and one on the core's clock, reset until
    the MMCM locks and while the port's own CMAC domain is. A port's resets
    never reach another port. The RX user reset (asserted again when the
    receive GTs lose the signal) resets no core: QPs survive a pulled cable.
    """

    def ports(self):
        """``(submodule name, port, cmac domain, sync domain)`` of each port."""
        raise NotImplementedError

    def status_uart(self, divisor, interval):
        """The status line's component and the ports' records it shows (in ``init``)."""
        raise NotImplementedError

    def leds(self, m, ports):
        """The LEDs' values, LED 0 first (``ports`` as :meth:`ports` gives them)."""
        raise NotImplementedError

    @property
    def cmac_ips(self):
        """``(cage, IP module name)`` of each port's CMAC."""
        return [(port.qsfp, port.ip_name) for _, port, _, _ in self.ports()]

    @property
    def clock_crossing_fifos(self):
        """The hierarchical names of the asynchronous FIFOs between clocks."""
        return [f"{name}/cmac_port/{fifo}" for name, *_ in self.ports()
                for fifo in ("rx_fifo", "tx_fifo", "status_fifo")]

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

        # The cores' clock: 250 MHz from the board clock's MMCM.
        mmcm_out, feedback, locked, core_clk = Signal(), Signal(), Signal(), Signal()
        m.submodules.core_mmcm = Instance(
            "MMCME4_BASE", **{f"p_{name}": value for name, value in MMCM.items()},
            i_CLKIN1=ClockSignal("init"), i_CLKFBIN=feedback, o_CLKFBOUT=feedback,
            o_CLKOUT0=mmcm_out, o_LOCKED=locked, i_RST=0, i_PWRDWN=0)
        m.submodules.core_bufg = Instance("BUFG", i_I=mmcm_out, o_O=core_clk)

        # The DIP switches, for every port's addresses.
        switches = Signal(ADDRESS_SWITCHES)
        for n in range(ADDRESS_SWITCHES):
            m.submodules[f"switch{n}"] = switch = io.Buffer(
                "i", platform.request("switch", n, dir="-"))
            m.d.comb += switches[n].eq(switch.i)

        # The ports, each in its own two domains.
        ports = self.ports()
        for name, port, cmac, sync in ports:
            renames = {domain: to for domain, to in [("cmac", cmac), ("sync", sync)]
                       if domain != to}
            m.submodules[name] = DomainRenamer(renames)(port) if renames else port
            m.domains += [ClockDomain(cmac), ClockDomain(sync)]
            m.d.comb += [
                ClockSignal(cmac).eq(port.o_tx_clk),
                ClockSignal(sync).eq(core_clk),
                port.i_switches.eq(switches),
            ]
            m.submodules[f"{cmac}_reset"] = ResetSynchronizer(
                arst=port.o_tx_reset | ResetSignal("init"), domain=cmac)
            m.submodules[f"{sync}_reset"] = ResetSynchronizer(
                arst=~locked | port.o_tx_reset | ResetSignal("init"), domain=sync)

        # The status line on the USB-UART.
        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_tx = uart_tx = io.Buffer("o", uart.tx)
        m.submodules.uart_rts = uart_rts = io.Buffer("o", uart.rts)
        status_uart, records = self.status_uart(divisor=init_hz // UART_BAUD, interval=init_hz)
        m.submodules.status_uart = status_uart = DomainRenamer("init")(status_uart)
        m.d.comb += [
            *[record.eq(port.o_status) for record, (_, port, _, _) in zip(records, ports,
                                                                          strict=True)],
            uart_tx.o.eq(status_uart.o_tx),
            uart_rts.o.eq(0),
        ]

        # Status LEDs.
        for index, value in enumerate(self.leds(m, ports)):
            m.submodules[f"led{index}"] = led = io.Buffer("o", platform.request("led", index,
                                                                                dir="-"))
            m.d.comb += led.o.eq(value)
        return m


class VCU118Top(_Board):
    """The endpoint on QSFP28 cage ``qsfp`` of a VCU118 (see :class:`_Board`; the port is
    :class:`~boards.vcu118_port.VCU118Port`, in the domains ``cmac`` and ``sync``).

    The port's CMAC takes its reference clock from quad 231's MGTREFCLK0 (the
    QSFP Si570, 156.25 MHz from power-up), which also serves quad 232. LEDs:
    see :data:`LEDS`; the link's status (:data:`BOARD_STATUS`) is a line of
    text once a second on the USB-UART (:class:`~boards.status_uart.StatusUart`,
    115,200 baud, 8N1).

    Parameters
    ----------
    qsfp : int
        The cage: 1 or 2.
    **port :
        Parameters of :class:`~boards.vcu118_port.VCU118Port`: ``rsfec`` and the core's
        build parameters (addresses, QPs, ...).
    """

    def __init__(self, *, qsfp=1, **port):
        self.port = VCU118Port(qsfp=qsfp, refclk=0, ip_name=cmac_ip_name(0), **port)
        self.core = self.port.core
        self.address = self.port.address

    @property
    def qsfp(self):
        return self.port.qsfp

    @property
    def rsfec(self):
        return self.port.rsfec

    def ports(self):
        return [("port", self.port, "cmac", "sync")]

    def status_uart(self, divisor, interval):
        uart = StatusUart(BOARD_STATUS, divisor=divisor, interval=interval)
        return uart, [uart.i]

    def leds(self, m, ports):
        leds = self.port.o_leds
        return [blink(m, "init", INIT_CLOCK_MHZ * 1_000_000), leds.cmac_clock,
                leds.cmac_running, leds.up, leds.module, leds.rx, leds.tx, leds.attention]


class VCU118DualTop(_Board):
    """An endpoint on each QSFP28 cage of a VCU118: two CMACs, two cores, each port with its
    own addresses, connection manager, QPs, counters and link bring-up (see
    :class:`_Board`; port ``n`` is in the domains ``cmac<n>`` and ``sync<n>``).

    Port 1 is QSFP1 (CMACE4_X0Y7, quad 231, its reference clock quad 231's
    MGTREFCLK0), port 2 is QSFP2 (CMACE4_X0Y8, quad 232, quad 232's own
    MGTREFCLK0: :data:`PORT2_REFCLK`); the CMAC IPs are ``cmac_usplus_0`` and
    ``cmac_usplus_1``. Both cores run on the one 250 MHz clock; each port's
    link comes up, goes down and recovers on its own, and a port whose link
    is down drops its core's frames whole, so the other port never waits for
    it. The DIP switches add to both ports' addresses. The status line shows
    each port in turn, a line each (``port=1 …``, ``port=2 …``), each port
    once a second (:class:`~boards.status_uart.PortStatusUart`). LEDs: see
    :data:`DUAL_LEDS`.

    Parameters
    ----------
    port2 : dict
        Address parameters of port 2 (``mac``, ``ip``, ``netmask``, ``gateway``), over
        :data:`PORT2_ADDRESS` over ``**port``'s.
    **port :
        Parameters of both :class:`~boards.vcu118_port.VCU118Port`: ``rsfec`` and the
        cores' build parameters (addresses of port 1, QPs, ...).
    """

    def __init__(self, *, port2=None, **port):
        address2 = {**PORT2_ADDRESS, **(port2 or {})}
        unknown = set(address2) - {"mac", "ip", "netmask", "gateway"}
        if unknown:
            raise ValueError(f"port2 takes addresses only, not {sorted(unknown)}")
        self.port1 = VCU118Port(qsfp=1, refclk=0, ip_name=cmac_ip_name(0), **port)
        self.port2 = VCU118Port(qsfp=2, refclk=PORT2_REFCLK, ip_name=cmac_ip_name(1),
                                **{**port, **address2})

    def ports(self):
        return [("port1", self.port1, "cmac1", "sync1"), ("port2", self.port2, "cmac2", "sync2")]

    def status_uart(self, divisor, interval):
        uart = PortStatusUart(BOARD_STATUS, ports=2, divisor=divisor, interval=interval)
        return uart, [uart.i[0], uart.i[1]]

    def leds(self, m, ports):
        one, two = self.port1.o_leds, self.port2.o_leds
        return [blink(m, "init", INIT_CLOCK_MHZ * 1_000_000), one.up, two.up, one.module,
                two.module, one.rx | one.tx, two.rx | two.tx, one.attention | two.attention]
