"""RequesterTransmitter against the Scapy model of sim/rocev2.py: every datagram it
sends (transport headers, payload, pad, ICRC slot) and every completion."""

import random

import pytest
from amaranth.lib import data

from gateware.config import parse_ipv4
from gateware.roce.requests import QP_STATE, CompletionStatus, PathMtu, Verb
from gateware.roce.tx import RequesterTransmitter
from sim.rocev2 import ROCEV2_PORT, Message, message_packets, roce_frame

from .streams import get_item, get_packet, put_item, put_packet, run_testbenches, wait_for

WIDTH = 64
HEADERS = 14 + 20 + 8        # Ethernet, IPv4, UDP in front of the transport headers
VERBS = [verb.name for verb in Verb]


class Qp:
    def __init__(self, index, *, remote_qpn, psn, rkey, remote_ip, path_mtu, src_port):
        self.index, self.remote_qpn, self.psn, self.rkey = index, remote_qpn, psn, rkey
        self.remote_ip, self.path_mtu, self.src_port = remote_ip, path_mtu, src_port

    def state(self):
        """The QP's state as a QP_STATE constant; path MTU 0 stands for a missing one."""
        state = QP_STATE.const({
            "remote_qpn": self.remote_qpn, "next_psn": self.psn, "rkey": self.rkey,
            "remote_ip": parse_ipv4(self.remote_ip),
            "path_mtu": PathMtu.from_bytes(self.path_mtu or 256), "src_port": self.src_port})
        if self.path_mtu:
            return state
        field = QP_STATE["path_mtu"]
        mask = ((1 << field.width) - 1) << field.offset
        return data.Const(QP_STATE, state.as_value().value & ~mask)


def expected_datagrams(qp, message, *, tos, ack_interval):
    """(meta, UDP payload with a zero ICRC slot) of each packet, and advances the QP's PSN."""
    packets = message_packets(message, psn=qp.psn, path_mtu=qp.path_mtu, rkey=qp.rkey,
                              ack_interval=ack_interval)
    out = []
    for fields in packets:
        frame = roce_frame(fields, src_mac="02:00:00:00:00:02", dst_mac="02:00:00:00:00:01",
                           src_ip="10.77.0.2", dst_ip=qp.remote_ip, dest_qp=qp.remote_qpn,
                           src_port=qp.src_port | 0xC000, tos=tos, ip_id=0)
        datagram = frame[HEADERS:-4] + bytes(4)
        meta = {"dst_ip": parse_ipv4(qp.remote_ip),
                "src_port": qp.src_port | 0xC000,   # RoCEv2 source ports: 0xC000–0xFFFF
                "dst_port": ROCEV2_PORT, "length": len(datagram), "tos": tos}
        out.append((meta, datagram))
    first_psn = qp.psn
    qp.psn = (qp.psn + len(packets)) % (1 << 24)
    return out, first_psn


