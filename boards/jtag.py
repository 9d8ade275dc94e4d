"""The Vivado hardware-manager scripts: ``program.tcl`` loads the bitstream over JTAG,
``flash.tcl`` writes it to the board's configuration flash.

Both open the JTAG target that holds the board's FPGA (``xcvu9p`` on the
VCU118) explicitly: every target of the ``hw_server`` is searched for a
device of that part, so other boards and cables on the same server are left
alone. More than one such device is an error that lists them; ``--jtag-target``
(part of the target's name, e.g. the cable's serial number) then picks one.

``flash.tcl`` writes the configuration memory files first (``write_cfgmem``):
the VCU118 boots from two Micron MT25QU01G (1 Gb each) as one x8 SPI
interface (UG1224, "Quad SPI Flash Memory"), so the bitstream is split into a
``_primary`` and a ``_secondary`` file. It erases, programs and verifies both,
then boots the FPGA from the flash (``boot_hw_device``), as after a power cycle.
"""

from pathlib import Path

__all__ = ["FLASH", "write_jtag_scripts"]

#: The VCU118's configuration flash as Vivado's ``write_cfgmem`` and ``create_hw_cfgmem``
#: name it: the part, its interface, the size of both devices together in MB.
FLASH = {"part": "mt25qu01g-spi-x1_x2_x4_x8", "interface": "SPIx8", "size_mb": 256}

_OPEN_DEVICE = r"""
proc open_board_device {part wanted} {
    # Opens the JTAG target with the one device of $part whose target name contains
    # $wanted (any when empty) and makes that device current; returns it.
    set found {}
    foreach target [get_hw_targets] {
        if {$wanted ne "" && [string first $wanted $target] < 0} {
            continue
        }
        open_hw_target $target
        foreach device [get_hw_devices -quiet ${part}*] {
            lappend found [list $target $device]
        }
        close_hw_target $target
    }
    if {[llength $found] == 0} {
        error "no $part on the JTAG targets [get_hw_targets] (wanted: '$wanted'):\
               is the board on and its JTAG USB connected?"
    }
    if {[llength $found] > 1} {
        error "several $part on the JTAG chain, pick one with --jtag-target: $found"
    }
    lassign [lindex $found 0] target device
    open_hw_target $target
    current_hw_device [get_hw_devices $device]
    refresh_hw_device -update_hw_probes false [current_hw_device]
    puts "JTAG: $device on $target"
    return [current_hw_device]
}
""".strip("\n")


def _session(hw_server: str, device: str, target: str) -> list[str]:
    return [
        _OPEN_DEVICE,
        "open_hw_manager",
        f"connect_hw_server -url {hw_server}",
        f"set device [open_board_device {device} {{{target}}}]",
    ]


def write_jtag_scripts(build_dir: Path, *, name: str, device: str, hw_server: str,
                       target: str = "") -> None:
    """Write ``program.tcl`` and ``flash.tcl`` for the bitstream ``<name>.bit``."""
    (build_dir / "program.tcl").write_text("\n".join([
        "# Loads the bitstream through Vivado's hardware manager (boards/jtag.py).",
        *_session(hw_server, device, target),
        f"set_property PROGRAM.FILE {{{name}.bit}} $device",
        "program_hw_devices $device",
        "refresh_hw_device $device",
        "close_hw_manager",
    ]) + "\n")
    files = [f"{name}_{half}.mcs" for half in ("primary", "secondary")]
    prms = [f"{name}_{half}.prm" for half in ("primary", "secondary")]
    (build_dir / "flash.tcl").write_text("\n".join([
        "# Writes the bitstream to the VCU118's configuration flash (boards/jtag.py).",
        f"write_cfgmem -force -format mcs -size {FLASH['size_mb']} "
        f"-interface {FLASH['interface']} -loadbit {{up 0x00000000 {name}.bit}} -checksum "
        f"-file {name}.mcs",
        *_session(hw_server, device, target),
        f"create_hw_cfgmem -hw_device $device [lindex [get_cfgmem_parts {{{FLASH['part']}}}] 0]",
        "set flash [get_property PROGRAM.HW_CFGMEM $device]",
        f"set_property PROGRAM.FILES [list {' '.join(files)}] $flash",
        f"set_property PROGRAM.PRM_FILES [list {' '.join(prms)}] $flash",
        "set_property PROGRAM.ADDRESS_RANGE {use_file} $flash",
        "set_property PROGRAM.UNUSED_PIN_TERMINATION {pull-none} $flash",
        *[f"set_property PROGRAM.{step} 1 $flash" for step in ("ERASE", "CFG_PROGRAM", "VERIFY")],
        "set_property PROGRAM.CHECKSUM 0 $flash",
        "set_property PROGRAM.BLANK_CHECK 0 $flash",
        "# The FPGA is loaded with the flash programmer's bitstream to reach the flash.",
        "create_hw_bitstream -hw_device $device [get_property PROGRAM.HW_CFGMEM_BITFILE $device]",
        "program_hw_devices $device",
        "refresh_hw_device $device",
        "program_hw_cfgmem -hw_cfgmem $flash",
        "boot_hw_device $device",
        "close_hw_manager",
    ]) + "\n")
