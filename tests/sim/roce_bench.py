"""cocotb tests of the RoCEv2 transmit path of NetworkCore; run through tests/sim/test_core.py.

Every frame on the MAC's transmit side is compared byte for byte with the frame
Scapy builds for the same fields (sim/rocev2.py), ICRC included.
"""

import json
import os
import random
from dataclasses import dataclass

import cocotb
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from gateware.config import parse_ipv4
from gateware.roce.requests import FIRST_QPN, PathMtu, Verb
from sim.bench import MIN_FRAME, NetworkBench
from sim.rocev2 import Message, generator_payload, message_packets, roce_frame

PARAMS = json.loads(os.environ["BENCH_PARAMS"])
OUR_MAC, OUR_IP = "02:00:00:00:00:02", "10.77.0.2"
PEER_MAC, PEER_IP = "52:54:00:12:34:56", "10.77.0.1"
TOS_ECT0 = 0x02
VERBS = [verb.name for verb in Verb]


@dataclass
class Qp:
    index: int
    remote_qpn: int
    psn: int
    rkey: int
    path_mtu: int
    src_port: int

    def state(self):
        return {"remote_qpn": self.remote_qpn, "next_psn": self.psn, "rkey": self.rkey,
                "remote_ip": parse_ipv4(PEER_IP),
                "path_mtu": PathMtu.from_bytes(self.path_mtu), "src_port": self.src_port}


class RoceRun:
    """A bench with QPs, the messages posted to them, and the frames they must produce."""

    def __init__(self, bench, *, tos=TOS_ECT0, ack_interval=0):
        self.bench = bench
        self.tos, self.ack_interval = tos, ack_interval
        self.expected = []            # (PacketFields, Qp) in wire order
        self.completions = []

    async def open(self, qp):
        await self.bench.set_qp(qp.index, qp.state())

    def expect(self, qp, message, tag):
        packets = message_packets(message, psn=qp.psn, path_mtu=qp.path_mtu, rkey=qp.rkey,
                                  ack_interval=self.ack_interval)
        self.expected += [(fields, qp) for fields in packets]
        self.completions.append({"qp": qp.index, "tag": tag, "status": 0, "first_psn": qp.psn,
                                 "packets": len(packets)})
        qp.psn = (qp.psn + len(packets)) % (1 << 24)

    def post(self, qp, message, tag):
        self.expect(qp, message, tag)
        self.bench.post({"verb": Verb[message.verb], "qp": qp.index, "tag": tag,
                         "remote_address": message.remote_address,
                         "length": len(message.payload), "immediate": message.immediate},
                        message.payload)

    async def check(self, timeout_cycles=20_000):
        """Every expected frame, in order, equal to Scapy's; then the completions."""
        psns = {}
        for index, (fields, qp) in enumerate(self.expected):
            frame = await self.bench.recv(timeout_cycles)
            ip_id = Ether(frame)[IP].id
            expected = roce_frame(fields, src_mac=OUR_MAC, dst_mac=PEER_MAC, src_ip=OUR_IP,
                                  dst_ip=PEER_IP, dest_qp=qp.remote_qpn, src_port=qp.src_port,
                                  tos=self.tos, ip_id=ip_id)
            expected += bytes(max(0, MIN_FRAME - len(expected)))
            assert frame == expected, (f"frame {index} (QP {qp.index}, PSN {fields.psn:#x}):\n"
                                       f"{frame.hex()}\n{expected.hex()}")
            if qp.index in psns:
                assert fields.psn == (psns[qp.index] + 1) % (1 << 24)
            psns[qp.index] = fields.psn
        await self.bench.idle(100)
        assert not self.bench.received, f"{len(self.bench.received)} frames too many"
        assert list(self.bench.completions) == self.completions


async def start(dut, **kwargs):
    bench = NetworkBench(dut, pcap=PARAMS["pcap"], peers={PEER_IP: PEER_MAC}, **kwargs)
    await bench.reset()
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
                message = Message(verb, rng.randbytes(length),
                                  remote_address=rng.getrandbits(64), immediate=rng.getrandbits(32))
                run.post(qp, message, tag)
                tag += 1
    await run.check()
    bench.close()


@cocotb.test()
async def psn_wraps_in_a_long_back_to_back_run(dut):
    """Messages back to back on one QP keep the PSN exact across the 2^24 wrap."""
    bench = await start(dut, seed=3)
    run = RoceRun(bench, tos=0xB8, ack_interval=4)
    await bench.configure_roce(tos=0xB8, ack_interval=4)
    qp = Qp(5, remote_qpn=0xABCDEF, psn=(1 << 24) - 40, rkey=0x1234, path_mtu=256,
            src_port=0xFFFF)
    await run.open(qp)
    rng = random.Random(4)
    for tag in range(60):
        length = rng.choice([0, 1, 200, 256, 257, 600, 1024, 1500])
        run.post(qp, Message(rng.choice(VERBS), rng.randbytes(length), rng.getrandbits(64),
                             rng.getrandbits(32)), tag)
    await run.check()
    assert qp.psn < 1000, "the run did not cross the wrap"
    await bench.configure_roce(tos=TOS_ECT0, ack_interval=0)
    bench.close()


@cocotb.test()
async def generator_run_follows_the_cm_rule(dut):
    """A generator run: payload words (k << 32) | j, immediate k, addresses in a ring."""
    bench = await start(dut, tx_ready=0.8, seed=5)
    run = RoceRun(bench)
    qp = Qp(2, remote_qpn=0x42, psn=0x77, rkey=0xBEEF, path_mtu=1024, src_port=0xC002)
    await run.open(qp)
    length, count, base, ring = 3000, 5, 0x7F00_0000_0000, 8000
    for k in range(count):
        address = base + (k % (ring // length)) * length
        run.expect(qp, Message("RDMA_WRITE_WITH_IMMEDIATE", generator_payload(k, length),
                               address, k), tag=k)
    await bench.start_generator({"qp": qp.index, "verb": Verb.RDMA_WRITE_WITH_IMMEDIATE,
                                 "length": length, "count": count, "divider": 0,
                                 "base": base, "ring": ring})
    await run.check()
    bench.close()


@cocotb.test()
async def acknowledgements_are_checked_and_counted(dut):
    """ACKs and NAKs for our QPs are taken; a bad ICRC, a request opcode and an unknown
    QPN are dropped and counted; the transmit side keeps working."""
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

    our_qpn = FIRST_QPN + qp.index
    for frame in (acknowledge(our_qpn, 0x1000), acknowledge(our_qpn, 0x1001, syndrome=0x60),
                  acknowledge(our_qpn, 0x1002, syndrome=0x2E),
                  acknowledge(our_qpn, 0x1000, corrupt=True),
                  acknowledge(our_qpn, 0x1000, opcode=0x0A),
                  acknowledge(FIRST_QPN + 200, 0x1000)):
        await bench.send(frame)
    run.post(qp, Message("RDMA_WRITE", bytes(range(200)), 0x1000), tag=1)
    await run.check()
    counters = bench.counters()
    assert counters["roce_ack"] == {"acks": 3, "icrc_errors": 1, "unsupported": 1,
                                    "unknown_qp": 1}, counters["roce_ack"]
    assert counters["udp"]["port"] == 0
    bench.close()