class Bench:
    """Work requests, payloads and QP writes in; datagrams and completions out, each
    checked in order against the model."""

    def __init__(self, *, qps=4, tos=0x02, ack_interval=0, seed=0, gaps=True):
        self.dut = RequesterTransmitter(qps=qps, width=WIDTH)
        self.tos, self.ack_interval = tos, ack_interval
        self.rng = random.Random(seed)
        self.gaps = gaps
        self.qps = {}
        self.requests = []          # (request dict, payload bytes sent)
        self.datagrams = []         # expected (meta, bytes)
        self.completions = []       # expected completion dicts
        self.seen = {"datagrams": 0, "completions": 0}
        self.configured = False

    def add_qp(self, qp):
        self.qps[qp.index] = qp.state()
        return qp

    def message(self, qp, message, *, payload=None, tag=None, status=None):
        """Queue a message; ``payload`` overrides what the payload stream carries."""
        tag = len(self.requests) if tag is None else tag
        request = {"verb": Verb[message.verb], "qp": qp.index, "tag": tag,
                   "remote_address": message.remote_address, "length": len(message.payload),
                   "immediate": message.immediate}
        sent = message.payload if payload is None else payload
        self.requests.append((request, sent))
        if status == CompletionStatus.BAD_REQUEST:
            self.completions.append({"qp": qp.index, "tag": tag, "status": status.value,
                                     "first_psn": qp.psn, "packets": 0})
            return
        if len(sent) < len(message.payload):
            message = Message(message.verb, sent + bytes(len(message.payload) - len(sent)),
                              message.remote_address, message.immediate)
        datagrams, first_psn = expected_datagrams(qp, message, tos=self.tos,
                                                  ack_interval=self.ack_interval)
        self.datagrams += datagrams
        self.completions.append({"qp": qp.index, "tag": tag,
                                 "status": (status or CompletionStatus.SUCCESS).value,
                                 "first_psn": first_psn, "packets": len(datagrams)})

    def gap_source(self, seed):
        return random.Random(seed) if self.gaps else None

    async def setup(self, ctx):
        ctx.set(self.dut.i_config, {"tos": self.tos, "ack_interval": self.ack_interval})
        for index, state in self.qps.items():
            await put_item(ctx, self.dut.i_qp_write, {"qp": index, "state": state})
        self.configured = True

    async def request_source(self, ctx):
        gaps = self.gap_source(1)
        await wait_for(ctx, lambda: self.configured, 100)
        for request, _ in self.requests:
            await put_item(ctx, self.dut.i_request, request, gaps=gaps)

    async def payload_source(self, ctx):
        gaps = self.gap_source(2)
        for _, payload in self.requests:
            await put_packet(ctx, self.dut.i_payload, payload, {}, width=WIDTH, gaps=gaps)

    async def datagram_sink(self, ctx):
        gaps = self.gap_source(3)
        for index, (meta, datagram) in enumerate(self.datagrams):
            got, got_meta = await get_packet(ctx, self.dut.o, width=WIDTH, gaps=gaps)
            assert got == datagram, (
                f"datagram {index}: got {got[:48].hex()}… ({len(got)} bytes), "
                f"expected {datagram[:48].hex()}… ({len(datagram)} bytes)")
            for field, value in meta.items():
                assert getattr(got_meta, field) == value, f"datagram {index}: {field}"
            self.seen["datagrams"] += 1

    async def completion_sink(self, ctx):
        gaps = self.gap_source(4)
        for index, expected in enumerate(self.completions):
            got = await get_item(ctx, self.dut.o_completion, gaps=gaps)
            actual = {field: getattr(got, field) for field in expected}
            actual["status"] = actual["status"].value
            assert actual == expected, f"completion {index}"
            self.seen["completions"] += 1

    def run(self, cycles=200_000):
        async def main(ctx):
            await self.setup(ctx)
            await wait_for(ctx, lambda: (self.seen["datagrams"] == len(self.datagrams)
                                         and self.seen["completions"] == len(self.completions)),
                           cycles)
            for _ in range(30):
                await ctx.tick()
                assert not ctx.get(self.dut.o.valid), "a datagram nobody expected"
                assert not ctx.get(self.dut.o_completion.valid), "a completion too many"

        run_testbenches(self.dut, main, self.request_source, self.payload_source,
                        self.datagram_sink, self.completion_sink)


def pattern(length, seed):
    return random.Random(seed).randbytes(length)


def grid_lengths(path_mtu):
    """The acceptance lengths: around 0, a word, a beat, the path MTU, and beyond (the
    cocotb bench of the whole core adds 64 KiB + 3)."""
    p = path_mtu
    return [0, 1, 3, 4, 63, 64, 65, p - 1, p, p + 1, 3 * p + 5]


@pytest.mark.parametrize("path_mtu", [256, 1024, 4096])
def test_every_verb_and_length(path_mtu):
    bench = Bench(seed=path_mtu)
    qps = [bench.add_qp(Qp(index, remote_qpn=0x11 + 0x101 * index, psn=0x100 * index + 7,
                           rkey=0xABC0 + index, remote_ip=f"10.77.0.{10 + index}",
                           path_mtu=path_mtu, src_port=0xC000 + 3 * index))
           for index in range(2)]
    count = 0
    for verb in VERBS:
        for length in grid_lengths(path_mtu):
            message = Message(verb, pattern(length, count), remote_address=0x1000_0000_0000 + count,
                              immediate=0xA5000000 + count)
            bench.message(qps[count % 2], message)
            count += 1
    bench.run()


