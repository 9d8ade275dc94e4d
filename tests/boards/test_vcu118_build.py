# amaranth: UnusedElaboratable=no
"""The VCU118 build trees (one cage, or both): the whole top elaborates to Verilog with each
CMAC instance; the XDC places every pin the board's documentation (UG1224) and corundum's
two-cage design give and constrains every clock; the Tcl creates each CMAC IP with its
properties before synthesis and stops before the bitstream when timing fails (run under
tclsh with Vivado's commands stubbed); `make bitstream` without Vivado writes the tree and
says so in one line, and with Vivado runs it."""

import argparse
import os
import re
import shutil
import stat
import subprocess

import pytest

from boards import build
from boards.cmac_ip import cmac_ip_properties
from boards.timing_gate import gate_report_name

from .trees import SMALL_ARGS, path_without_vivado, run_build

#: Under pytest-xdist, the module's tests stay on one worker, which converts each tree once.
pytestmark = pytest.mark.xdist_group("vcu118-tree")


#: Pins from the VCU118 user guide (UG1224), written out here independently of the
#: platform file: (port, LOC).
BOARD_PINS = [
    ("clk125_0__p", "AY24"), ("clk125_0__n", "AY23"), ("cpu_reset_0__io", "L19"),
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
#: The CMAC site and GTY channels of each cage, as corundum's VCU118 100G design sets them
#: (fpga/mqnic/VCU118/fpga_100g/ip/cmac_usplus_0.tcl and cmac_usplus_1.tcl:
#: CMAC_CORE_SELECT, GT_GROUP_SELECT, LANE1-4_GT_LOC; its fpga.xdc places the same lanes).
CAGE_CMAC = {1: ("CMACE4_X0Y7", "X1Y48 X1Y49 X1Y50 X1Y51"),
             2: ("CMACE4_X0Y8", "X1Y52 X1Y53 X1Y54 X1Y55")}
#: The GTY reference clocks' pins (corundum's fpga.xdc: qsfp1_mgt_refclk_0 on W9/W8,
#: MGTREFCLK0 of quad 231 from U38; qsfp2_mgt_refclk_0 on R9/R8, MGTREFCLK0 of quad 232
#: from U104), by ``qsfp_refclk`` number.
REFCLK_PINS = {0: ("W9", "W8"), 1: ("R9", "R8")}

#: Per tree: each cage's CMAC IP and the reference clock it takes. One cage: cmac_usplus_0 on
#: quad 231's reference clock (which reaches quad 232 too); both: corundum's two-CMAC design
#: (rtl/fpga.v at 1bb5d8ab: cmac_usplus_0 on qsfp1_mgt_refclk_0, cmac_usplus_1 on
#: qsfp2_mgt_refclk_0).
TREE_CMACS = {"1": {1: ("cmac_usplus_0", 0)}, "2": {2: ("cmac_usplus_0", 0)},
              "both": {1: ("cmac_usplus_0", 0), 2: ("cmac_usplus_1", 1)}}


@pytest.fixture
def small_tree(example_tree):
    """The build script of the tree for QSFP2 (a small core, the example source)."""
    build_dir, _ = example_tree
    return build_dir / "build_top.sh"


@pytest.fixture(scope="module")
def both_tree(tmp_path_factory):
    """The tree for both cages with small cores, written by ``make bitstream QSFP=both``'s
    command without Vivado on PATH: ``(tree, the command's stderr)``."""
    build_dir = tmp_path_factory.mktemp("vcu118-qsfpboth")
    run = run_build("bitstream", "--qsfp", "both", "--build-dir", str(build_dir),
                    *SMALL_ARGS, path=path_without_vivado())
    assert run.returncode == 1, run.stderr
    return build_dir, run.stderr


@pytest.fixture(scope="module", params=["1", "2", "both"],
                ids=["qsfp1-default-core", "qsfp2-small-core-example", "qsfpboth-small-core"])
def tree(request, tmp_path_factory):
    """The tree ``make bitstream`` writes: for QSFP1 with the default core (what users
    build; about a minute to convert), for QSFP2 with a small one and the example source
    (``example_tree``), for both cages with small ones (through the command line without
    Vivado, as ``make bitstream QSFP=both``)."""
    if request.param == "both":
        build_dir, _ = request.getfixturevalue("both_tree")
    elif request.param == "2":
        build_dir, _ = request.getfixturevalue("example_tree")
    else:
        build_dir = tmp_path_factory.mktemp("vcu118-qsfp1")
        build.write_tree(build_dir, qsfp=1)
    return request.param, build_dir


def cmac_instances(verilog):
    """``{IP module name: (the module holding it, its connections)}``."""
    instances = {}
    for module in re.split(r"^endmodule", verilog, flags=re.M):
        name = re.search(r"^module (\\\S+|\w+)", module, re.M)
        for ip, ports in re.findall(r"^  (cmac_usplus_\d) ip \((.*?)\);", module, re.M | re.S):
            instances[ip] = (name[1], ports)
    return instances


def locs(xdc):
    return dict((port.replace("\\", ""), pin) for pin, port in
                re.findall(r'set_property LOC (\S+) \[get_ports "?([^"\]]+\]?)"?\]', xdc))


def test_the_whole_top_elaborates_with_the_cmac(tree):
    qsfp, build_dir = tree
    verilog = (build_dir / "top.v").read_text()
    assert re.search(r"^module top\(", verilog, re.M)
    instances = cmac_instances(verilog)
    assert sorted(instances) == sorted(ip for ip, _ in TREE_CMACS[qsfp].values())
    for cage, (ip, refclk) in TREE_CMACS[qsfp].items():
        _, connections = instances[ip]
        for pin in ("gt_rxp_in", "gt_rxn_in", "gt_txp_out", "gt_txn_out"):
            assert re.search(rf"\.{pin}\(qsfp_{cage}__[rt]x__[pn]\)", connections), (ip, pin)
        for pin in ("p", "n"):
            assert f".gt_ref_clk_{pin}(qsfp_refclk_{refclk}__{pin})" in connections, ip
        check_cmac_instance(connections)
    port_names = ["port"] if qsfp != "both" else ["port1", "port2"]
    for port in port_names:
        assert re.search(rf"^module \\top\.{port}\.core\b", verilog, re.M), f"no core in {port}"


def check_cmac_instance(connections):
    ports = set(re.findall(r"\.(\w+)\(", connections))
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
        assert re.search(rf"\.ctl_rx_enable_{kind}\(1'h0\)", connections), kind
    assert re.search(r"\.ctl_rx_pause_enable\(9'h000\)", connections)
    # The receive datapath reset is driven (by the watchdog), not tied off.
    assert re.search(r"\.gtwiz_reset_rx_datapath\(\w+\)", connections)
    # The receive side runs on the TX user clock.
    assert re.search(r"\.gt_txusrclk2\((\w+)\).*\.rx_clk\(\1\)", connections, re.S)


def test_xdc_places_every_pin(tree):
    qsfp, build_dir = tree
    placed = locs((build_dir / "top.xdc").read_text())
    expected = dict(BOARD_PINS)
    for cage, (_, refclk) in TREE_CMACS[qsfp].items():
        for signal, pins in CAGE_PINS[cage].items():
            for lane, pin in enumerate(pins.split()):
                name = f"qsfp_{cage}__{signal}"
                expected[f"{name}[{lane}]" if " " in pins else name] = pin
        expected.update(zip([f"qsfp_refclk_{refclk}__p", f"qsfp_refclk_{refclk}__n"],
                            REFCLK_PINS[refclk], strict=True))
    assert {port: placed.get(port) for port in expected} == expected
    cages = {f"qsfp_{cage}__" for cage in TREE_CMACS[qsfp]}
    refclks = {f"qsfp_refclk_{refclk}__" for _, refclk in TREE_CMACS[qsfp].values()}
    assert all(port.startswith(tuple(cages | refclks)) for port in placed
               if port.startswith("qsfp_")), "a pin of a cage or clock the build does not use"


def test_xdc_constrains_every_clock(tree):
    qsfp, build_dir = tree
    xdc = (build_dir / "top.xdc").read_text()
    clocks = dict(re.findall(r"create_clock -name (\S+) -period (\S+)", xdc))
    assert float(clocks["clk125_0__p"]) == 8.0
    for _, refclk in TREE_CMACS[qsfp].values():
        assert float(clocks[f"qsfp_refclk_{refclk}__p"]) == pytest.approx(1000 / 156.25)
    # Each CMAC's GT clocks are created by the IP's constraints; ours declares them
    # asynchronous to the board clock and to each other's.
    groups = re.search(r"set_clock_groups -asynchronous (.*)", xdc)[1].split(" -group ")
    assert "clk125_0__p" in groups[0] and "core_mmcm/CLKOUT0" in groups[1]
    cmac_groups = [re.fullmatch(r"\[get_clocks -include_generated_clocks .*REF_NAME == (\w+)\}.*"
                                r"gt_txusrclk2\}\]\]", group) for group in groups[2:]]
    assert [group and group[1] for group in cmac_groups] == [
        ip for ip, _ in TREE_CMACS[qsfp].values()]
    assert "set_property CONFIG_VOLTAGE 1.8 [current_design]" in xdc


def test_core_runs_at_250_mhz_behind_asynchronous_fifos(tree):
    """The MMCM makes 250 MHz from the 125 MHz board clock (the VCO within UltraScale+'s
    800-1600 MHz); the cores' clock is its output, each CMAC's TX user clock is another
    domain, and the FIFOs between them (and the status's, to the board clock) are
    constrained: the clocks asynchronous in the XDC, each FIFO's two gray-code pointers
    with a bus skew after synthesis."""
    qsfp, build_dir = tree
    ports = ["port"] if qsfp != "both" else ["port1", "port2"]
    fifos = [f"{port}/cmac_port/{fifo}" for port in ports
             for fifo in ("rx_fifo", "tx_fifo", "status_fifo")]
    verilog = (build_dir / "top.v").read_text()
    mmcm = re.search(r"^  MMCME4_BASE #\((.*?)\) core_mmcm \((.*?)\);", verilog, re.M | re.S)
    assert mmcm, "no MMCM"
    parameters = {name: float(value) for name, value in
                  re.findall(r"\.(\w+)\((?:32'd)?([\d.]+)\)", mmcm[1])}
    vco = 1000 / parameters["CLKIN1_PERIOD"] * parameters["CLKFBOUT_MULT_F"] \
        / parameters["DIVCLK_DIVIDE"]
    assert 800 <= vco <= 1600 and vco / parameters["CLKOUT0_DIVIDE_F"] == 250
    for fifo in fifos:
        module = "top." + fifo.replace("/", ".") + ".produce_cdc"
        assert re.search(rf"^module \\{re.escape(module)}\b", verilog, re.M), fifo
    xdc = (build_dir / "top.xdc").read_text()
    groups = re.search(r"set_clock_groups -asynchronous (.*)", xdc)[1].split(" -group ")
    assert len(groups) == 2 + len(ports) and "core_mmcm/CLKOUT0" in groups[1]
    script = (build_dir / "top.tcl").read_text()
    synthesis, placement = script.index("synth_design -top top"), script.index("opt_design")
    skews = re.findall(r"^set_bus_skew .*NAME =~ ([\w/]+)/(\w+)/stage0_reg.* ([\d.]+)$",
                       script, re.M)
    assert sorted((fifo, cdc) for fifo, cdc, _ in skews) == sorted(
        (fifo, cdc) for fifo in fifos for cdc in ("consume_cdc", "produce_cdc"))
    assert all(float(skew) <= 1e3 / 322.265625 for *_, skew in skews)
    assert all(synthesis < script.index(f"{fifo}/{cdc}/") < placement for fifo, cdc, _ in skews)
    # Amaranth's flow cuts every synchronizer's input (the pointers' too) just before.
    false_paths = script.index('amaranth.vivado.false_path == "TRUE"')
    assert synthesis < false_paths < script.index("set_bus_skew")


def test_tcl_creates_the_cmac_before_synthesis(tree):
    qsfp, build_dir = tree
    lines = (build_dir / "top.tcl").read_text().splitlines()

    def first(prefix):
        return next(n for n, line in enumerate(lines) if line.startswith(prefix))

    created = [re.search(r"-module_name (\w+)$", line)[1] for line in lines
               if line.startswith("create_ip -name cmac_usplus ")]
    assert created == [ip for ip, _ in TREE_CMACS[qsfp].values()]
    script = "\n".join(lines)
    settings = {match[2]: (script[:match.start()].count("\n"), match[1]) for match in re.finditer(
        r"^set_property -dict \[list (.*?)\] \[get_ips (\w+)\]$", script, re.M | re.S)}
    assert sorted(settings) == sorted(created)
    for cage, (ip, _) in TREE_CMACS[qsfp].items():
        create = first(f"create_ip -name cmac_usplus -vendor xilinx.com -library ip "
                       f"-module_name {ip}")
        assert first("create_project") < create < settings[ip][0] \
            < first(f"generate_target all [get_ips {ip}]") \
            < first(f"synth_ip [get_ips {ip}]") < first("synth_design -top top")
        properties = dict(re.findall(r"CONFIG\.(\w+) \{([^}]*)\}", settings[ip][1]))
        site, channels = CAGE_CMAC[cage]
        channels = channels.split()
        assert properties["CMAC_CORE_SELECT"] == site
        assert properties["GT_GROUP_SELECT"] == f"{channels[0]}~{channels[-1]}"
        assert [properties[f"LANE{n}_GT_LOC"] for n in range(1, 5)] == channels
        assert all(properties[f"LANE{n}_GT_LOC"] == "NA" for n in range(5, 11))
        assert properties["CMAC_CAUI4_MODE"] == "1" and properties["NUM_LANES"] == "4x25"
        assert properties["GT_REF_CLK_FREQ"] == "156.25"
        assert properties["USER_INTERFACE"] == "AXIS"
        assert properties["INCLUDE_RS_FEC"] == "1" and properties["GT_DRP_CLK"] == "125"
        assert int(properties["RX_MAX_PACKET_LEN"]) >= 4096 + 100
        assert (properties["RX_FLOW_CONTROL"],
                properties["RX_FORWARD_CONTROL_FRAMES"]) == ("1", "1")
        assert properties == cmac_ip_properties(cage)


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


def test_bitstream_without_vivado(both_tree):
    """Non-zero, the tree written, and one error line that says how to finish."""
    build_dir, stderr = both_tree
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert "Vivado is not on PATH" in errors[0] and str(build_dir) in errors[0]
    assert "sh build_top.sh" in errors[0]
    for name in ("build_top.sh", "top.tcl", "top.xdc", "top.v", "program.tcl"):
        assert (build_dir / name).exists(), name


def test_both_cages_build_directory_and_options():
    """``--qsfp both`` builds in build/vcu118-qsfpboth; port 2's addresses are refused for
    a single cage."""
    args = argparse.Namespace(board="vcu118", qsfp="both", build_dir=None)
    assert build._build_dir(args) == build.ROOT / "build" / "vcu118-qsfpboth"
    run = run_build("bitstream", "--qsfp", "2", "--ip2", "10.77.1.9", path=os.environ["PATH"])
    assert run.returncode == 2 and "--qsfp both" in run.stderr


def copy_of(script, tmp_path):
    """A copy of the tree of ``script`` in ``tmp_path``, and its script there."""
    shutil.copytree(script.parent, tmp_path / "tree")
    return tmp_path / "tree" / script.name


def test_bitstream_and_program_with_vivado(small_tree, tmp_path, monkeypatch, capsys):
    """With ``vivado`` on PATH the written script runs it on top.tcl; ``program`` and
    ``flash`` run it on program.tcl and flash.tcl, for the JTAG target asked for;
    ``program`` without a bitstream names the fix."""
    tools = fake_vivado(tmp_path / "bin")
    path = f"{tools}{os.pathsep}{os.environ['PATH']}"
    script = copy_of(small_tree, tmp_path)
    tree = script.parent
    run = run_build("program", "--build-dir", str(tree), path=path)
    assert run.returncode == 1 and "run `make bitstream` first" in run.stderr
    monkeypatch.setenv("PATH", path)
    assert build.run_vivado(script) == 0, capsys.readouterr().err
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


def test_bitstream_that_fails_timing(small_tree, tmp_path, monkeypatch, capsys):
    """The gate stops Vivado: `make bitstream` fails with one line naming the failed check
    and the reports, and leaves no top.bit (not even one of an earlier run)."""
    tools = fake_vivado(tmp_path / "bin", timing_failed=True)
    script = copy_of(small_tree, tmp_path)
    tree = script.parent
    (tree / "top.bit").write_text("an earlier bitstream")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    assert build.run_vivado(script) != 0
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
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
