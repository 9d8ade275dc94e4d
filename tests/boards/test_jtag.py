"""The hardware-manager scripts: the flash written as the VCU118 needs it (two MT25QU01G as
SPIx8, UG1224), and the board's FPGA found among several JTAG targets (run under tclsh with
a stand-in hardware manager)."""

import re
import shutil
import subprocess

import pytest

from boards.jtag import write_jtag_scripts

needs_tclsh = pytest.mark.skipif(shutil.which("tclsh") is None,
                                 reason="needs tclsh (Debian package tcl; .ci/run installs it)")


def scripts(tmp_path, target=""):
    write_jtag_scripts(tmp_path, name="top", device="xcvu9p", hw_server="localhost:3121",
                       target=target)
    return (tmp_path / "program.tcl").read_text(), (tmp_path / "flash.tcl").read_text()


def test_flash_script(tmp_path):
    """write_cfgmem for 2 × 1 Gb at x8 from address 0; both halves programmed and verified
    through the MT25QU01G's cfgmem part; then the FPGA boots from the flash."""
    _, flash = scripts(tmp_path)
    cfgmem = re.search(r"^write_cfgmem (.*)$", flash, re.M)[1]
    assert "-format mcs" in cfgmem and "-size 256" in cfgmem and "-interface SPIx8" in cfgmem
    assert "-loadbit {up 0x00000000 top.bit}" in cfgmem and cfgmem.endswith("-file top.mcs")
    lines = flash.splitlines()
    order = ["write_cfgmem", "open_hw_manager", "set device [open_board_device xcvu9p {}]",
             "create_hw_cfgmem -hw_device $device [lindex [get_cfgmem_parts "
             "{mt25qu01g-spi-x1_x2_x4_x8}] 0]",
             "set_property PROGRAM.FILES [list top_primary.mcs top_secondary.mcs] $flash",
             "program_hw_devices $device", "program_hw_cfgmem -hw_cfgmem $flash",
             "boot_hw_device $device"]
    positions = [next(n for n, line in enumerate(lines) if line.startswith(command))
                 for command in order]
    assert positions == sorted(positions)
    for step in ("ERASE", "CFG_PROGRAM", "VERIFY"):
        assert f"set_property PROGRAM.{step} 1 $flash" in lines


#: A hardware manager with JTAG targets and their devices (``chain``), the one open, and a
#: record of what was opened and programmed.
STUBS = r"""
proc unknown {args} { return "" }
set open ""
proc get_hw_targets {} { return [dict keys $::chain] }
proc open_hw_target {target} { set ::open $target; lappend ::opened $target }
proc close_hw_target {target} { set ::open "" }
proc get_hw_devices {args} {
    set pattern [lindex $args end]
    return [lsearch -all -inline -glob [dict get $::chain $::open] $pattern]
}
proc current_hw_device {args} {
    if {[llength $args]} { set ::current "$::open/[lindex $args 0]" }
    return $::current
}
proc program_hw_devices {device} { puts "programmed $device" }
"""


def run_program(tmp_path, chain, target=""):
    program, _ = scripts(tmp_path, target)
    entries = " ".join(f"{{{name}}} {{{' '.join(devices)}}}" for name, devices in chain.items())
    (tmp_path / "run.tcl").write_text(f"{STUBS}\nset chain [dict create {entries}]\n{program}")
    return subprocess.run(["tclsh", "run.tcl"], cwd=tmp_path, capture_output=True, text=True)


CHAIN = {"localhost:3121/xilinx_tcf/Digilent/A1": ["xczu9_0", "arm_dap_1"],
         "localhost:3121/xilinx_tcf/Xilinx/B2": ["xcvu9p_0"],
         "localhost:3121/xilinx_tcf/Digilent/C3": ["xcku040_0"]}


@needs_tclsh
def test_program_finds_the_board_among_other_targets(tmp_path):
    run = run_program(tmp_path, CHAIN)
    assert run.returncode == 0, run.stderr
    assert "programmed localhost:3121/xilinx_tcf/Xilinx/B2/xcvu9p_0" in run.stdout


@needs_tclsh
def test_program_with_two_boards_needs_a_target(tmp_path):
    chain = {**CHAIN, "localhost:3121/xilinx_tcf/Xilinx/D4": ["xcvu9p_0"]}
    run = run_program(tmp_path, chain)
    assert run.returncode != 0 and "--jtag-target" in run.stderr
    assert "programmed" not in run.stdout
    run = run_program(tmp_path, chain, target="D4")
    assert run.returncode == 0, run.stderr
    assert "programmed localhost:3121/xilinx_tcf/Xilinx/D4/xcvu9p_0" in run.stdout


@needs_tclsh
def test_program_without_the_board(tmp_path):
    chain = {name: devices for name, devices in CHAIN.items() if "B2" not in name}
    run = run_program(tmp_path, chain)
    assert run.returncode != 0 and "no xcvu9p on the JTAG targets" in run.stderr
