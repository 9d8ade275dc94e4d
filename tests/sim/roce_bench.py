"""cocotb tests of the RoCEv2 requester of NetworkCore; run through tests/sim/test_core.py.

A responder model (sim/models/responder.py) plays the peer of every QP and acknowledges
its packets. Every frame on the MAC's transmit side is compared byte for byte
with the frame Scapy builds for the same fields (sim/models/rocev2.py), ICRC included;
every message must land in the model's memory or receive queue, and complete.
"""

import json
import os
import random
from collections import deque
from dataclasses import dataclass, field, replace

import cocotb
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from gateware.config import parse_ipv4
from gateware.core import TOS_ECT0
from gateware.roce.requests import FIRST_QPN, CompletionStatus, PathMtu, Verb
from sim.models.responder import Completion, Responder
from sim.models.rocev2 import (
    Message,
    RetransmitPages,
    message_packets,
    roce_frame,
)
from sim.testbench import MIN_FRAME, NetworkBench

PARAMS = json.loads(os.environ["BENCH_PARAMS"])
OUR_MAC, OUR_IP = "02:00:00:00:00:02", "10.77.0.2"
PEER_MAC, PEER_IP = "52:54:00:12:34:56", "10.77.0.1"
VERBS = [verb.name for verb in Verb]
SUCCESS = CompletionStatus.SUCCESS.value

#: Beats of each QP's retransmit ring; None for a core without one (AckReq on
#: the last packet of a message only). TODO: always set, with the reliable core.
RING_BEATS = PARAMS.get("retransmit_beats")

#: Clock cycles of one 4.096 us timer tick in the benches: timers run ~80x faster.
TICK = 16


@dataclass
class Qp:
    """One of our QPs, its peer (a responder model once opened) and what it must produce."""
    index: int
    remote_qpn: int
    psn: int                    # the PSN of the next packet posted
    rkey: int
    path_mtu: int
    src_port: int
    memory_base: int = 0x1000_0000
    timeout: int = 8            # ACK timeout 2^8 ticks: 4096 cycles, nothing times out
    retry_count: int = 7
    rnr_retry: int = 7
    # Filled by RoceRun.open and as messages are posted:
    responder: Responder | None = None
    ring: RetransmitPages | None = None
    image: bytearray = field(default_factory=bytearray)     # the model's memory, expected
    receives: list = field(default_factory=list)            # its receive queue, expected
    unsent: deque = field(default_factory=deque)            # packets not yet seen on the wire
    sent: dict = field(default_factory=dict)                # PSN → packets seen
    next_address: int = 0
    messages: int = 0
    packets: int = 0
    bytes: int = 0
    retransmitted: int = 0      # frames seen on the wire again
    failed: bool = False        # a work request is expected to fail

    @property
    def qpn(self):
        return FIRST_QPN + self.index

    def state(self):
        return {"remote_qpn": self.remote_qpn, "next_psn": self.psn, "rkey": self.rkey,
                "remote_ip": parse_ipv4(PEER_IP), "path_mtu": PathMtu.from_bytes(self.path_mtu),
                "src_port": self.src_port, "timeout": self.timeout,
                "retry_count": self.retry_count, "rnr_retry": self.rnr_retry}

    def address(self, length):
        """A fresh range of ``length`` bytes in the peer's memory."""
        address = self.next_address
        self.next_address += length
        return address


