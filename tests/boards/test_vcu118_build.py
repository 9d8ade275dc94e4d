# amaranth: UnusedElaboratable=no
"""The VCU118 build tree: the whole top elaborates to Verilog with the CMAC instance; the
XDC places every pin the board's documentation (UG1224) gives and constrains every clock;
the Tcl creates the CMAC IP with its properties before synthesis; `make bitstream` without
Vivado writes the tree and says so in one line, and with Vivado runs it."""

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from boards import build
from boards.cmac_ip import cmac_ip_properties

#: Small core parameters: the same top and ports, quicker to convert.
SMALL_CORE = {"qps": 4, "retransmit_beats": 64, "messages": 8}

#: Pins from the VCU118 user guide (UG1224), written out here independently of the
#: platform file: (port, LOC).
BOARD_PINS = [
    ("clk125_0__p", "AY24"), ("clk125_0__n", "AY23"), ("cpu_reset_0__io", "L19"),
    ("qsfp_refclk_0__p", "W9"), ("qsfp_refclk_0__n", "W8"),
    *[(f"led_{n}__io", pin) for n, pin in
      enumerate("AT32 AV34 AY30 BB32 BF32 AU37 AV36 BA37".split())],
]
CAGE_PINS = {
    1: {"rx__p": "Y2 W4 V2 U4", "rx__n": "Y1 W3 V1 U3", "tx__p": "V7 T7 P7 M7",
        "tx__n": "V6 T6 P6 M6", "modsel__io": "AM21", "reset__io": "BA22",
        "lpmode__io": "AN21", "present__io": "AL21"},
    2: {"rx__p": "T2 R4 P2 M2", "rx__n": "T1 R3 P1 M1", "tx__p": "L5 K7 J5 H7",
        "tx__n": "L4 K6 J4 H6", "modsel__io": "AN23", "reset__io": "AY22",
        "lpmode__io": "AT24", "present__io": "AN24"},
}
#: The CMAC site and GTY channels of each cage (UG1224 and the XCVU9P's CMAC placement).
CAGE_CMAC = {1: ("CMACE4_X0Y7", "X1Y48 X1Y49 X1Y50 X1Y51"),
             2: ("CMACE4_X0Y8", "X1Y52 X1Y53 X1Y54 X1Y55")}


@pytest.fixture(scope="module", params=[1, 2], ids=["qsfp1-default-core", "qsfp2-small-core"])
def tree(request, tmp_path_factory):
    """The tree ``make bitstream`` writes: for QSFP1 with the default core (what users
    build; about a minute to convert), for QSFP2 with a small one."""
    build_dir = tmp_path_factory.mktemp(f"vcu118-qsfp{request.param}")
    build.write_tree(build_dir, qsfp=request.param, **({} if request.param == 1 else SMALL_CORE))
    return request.param, build_dir


def locs(xdc):
    return dict((port.replace("\\", ""), pin) for pin, port in
                re.findall(r'set_property LOC (\S+) \[get_ports "?([^"\]]+\]?)"?\]', xdc))


def test_the_whole_top_elaborates_with_the_cmac(tree):
    _, build_dir = tree
    verilog = (build_dir / "top.v").read_text()
    assert re.search(r"^module top\(", verilog, re.M)
    instance = re.search(r"^  cmac_usplus_0 ip \((.*?)\);", verilog, re.M | re.S)
    assert instance, "no instance of the CMAC IP"
    ports = set(re.findall(r"\.(\w+)\(", instance[1]))
    # Every input of the IP's port list (as configured) is driven; the outputs used are there.
    assert {"gt_rxp_in", "gt_rxn_in", "gt_ref_clk_p", "gt_ref_clk_n", "init_clk", "sys_reset",
            "drp_clk", "rx_clk", "ctl_rx_enable", "ctl_tx_enable", "ctl_tx_send_rfi",
            "ctl_tx_send_lfi", "ctl_tx_send_idle", "ctl_rx_rsfec_enable",
            "ctl_tx_rsfec_enable", "tx_axis_tvalid", "tx_axis_tdata", "tx_axis_tkeep",
            "tx_axis_tlast", "tx_axis_tuser", "tx_preamblein", "gt_loopback_in",
            "core_tx_reset", "core_rx_reset", "core_drp_reset"} <= ports
    assert {"gt_txp_out", "gt_txn_out", "gt_txusrclk2", "usr_tx_reset", "usr_rx_reset",
            "rx_axis_tvalid", "rx_axis_tdata", "tx_axis_tready", "stat_rx_aligned"} <= ports
    # The receive side runs on the TX user clock.
    assert re.search(r"\.gt_txusrclk2\((\w+)\).*\.rx_clk\(\1\)", instance[1], re.S)
    assert re.search(r"^module \\top\.core\b", verilog, re.M), "the core is not in the top"


def test_xdc_places_every_pin(tree):
    qsfp, build_dir = tree
    placed = locs((build_dir / "top.xdc").read_text())
    expected = dict(BOARD_PINS)
    for signal, pins in CAGE_PINS[qsfp].items():
        for lane, pin in enumerate(pins.split()):
            name = f"qsfp_{qsfp}__{signal}"
            expected[f"{name}[{lane}]" if " " in pins else name] = pin
    assert {port: placed.get(port) for port in expected} == expected
    other = 3 - qsfp
    assert not any(port.startswith(f"qsfp_{other}__") for port in placed)


