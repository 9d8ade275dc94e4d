"""The whole core in cocotb, through the Python runner (SIM=verilator or SIM=icarus):
the network layer (network_bench: ARP, ICMP echo, UDP echo, every bad input), the
RoCEv2 requester (roce_bench: frames byte for byte against Scapy, ICRC included, and
what lands at a responder model) and its reliability (reliability_bench: responder
models with faults), against a ConnectX-class peer (connectx_bench), DCQCN's CNPs
(dcqcn_bench) and a congested switch (switch_bench), and PAUSE and PFC frames
(pause_bench)."""

import shutil
from pathlib import Path

import pytest

from sim.runner import BUILD, run
from sim.testbench import CORE_PARAMS

HERE = Path(__file__).parent

#: The cases that need a tool besides the simulator: (the tool, the Debian package).
TOOLS = {"every_cm_frame_sent_is_the_models_and_wireshark_dissects_it": ("tshark", "tshark")}

TESTCASES = {
    "network_bench": [
        "arp_reply_matches_scapy",
        "ping_reply_accepted_by_scapy",
        "arp_resolution_survives_lost_reply",
        "unresolved_peer_is_dropped",
        "arp_entry_expires",
        "udp_echo_and_port_demux",
        "bad_input_dropped_and_counted",
        "frame_lengths_under_backpressure",
        "runtime_address_change",
        "minimum_frames_after_a_jumbo_are_absorbed",
        "rfc1122_sources_are_discarded",
        "qp1_counts_cm_mads_and_drops_a_bad_icrc",
        "a_silent_host_never_stalls_a_qp",
    ],
    "roce_bench": [
        "every_verb_length_and_path_mtu_matches_scapy",
        "psn_wraps_in_a_long_back_to_back_run",
        "acknowledgements_are_checked_and_counted",
    ],
    "reliability_bench": [
        "packet_loss_1_percent",
        "packet_loss_10_percent",
        "ack_loss",
        "duplicated_and_ghost_acks",
        "corrupted_acks",
        "rnr_bursts",
        "responder_stalls_longer_than_the_timeout",
        "every_fault_at_once",
        "never_answering_peer_exhausts_retries",
        "error_naks_stop_the_qp",
    ],
    "cm_bench": [
        "generator_run_through_the_cm",
        "a_credited_run_writes_a_slot_only_once_the_host_has_consumed_it",
        "runs_on_several_qps_and_a_reopened_qp",
        "the_generator_pool_refuses_a_fifth_run",
        "sixteen_qps_opened_used_and_closed_in_random_order",
        "only_the_qps_host_steers_it",
        "a_host_that_restarts_closes_all_its_qps",
        "rdma_connect_opens_a_qp_that_a_cm_start_writes_into",
        "every_cm_frame_sent_is_the_models_and_wireshark_dissects_it",
        "rdma_disconnect_is_answered_with_drep_and_frees_the_qp",
        "a_dreq_from_another_host_is_ignored",
        "close_qp_of_an_rdma_cm_qp_sends_a_dreq",
        "lost_rep_lost_rtu_and_a_duplicate_req",
        "sixteen_qps_connected_back_to_back_with_rdma_cm",
        "the_endpoint_connects_to_a_listening_host",
    ],
    "connectx_bench": [
        "sixteen_qps_of_64_byte_messages_acknowledged_at_once",
        "ten_rounds_of_rnr_and_sequence_naks_with_one_retry",
        "lost_nak_on_a_slow_qp_is_resent_one_timeout_after_the_lost_packet",
        "timer_expires_on_time_while_other_qps_are_acknowledged",
    ],
    "dcqcn_bench": [
        "cnps_every_25_us_on_one_of_two_qps",
    ],
    "fuzz_bench": [
        "mutated_frames_of_every_protocol",
    ],
    "pause_bench": [
        "pause_holds_every_frame_longer_than_the_ack_timeout",
        "pfc_holds_the_roce_priority_only",
    ],
    "switch_bench": [
        "four_qps_converge_behind_a_marking_switch",
    ],
}

#: Convergence runs (minutes each): pytest's ``convergence`` mark, which ``make bench`` runs
#: and ``make test`` leaves out.
CONVERGENCE = {"four_qps_converge_behind_a_marking_switch"}


@pytest.mark.parametrize("module, testcase", [
    pytest.param(module, testcase,
                 marks=[pytest.mark.convergence] if testcase in CONVERGENCE else [])
    for module, testcases in TESTCASES.items() for testcase in testcases])
def test_core(core_design, module, testcase):
    tool, package = TOOLS.get(testcase, (None, None))
    if tool is not None and shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (apt-get install {package})")
    pcap = BUILD / "pcap" / f"{module.removesuffix('_bench')}-{testcase}.pcap"
    run(core_design, module=module, test_dir=HERE, testcase=testcase,
        params={**CORE_PARAMS, "pcap": str(pcap)})
    assert pcap.stat().st_size > 24, "the simulation wrote no frames to its pcap"