class RoceRun:
    """A bench with QPs, a responder model for each, the messages posted to them, and
    what they must produce: frames, completions, the models' memory and receive queues."""

    def __init__(self, bench, *, tos=None):
        self.bench = bench
        self.tos = bench.roce_tos if tos is None else tos   # what the core's frames carry
        self.qps = {}                 # by remote QPN
        self.completions = []         # expected, in posting order

    async def open(self, qp, *, memory_size=1 << 20, **responder_params):
        """Set the QP in the core and attach a fresh responder as its peer."""
        await self.bench.set_qp(qp.index, qp.state())
        self.attach_peer(qp, memory_size=memory_size, **responder_params)

    def attach_peer(self, qp, *, memory_size=1 << 20, **responder_params):
        """Attach a fresh responder as the peer of a QP set in the core."""
        qp.responder = Responder(mac=PEER_MAC, ip=PEER_IP, peer_mac=OUR_MAC, peer_ip=OUR_IP,
                                 qpn=qp.remote_qpn, peer_qpn=qp.qpn, expected_psn=qp.psn,
                                 rkey=qp.rkey, memory_base=qp.memory_base,
                                 memory_size=memory_size, path_mtu=qp.path_mtu,
                                 **responder_params)
        self.bench.attach(qp.responder)
        qp.ring = RetransmitPages()
        qp.image = bytearray(memory_size)
        qp.receives, qp.unsent, qp.sent = [], deque(), {}
        qp.next_address = qp.memory_base
        qp.messages = qp.packets = qp.bytes = qp.retransmitted = 0
        qp.failed = False
        self.qps[qp.remote_qpn] = qp

    def message(self, qp, verb, payload, immediate=0):
        """A message to a fresh range of the peer's memory."""
        return Message(verb, payload, remote_address=qp.address(len(payload)),
                       immediate=immediate)

    def expect(self, qp, message, tag, status=SUCCESS):
        """What a message must produce. A failing one (``status``) is checked by its
        completion's status alone; the test checks what it left in the model."""
        packets = message_packets(message, psn=qp.psn, path_mtu=qp.path_mtu, rkey=qp.rkey,
                                  ring=qp.ring)
        qp.unsent.extend(packets)
        qp.psn = (qp.psn + len(packets)) % (1 << 24)
        if status != SUCCESS:
            qp.failed = True
            self.completions.append({"qp": qp.index, "tag": tag, "status": status})
            return
        self.completions.append({"qp": qp.index, "tag": tag, "status": SUCCESS,
                                 "first_psn": packets[0].psn, "packets": len(packets)})
        qp.messages += 1
        qp.packets += len(packets)
        qp.bytes += len(message.payload)
        if message.write:
            start = message.remote_address - qp.memory_base
            qp.image[start:start + len(message.payload)] = message.payload
        if message.verb != "RDMA_WRITE":
            qp.responder.post_receive()
            qp.receives.append(Completion(packets[-1].opcode, message.payload,
                                          message.immediate if message.with_immediate
                                          else None))

    def post(self, qp, message, tag, status=SUCCESS):
        self.expect(qp, message, tag, status)
        self.bench.post({"verb": Verb[message.verb], "qp": qp.index, "tag": tag,
                         "remote_address": message.remote_address,
                         "length": len(message.payload), "immediate": message.immediate},
                        message.payload)

    async def finish(self, timeout_cycles=50_000, *, retransmissions=False, idle_cycles=200):
        """Wait for every completion and ``idle_cycles`` more, then check the completions,
        every frame the core sent, and what landed at each peer whose messages all
        succeed."""
        await self.bench.wait_completions(len(self.completions), timeout_cycles)
        await self.bench.idle(idle_cycles)
        self.check_completions()
        self.check_frames(retransmissions=retransmissions)
        for qp in self.qps.values():
            if not qp.failed:
                self.check_landed(qp)

    def check_completions(self):
        """Exactly the expected completions, in order per QP."""
        actual = list(self.bench.completions)
        assert len(actual) == len(self.completions), \
            f"{len(actual)} completions, expected {len(self.completions)}"
        for qp in self.qps.values():
            mine = [c for c in actual if c["qp"] == qp.index]
            expected = [c for c in self.completions if c["qp"] == qp.index]
            for index, (completion, want) in enumerate(zip(mine, expected, strict=True)):
                got = {key: completion[key] for key in want}
                assert got == want, f"QP {qp.index} completion {index}: {got}, expected {want}"

    def check_frames(self, *, retransmissions):
        """Each frame the core sent is its QP's next packet, or one sent before
        (``retransmissions``: only AckReq may be added), byte for byte as Scapy
        builds it; every packet of a QP without failures was sent."""
        while self.bench.received:
            frame = self.bench.received.popleft()
            bth = Ether(frame)[BTH]
            qp = self.qps[bth.dqpn]
            if qp.unsent and qp.unsent[0].psn == bth.psn:
                fields = qp.sent[bth.psn] = qp.unsent.popleft()
            else:
                fields = qp.sent.get(bth.psn)
                assert fields is not None, f"QP {qp.index}: PSN {bth.psn:#x} out of order"
                assert retransmissions, f"QP {qp.index}: PSN {bth.psn:#x} sent again"
                qp.retransmitted += 1
                fields = replace(fields, ack_request=fields.ack_request or bool(bth.ackreq))
            expected = roce_frame(fields, src_mac=OUR_MAC, dst_mac=PEER_MAC, src_ip=OUR_IP,
                                  dst_ip=PEER_IP, dest_qp=qp.remote_qpn, src_port=qp.src_port,
                                  tos=self.tos, ip_id=Ether(frame)[IP].id)
            expected += bytes(max(0, MIN_FRAME - len(expected)))
            assert frame == expected, (f"QP {qp.index}, PSN {bth.psn:#x}:\n"
                                       f"{frame.hex()}\n{expected.hex()}")
        for qp in self.qps.values():
            assert qp.failed or not qp.unsent, f"QP {qp.index}: {len(qp.unsent)} packets unsent"

    def check_landed(self, qp):
        """Every message executed exactly once, in order, byte for byte."""
        model = qp.responder
        assert model.state == "RTS"
        assert model.stats["messages"] == qp.messages
        assert model.stats["executed"] == qp.packets
        assert model.memory == qp.image, f"QP {qp.index}: the peer's memory differs"
        assert model.receive_queue == qp.receives, f"QP {qp.index}: its receive queue differs"

    async def check_status(self, qp):
        """The core's status of a QP that finished without faults; returns it."""
        status = await self.bench.qp_status(qp.index)
        counters, model = status["counters"], qp.responder.stats
        assert (status["error"], status["outstanding"]) == (0, 0), status
        assert (counters["packets"], counters["bytes"]) == (qp.packets, qp.bytes), counters
        assert counters["retransmitted"] == qp.retransmitted == 0, counters
        assert counters["timeouts"] == 0, counters
        assert counters["acks"] == model["frames_sent"], (counters, model)
        return status


