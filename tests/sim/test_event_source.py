"""The example EventCore (the core with the example event source on its user ports) in
cocotb, through the Python runner (SIM=verilator or SIM=icarus): event_source_bench, on
the build every cocotb bench of the core runs (tests/sim/conftest.py)."""

import pytest

from sim.runner import BUILD, run
from sim.testbench import SOURCE_PARAMS

from .test_core import HERE


@pytest.mark.parametrize("testcase", ["fragments_land_in_the_host_ring"])
def test_event_source(core_design, testcase):
    pcap = BUILD / "pcap" / f"event_source-{testcase}.pcap"
    run(core_design, module="event_source_bench", test_dir=HERE, testcase=testcase,
        params={**SOURCE_PARAMS, "pcap": str(pcap)})
    assert pcap.stat().st_size > 24, "the simulation wrote no frames to its pcap"
