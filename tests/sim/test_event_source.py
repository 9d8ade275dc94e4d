"""The example EventCore (the core with the example event source on its user ports) in
cocotb, through the Python runner (SIM=verilator or SIM=icarus): event_source_bench."""

import pytest

from sim.netdev import event_core_design as build_event_core
from sim.runner import BUILD, run
from sim.testbench import EVENT_CORE_PARAMS as PARAMS

from .test_core import HERE


@pytest.fixture(scope="module")
def event_core_design():
    return build_event_core()


@pytest.mark.parametrize("testcase", ["fragments_land_in_the_host_ring"])
def test_event_source(event_core_design, testcase):
    pcap = BUILD / "pcap" / f"event_source-{testcase}.pcap"
    run(event_core_design, module="event_source_bench", test_dir=HERE, testcase=testcase,
        params={**PARAMS, "pcap": str(pcap)})
    assert pcap.stat().st_size > 24, "the simulation wrote no frames to its pcap"
