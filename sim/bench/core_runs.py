"""The whole core under a bench: the tests' build of it, and a cocotb testcase of a
``*_runs`` module beside this one that writes its results as JSON."""

import json
import os
import tempfile
from pathlib import Path

from gateware.examples.event_core import EventCore
from sim.runner import BUILD, Build, build, run, simulator
from sim.testbench import CORE_PARAMS, SOURCE_PARAMS

__all__ = ["core_build", "core_design", "run_for_results"]


def core_build(params: dict = CORE_PARAMS, source: dict = SOURCE_PARAMS) -> Build:
    """The benches' build of the core with ``params`` (cached): the example event source
    (built with ``source``) beside it on the user ports, with the ports themselves and
    ``use_source`` to choose (:class:`~gateware.examples.event_core.EventCore` with
    ``user_ports``). A bench of the core keeps the source off, one of the source turns it
    on, so one build serves both: a Verilator build of the core is some 4 CPU-minutes."""
    key = repr({**params, "source": source})
    return build("core", lambda: EventCore(user_ports=True, **source, **params), key=key)


def core_design(params: dict = CORE_PARAMS) -> Build:
    """The core built with ``params`` (the tests' build by default, cached), and cocotb
    set to print warnings only."""
    print(f"Building the core with {simulator()} (cached after the first run)...", flush=True)
    design = core_build(params)
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
