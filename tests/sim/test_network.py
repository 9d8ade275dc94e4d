"""The network layer in cocotb: ARP, ICMP echo, UDP echo and every bad input,
against Scapy, through the Python runner (SIM=verilator or SIM=icarus)."""

from pathlib import Path

import pytest

from gateware.core import NetworkCore
from sim.runner import BUILD, build, run

HERE = Path(__file__).parent

#: Small ARP timers (in cycles) so that retries and expiry fit in a short simulation.
PARAMS = {"arp_retry_interval": 3000, "arp_lifetime": 40_000, "arp_retries": 3}


@pytest.fixture(scope="module")
def design():
    return build("network", NetworkCore(**PARAMS))


@pytest.mark.parametrize("testcase", [
    "arp_reply_matches_scapy",
    "ping_reply_accepted_by_scapy",
    "arp_resolution_survives_lost_reply",
    "unresolved_peer_is_dropped",
    "arp_entry_expires",
    "udp_echo_and_port_demux",
    "bad_input_dropped_and_counted",
    "frame_lengths_under_backpressure",
    "runtime_address_change",
])
def test_network(design, testcase):
    pcap = BUILD / "pcap" / f"network-{testcase}.pcap"
    run(design, module="network_bench", test_dir=HERE, testcase=testcase,
        params={**PARAMS, "pcap": str(pcap)})
    assert pcap.stat().st_size > 24, "the simulation wrote no frames to its pcap"
