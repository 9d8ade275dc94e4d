"""One 100G port of the VCU118: a QSFP28 cage's CMAC, the logic around it and its core with
its own addresses. The board's tops (:mod:`boards.vcu118_top`) hold one or two."""

import inspect

from amaranth import *
from amaranth.lib import io, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out, connect

from gateware.core import NetworkCore
from gateware.examples.event_core import EventCore

from .board_address import BoardAddress
from .cmac import Cmac
from .cmac_ip import CMAC_IP_NAME
from .cmac_port import PORT_LEDS, PORT_STATUS, CmacPort
from .vcu118 import QSFP_LANES

__all__ = ["VCU118Port", "CORE_CLOCK_HZ", "ADDRESS_SWITCHES", "SOURCES"]

#: The core's clock (the board top's MMCM makes it). A beat of 512 bits a cycle is
#: 128 Gb/s, above the line's 100 Gb/s.
CORE_CLOCK_HZ = 250_000_000

#: The VCU118's GPIO DIP switches (GPIO_DIP_SW0-3), added to the IP's and MAC's last octet.
ADDRESS_SWITCHES = 4

#: What drives the core's user request ports: nothing (the built-in generator, started
#: through the CM, is the only RoCE source), or the example event source
#: (:class:`~gateware.examples.event_core.EventCore`).
SOURCES = {"generator": NetworkCore, "example": EventCore}

#: The core's address parameters, which :class:`BoardAddress` also takes.
ADDRESS_PARAMETERS = ("mac", "ip", "netmask", "gateway")


class VCU118Port(wiring.Component):
    """The endpoint on QSFP28 cage ``qsfp``: its CMAC (:class:`~boards.cmac.Cmac`, the IP
    ``ip_name`` on the GTY reference clock ``qsfp_refclk`` ``refclk``), the logic around
    it (:class:`~boards.cmac_port.CmacPort`), its core and its addresses.

    Domains: ``init`` (the board clock), ``cmac`` and ``sync``: the parent
    defines them for each port, ``cmac`` on ``o_tx_clk`` (the CMAC's TX user
    clock) and reset while ``o_tx_reset`` is, ``sync`` on the core's clock.
    With ``source="generator"`` the core's user work-request port is idle and its
    completions are drained: the built-in generator is the source of RoCE traffic;
    with ``source="example"`` the example event source drives it (:data:`SOURCES`).

    The addresses are the build-time ones with ``i_switches`` (the DIP
    switches' pins, synchronized here, read at reset) added to the last octet
    of the IP and MAC address (:class:`~boards.board_address.BoardAddress`).
    ``o_status`` is the port's status in ``init``, ``o_leds`` its LEDs'
    signals (:class:`~boards.cmac_port.CmacPort`).

    Parameters
    ----------
    qsfp : int
        The cage: 1 or 2.
    refclk : int
        The ``qsfp_refclk`` resource of the CMAC's reference clock.
    ip_name : str
        The CMAC IP's module name.
    rsfec : bool
        Clause 91 RS-FEC on (it must match the peer's setting).
    source : str
        A key of :data:`SOURCES`: what drives the core's user request ports.
    **core :
        Build parameters of :class:`~gateware.core.NetworkCore` (addresses, QPs, ...),
        and with ``source="example"`` those of
        :class:`~gateware.examples.event_core.EventCore`.
    """

    def __init__(self, *, qsfp, refclk=0, ip_name=CMAC_IP_NAME, rsfec=True,
                 source="generator", **core):
        if qsfp not in QSFP_LANES:
            raise ValueError(f"The VCU118 has QSFP28 cages 1 and 2, not {qsfp!r}")
        if source not in SOURCES:
            raise ValueError(f"Source must be one of {', '.join(SOURCES)}, not {source!r}")
        self._qsfp = qsfp
        self._refclk = refclk
        self._ip_name = ip_name
        self._source = source
        self.core = SOURCES[source](clock_hz=CORE_CLOCK_HZ, **core)
        defaults = inspect.signature(NetworkCore).parameters
        self.address = BoardAddress(
            switches=ADDRESS_SWITCHES,
            **{name: core.get(name, defaults[name].default) for name in ADDRESS_PARAMETERS})
        self.cmac_port = CmacPort(rsfec=rsfec)
        super().__init__({
            "o_tx_clk": Out(1),
            "o_tx_reset": Out(1),
            "i_switches": In(ADDRESS_SWITCHES),
            "o_status": Out(PORT_STATUS),
            "o_leds": Out(PORT_LEDS),
        })

    @property
    def qsfp(self):
        return self._qsfp

    @property
    def ip_name(self):
        return self._ip_name

    @property
    def rsfec(self):
        return self.cmac_port.rsfec

    def elaborate(self, platform):
        m = Module()
        cage = platform.request("qsfp", self._qsfp, dir="-")
        refclk = platform.request("qsfp_refclk", self._refclk, dir="-")
        m.submodules.cmac = cmac = Cmac(rx_pins=cage.rx, tx_pins=cage.tx, refclk_pins=refclk,
                                        ip_name=self._ip_name)
        m.submodules.cmac_port = cmac_port = self.cmac_port
        m.submodules.core = core = self.core
        connect(m, cmac, cmac_port.cmac)
        connect(m, cmac_port.o_rx, core.rx)
        connect(m, core.tx, cmac_port.i_tx)
        m.d.comb += [
            self.o_tx_clk.eq(cmac.tx_clk),
            self.o_tx_reset.eq(cmac.tx_reset),
            self.o_status.eq(cmac_port.o_status),
            self.o_leds.eq(cmac_port.o_leds),
        ]
        if self._source == "generator":
            # No user logic: the generator's completions come out of the user completion
            # port (the example source takes them itself). The connection events are left
            # untaken (ready 0): the core counts them in cm.events_lost.
            m.d.comb += core.completion.ready.eq(1)

        # The module's low-speed pins: selected; reset and low power as CmacPort says.
        m.submodules.modsel = modsel = io.Buffer("o", cage.modsel)
        m.submodules.module_reset = module_reset = io.Buffer("o", cage.reset)
        m.submodules.lpmode = lpmode = io.Buffer("o", cage.lpmode)
        m.submodules.present = present = io.Buffer("i", cage.present)
        m.d.comb += [
            modsel.o.eq(1),
            module_reset.o.eq(cmac_port.o_module_reset),
            lpmode.o.eq(cmac_port.o_lpmode),
            cmac_port.i_present.eq(present.i),
        ]

        # The addresses, from the switches.
        m.submodules.address = address = self.address
        m.submodules.switches_sync = FFSynchronizer(self.i_switches, address.i_switches,
                                                    o_domain="sync")
        connect(m, address.o_config, core.config)
        return m
