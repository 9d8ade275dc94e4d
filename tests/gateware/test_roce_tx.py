"""RequesterTransmitter against the Scapy model of sim/models/rocev2.py: every datagram it
sends (transport headers, payload, pad, ICRC slot) and every completion, with an
acknowledger that answers each AckReq packet."""

import random

import pytest
from amaranth.lib import data

from gateware.config import parse_ipv4
from gateware.roce.page_pool import check_ring_beats
from gateware.roce.planner import PacketPlanner
from gateware.roce.requests import QP_STATE, CompletionStatus, PathMtu, Verb
from gateware.roce.tx import RequesterTransmitter
from sim.models.rocev2 import ROCEV2_PORT, Message, RetransmitPages, message_packets, roce_frame

from .streams import get_item, get_packet, put_item, put_packet, run_testbenches, wait_for

RING_BEATS = 128            # per QP: 8 KiB, so long messages wait for ACKs
ACK = 0x1F                  # AETH syndrome: ACK, no credit limit
NAK_SEQUENCE = 0x60

WIDTH = 64
HEADERS = 14 + 20 + 8        # Ethernet, IPv4, UDP in front of the transport headers
VERBS = [verb.name for verb in Verb]


class Qp:
    def __init__(self, index, *, remote_qpn, psn, rkey, remote_ip, path_mtu, src_port,
                 timeout=8, retry_count=7, ring_beats=RING_BEATS):
        self.index, self.remote_qpn, self.psn, self.rkey = index, remote_qpn, psn, rkey
        self.remote_ip, self.path_mtu, self.src_port = remote_ip, path_mtu, src_port
        self.timeout, self.retry_count = timeout, retry_count
        self.ring = RetransmitPages()

    def state(self):
        """The QP's state as a QP_STATE constant; path MTU 0 stands for a missing one."""
        state = QP_STATE.const({
            "remote_qpn": self.remote_qpn, "next_psn": self.psn, "rkey": self.rkey,
            "remote_ip": parse_ipv4(self.remote_ip),
            "path_mtu": PathMtu.from_bytes(self.path_mtu or 256), "src_port": self.src_port,
            "timeout": self.timeout, "retry_count": self.retry_count, "rnr_retry": 7})
        if self.path_mtu:
            return state
        field = QP_STATE["path_mtu"]
        mask = ((1 << field.width) - 1) << field.offset
        return data.Const(QP_STATE, state.as_value().value & ~mask)