def test_psn_wraps_across_messages():
    bench = Bench(ack_interval=0, seed=7)
    qp = bench.add_qp(Qp(1, remote_qpn=0xFFFFFF, psn=(1 << 24) - 6, rkey=1, remote_ip="10.77.0.9",
                         path_mtu=256, src_port=0xFFFF))
    rng = random.Random(3)
    for index in range(24):
        length = rng.choice([0, 1, 255, 256, 257, 700])
        bench.message(qp, Message(rng.choice(VERBS), pattern(length, index), 0x2000 * index, index))
    bench.run()
    assert qp.psn < 100, "the run did not cross the 2^24 wrap"


def test_ack_request_interval():
    bench = Bench(ack_interval=3, seed=2)
    qp = bench.add_qp(Qp(0, remote_qpn=5, psn=0, rkey=9, remote_ip="10.77.0.3", path_mtu=256,
                         src_port=0xC123))
    bench.message(qp, Message("RDMA_WRITE", pattern(10 * 256, 1), 0x4000))
    bench.message(qp, Message("SEND", pattern(2 * 256 + 1, 2)))
    bench.run()
    acks = [datagram[8] >> 7 for _, datagram in bench.datagrams]
    assert acks == [0, 0, 1, 0, 0, 1, 0, 0, 1, 1, 0, 0, 1]


def test_bad_requests_are_refused_and_drained():
    bench = Bench(qps=4, seed=5)
    good = bench.add_qp(Qp(2, remote_qpn=7, psn=100, rkey=3, remote_ip="10.77.0.4",
                           path_mtu=1024, src_port=0xC002))
    no_mtu = bench.add_qp(Qp(3, remote_qpn=8, psn=0, rkey=3, remote_ip="10.77.0.4",
                             path_mtu=0, src_port=0xC003))
    missing = Qp(9, remote_qpn=1, psn=0, rkey=0, remote_ip="10.77.0.4", path_mtu=256,
                 src_port=0)
    bench.message(good, Message("SEND", pattern(100, 1)))
    bench.message(missing, Message("SEND", pattern(300, 2)),
                  status=CompletionStatus.BAD_REQUEST)
    bench.message(no_mtu, Message("RDMA_WRITE", pattern(64, 3)),
                  status=CompletionStatus.BAD_REQUEST)
    bench.message(good, Message("RDMA_WRITE_WITH_IMMEDIATE", pattern(2000, 4), 0x8000, 77))
    bench.run()


def test_payload_shorter_or_longer_than_the_request():
    bench = Bench(seed=9)
    qp = bench.add_qp(Qp(0, remote_qpn=3, psn=0, rkey=3, remote_ip="10.77.0.5", path_mtu=256,
                         src_port=0xC000))
    bench.message(qp, Message("SEND", pattern(600, 1)), payload=pattern(600, 1)[:130],
                  status=CompletionStatus.PAYLOAD_SHORT)
    bench.message(qp, Message("SEND", pattern(100, 2)))
    bench.message(qp, Message("RDMA_WRITE", pattern(70, 3)),
                  payload=pattern(70, 3) + pattern(230, 33),
                  status=CompletionStatus.PAYLOAD_LONG)
    bench.message(qp, Message("RDMA_WRITE", pattern(0, 4)), payload=pattern(5, 4),
                  status=CompletionStatus.PAYLOAD_LONG)
    bench.message(qp, Message("SEND", pattern(256, 5)), payload=b"",
                  status=CompletionStatus.PAYLOAD_SHORT)
    bench.message(qp, Message("SEND_WITH_IMMEDIATE", pattern(513, 6), 0, 6))
    bench.run()


def test_source_port_stays_in_the_rocev2_range():
    bench = Bench(seed=11)
    qp = bench.add_qp(Qp(1, remote_qpn=9, psn=0, rkey=1, remote_ip="10.77.0.6", path_mtu=512,
                         src_port=0x1234))
    bench.message(qp, Message("SEND", pattern(1000, 1)))
    bench.run()
    assert all(meta["src_port"] == 0xD234 for meta, _ in bench.datagrams)