async def start(dut, *, tos=TOS_ECT0, dcqcn=True, **kwargs):
    bench = NetworkBench(dut, pcap=PARAMS["pcap"], peers={PEER_IP: PEER_MAC}, **kwargs)
    await bench.reset()
    await bench.configure_roce(tos=tos, tick=TICK)
    if not dcqcn:
        await bench.configure_dcqcn(enable=0)
    return bench


def grid_lengths(path_mtu):
    p = path_mtu
    return [0, 1, 3, 4, 63, 64, 65, p - 1, p, p + 1, 3 * p + 5, 64 * 1024 + 3]


@cocotb.test()
async def every_verb_length_and_path_mtu_matches_scapy(dut):
    """The acceptance grid, with random gaps on the payload and backpressure on the MAC."""
    bench = await start(dut, tx_ready=0.7, payload_gaps=0.2, seed=1)
    run = RoceRun(bench)
    qps = [Qp(index, remote_qpn=0x100 + 0x111 * index, psn=0x1000 * index + 3,
              rkey=0xD3D0 + index, path_mtu=mtu, src_port=0xC000 + index)
           for index, mtu in enumerate((256, 1024, 4096))]
    for qp in qps:
        await run.open(qp)
    rng = random.Random(2)
    tag = 0
    for qp in qps:
        for verb in VERBS:
            for length in grid_lengths(qp.path_mtu):
                run.post(qp, run.message(qp, verb, rng.randbytes(length), rng.getrandbits(32)),
                         tag)
                tag += 1
    await run.finish(timeout_cycles=100_000)
    for qp in qps:
        await run.check_status(qp)
    bench.close()