def expected_datagrams(qp, message, *, tos):
    """(meta, UDP payload with a zero ICRC slot) of each packet, and advances the QP's PSN
    and ring."""
    packets = message_packets(message, psn=qp.psn, path_mtu=qp.path_mtu, rkey=qp.rkey,
                              ring=qp.ring)
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

    def __init__(self, *, qps=4, tos=0x02, seed=0, gaps=True, acknowledge=None,
                 ring_beats=RING_BEATS, pages=None, qp_pages=0, ack_delay=0):
        # By default the fewest pages the QPs may have (each keeps one, one fills its
        # ring), as a power of 2: a QP may wait for a page.
        pages = pages or 1 << (qps + ring_beats // 64 - 1).bit_length()
        self.qp_pages = qp_pages
        self.page_waits = None
        self.ack_delay = ack_delay      # cycles from an AckReq datagram to its ACK
        self.cycle = 0
        self.dut = RequesterTransmitter(qps=qps, ring_beats=ring_beats, pages=pages,
                                        messages=4, width=WIDTH)
        self.tos = tos
        self.acknowledge = acknowledge or (lambda qp, psn: ACK)
        self.acks = []              # (qp, psn, syndrome) to send
        self.rng = random.Random(seed)
        self.gaps = gaps
        self.qps = {}
        self.qp_objects = []
        self.holds = {}             # request index: wait until this is true before posting it
        self.requests = []          # (request dict, payload bytes sent)
        self.datagrams = []         # expected (meta, bytes)
        self.completions = []       # expected completion dicts
        self.seen = {"datagrams": 0, "completions": 0}
        self.resent = 0
        self.status = {}            # QP index: its QP_STATUS at the end
        self.configured = False

    def add_qp(self, qp):
        self.qps[qp.index] = qp.state()
        self.qp_objects.append(qp)
        return qp

    def message(self, qp, message, *, payload=None, tag=None, status=None, goes_out=True):
        """Queue a message; ``payload`` overrides what the payload stream carries;
        ``goes_out``: whether its packets are sent (a QP in ERROR sends nothing)."""
        tag = len(self.requests) if tag is None else tag
        request = {"verb": Verb[message.verb], "qp": qp.index, "tag": tag,
                   "remote_address": message.remote_address, "length": len(message.payload),
                   "immediate": message.immediate}
        sent = message.payload if payload is None else payload
        self.requests.append((request, sent))
        if status == CompletionStatus.BAD_REQUEST or not goes_out:
            self.completions.append({"qp": qp.index, "tag": tag, "status": status.value,
                                     "first_psn": qp.psn, "packets": 0})
            return
        if len(sent) < len(message.payload):
            message = Message(message.verb, sent + bytes(len(message.payload) - len(sent)),
                              message.remote_address, message.immediate)
        datagrams, first_psn = expected_datagrams(qp, message, tos=self.tos)
        self.datagrams += datagrams
        self.completions.append({"qp": qp.index, "tag": tag,
                                 "status": (status or CompletionStatus.SUCCESS).value,
                                 "first_psn": first_psn, "packets": len(datagrams)})

    def gap_source(self, seed):
        return random.Random(seed) if self.gaps else None

    async def setup(self, ctx):
        ctx.set(self.dut.i_config, {"tos": self.tos, "tick": 1, "qp_pages": self.qp_pages})
        for index, state in self.qps.items():
            await put_item(ctx, self.dut.i_qp_write, {"qp": index, "state": state})
        self.configured = True

    async def request_source(self, ctx):
        gaps = self.gap_source(1)
        await wait_for(ctx, lambda: self.configured, 100)
        for index, (request, _) in enumerate(self.requests):
            if index in self.holds:
                await wait_for(ctx, self.holds[index], 100_000)
            await put_item(ctx, self.dut.i_request, request, gaps=gaps)

    async def payload_source(self, ctx):
        gaps = self.gap_source(2)
        for _, payload in self.requests:
            await put_packet(ctx, self.dut.i_payload, payload, {}, width=WIDTH, gaps=gaps)

    async def datagram_sink(self, ctx):
        """The expected datagrams in order; a resend (a PSN already seen) must equal its
        original but for AckReq."""
        gaps = self.gap_source(3)
        originals = {}
        index = 0
        while True:
            got, got_meta = await get_packet(ctx, self.dut.o, width=WIDTH, gaps=gaps)
            key = got[5:8] + got[9:12]                  # destination QP and PSN
            expected = self.datagrams[index][1] if index < len(self.datagrams) else b""
            if key == expected[5:8] + expected[9:12]:
                meta, datagram = self.datagrams[index]
                index += 1
                self.seen["datagrams"] += 1
                originals[key] = datagram
            else:
                assert key in originals, f"datagram {index}: unexpected {got[:16].hex()}"
                meta, datagram = None, originals[key]
                self.resent += 1
            if meta is None:        # a resend may ask for an ACK its original did not
                got = got[:8] + bytes([got[8] & 0x7F | datagram[8] & 0x80]) + got[9:]
            assert got == datagram, (
                f"datagram {index}: got {got[:48].hex()}… ({len(got)} bytes), "
                f"expected {datagram[:48].hex()}… ({len(datagram)} bytes)")
            for field, value in (meta or {}).items():
                assert getattr(got_meta, field) == value, f"datagram {index}: {field}"
            if got[8] & 0x80:
                self.answer({"dst_ip": got_meta.dst_ip}, got)

    def answer(self, meta, datagram):
        """Queue the acknowledgement of an AckReq packet (or what ``acknowledge`` says)."""
        qpn = int.from_bytes(datagram[5:8], "big")
        psn = int.from_bytes(datagram[9:12], "big")
        qp = next(qp for qp in self.qp_objects if qp.remote_qpn == qpn)
        syndrome = self.acknowledge(qp, psn)
        if syndrome is not None:
            self.acks.append((self.cycle + self.ack_delay,
                              {"qp": qp.index, "src_ip": meta["dst_ip"], "psn": psn,
                               "syndrome": syndrome, "msn": 0}))

    async def ack_source(self, ctx):
        while True:
            await ctx.tick()
            self.cycle += 1
            if self.acks and self.acks[0][0] <= self.cycle:
                ctx.set(self.dut.i_ack.p, self.acks.pop(0)[1])
                ctx.set(self.dut.i_ack.valid, 1)
            else:
                ctx.set(self.dut.i_ack.valid, 0)

    async def completion_sink(self, ctx):
        """Completions in order per QP (a refused request completes at once)."""
        gaps = self.gap_source(4)
        expected = {}
        for completion in self.completions:
            expected.setdefault(completion["qp"], []).append(completion)
        for index in range(len(self.completions)):
            got = await get_item(ctx, self.dut.o_completion, gaps=gaps)
            actual = {field: getattr(got, field) for field in self.completions[0]}
            actual["status"] = actual["status"].value
            assert expected[actual["qp"]], f"completion {index}: {actual} not expected"
            want = expected[actual["qp"]].pop(0)
            assert actual == want, f"completion {index}: {actual} != {want}"
            self.seen["completions"] += 1

    def run(self, cycles=200_000, monitors=()):
        async def main(ctx):
            await self.setup(ctx)
            await wait_for(ctx, lambda: (self.seen["datagrams"] == len(self.datagrams)
                                         and self.seen["completions"] == len(self.completions)),
                           cycles)
            # Long enough for a resend already under way to leave (a packet of 256 bytes
            # is 32 beats here, with the sink's random gaps): its count is then compared.
            for _ in range(200):
                await ctx.tick()
                assert not ctx.get(self.dut.o_completion.valid), "a completion too many"
            for index in self.qps:
                ctx.set(self.dut.status_qp[0], index)
                await ctx.tick()
                self.status[index] = ctx.get(self.dut.status[0])
            self.page_waits = ctx.get(self.dut.counters.page_waits)

        run_testbenches(self.dut, main, self.request_source, self.payload_source,
                        self.datagram_sink, self.completion_sink, self.ack_source, *monitors)


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
    bench = Bench(seed=7)
    qp = bench.add_qp(Qp(1, remote_qpn=0xFFFFFF, psn=(1 << 24) - 6, rkey=1, remote_ip="10.77.0.9",
                         path_mtu=256, src_port=0xFFFF))
    rng = random.Random(3)
    for index in range(24):
        length = rng.choice([0, 1, 255, 256, 257, 700])
        bench.message(qp, Message(rng.choice(VERBS), pattern(length, index), 0x2000 * index, index))
    bench.run()
    assert qp.psn < 100, "the run did not cross the 2^24 wrap"


def test_ack_request_on_each_packet_that_enters_a_page_of_the_ring():
    """AckReq on a packet that starts a 4 KiB page of the ring (64 beats) or crosses into
    one, and on each message's last."""
    bench = Bench(seed=2)
    qp = bench.add_qp(Qp(0, remote_qpn=5, psn=0, rkey=9, remote_ip="10.77.0.3", path_mtu=256,
                         src_port=0xC123))
    bench.message(qp, Message("RDMA_WRITE", pattern(20 * 256, 1), 0x4000))
    bench.message(qp, Message("SEND", pattern(2 * 256 + 1, 2)))
    bench.message(qp, Message("RDMA_WRITE", pattern(20 * 256, 3), 0x8000))
    bench.run()
    acks = [datagram[8] >> 7 for _, datagram in bench.datagrams]
    assert acks == ([1] + [0] * 15 + [1, 0, 0, 1]       # beats 0 and 64 start pages
                    + [0, 0, 1]                         # beats 80 to 89
                    + [0] * 9 + [1] + [0] * 9 + [1])    # beats 125 to 129 cross into 128


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


def status_of(bench, qp):
    status = bench.status[qp.index]
    return status.error, status.error_status, status.counters


def once(syndrome, qp_index, psn):
    """An acknowledger that answers ``syndrome`` (None: loses the ACK) for one packet the
    first time, else ACK."""
    done = set()

    def acknowledge(qp, packet_psn):
        if qp.index == qp_index and packet_psn == psn and not done:
            done.add(psn)
            return syndrome
        return ACK
    return acknowledge


def test_nak_sequence_resends_from_the_nakd_packet():
    # AckReq on PSN 16: its packet starts the ring's second page.
    bench = Bench(seed=21, acknowledge=once(NAK_SEQUENCE, 0, 16))
    qp = bench.add_qp(Qp(0, remote_qpn=5, psn=0, rkey=9, remote_ip="10.77.0.3", path_mtu=256,
                         src_port=0xC123))
    bench.message(qp, Message("RDMA_WRITE", pattern(20 * 256, 1), 0x4000))
    bench.message(qp, Message("SEND", pattern(300, 2)))
    bench.run()
    error, _, counters = status_of(bench, qp)
    assert not error
    assert counters.naks_sequence == 1 and counters.retransmitted == bench.resent > 0
    assert counters.packets == 22 and counters.bytes == 20 * 256 + 300


def test_lost_ack_times_out_and_resends():
    # PSN 0 (it starts a page) and PSN 3 (the last) ask for an ACK; PSN 3's is lost.
    bench = Bench(seed=22, acknowledge=once(None, 0, 3))
    qp = bench.add_qp(Qp(0, remote_qpn=5, psn=0, rkey=9, remote_ip="10.77.0.3", path_mtu=256,
                         src_port=0xC123))
    bench.message(qp, Message("SEND", pattern(4 * 256, 1)))
    bench.run()
    error, _, counters = status_of(bench, qp)
    assert not error and counters.timeouts == 1 and bench.resent == 3


def test_rnr_nak_waits_then_resends():
    bench = Bench(seed=23, acknowledge=once(0x20 | 2, 1, 0))
    qp = bench.add_qp(Qp(1, remote_qpn=6, psn=0, rkey=9, remote_ip="10.77.0.3", path_mtu=256,
                         src_port=0xC123))
    bench.message(qp, Message("SEND_WITH_IMMEDIATE", pattern(40, 1), 0, 5))
    bench.run()
    error, _, counters = status_of(bench, qp)
    assert not error and counters.naks_rnr == 1 and counters.rnr_waits == 1
    assert bench.resent >= 1


def starts_and_acknowledgements(dut, syndrome):
    """A monitor of the transmitter, and the lists it fills: (cycle, PSN) of each datagram
    it sends, and the cycles an acknowledgement with ``syndrome`` comes in."""
    starts, acknowledged = [], []

    async def monitor(ctx):
        cycle, first = 0, True
        async for _, _, valid, ready, beat, ack_valid, ack in ctx.tick().sample(
                dut.o.valid, dut.o.ready, dut.o.p, dut.i_ack.valid, dut.i_ack.p):
            cycle += 1
            if valid and ready:
                if first:
                    starts.append((cycle, int.from_bytes(
                        beat.data.to_bytes(WIDTH, "little")[9:12], "big")))
                first = beat.last
            if ack_valid and ack.syndrome == syndrome:
                acknowledged.append(cycle)

    return starts, acknowledged, monitor


def test_a_resend_stops_for_an_rnr_wait():
    """A NAK for PSN 0 of a 16-packet message starts a resend; an RNR NAK for its first
    packet stops it: nothing of the QP leaves during the wait but the packets planned
    before it, then it resends from PSN 0 (IBTA 9.7.5.2.8)."""
    rnr_nak = 0x20 | 14                             # 1.28 ms: 313 ticks of 1 cycle
    # The responder NAKs PSN 0, then RNR NAKs it, each time discarding what follows until
    # PSN 0 comes again (it sees the AckReq packets: PSN 0, which starts a page of the
    # ring, the last and a resend's last).
    script = [(0, NAK_SEQUENCE), (0, rnr_nak), (0, ACK)]

    def acknowledge(qp, psn):
        if not script:
            return ACK
        if psn != script[0][0]:
            return None if len(script) < 3 else ACK
        return script.pop(0)[1]

    bench = Bench(seed=26, gaps=False, acknowledge=acknowledge)
    qp = bench.add_qp(Qp(0, remote_qpn=5, psn=0, rkey=9, remote_ip="10.77.0.3", path_mtu=256,
                         src_port=0xC123, timeout=12))
    bench.message(qp, Message("RDMA_WRITE", pattern(16 * 256, 1), 0x4000))
    sent, rnr_at, monitor = starts_and_acknowledgements(bench.dut, rnr_nak)
    bench.run(monitors=[monitor])
    assert len(rnr_at) == 1
    during = [psn for cycle, psn in sent if rnr_at[0] + 50 <= cycle < rnr_at[0] + 300]
    assert not during, f"sent during the RNR wait: PSNs {during}"
    after = [psn for cycle, psn in sent if cycle >= rnr_at[0] + 300]
    assert after[:1] == [0], after


def test_a_resend_waits_for_the_packet_being_segmented_only():
    """A NAK for PSN 3 of a message of 4 KiB packets: its resend's first beat leaves
    after the packet being segmented (66 beats with the transport headers) and at most
    24 cycles more (here 68 cycles). A planner that filled the queue to the segmenter
    (6 descriptors) would delay it to 393 cycles: each 4 KiB packet queued costs a
    further 108 cycles of a 100 Gb/s line before a go-back-N resend."""
    nak = []

    def acknowledge(qp, psn):
        # A go-back-N responder: after its NAK it answers nothing until PSN 3 comes again.
        if psn == 3:
            nak.append(psn)
            return NAK_SEQUENCE if len(nak) == 1 else ACK
        return None if len(nak) == 1 else ACK

    bench = Bench(seed=27, gaps=False, acknowledge=acknowledge, ring_beats=512)
    qp = bench.add_qp(Qp(0, remote_qpn=5, psn=0, rkey=9, remote_ip="10.77.0.3", path_mtu=4096,
                         src_port=0xC123, ring_beats=512))
    bench.message(qp, Message("RDMA_WRITE", pattern(12 * 4096, 1), 0x4000))
    starts, nak_at, monitor = starts_and_acknowledgements(bench.dut, NAK_SEQUENCE)
    bench.run(monitors=[monitor])
    assert len(nak_at) == 1
    resend = next(cycle for cycle, psn in starts if psn == 3 and cycle > nak_at[0])
    assert resend - nak_at[0] <= 66 + 24, (resend - nak_at[0], starts)


@pytest.mark.parametrize("syndrome, status", [
    (0x62, CompletionStatus.REMOTE_ACCESS_ERROR),
    (0x61, CompletionStatus.REMOTE_INVALID_REQUEST),
])
def test_error_nak_fails_the_qp_and_flushes(syndrome, status):
    bench = Bench(seed=24, acknowledge=once(syndrome, 0, 1))
    bad = bench.add_qp(Qp(0, remote_qpn=5, psn=0, rkey=9, remote_ip="10.77.0.3", path_mtu=256,
                          src_port=0xC123))
    good = bench.add_qp(Qp(1, remote_qpn=6, psn=50, rkey=9, remote_ip="10.77.0.4",
                           path_mtu=256, src_port=0xC124))
    bench.message(bad, Message("RDMA_WRITE", pattern(100, 1), 0x4000))      # PSN 0: ACKed
    bench.message(bad, Message("RDMA_WRITE", pattern(100, 2), 0x5000), status=status)
    bench.message(good, Message("SEND", pattern(700, 3)))
    # Posted once the QP failed: flushed, nothing sent.
    bench.holds[3] = lambda: bench.seen["completions"] >= 2
    bench.message(bad, Message("SEND", pattern(70, 4)), status=CompletionStatus.FLUSHED,
                  goes_out=False)
    bench.message(good, Message("SEND", pattern(70, 5)))
    bench.run()
    error, error_status, _ = status_of(bench, bad)
    assert error and error_status == status
    assert not status_of(bench, good)[0]


def test_a_silent_responder_exhausts_the_retries_and_other_qps_go_on():
    bench = Bench(seed=25, acknowledge=lambda qp, psn: None if qp.index == 0 else ACK)
    dead = bench.add_qp(Qp(0, remote_qpn=5, psn=0, rkey=9, remote_ip="10.77.0.3", path_mtu=256,
                           src_port=0xC123, timeout=5, retry_count=2))
    alive = bench.add_qp(Qp(1, remote_qpn=6, psn=0, rkey=9, remote_ip="10.77.0.4",
                            path_mtu=256, src_port=0xC124))
    bench.message(dead, Message("SEND", pattern(300, 1)), status=CompletionStatus.RETRY_EXCEEDED)
    bench.message(dead, Message("SEND", pattern(30, 2)), status=CompletionStatus.FLUSHED)
    for index in range(6):
        bench.message(alive, Message("RDMA_WRITE", pattern(500, 3 + index), 0x100 * index))
    bench.run()
    error, error_status, counters = status_of(bench, dead)
    assert error and error_status == CompletionStatus.RETRY_EXCEEDED
    assert counters.timeouts == 3 and bench.resent == 2 * 3
    assert not status_of(bench, alive)[0]


@pytest.mark.parametrize("ring_beats", [2, 32, 64, 96, 1 << 21])
def test_a_ring_that_cannot_hold_two_pages_or_be_addressed_is_refused(ring_beats):
    """A ring of 64-byte beats holds two 4 KiB pages from 128 beats on, and the
    planner's ring pointers reach 2^20 beats."""
    with pytest.raises(ValueError, match=r"power of 2, 128\.\.1048576 .* not"):
        PacketPlanner(qps=4, ring_beats=ring_beats)
    assert check_ring_beats(128) == 128 and check_ring_beats(1 << 20) == 1 << 20
    assert check_ring_beats(8, width=1024) == 8


@pytest.mark.parametrize("qp_pages, waits", [(2, True), (0, False)])
def test_a_qp_waits_at_its_run_time_cap_of_pages(qp_pages, waits):
    """A 32 KiB WRITE on a QP whose ring is 8 pages, from a pool of 16, its ACKs 300
    cycles behind: capped at 2 pages at run time it waits for ACKs to free them
    (counted), at its ring's 8 it does not;
    every datagram and completion is the model's either way."""
    bench = Bench(qps=2, seed=31, gaps=False, ring_beats=512, pages=16, qp_pages=qp_pages,
                  ack_delay=300)
    qp = bench.add_qp(Qp(0, remote_qpn=5, psn=0, rkey=9, remote_ip="10.77.0.3",
                         path_mtu=1024, src_port=0xC123, ring_beats=512, timeout=14))
    bench.message(qp, Message("RDMA_WRITE", pattern(32 * 1024, 1), 0x4000))
    bench.message(qp, Message("SEND", pattern(5000, 2)))
    bench.run()
    assert (bench.page_waits > 0) == waits, bench.page_waits
    assert bench.resent == 0


def test_qps_share_a_pool_smaller_than_their_rings():
    """Four QPs with rings of 8 pages send 32 KiB each at once from a pool of 16 pages,
    their ACKs 3,000 cycles behind: they wait for pages (counted) and lose nothing."""
    bench = Bench(qps=4, seed=32, gaps=False, ring_beats=512, pages=16, ack_delay=3000)
    qps = [bench.add_qp(Qp(index, remote_qpn=5 + index, psn=100 * index, rkey=9,
                           remote_ip="10.77.0.3", path_mtu=4096, src_port=0xC000 + index,
                           ring_beats=512, timeout=14)) for index in range(4)]
    for round_ in range(2):
        for qp in qps:
            bench.message(qp, Message("RDMA_WRITE", pattern(16 * 1024, qp.index + 4 * round_),
                                      0x4000 + round_ * 0x10000))
    bench.run()
    assert bench.page_waits > 0 and bench.resent == 0


def test_messages_after_an_idle_spell_take_their_page_again_and_resend_from_it():
    """A QP with nothing outstanding gives back the page it sends into; its next message
    starts in that page of its ring and takes it again (with its first packet, or
    before it when that packet crosses into the next page). The other QP's first page
    comes from those given back, while the first QP's packets in the page are on their
    way: packets that ask for an ACK are NAK'd once each (their ACKs 200 cycles behind),
    and their resends are byte for byte the originals."""
    naked = set()
    # QP 0: PSN 2 ends its SEND; PSN 17 crosses from the page taken again into the next.
    # QP 1: PSN 16 starts its second page.
    nak_psns = {(0, 2), (0, 17), (1, 16)}

    def acknowledge(qp, psn):
        if (qp.index, psn) in nak_psns and (qp.index, psn) not in naked:
            naked.add((qp.index, psn))
            return NAK_SEQUENCE
        return ACK

    bench = Bench(qps=2, seed=33, acknowledge=acknowledge, ack_delay=200)
    qps = [bench.add_qp(Qp(index, remote_qpn=5 + index, psn=0, rkey=9,
                           remote_ip="10.77.0.3", path_mtu=256, src_port=0xC000 + index,
                           timeout=14))
           for index in range(2)]
    # QP 0: 100 bytes (beats 0 to 2), then, idle, 300 (beats 2 to 7), QP 1's 5,000 right
    # behind; then, idle, 4,000 (beats 7 to 70: its first packet stays in page 0 of the
    # ring, its 15th crosses into page 1).
    plan = [(qps[0], "RDMA_WRITE", 100, None), (qps[0], "SEND", 300, 1),
            (qps[1], "SEND", 5000, None), (qps[0], "RDMA_WRITE", 4000, 3)]
    idle_from = {}

    def after_idle(count):
        """Once ``count`` completions are in and 100 cycles more have passed."""
        def ready():
            if bench.seen["completions"] < count:
                return False
            idle_from.setdefault(count, bench.cycle)
            return bench.cycle >= idle_from[count] + 100
        return ready

    for index, (qp, verb, length, idle_after) in enumerate(plan):
        bench.message(qp, Message(verb, pattern(length, index), 0x4000 * (index + 1)))
        if idle_after is not None:
            bench.holds[index] = after_idle(idle_after)
    bench.run()
    assert naked == nak_psns and bench.resent > 0


def test_a_request_right_after_its_qps_setting_sees_it():
    """A request offered from the cycle after its QP's setting was taken is planned with
    that setting, not refused for the invalid path MTU the QP had before: new requests
    wait while a QP is being set."""
    bench = Bench(seed=5, gaps=False)
    qp = bench.add_qp(Qp(1, remote_qpn=0x21, psn=5, rkey=3, remote_ip="10.77.0.9",
                         path_mtu=1024, src_port=0xC001))
    bench.message(qp, Message("RDMA_WRITE", pattern(100, 1), 0x1000, 0))

    async def setup(ctx):
        ctx.set(bench.dut.i_config, {"tos": bench.tos, "tick": 1})
        await put_item(ctx, bench.dut.i_qp_write, {"qp": 1, "state": bench.qps[1]})
        await put_item(ctx, bench.dut.i_request, bench.requests[0][0])

    async def no_other_requests(ctx):
        pass

    bench.setup = setup
    bench.request_source = no_other_requests
    bench.run()


def test_a_qp_set_while_its_message_is_sent_is_set_after_the_messages_last_packet():
    """A QP's setting offered once its 16-packet message has started is taken only after
    the message's last packet (the planner holds the QP): every packet of the message
    goes out with the old setting, the message (never acknowledged) completes FLUSHED,
    and the next message starts at the new setting's PSN."""
    old = Qp(1, remote_qpn=0x21, psn=100, rkey=3, remote_ip="10.77.0.9", path_mtu=256,
             src_port=0xC001, timeout=20)
    new = Qp(1, remote_qpn=0x22, psn=5000, rkey=4, remote_ip="10.77.0.9", path_mtu=256,
             src_port=0xC001, timeout=20)
    bench = Bench(seed=6, gaps=False,
                  acknowledge=lambda qp, psn: ACK if qp is new else None)
    bench.add_qp(old)
    bench.qp_objects.append(new)
    setting = new.state()               # (the model's PSN moves on as messages are added)
    bench.message(old, Message("RDMA_WRITE", pattern(4096, 2), 0x1000, 0),
                  status=CompletionStatus.FLUSHED)
    bench.message(new, Message("RDMA_WRITE", pattern(100, 3), 0x2000, 0))
    written = []

    async def set_again(ctx):
        await wait_for(ctx, lambda: bench.seen["datagrams"] >= 1, 10_000)
        await put_item(ctx, bench.dut.i_qp_write, {"qp": 1, "state": setting})
        written.append(True)

    bench.holds[1] = lambda: bool(written)
    bench.run(monitors=[set_again])
