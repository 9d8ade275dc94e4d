# amaranth: UnusedElaboratable=no
"""The VCU118 build tree: the whole top elaborates to Verilog with the CMAC instance; the
XDC places every pin the board's documentation (UG1224) gives and constrains every clock;
the Tcl creates the CMAC IP with its properties before synthesis and stops before the
bitstream when timing fails (run under tclsh with Vivado's commands stubbed); `make bitstream`
without Vivado writes the tree and says so in one line, and with Vivado runs it."""

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from boards import build
from boards.cmac_ip import cmac_ip_properties
from boards.timing_gate import gate_report_name

#: Under pytest-xdist, the module's tests stay on one worker, which converts each tree once.
pytestmark = pytest.mark.xdist_group("vcu118-tree")

#: Small core parameters: the same top and ports, quicker to convert.
SMALL_CORE = {"qps": 4, "retransmit_beats": 64, "messages": 8}

#: Pins from the VCU118 user guide (UG1224), written out here independently of the
#: platform file: (port, LOC).
BOARD_PINS = [
    ("clk125_0__p", "AY24"), ("clk125_0__n", "AY23"), ("cpu_reset_0__io", "L19"),
    ("qsfp_refclk_0__p", "W9"), ("qsfp_refclk_0__n", "W8"),
    *[(f"led_{n}__io", pin) for n, pin in
      enumerate("AT32 AV34 AY30 BB32 BF32 AU37 AV36 BA37".split())],
    *[(f"switch_{n}__io", pin) for n, pin in enumerate("B17 G16 J16 D21".split())],
    ("uart_0__tx__io", "BB21"), ("uart_0__rts__io", "BB22"),
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
            "rx_axis_tvalid", "rx_axis_tdata", "tx_axis_tready", "stat_rx_aligned",
            "stat_rx_remote_fault", "stat_rx_rsfec_am_lock0", "stat_rx_rsfec_am_lock3",
            "stat_rx_rsfec_lane_alignment_status", "stat_rx_rsfec_hi_ser",
            "stat_rx_rsfec_corrected_cw_inc", "stat_rx_rsfec_uncorrected_cw_inc"} <= ports
    # Pause processing is off in the CMAC: it forwards PAUSE and PFC frames to the core.
    for kind in ("gcp", "gpp", "pcp", "ppp"):
        assert re.search(rf"\.ctl_rx_enable_{kind}\(1'h0\)", instance[1]), kind
    assert re.search(r"\.ctl_rx_pause_enable\(9'h000\)", instance[1])
    # The receive datapath reset is driven (by the watchdog), not tied off.
    assert re.search(r"\.gtwiz_reset_rx_datapath\(\w+\)", instance[1])
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
    assert (properties["RX_FLOW_CONTROL"], properties["RX_FORWARD_CONTROL_FRAMES"]) == ("1", "1")
    assert properties == cmac_ip_properties(qsfp)


def test_timing_gate_stands_between_routing_and_bitstream(tree):
    _, build_dir = tree
    lines = (build_dir / "top.tcl").read_text().splitlines()
    route = lines.index("route_design")
    gate = next(n for n, line in enumerate(lines) if line.startswith("if {[timing_gate "))
    bitstream = next(n for n, line in enumerate(lines) if line.startswith("write_bitstream"))
    assert route < lines.index("phys_opt_design") < gate < bitstream
    assert lines[gate + 1].lstrip().startswith("error ")


#: Vivado's commands as the gate uses them, answering from the arrays ``slack`` (by delay
#: type) and the variable ``wpws``; every other Vivado command does nothing, and
#: ``write_bitstream`` leaves a ``top.bit``.
TCL_STUBS = r"""
proc unknown {args} { return "" }
proc get_timing_paths {args} {
    set type [lindex $args [expr {[lsearch $args -delay_type] + 1}]]
    if {$::slack($type) eq ""} { return {} }
    if {"-slack_lesser_than" in $args && $::slack($type) >= 0} { return {} }
    return [list path_$type]
}
proc get_property {name object} {
    if {$object eq ""} { error "get_property expects at least one object" }
    if {$name eq "SLACK"} { return $::slack([string range $object 5 end]) }
    return "${name}_of_$object"
}
proc report_timing_summary {args} {
    set header "    WNS(ns)  TNS(ns)  TNS Failing Endpoints  TNS Total Endpoints  WHS(ns)  THS(ns)\
  THS Failing Endpoints  THS Total Endpoints  WPWS(ns)  TPWS(ns)  TPWS Failing Endpoints\
  TPWS Total Endpoints"
    return [join [list "Design Timing Summary" "" $header "    -------  -------" \
        "    $::slack(max) 0.000 0 100 $::slack(min) 0.000 0 100 $::wpws 0.000 0 50 " ""] "\n"]
}
proc report_pulse_width {args} { return "pulse width violator: gt_txusrclk2" }
proc write_bitstream {args} { close [open top.bit w] }
"""

needs_tclsh = pytest.mark.skipif(shutil.which("tclsh") is None,
                                 reason="needs tclsh (Debian package tcl; .ci/run installs it)")


