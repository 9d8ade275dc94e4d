"""The Vivado recipe of the 100G Ethernet hard IP (``cmac_usplus``) for a VCU118 QSFP28 cage.

The IP is created, generated and synthesized out of context by Tcl in the
build script, before ``synth_design`` of the top; :class:`boards.cmac.Cmac`
instantiates it. Its configuration:

* CAUI-4: 4 × 25.78125 Gb/s GTY lanes of the chosen cage, 156.25 MHz
  reference clock; the CMAC site next to those lanes.
* The AXI4-Stream user interface (512 bits, in the TX user clock,
  322.265625 MHz); FCS inserted on transmit, checked and stripped on
  receive; frames up to 9600 bytes.
* Pause frames: the CMAC sends none (no TX flow control) and acts on none it
  receives: its RX flow-control logic is built (``RX_FLOW_CONTROL``) only so
  that it forwards MAC control frames (``RX_FORWARD_CONTROL_FRAMES``, PG203);
  :class:`boards.cmac.Cmac` ties its pause processing off (``ctl_rx_enable_*``,
  ``ctl_rx_pause_enable`` 0). The core's own MAC-control block
  (:class:`gateware.eth.mac_control.MacControl`) reads PAUSE and PFC frames.
* RS-FEC (Clause 91) built in; whether it runs is chosen by the top through
  the IP's ``ctl_*_rsfec_*`` inputs, so the port list is the same either way.
* Control and status as ports (no AXI4-Lite, no statistics counters).
* The GT's DRP and init clock at 125 MHz: the board's 125 MHz clock.
"""

from .vcu118 import QSFP_LANES

__all__ = ["CMAC_IP_NAME", "CMAC_SITES", "INIT_CLOCK_MHZ", "cmac_ip_name", "cmac_ip_properties",
           "cmac_ip_tcl"]



def cmac_ip_name(index: int) -> str:
    """The module name of a board's CMAC IP ``index`` (0 for the first), as corundum's
    two-CMAC VCU118 design names them (fpga/mqnic/VCU118/fpga_100g/ip/cmac_usplus_0.tcl and
    cmac_usplus_1.tcl)."""
    return f"cmac_usplus_{index}"


#: The module name of a single-port build's CMAC IP.
CMAC_IP_NAME = cmac_ip_name(0)

#: The CMAC hard block next to each cage's GTY quad on the XCVU9P: CMACE4_X0Y7 by quad 231
#: (QSFP1), CMACE4_X0Y8 by quad 232 (QSFP2), as corundum's VCU118 100G design selects them
#: (fpga/mqnic/VCU118/fpga_100g/ip/cmac_usplus_0.tcl and cmac_usplus_1.tcl,
#: ``CMAC_CORE_SELECT``).
CMAC_SITES = {1: "CMACE4_X0Y7", 2: "CMACE4_X0Y8"}

#: Frequency of the CMAC's ``init_clk`` and ``drp_clk``.
INIT_CLOCK_MHZ = 125


def cmac_ip_properties(qsfp: int) -> dict[str, str]:
    """The IP's ``CONFIG.*`` properties for QSFP28 cage ``qsfp`` (1 or 2), in the order set."""
    if qsfp not in QSFP_LANES:
        raise ValueError(f"The VCU118 has QSFP28 cages 1 and 2, not {qsfp!r}")
    lanes = QSFP_LANES[qsfp]
    properties = {
        "CMAC_CAUI4_MODE": "1",
        "NUM_LANES": "4x25",
        "GT_REF_CLK_FREQ": "156.25",
        "GT_DRP_CLK": f"{INIT_CLOCK_MHZ}",
        "USER_INTERFACE": "AXIS",
        "ENABLE_AXI_INTERFACE": "0",
        "INCLUDE_STATISTICS_COUNTERS": "0",
        "TX_FLOW_CONTROL": "0",
        "RX_FLOW_CONTROL": "1",
        "RX_FORWARD_CONTROL_FRAMES": "1",
        "TX_FRAME_CRC_CHECKING": "Enable FCS Insertion",
        "RX_FRAME_CRC_CHECKING": "Enable FCS Stripping",
        "RX_MAX_PACKET_LEN": "9600",
        "INCLUDE_RS_FEC": "1",
        "ENABLE_PIPELINE_REG": "1",
        "GT_GROUP_SELECT": f"{lanes[0]}~{lanes[-1]}",
        "CMAC_CORE_SELECT": CMAC_SITES[qsfp],
    }
    for lane in range(1, 11):
        properties[f"LANE{lane}_GT_LOC"] = lanes[lane - 1] if lane <= len(lanes) else "NA"
    return properties


def cmac_ip_tcl(qsfp: int, name: str = CMAC_IP_NAME) -> str:
    """Tcl that creates the IP ``name`` for cage ``qsfp`` in the open project, generates and
    synthesizes it."""
    settings = " \\\n    ".join(f"CONFIG.{key} {{{value}}}"
                                for key, value in cmac_ip_properties(qsfp).items())
    return "\n".join([
        f"# The CMAC for QSFP{qsfp}: {name} (boards/cmac_ip.py)",
        f"create_ip -name cmac_usplus -vendor xilinx.com -library ip -module_name {name}",
        f"set_property -dict [list \\\n    {settings} \\\n] [get_ips {name}]",
        f"generate_target all [get_ips {name}]",
        f"synth_ip [get_ips {name}]",
    ])