def test_xdc_constrains_every_clock(tree):
    _, build_dir = tree
    xdc = (build_dir / "top.xdc").read_text()
    clocks = dict(re.findall(r"create_clock -name (\S+) -period (\S+)", xdc))
    assert float(clocks["clk125_0__p"]) == 8.0
    assert float(clocks["qsfp_refclk_0__p"]) == pytest.approx(1000 / 156.25)
    # The CMAC's GT clocks are created by the IP's constraints; ours declares them
    # asynchronous to the board clock.
    assert re.search(r"set_clock_groups -asynchronous -group .*clk125_0__p.* -group .*"
                     r"REF_NAME == cmac_usplus_0.*gt_txusrclk2", xdc)
    assert "set_property CONFIG_VOLTAGE 1.8 [current_design]" in xdc


def test_tcl_creates_the_cmac_before_synthesis(tree):
    qsfp, build_dir = tree
    lines = (build_dir / "top.tcl").read_text().splitlines()

    def first(prefix):
        return next(n for n, line in enumerate(lines) if line.startswith(prefix))

    create = first("create_ip -name cmac_usplus ")
    assert "-module_name cmac_usplus_0" in lines[create]
    assert first("create_project") < create < first("set_property -dict") \
        < first("generate_target all [get_ips cmac_usplus_0]") \
        < first("synth_ip [get_ips cmac_usplus_0]") < first("synth_design -top top")
    script = "\n".join(lines)
    properties = dict(re.findall(r"CONFIG\.(\w+) \{([^}]*)\}", script))
    site, channels = CAGE_CMAC[qsfp]
    channels = channels.split()
    assert properties["CMAC_CORE_SELECT"] == site
    assert properties["GT_GROUP_SELECT"] == f"{channels[0]}~{channels[-1]}"
    assert [properties[f"LANE{n}_GT_LOC"] for n in range(1, 5)] == channels
    assert all(properties[f"LANE{n}_GT_LOC"] == "NA" for n in range(5, 11))
    assert properties["CMAC_CAUI4_MODE"] == "1" and properties["NUM_LANES"] == "4x25"
    assert properties["GT_REF_CLK_FREQ"] == "156.25" and properties["USER_INTERFACE"] == "AXIS"
    assert properties["INCLUDE_RS_FEC"] == "1" and properties["GT_DRP_CLK"] == "125"
    assert int(properties["RX_MAX_PACKET_LEN"]) >= 4096 + 100
    assert properties == cmac_ip_properties(qsfp)


def test_program_script_loads_the_bitstream(tree):
    _, build_dir = tree
    script = (build_dir / "program.tcl").read_text()
    for command in ("open_hw_manager", "connect_hw_server -url localhost:3121",
                    "get_hw_devices xcvu9p", "set_property PROGRAM.FILE {top.bit}",
                    "program_hw_devices"):
        assert command in script


def run_build(*args, path):
    """``python -m boards.build`` with ``PATH`` as given."""
    return subprocess.run([sys.executable, "-m", "boards.build", *args],
                          cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "PATH": path}, capture_output=True, text=True)


SMALL_ARGS = [word for name, value in SMALL_CORE.items()
              for word in (f"--{name.replace('_', '-')}", str(value))]


def path_without_vivado():
    return os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if not (Path(p) / "vivado").exists())


def test_bitstream_without_vivado(tmp_path):
    """Non-zero, the tree written, and one error line that says how to finish."""
    run = run_build("bitstream", "--build-dir", str(tmp_path), *SMALL_ARGS,
                    path=path_without_vivado())
    assert run.returncode == 1
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, run.stderr
    assert "Vivado is not on PATH" in errors[0] and str(tmp_path) in errors[0]
    assert "sh build_top.sh" in errors[0]
    for name in ("build_top.sh", "top.tcl", "top.xdc", "top.v", "program.tcl"):
        assert (tmp_path / name).exists(), name


def test_bitstream_and_program_with_vivado(tmp_path):
    """With ``vivado`` on PATH the written script runs it on top.tcl; ``program`` runs it
    on program.tcl; ``program`` without a bitstream names the fix."""
    tools = fake_vivado(tmp_path / "bin")
    path = f"{tools}{os.pathsep}{os.environ['PATH']}"
    tree = tmp_path / "tree"
    run = run_build("program", "--build-dir", str(tree), path=path)
    assert run.returncode == 1 and "run `make bitstream` first" in run.stderr
    run = run_build("bitstream", "--build-dir", str(tree), *SMALL_ARGS, path=path)
    assert run.returncode == 0, run.stderr
    assert (tree / "top.bit").exists()
    assert "-mode batch -log top.log -source top.tcl" in (tree / "vivado.args").read_text()
    run = run_build("program", "--build-dir", str(tree), path=path)
    assert run.returncode == 0, run.stderr
    assert "-source program.tcl" in (tree / "vivado.args").read_text()


def fake_vivado(directory):
    """A ``vivado`` that records its arguments and writes ``top.bit`` as the flow would."""
    directory.mkdir()
    tool = directory / "vivado"
    tool.write_text('#!/bin/sh\necho "$@" >> vivado.args\n'
                    'case "$*" in *top.tcl*) echo bitstream > top.bit ;; esac\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return directory
