"""`make bitstream SOURCE=example`: the VCU118 tree with the example event source on the
core's user request ports (gateware/examples/event_core.py) instead of the generator
alone; without Vivado it is written and the build stops with the one error line."""

import re
import subprocess
from pathlib import Path

import pytest

from gateware.examples.event_source import EVENT_CONFIG

from .trees import path_without_vivado, run_build

pytestmark = pytest.mark.xdist_group("vcu118-tree")

ROOT = Path(__file__).resolve().parents[2]


def make_dry_run(*arguments):
    """The command `make -n` prints for the build. --no-print-directory: under `make test`
    the inner make would otherwise end with "make[1]: Leaving directory"."""
    run = subprocess.run(["make", "--no-print-directory", "-n", *arguments], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    builds = [line for line in run.stdout.splitlines() if "boards.build" in line]
    assert len(builds) == 1, run.stdout
    return builds[0].split()


def test_make_bitstream_passes_the_example_options():
    command = make_dry_run("bitstream", "SOURCE=example", "RING_SLOTS=8", "FRAGMENT_BYTES=1024")
    assert command[command.index("--source") + 1] == "example"
    assert command[command.index("--ring-slots") + 1] == "8"
    assert command[command.index("--fragment-bytes") + 1] == "1024"
    assert "--source" not in make_dry_run("bitstream")


def test_the_example_tree_without_vivado(example_tree):
    """The tree for QSFP2 with the example source (``example_tree``; the build tests check
    its cage, pins and clocks)."""
    build_dir, stderr = example_tree
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Vivado is not on PATH" in errors[0], stderr
    for name in ("build_top.sh", "top.tcl", "top.xdc", "top.v", "program.tcl"):
        assert (build_dir / name).exists(), name
    verilog = (build_dir / "top.v").read_text()
    modules = set(re.findall(r"^module \\?(\S+)", verilog, re.M))
    assert {"top.port.core", "top.port.core.core", "top.port.core.source",
            "top.port.cmac"} <= modules, modules
    # The source's build-time ring: the init of its config register.
    ring = EVENT_CONFIG.const({"slots": 8, "slot_bytes": 1024})
    init = f"{EVENT_CONFIG.size}'h{ring.as_value().value:0{-(-EVENT_CONFIG.size // 4)}x}"
    assert re.search(rf"reg \[{EVENT_CONFIG.size - 1}:0\] \\config\s+= {init};", verilog), \
        "the source's ring is not the one asked for"


def test_the_example_options_need_the_example_source(tmp_path):
    run = run_build("bitstream", "--build-dir", str(tmp_path), "--ring-slots", "8",
                    path=path_without_vivado())
    assert run.returncode == 2 and "add --source example" in run.stderr
    assert not (tmp_path / "top.v").exists()
