"""The whole core under a bench: the tests' build of it, and a cocotb testcase of a
``*_runs`` module beside this one that writes its results as JSON."""

import json
import os
import tempfile
from pathlib import Path

from gateware.core import NetworkCore
from sim.runner import BUILD, Build, build, run, simulator
from sim.testbench import CORE_PARAMS

__all__ = ["core_design", "run_for_results"]


def core_design(params: dict = CORE_PARAMS) -> Build:
    """The core built with ``params`` (the tests' build by default, cached), and cocotb
    set to print warnings only."""
    print(f"Building the core with {simulator()} (cached after the first run)...", flush=True)
    design = build("core", lambda: NetworkCore(**params), key=repr(params))
    os.environ.setdefault("COCOTB_LOG_LEVEL", "WARNING")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    return design


def run_for_results(design: Build, module: str, testcase: str, name: str,
                    params: dict | None = None):
    """Runs ``testcase`` of ``module`` with ``params``, a pcap ``bench-<name>.pcap`` and
    a ``results`` file to write, and returns what it wrote there."""
    with tempfile.TemporaryDirectory() as directory:
        results = Path(directory) / f"{name}.json"
        run(design, module=module, test_dir=Path(__file__).parent, testcase=testcase,
            params={"pcap": str(BUILD / "pcap" / f"bench-{name}.pcap"), **(params or {}),
                    "results": str(results)})
        return json.loads(results.read_text())