@cocotb.test()
async def psn_wraps_in_a_long_back_to_back_run(dut):
    """Messages back to back on one QP keep the PSN exact across the 2^24 wrap, and
    AckReq follows the retransmit ring. DCQCN is off, so the ECN field is Not-ECT
    though the traffic class set asks for ECT(0) (DSCP 46 and ECN 10: 0xBA)."""
    bench = await start(dut, tos=0xBA, seed=3, dcqcn=False)
    run = RoceRun(bench)
    assert run.tos == 0xB8
    qp = Qp(5, remote_qpn=0xABCDEF, psn=(1 << 24) - 40, rkey=0x1234, path_mtu=256,
            src_port=0xFFFF)
    await run.open(qp)
    rng = random.Random(4)
    for tag in range(60):
        length = rng.choice([0, 1, 200, 256, 257, 600, 1024, 1500])
        run.post(qp, run.message(qp, rng.choice(VERBS), rng.randbytes(length),
                                 rng.getrandbits(32)), tag)
    await run.finish()
    assert qp.psn < 1000, "the run did not cross the wrap"
    await run.check_status(qp)
    bench.close()


@cocotb.test()
async def acknowledgements_are_checked_and_counted(dut):
    """The ACK receiver takes ACKs and NAKs for our QPs (those outside a QP's window
    are then dropped by it), and drops and counts a bad ICRC, a request opcode and an
    unknown QPN; a responder acknowledges a WRITE meanwhile."""
    bench = await start(dut, seed=7)
    run = RoceRun(bench)
    qp = Qp(3, remote_qpn=0x17, psn=0x1000, rkey=0xD3D, path_mtu=1024, src_port=0xC003)
    await run.open(qp)

    def acknowledge(qpn, psn, *, syndrome=0x1F, opcode=0x11, corrupt=False):
        frame = bytes(Ether(src=PEER_MAC, dst=OUR_MAC)
                      / IP(src=PEER_IP, dst=OUR_IP, flags="DF", ttl=64)
                      / UDP(sport=0xDA25, dport=4791, chksum=0)
                      / BTH(opcode=opcode, dqpn=qpn, psn=psn)
                      / AETH(syndrome=syndrome, msn=1))
        return frame[:-1] + bytes([frame[-1] ^ 1]) if corrupt else frame

    # Nothing is outstanding yet: the first three are outside the window.
    for frame in (acknowledge(qp.qpn, qp.psn + (1 << 22)),
                  acknowledge(qp.qpn, qp.psn - 5, syndrome=0x60),
                  acknowledge(qp.qpn, qp.psn + 100, syndrome=0x2E),
                  acknowledge(qp.qpn, qp.psn, corrupt=True),
                  acknowledge(qp.qpn, qp.psn, opcode=0x0A),
                  acknowledge(FIRST_QPN + 200, qp.psn)):
        await bench.send(frame)
    run.post(qp, run.message(qp, "RDMA_WRITE", bytes(range(200))), tag=1)
    run.post(qp, run.message(qp, "SEND", bytes(3000)), tag=2)
    await run.finish()
    acks_sent = qp.responder.stats["frames_sent"]
    assert acks_sent == 2
    counters = bench.counters()
    assert counters["roce_ack"] == {"acks": acks_sent + 3, "icrc_errors": 1, "unsupported": 1,
                                    "unknown_qp": 1}, counters["roce_ack"]
    assert counters["udp"]["port"] == 0
    status = await run.check_status(qp)
    assert status["counters"]["acks_dropped"] == 3
    assert status["counters"]["icrc_errors"] == 1
    bench.close()
