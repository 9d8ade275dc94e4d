"""The cocotb side of ``python -m sim.bench.many_qps``: every QP of the core opened
through the connection manager (OPEN_QP from one host, a responder model as each host
QP), then 64-byte WRITEs on all of them, QP after QP, round after round.

BENCH_PARAMS gives the QPs and rounds and the JSON file to write the results to. The
run checks what it reports: every OPEN_QP answered ACK with a QP of its own, every
WRITE completed SUCCESS on its QP in order, and every responder's memory holding
exactly the payloads written to it.
"""

import json
import os
from collections import Counter

import cocotb

from gateware.roce.requests import FIRST_QPN, CompletionStatus, Verb
from host import protocol
from host.protocol import Ack, Datagram, QpInfo
from sim.models.responder import Responder
from sim.testbench import NetworkBench

PARAMS = json.loads(os.environ["BENCH_PARAMS"])
PEER_MAC, PEER_IP = "52:54:00:12:34:56", "10.77.0.1"
LENGTH = 64
HOST_QPN = 0x10000              # the host's QPs: HOST_QPN + their number
#: What a responder drops that no fault-free run may have.
DROPS = ("malformed", "not_for_us", "wrong_source", "bad_ip_checksum", "bad_udp_checksum",
         "icrc_errors", "bad_version", "bad_qpn", "bad_pkey", "bad_opcode",
         "out_of_sequence")
BASE = 0x7F00_0000_0000         # each host QP's buffer, a WRITE per round


def payload(qp, round_):
    """The bytes of QP ``qp``'s WRITE of round ``round_``: unlike any other's."""
    return bytes((qp * 7 + round_ * 13 + at) & 0xFF for at in range(LENGTH - 4)) + \
        (qp << 16 | round_).to_bytes(4, "little")


@cocotb.test()
async def many_qps(dut):
    qps, rounds = PARAMS["qps"], PARAMS["rounds"]
    bench = NetworkBench(dut, pcap=PARAMS["pcap"], peers={PEER_IP: PEER_MAC})
    await bench.reset()

    # Open every QP: each OPEN_QP answered before the next is sent.
    opened = {}                                 # endpoint QP index → its responder
    start = bench.cycle
    for number in range(qps):
        host = QpInfo(HOST_QPN + number, psn=number * 0x101 & 0xFFFFFF, rkey=0x5000 + number,
                      base_addr=BASE, ip=PEER_IP)
        reply = Datagram.decode(await bench.cm_request(
            protocol.open_qp(host, mtu=protocol.PathMtu.MTU_1024).encode(), host_ip=PEER_IP))
        assert reply.ack == Ack.ACK, f"OPEN_QP {number}: {reply}"
        index = reply.loc.qpn - FIRST_QPN
        assert 0 <= index < qps and index not in opened, f"OPEN_QP {number}: {reply}"
        responder = Responder(mac=PEER_MAC, ip=PEER_IP, peer_mac=bench.core_mac,
                              peer_ip=bench.core_ip, qpn=host.qpn, peer_qpn=reply.loc.qpn,
                              expected_psn=reply.loc.psn, rkey=host.rkey, memory_base=BASE,
                              memory_size=LENGTH * rounds, path_mtu=1024)
        bench.attach(responder)
        opened[index] = responder
    open_cycles = bench.cycle - start
    refused = Datagram.decode(await bench.cm_request(
        protocol.open_qp(QpInfo(HOST_QPN + qps, base_addr=BASE, ip=PEER_IP)).encode(),
        host_ip=PEER_IP))
    assert refused.ack == Ack.NO_QP, f"a QP past the last: {refused}"

    # The WRITEs: QP after QP, round after round.
    start = bench.cycle
    for round_ in range(rounds):
        for index in sorted(opened):
            bench.post({"verb": Verb.RDMA_WRITE.value, "qp": index,
                        "tag": (round_ * qps + index) & 0xFFFF,
                        "remote_address": BASE + round_ * LENGTH, "length": LENGTH,
                        "immediate": 0}, payload(index, round_))
    messages = qps * rounds
    await bench.wait_completions(messages, timeout_cycles=200 * messages + 100_000)
    write_cycles = bench.cycle - start

    completed = Counter()
    for completion in bench.completions:
        index = completion["qp"]
        assert completion["status"] == CompletionStatus.SUCCESS.value, completion
        assert completion["tag"] == (completed[index] * qps + index) & 0xFFFF, completion
        completed[index] += 1
    for index, responder in opened.items():
        written = b"".join(payload(index, round_) for round_ in range(rounds))
        assert bytes(responder.memory) == written, f"QP {index}: its host's memory"
        dropped = {name: responder.stats[name] for name in DROPS if responder.stats[name]}
        assert not dropped, f"QP {index}: its host dropped {dropped}"
    results = {
        "qps": qps, "rounds": rounds, "opened": len(opened), "open_cycles": open_cycles,
        "messages": messages, "completed": sum(completed.values()),
        "lost": messages - sum(completed.values()),
        "fewest": min(completed[index] for index in opened),
        "most": max(completed[index] for index in opened),
        "write_cycles": write_cycles,
        "retransmitted": sum(responder.stats.get("duplicates", 0)
                             for responder in opened.values()),
    }
    with open(PARAMS["results"], "w") as file:
        json.dump(results, file)
    bench.close()
