"""The Xilinx VCU118 evaluation board (Virtex UltraScale+ XCVU9P) as an Amaranth platform.

Pins are from the board's user guide (UG1224) and schematic, as the
open designs for this board use them (corundum's ``fpga.xdc``). Only what
this project uses or may need for bring-up is described: the system clocks,
the CPU reset button, the user LEDs, push buttons and DIP switches, the
USB-UART and both QSFP28 cages.

QSFP28 cages: four GTY lanes each, in quad 231 (QSFP1, ``GTYE4_CHANNEL_X1Y48``
to ``X1Y51``) and quad 232 (QSFP2, ``X1Y52`` to ``X1Y55``); lane ``n`` of the
``rx``/``tx`` pairs is the cage's lane ``n + 1``. The reference clock both
cages use in a single-port build is ``qsfp_refclk`` 0: MGTREFCLK0 of quad
231, from the QSFP Si570 (U38), 156.25 MHz from power-up; a quad's reference
clock also reaches the quads next to it, so it serves quad 232 as well.
``qsfp_refclk`` 1 is quad 232's own MGTREFCLK0, from U104; the two-port build
takes QSFP2's CMAC's reference clock there (each CMAC IP buffers its own
reference clock, so two cannot share one pin pair), as corundum's two-CMAC
design did (fpga/mqnic/VCU118/fpga_100g/fpga.xdc, ``qsfp2_mgt_refclk_0``).
"""

from amaranth.build import Attrs, Clock, DiffPairs, Pins, PinsN, Resource, Subsignal
from amaranth.vendor import XilinxPlatform
from amaranth_boards.resources import ButtonResources, LEDResources, SwitchResources, UARTResource

from gateware.conversion import large_memories_without_zero_init

__all__ = ["VCU118Platform", "QSFP_LANES"]

#: GTY channel sites of each QSFP28 cage, lane 1 first (``GT_GROUP_SELECT`` of the CMAC IP), as
#: corundum's VCU118 100G design places them (fpga/mqnic/VCU118/fpga_100g/fpga.xdc: QSFP1's
#: lanes 1-4 on GTYE4_CHANNEL_X1Y48-X1Y51, QSFP2's on X1Y52-X1Y55).
QSFP_LANES = {
    1: ("X1Y48", "X1Y49", "X1Y50", "X1Y51"),
    2: ("X1Y52", "X1Y53", "X1Y54", "X1Y55"),
}


def _qsfp(number, *, rx_p, rx_n, tx_p, tx_n, modsel, module_reset, present, interrupt,
          lpmode):
    """A QSFP28 cage: GT lanes and the module's low-speed pins (all active-high here)."""
    lvcmos18 = Attrs(IOSTANDARD="LVCMOS18")
    return Resource(
        "qsfp", number,
        Subsignal("rx", DiffPairs(rx_p, rx_n, dir="i")),
        Subsignal("tx", DiffPairs(tx_p, tx_n, dir="o")),
        Subsignal("modsel", PinsN(modsel, dir="o"), lvcmos18, Attrs(SLEW="SLOW", DRIVE="8")),
        Subsignal("reset", PinsN(module_reset, dir="o"), lvcmos18, Attrs(SLEW="SLOW", DRIVE="8")),
        Subsignal("lpmode", Pins(lpmode, dir="o"), lvcmos18, Attrs(SLEW="SLOW", DRIVE="8")),
        Subsignal("present", PinsN(present, dir="i"), lvcmos18, Attrs(PULLUP="TRUE")),
        Subsignal("interrupt", PinsN(interrupt, dir="i"), lvcmos18, Attrs(PULLUP="TRUE")),
    )


class VCU118Platform(XilinxPlatform):
    device = "xcvu9p"
    package = "flga2104"
    speed = "2L-e"
    default_clk = "clk125"
    default_rst = "cpu_reset"

    resources = [
        Resource("clk125", 0, DiffPairs("AY24", "AY23", dir="i"), Clock(125e6),
                 Attrs(IOSTANDARD="LVDS")),
        Resource("clk300", 0, DiffPairs("G31", "F31", dir="i"), Clock(300e6),
                 Attrs(IOSTANDARD="DIFF_SSTL12")),
        # SW5, high while pressed.
        Resource("cpu_reset", 0, Pins("L19", dir="i"), Attrs(IOSTANDARD="LVCMOS12")),

        *LEDResources(pins="AT32 AV34 AY30 BB32 BF32 AU37 AV36 BA37",
                      attrs=Attrs(IOSTANDARD="LVCMOS12", SLEW="SLOW", DRIVE="8")),
        # North, west, south, east, centre.
        *ButtonResources(pins="BB24 BF22 BE22 BE23 BD23", attrs=Attrs(IOSTANDARD="LVCMOS18")),
        *SwitchResources(pins="B17 G16 J16 D21", attrs=Attrs(IOSTANDARD="LVCMOS12")),
        # CP2105 (USB-UART); the FPGA is the DTE (tx and rts are its outputs).
        UARTResource(0, rx="AW25", tx="BB21", rts="BB22", cts="AY25",
                     attrs=Attrs(IOSTANDARD="LVCMOS18"), role="dte"),

        Resource("qsfp_refclk", 0, DiffPairs("W9", "W8", dir="i"), Clock(156.25e6)),
        Resource("qsfp_refclk", 1, DiffPairs("R9", "R8", dir="i"), Clock(156.25e6)),
        _qsfp(1, rx_p="Y2 W4 V2 U4", rx_n="Y1 W3 V1 U3", tx_p="V7 T7 P7 M7",
              tx_n="V6 T6 P6 M6", modsel="AM21", module_reset="BA22", present="AL21",
              interrupt="AP21", lpmode="AN21"),
        _qsfp(2, rx_p="T2 R4 P2 M2", rx_n="T1 R3 P1 M1", tx_p="L5 K7 J5 H7",
              tx_n="L4 K6 J4 H6", modsel="AN23", module_reset="AY22", present="AN24",
              interrupt="AT21", lpmode="AT24"),
    ]
    connectors = []

    #: Configuration from the board's SPI flash (two MT25QU01G, x8) at 1.8 V.
    _bitstream_properties = {
        "CFGBVS": "GND",
        "CONFIG_VOLTAGE": "1.8",
        "BITSTREAM.GENERAL.COMPRESS": "TRUE",
        "BITSTREAM.CONFIG.EXTMASTERCCLK_EN": "DIV-1",
        "BITSTREAM.CONFIG.SPI_32BIT_ADDR": "YES",
        "BITSTREAM.CONFIG.SPI_BUSWIDTH": "8",
        "BITSTREAM.CONFIG.SPI_FALL_EDGE": "YES",
        "BITSTREAM.CONFIG.OVERTEMPSHUTDOWN": "ENABLE",
    }

    def prepare(self, elaboratable, name="top", **kwargs):
        """The build plan, its Verilog without the zero contents of large memories: block RAM
        and UltraRAM are zero at configuration (:mod:`gateware.conversion`)."""
        with large_memories_without_zero_init():
            return super().prepare(elaboratable, name, **kwargs)

    def bitstream_constraints(self):
        """XDC lines for the configuration settings above."""
        return "\n".join(f"set_property {name} {value} [current_design]"
                         for name, value in self._bitstream_properties.items())