def run_flow_after_routing(build_dir, tmp_path, *, wns, whs, wpws):
    """``top.tcl`` from ``route_design`` on, under tclsh with Vivado's commands stubbed."""
    lines = (build_dir / "top.tcl").read_text().splitlines()
    flow = "\n".join(lines[lines.index("route_design"):])
    script = tmp_path / "flow.tcl"
    script.write_text(f"{TCL_STUBS}\narray set slack {{max {{{wns}}} min {{{whs}}}}}\n"
                      f"set wpws {{{wpws}}}\n{flow}\n")
    run = subprocess.run(["tclsh", script.name], cwd=tmp_path, capture_output=True, text=True)
    return run, (tmp_path / gate_report_name("top")).read_text().splitlines()


@needs_tclsh
@pytest.mark.parametrize("wns, whs, wpws", [("0.012", "0.010", "0.225"),
                                            ("inf", "0.000", "NA")])
def test_timing_gate_passes_when_every_slack_is_met(tree, tmp_path, wns, whs, wpws):
    _, build_dir = tree
    run, report = run_flow_after_routing(build_dir, tmp_path, wns=wns, whs=whs, wpws=wpws)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "top.bit").exists()
    assert len(report) == 3 and all(line.endswith(" ok") for line in report), report


@needs_tclsh
@pytest.mark.parametrize("failing, wns, whs, wpws", [
    ("setup (WNS)", "-0.081", "0.010", "0.225"),
    ("hold (WHS)", "0.012", "-0.004", "0.225"),
    ("pulse width (WPWS)", "0.012", "0.010", "-0.133"),
    ("setup (WNS)", "", "0.010", "0.225"),
])
def test_timing_gate_fails_on_a_negative_slack(tree, tmp_path, failing, wns, whs, wpws):
    """Non-zero exit before write_bitstream; the failing check and its worst paths named."""
    _, build_dir = tree
    run, report = run_flow_after_routing(build_dir, tmp_path, wns=wns, whs=whs, wpws=wpws)
    assert run.returncode != 0 and "timing failed" in run.stderr
    assert not (tmp_path / "top.bit").exists()
    failed = [line for line in report if line.endswith(" FAIL")]
    assert len(failed) == 1 and failed[0].startswith(failing + ":"), report
    details = report[report.index(failed[0]) + 1:]
    if failing == "pulse width (WPWS)":
        assert "pulse width violator: gt_txusrclk2" in details
    elif wns:
        delay_type = "max" if failing.startswith("setup") else "min"
        assert details[0].split() == [
            (wns if delay_type == "max" else whs), "ns", f"STARTPOINT_PIN_of_path_{delay_type}",
            "->", f"ENDPOINT_PIN_of_path_{delay_type}", f"(STARTPOINT_CLOCK_of_path_{delay_type}",
            "->", f"ENDPOINT_CLOCK_of_path_{delay_type})"]


def test_jtag_scripts_load_and_flash_the_bitstream(tree):
    _, build_dir = tree
    program = (build_dir / "program.tcl").read_text()
    for command in ("open_hw_manager", "connect_hw_server -url localhost:3121",
                    "open_board_device xcvu9p {}", "set_property PROGRAM.FILE {top.bit}",
                    "program_hw_devices"):
        assert command in program
    flash = (build_dir / "flash.tcl").read_text()
    assert "-loadbit {up 0x00000000 top.bit}" in flash and "program_hw_cfgmem" in flash


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
    """With ``vivado`` on PATH the written script runs it on top.tcl; ``program`` and
    ``flash`` run it on program.tcl and flash.tcl, for the JTAG target asked for;
    ``program`` without a bitstream names the fix."""
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
    run = run_build("flash", "--build-dir", str(tree), "--jtag-target", "210308A5A8DB",
                    path=path)
    assert run.returncode == 0, run.stderr
    assert "-log flash.log -source flash.tcl" in (tree / "vivado.args").read_text()
    assert "open_board_device xcvu9p {210308A5A8DB}" in (tree / "flash.tcl").read_text()


def test_bitstream_that_fails_timing(tmp_path):
    """The gate stops Vivado: `make bitstream` fails with one line naming the failed check
    and the reports, and leaves no top.bit (not even one of an earlier run)."""
    tools = fake_vivado(tmp_path / "bin", timing_failed=True)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "top.bit").write_text("an earlier bitstream")
    run = run_build("bitstream", "--build-dir", str(tree), *SMALL_ARGS,
                    path=f"{tools}{os.pathsep}{os.environ['PATH']}")
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, run.stderr
    assert "timing failed" in errors[0] and "setup (WNS): -0.081 ns FAIL" in errors[0]
    assert str(tree / "top_timing_gate.rpt") in errors[0]
    assert str(tree / "top_timing.rpt") in errors[0]
    assert not (tree / "top.bit").exists()


def fake_vivado(directory, *, timing_failed=False):
    """A ``vivado`` that records its arguments and, on top.tcl, writes ``top.bit`` as the
    flow would, or the gate's report of a setup failure and exits 1 as the gate does."""
    directory.mkdir()
    tool = directory / "vivado"
    flow = ("printf 'setup (WNS): -0.081 ns FAIL\\n    -0.081 ns  a/Q -> b/D\\n' "
            "> top_timing_gate.rpt; exit 1" if timing_failed else "echo bitstream > top.bit")
    tool.write_text('#!/bin/sh\necho "$@" >> vivado.args\n'
                    f'case "$*" in *top.tcl*) {flow} ;; esac\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return directory
