"""ConnectionManager against the host codec (host/protocol.py): every reply byte, every
QP it sets, closes, starts and stops, and every datagram it must drop."""

import dataclasses
import ipaddress
import random
import struct

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from gateware.cm.ib_cm import OpenRefusal
from gateware.cm.lease import LEASE_SWEEPS
from gateware.cm.manager import CLOSE_ALL_QPN, ConnectionManager, access_list
from gateware.config import parse_ipv4
from gateware.roce.requests import QP_STATE, CompletionStatus, ConnectionEvent, PathMtu, Verb
from host import protocol
from host.protocol import Ack, Datagram, QpInfo, Request, Status

from .streams import get_packet, run_testbenches, to_beats, udp_delivery, wait_for

ENDPOINT_IP = "10.77.0.2"
#: The CM as the tests set it up: any 10.x.x.x host may use it, no lease.
CONFIG = {"path_mtu": PathMtu.MTU_4096, "timeout": 14, "retry_count": 6, "rnr_retry": 7,
          **access_list("10.0.0.0", "255.0.0.0"), "lease_tick": 0}
COUNTERS = ConnectionManager.DROP_REASONS + ConnectionManager.EVENTS


@dataclasses.dataclass
class Host:
    """A host QP that asks the CM for an endpoint QP."""
    ip: str
    qpn: int
    psn: int = 0x123456
    rkey: int = 0xABCD0001
    base: int = 0x7F00_1234_5000
    port: int = 40000

    @property
    def info(self):
        return QpInfo(self.qpn, self.psn, self.rkey, self.base, self.ip)


def fake_status(index):
    """The engine's status of QP ``index``, as the bench drives it (values above 16 bits
    in the error-NAK, timeout and CNP counters, to see them cut)."""
    rng = random.Random(index)
    counters = {name: rng.getrandbits(32) for name in (
        "packets", "retransmitted", "acks", "naks_sequence", "naks_rnr", "naks_invalid",
        "naks_access", "naks_operational", "rnr_waits", "timeouts", "icrc_errors",
        "acks_dropped", "cnps")}
    counters["bytes"] = rng.getrandbits(48)
    return {"error": index % 2, "error_status": CompletionStatus(index % 10),
            "outstanding": rng.getrandbits(24), "counters": counters}


def fake_run(index):
    return {"running": index % 3 == 0, "messages": 1000 + index}


def expected_status(index, *, open_, runs=0):
    status, run = fake_status(index), fake_run(index)
    counters = dict(status["counters"])
    for name in ("naks_invalid", "naks_access", "naks_operational", "timeouts", "cnps"):
        counters[name] &= 0xFFFF
    return Status(open=open_, running=run["running"], error=bool(status["error"]),
                  error_status=status["error_status"].value, outstanding=status["outstanding"],
                  messages=run["messages"], runs=runs, **counters)


class Bench:
    """The CM with a fake transmit engine and generator pool around it: sinks for its
    QP writes, closes, starts and connection events (random ready; the pool takes every
    other start; events are taken only while ``take_events``), a record of stops, the
    status and run of each QP driven from ``fake_status`` and ``fake_run``, and a
    collector of replies."""

    def __init__(self, *, qps=16, width=64, seed=0, config=CONFIG, events=4):
        self.dut = ConnectionManager(qps=qps, width=width, events=events)
        self.qps, self.width, self.config = qps, width, config
        self.rng = random.Random(seed)
        self.replies, self.writes, self.closes, self.starts, self.stops = [], [], [], [], []
        self.events = []                # (QP, ConnectionEvent, state, base) of each event
        self.take_events = True
        self.stop_cycles = []           # the cycle of each stop
        self.credits = []               # (QP, count) of each credit
        self.ib_closed = []             # each QP o_ib_closed reports
        self.ib_connects = []           # each o_ib_connect: (QP, host IP, port, MTU)
        self.event_details = []         # (length, port, reason) of each event
        self.cycle = 0                  # cycles since the bench began
        self.status_of, self.run_of = fake_status, fake_run
        self.counters = {}
        self.steps = []

    async def sink(self, ctx, stream, record, convert):
        while True:
            ready = self.rng.random() < 0.6
            if stream is self.dut.o_connection:
                ready = ready and self.take_events
            ctx.set(stream.ready, ready)
            if stream is self.dut.o_start:
                taken = len(record) % 2 == 0
                ctx.set(self.dut.start_taken, ready and taken)
            _, _, valid, item = await ctx.tick().sample(stream.valid, stream.payload)
            if valid and ready:
                record.append(convert(item))

    async def reply_sink(self, ctx):
        while True:
            payload, meta = await get_packet(ctx, self.dut.o, width=self.width, gaps=self.rng)
            self.replies.append((payload, {name: int(getattr(meta, name)) for name in (
                "dst_ip", "src_port", "dst_port", "length", "tos")}))

    async def stop_monitor(self, ctx):
        """Records the stops and credits (always-ready streams) by cycle."""
        async for _, _, valid, qp, credit_valid, credit, closed_valid, closed in \
                ctx.tick().sample(self.dut.o_stop.valid, self.dut.o_stop.payload,
                                  self.dut.o_credit.valid, self.dut.o_credit.payload,
                                  self.dut.o_ib_closed.valid, self.dut.o_ib_closed.payload):
            self.cycle += 1
            if closed_valid:
                self.ib_closed.append(int(closed))
            if valid:
                self.stops.append(int(qp))
                self.stop_cycles.append(self.cycle)
            if credit_valid:
                self.credits.append((int(credit.qp), int(credit.count)))

    async def status_driver(self, ctx):
        async for _, _, status_qp, run_qp in ctx.tick().sample(self.dut.status_qp,
                                                                self.dut.run_qp):
            ctx.set(self.dut.status, self.status_of(int(status_qp)))
            ctx.set(self.dut.run, self.run_of(int(run_qp)))

    async def send(self, ctx, payload, *, src_ip, sport=40000, udp_length=None):
        """Deliver one datagram as the UDP receiver would (the CM never stalls)."""
        frame = bytes(Ether(dst="02:00:00:00:00:02") / IP(src=src_ip, dst=ENDPOINT_IP)
                      / UDP(sport=sport, dport=protocol.CM_PORT, len=udp_length)
                      / Raw(payload))
        meta, body = udp_delivery(frame)
        for data, keep, last in to_beats(body, self.width):
            ctx.set(self.dut.i.valid, 1)
            ctx.set(self.dut.i.payload, {"data": data, "keep": keep, "last": last,
                                         "meta": meta})
            await ctx.tick()
        ctx.set(self.dut.i.valid, 0)

    async def exchange(self, ctx, datagram, host, *, reply=True):
        """Send ``datagram`` from ``host``; return its reply (bytes, meta), or check that
        none comes."""
        before = len(self.replies)
        await self.send(ctx, datagram.encode(), src_ip=host.ip, sport=host.port)
        if reply:
            await wait_for(ctx, lambda: len(self.replies) > before, 40 * self.qps + 200)
            assert len(self.replies) == before + 1
            return self.replies[-1]
        for _ in range(3 * self.qps + 100):
            await ctx.tick()
        assert len(self.replies) == before, "a reply to a datagram that gets none"
        return None

    async def ib_open(self, ctx, host, *, mtu=PathMtu.MTU_1024, timers=(18, 7, 6)):
        """Ask for a QP on the IB side's port, as the passive CM does for ``host``'s REQ;
        returns the answer: the QP taken, or the refusal."""
        timeout, retry_count, rnr_retry = timers
        ctx.set(self.dut.i_ib_open.payload, {
            "remote_ip": parse_ipv4(host.ip), "remote_qpn": host.qpn, "next_psn": host.psn,
            "path_mtu": mtu, "timeout": timeout, "retry_count": retry_count,
            "rnr_retry": rnr_retry, "rkey": host.rkey, "base": host.base, "length": 1 << 20})
        ctx.set(self.dut.i_ib_open.valid, 1)
        await ctx.tick().until(self.dut.i_ib_open.ready)
        ctx.set(self.dut.i_ib_open.valid, 0)
        ctx.set(self.dut.o_ib_opened.ready, 1)
        answer, = await ctx.tick().sample(self.dut.o_ib_opened.payload).until(
            self.dut.o_ib_opened.valid)
        ctx.set(self.dut.o_ib_opened.ready, 0)
        return int(answer.qp) if answer.accepted else answer.refusal

    async def ib_connected(self, ctx, qp, *, reason=None, host=None, length=1 << 16):
        """The IB CM's answer to a CONNECT on ``qp``: established with ``host``'s QPN,
        PSN, rkey and buffer (RNR retry 6), or refused for ``reason``."""
        answer = {"qp": qp, "accepted": 0, "reason": reason}
        if reason is None:
            answer = {"qp": qp, "accepted": 1, "remote_qpn": host.qpn, "next_psn": host.psn,
                      "rnr_retry": 6, "rkey": host.rkey, "base": host.base, "length": length}
        ctx.set(self.dut.i_ib_connected.payload, answer)
        ctx.set(self.dut.i_ib_connected.valid, 1)
        await ctx.tick().until(self.dut.i_ib_connected.ready)
        ctx.set(self.dut.i_ib_connected.valid, 0)

    async def user_connect(self, ctx, ip, port, mtu=PathMtu.MTU_1024):
        """User logic's ``i_connect``."""
        ctx.set(self.dut.i_connect.payload, {"remote_ip": parse_ipv4(ip), "port": port,
                                             "path_mtu": mtu})
        ctx.set(self.dut.i_connect.valid, 1)
        await ctx.tick().until(self.dut.i_connect.ready)
        ctx.set(self.dut.i_connect.valid, 0)

    async def ib_close(self, ctx, qp):
        """Free ``qp`` on the IB side's port (no answer)."""
        ctx.set(self.dut.i_ib_close.payload, qp)
        ctx.set(self.dut.i_ib_close.valid, 1)
        await ctx.tick().until(self.dut.i_ib_close.ready)
        ctx.set(self.dut.i_ib_close.valid, 0)

    def run(self, steps, *extra):
        """Run ``steps`` (and ``extra`` testbenches beside it) on the bench."""
        dut = self.dut

        async def main(ctx):
            ctx.set(dut.i_ip, parse_ipv4(ENDPOINT_IP))
            ctx.set(dut.i_config, self.config)
            await steps(self, ctx)
            for _ in range(20):
                await ctx.tick()
            for name in COUNTERS:
                self.counters[name] = ctx.get(getattr(dut.o_counters, name))

        def write(item):
            """(QP, its state's fields); the path MTU as its code (a FAILED event's: 0)."""
            state = item.state
            bits = state.as_value().value
            mtu = QP_STATE["path_mtu"]
            return (int(item.qp), {name: int(getattr(state, name)) if name != "path_mtu"
                                   else bits >> mtu.offset & (1 << mtu.width) - 1
                                   for name in (
                "remote_qpn", "next_psn", "rkey", "remote_ip", "path_mtu", "src_port",
                "timeout", "retry_count", "rnr_retry")})

        def event(item):
            """(QP, event, state, base); state None when all its bits are 0."""
            zero = item.state.as_value().value == 0
            self.event_details.append((int(item.length), int(item.port), int(item.reason)))
            return (int(item.qp), item.event, None if zero else write(item)[1],
                    int(item.base))

        def ib_connect(item):
            return (int(item.qp), str(ipaddress.IPv4Address(int(item.remote_ip))),
                    int(item.port), item.path_mtu)

        def start(item):
            return {"qp": int(item.qp), "verb": Verb(item.verb.value),
                    "taken": len(self.starts) % 2 == 0, **{
                        name: int(getattr(item, name)) for name in (
                            "length", "count", "divider", "base", "ring", "credited")}}

        def sink(stream, record, convert):
            async def testbench(ctx):
                await self.sink(ctx, stream, record, convert)
            return testbench

        run_testbenches(dut, main, self.reply_sink, self.stop_monitor, self.status_driver,
                        sink(dut.o_qp_write, self.writes, write),
                        sink(dut.o_qp_close, self.closes, int),
                        sink(dut.o_start, self.starts, start),
                        sink(dut.o_connection, self.events, event),
                        sink(dut.o_ib_connect, self.ib_connects, ib_connect), *extra)


def open_reply(request, index, psn, mtu):
    return protocol.reply(request, Ack.ACK, QpInfo(qpn=protocol.FIRST_QPN + index, psn=psn,
                                                   ip=ENDPOINT_IP),
                          mtu=protocol.PathMtu(mtu.value)).encode()


def no_qp(request):
    return protocol.reply(request, Ack.NO_QP, QpInfo(ip=ENDPOINT_IP)).encode()


def check_open(bench, reply, request, host, index, mtu, *, port=None):
    """An OPEN_QP (or legacy) ACK for endpoint QP ``index``; returns its PSN."""
    payload, meta = reply
    psn = Datagram.decode(payload).loc.psn
    assert payload == open_reply(request, index, psn, mtu)
    assert psn < 1 << 24
    assert meta == {"dst_ip": parse_ipv4(host.ip), "src_port": protocol.CM_PORT,
                    "dst_port": port or host.port, "length": 64, "tos": 0}
    return psn


def qp_write(host, index, psn, mtu):
    return (index, {"remote_qpn": host.qpn, "next_psn": psn, "rkey": host.rkey,
                    "remote_ip": parse_ipv4(host.ip), "path_mtu": mtu.value,
                    "src_port": index, "timeout": CONFIG["timeout"],
                    "retry_count": CONFIG["retry_count"], "rnr_retry": CONFIG["rnr_retry"]})


@pytest.mark.parametrize("width", [64, 16])
def test_every_request_answers_as_the_codec_predicts(width):
    bench = Bench(width=width)
    a = Host("10.77.0.1", 0x11)
    b = Host("10.77.0.9", 0xFFFF42, port=40001)
    stranger = Host("10.77.0.5", 0x11)
    counts = dict.fromkeys(COUNTERS, 0)

    async def steps(bench, ctx):
        # OPEN_QP: the lowest free QP, the default MTU; a retry gets the same answer.
        request = protocol.open_qp(a.info)
        psn_a = check_open(bench, await bench.exchange(ctx, request, a), request, a, 0,
                           PathMtu.MTU_4096)
        assert bench.writes == [qp_write(a, 0, psn_a, PathMtu.MTU_4096)]
        again = await bench.exchange(ctx, request, a)
        assert again[0] == open_reply(request, 0, psn_a, PathMtu.MTU_4096)
        # Another host asks for MTU 1024 and replies at its reply_port.
        request = protocol.open_qp(b.info, mtu=protocol.PathMtu.MTU_1024, reply_port=5000)
        psn_b = check_open(bench, await bench.exchange(ctx, request, b), request, b, 1,
                           PathMtu.MTU_1024, port=5000)
        assert bench.writes[1:] == [qp_write(b, 1, psn_b, PathMtu.MTU_1024)]
        counts["opened"] += 2
        # Legacy steps are acknowledged for the requester's QP; unknown requesters get NO_QP.
        for kind in (Request.SEND_QP_INFO, Request.MODIFY_QP_RTS):
            request = Datagram(kind, loc=a.info, rem=QpInfo(qpn=256, psn=psn_a))
            reply = await bench.exchange(ctx, request, a)
            assert reply[0] == open_reply(request, 0, psn_a, PathMtu.MTU_4096)
            request = Datagram(kind, loc=stranger.info)
            assert (await bench.exchange(ctx, request, stranger))[0] == no_qp(request)
            counts["no_qp"] += 1
        # A path MTU code past 4096: NAK.
        request = dataclasses.replace(protocol.open_qp(stranger.info),
                                      txmeta=protocol.TxMeta(mtu=6))
        reply = await bench.exchange(ctx, request, stranger)
        assert reply[0] == protocol.reply(request, Ack.NAK, QpInfo(ip=ENDPOINT_IP)).encode()
        counts["malformed"] += 1
        assert len(bench.writes) == 2

        # STATUS: open, closed and out-of-range QPs.
        for index, open_ in ((0, True), (1, True), (7, False), (15, False)):
            reply = await bench.exchange(ctx, protocol.status(256 + index), stranger)
            assert reply[0] == expected_status(index, open_=open_).reply(256 + index)
            assert Status.from_reply(reply[0]) == expected_status(index, open_=open_)
        for qpn in (255, 256 + 16, 0xFFFFFF, 0):
            request = protocol.status(qpn)
            assert (await bench.exchange(ctx, request, stranger))[0] == no_qp(request)
            counts["no_qp"] += 1

        # Starts: every verb, base from OPEN_QP, ring from rem_base_addr; no reply.
        verbs = {(True, False): Verb.RDMA_WRITE, (True, True): Verb.RDMA_WRITE_WITH_IMMEDIATE,
                 (False, False): Verb.SEND, (False, True): Verb.SEND_WITH_IMMEDIATE}
        for (write, immediate), verb in verbs.items():
            request = protocol.start_run(257, length=4097, count=0xFFFF_FFFF, divider=7,
                                         write=write, immediate=immediate, ring=1 << 40)
            await bench.exchange(ctx, request, b, reply=False)
            assert bench.starts[-1] == {"qp": 1, "verb": verb, "length": 4097,
                                        "count": 0xFFFF_FFFF, "divider": 7, "base": b.base,
                                        "ring": 1 << 40, "credited": 0,
                                        "taken": verb.value % 2 == 0}
        counts["starts"] += 4
        reply = await bench.exchange(ctx, protocol.status(257), stranger)
        assert reply[0] == expected_status(1, open_=True, runs=2).reply(257)
        await bench.exchange(ctx, protocol.start_run(258, length=1, count=1), a, reply=False)
        counts["start_closed"] += 1
        await bench.exchange(ctx, protocol.start_run(256 + 16, length=1, count=1), a,
                             reply=False)
        counts["qpn"] += 1
        assert len(bench.starts) == 4

        # CLOSE: only from the host that opened it (no reply to another, whatever its
        # loc_ip says); then NO_QP (a retried close).
        for loc_ip in (stranger.ip, a.ip):
            await bench.exchange(ctx, protocol.close_qp(256, loc_ip), stranger, reply=False)
            counts["spoofed"] += 1
        assert bench.closes == [] and bench.stops == []
        request = protocol.close_qp(256, a.ip)
        reply = await bench.exchange(ctx, request, a)
        assert reply[0] == open_reply(request, 0, psn_a, PathMtu.MTU_4096)
        assert bench.closes == [0] and bench.stops == [0]
        assert (await bench.exchange(ctx, request, a))[0] == no_qp(request)
        request = protocol.close_qp(300, a.ip)
        assert (await bench.exchange(ctx, request, a))[0] == no_qp(request)
        counts["closed"] += 1
        counts["no_qp"] += 2
        await bench.exchange(ctx, protocol.start_run(256, length=1, count=1), a, reply=False)
        counts["start_closed"] += 1

        # Reopen from the same host QP: QP 0 again, with a new PSN, set again.
        request = protocol.open_qp(dataclasses.replace(a, psn=0x777).info)
        psn = check_open(bench, await bench.exchange(ctx, request, a), request, a, 0,
                         PathMtu.MTU_4096)
        assert psn != psn_a
        assert bench.writes[-1] == qp_write(dataclasses.replace(a, psn=0x777), 0, psn,
                                            PathMtu.MTU_4096)
        counts["opened"] += 1

        # Malformed: dropped and counted, no reply, and the next datagram is served.
        good = protocol.status(256).encode()
        bad = {
            "length": [good[:63], good + b"\0", b"", bytes(200)],
            "malformed": [bytes([good[0] & ~1]) + good[1:],                 # info_valid clear
                          Datagram(Request.STATUS, Ack.ACK, rem=QpInfo(qpn=256)).encode()],
            "spoofed": [bytes([0x0D]) + good[1:]],      # CONNECT (6) for loc_ip 0.0.0.0
            "request": [bytes([0x0F]) + good[1:],                            # code 7
                        Datagram().encode(),                                 # NULL, no start
                        Datagram(txmeta=protocol.TxMeta(valid=True), rem=QpInfo(qpn=256)
                                 ).encode()],
        }
        for reason, payloads in bad.items():
            for payload in payloads:
                await bench.send(ctx, payload, src_ip=a.ip)
                counts[reason] += 1
        await bench.send(ctx, good, src_ip=a.ip, udp_length=8 + 60)     # UDP length says 60
        counts["length"] += 1
        for _ in range(200):
            await ctx.tick()
        reply = await bench.exchange(ctx, protocol.status(256), a)
        assert reply[0] == expected_status(0, open_=True).reply(256)

    bench.run(steps)
    assert bench.counters == counts


def test_credited_starts_and_credits_go_to_the_pool_only_from_the_qps_host():
    """A credited start needs a WRITE into a ring; CREDIT (txmeta exactly 0x11) from the
    QP's host reaches the pool with the QP and count, from anyone else it is dropped;
    neither gets a reply."""
    bench = Bench()
    host, stranger = Host("10.77.0.1", 0x21), Host("10.77.0.7", 0x21)
    counts = dict.fromkeys(COUNTERS, 0)

    async def steps(bench, ctx):
        request = protocol.open_qp(host.info)
        await bench.exchange(ctx, request, host)
        counts["opened"] += 1
        for immediate in (False, True):
            start = protocol.start_run(256, length=64, count=100, write=True,
                                       immediate=immediate, ring=640, credited=True)
            assert start.encode()[51] == 0x1B | immediate << 2
            await bench.exchange(ctx, start, host, reply=False)
            assert bench.starts[-1]["credited"] == 1 and bench.starts[-1]["ring"] == 640
            counts["starts"] += 1
        for refused in (protocol.start_run(256, length=64, count=9, write=False, ring=640,
                                           credited=True),
                        protocol.start_run(256, length=64, count=9, write=True, ring=0,
                                           credited=True)):
            await bench.exchange(ctx, refused, host, reply=False)
            counts["credit_refused"] += 1
        assert len(bench.starts) == 2

        for consumed in (3, 3, 1 << 32 | 17):
            await bench.exchange(ctx, protocol.credit(256, consumed), host, reply=False)
            counts["credits"] += 1
        assert bench.credits == [(0, 3), (0, 3), (0, 17)]
        assert protocol.credit(256, 5).encode()[51] == 0x11
        await bench.exchange(ctx, protocol.credit(256, 40), stranger, reply=False)
        counts["spoofed"] += 1
        await bench.exchange(ctx, protocol.credit(257, 40), host, reply=False)
        counts["start_closed"] += 1
        await bench.exchange(ctx, protocol.credit(256 + 16, 40), host, reply=False)
        counts["qpn"] += 1
        # bit 4 with another bit of the start set is not a CREDIT: no start either
        not_credit = dataclasses.replace(protocol.credit(256, 41),
                                         txmeta=protocol.TxMeta(valid=True, write=True,
                                                                credited=True))
        await bench.exchange(ctx, not_credit, host, reply=False)
        counts["request"] += 1
        assert bench.credits == [(0, 3), (0, 3), (0, 17)] and len(bench.starts) == 2

    bench.run(steps)
    assert bench.counters == counts


def test_sixteen_qps_opened_used_and_closed_in_random_order():
    """Random opens, retries, statuses and closes of 16 hosts against a model of the
    allocation (the lowest free QP), until every QP has been opened more than once."""
    qps = 16
    bench = Bench(qps=qps, seed=5)
    rng = random.Random(9)
    hosts = [Host(f"10.77.{index}.1", 0x100 + index, psn=rng.getrandbits(24),
                  rkey=rng.getrandbits(32), base=rng.getrandbits(64), port=41000 + index)
             for index in range(qps + 2)]

    async def steps(bench, ctx):
        owner = [None] * qps            # host index of each endpoint QP
        psns = [None] * qps
        runs = [0] * qps                # starts the pool took since the QP was opened
        opened = 0
        for _ in range(120):
            host_index = rng.randrange(len(hosts))
            host = hosts[host_index]
            mine = owner.index(host_index) if host_index in owner else None
            action = rng.choice(["open", "open", "close", "status", "start"])
            if action == "open":
                request = protocol.open_qp(host.info)
                reply = await bench.exchange(ctx, request, host)
                if mine is not None:
                    assert reply[0] == open_reply(request, mine, psns[mine], PathMtu.MTU_4096)
                elif None in owner:
                    index = owner.index(None)
                    psns[index] = check_open(bench, reply, request, host, index,
                                             PathMtu.MTU_4096)
                    owner[index] = host_index
                    runs[index] = 0
                    assert bench.writes[-1] == qp_write(host, index, psns[index],
                                                        PathMtu.MTU_4096)
                    opened += 1
                else:
                    assert reply[0] == no_qp(request)
            elif action == "close":
                index = mine if mine is not None else rng.randrange(qps)
                request = protocol.close_qp(256 + index, host.ip)
                if owner[index] not in (None, host_index):      # another host's QP
                    closes = len(bench.closes)
                    await bench.exchange(ctx, request, host, reply=False)
                    assert len(bench.closes) == closes
                    continue
                reply = await bench.exchange(ctx, request, host)
                if mine is not None:
                    assert reply[0] == open_reply(request, mine, psns[mine], PathMtu.MTU_4096)
                    assert bench.closes[-1] == mine and bench.stops[-1] == mine
                    owner[mine] = None
                else:
                    assert reply[0] == no_qp(request)
            elif action == "status":
                index = rng.randrange(qps)
                reply = await bench.exchange(ctx, protocol.status(256 + index), host)
                assert reply[0] == expected_status(index, open_=owner[index] is not None,
                                                   runs=runs[index]).reply(256 + index)
            else:
                index = mine if mine is not None else rng.randrange(qps)
                before = len(bench.starts)
                await bench.exchange(ctx, protocol.start_run(256 + index, length=64, count=3),
                                     host, reply=False)
                assert len(bench.starts) == before + (owner[index] == host_index)
                if owner[index] == host_index:
                    assert bench.starts[-1]["base"] == hosts[owner[index]].base
                    runs[index] += bench.starts[-1]["taken"]
        assert opened > qps, "the run should reuse QPs"
        assert len(bench.writes) == opened

    bench.run(steps)


def test_the_queue_drops_what_it_cannot_hold_and_serves_the_rest():
    bench = Bench(qps=32, seed=2)
    host = Host("10.77.0.1", 0x42)

    async def steps(bench, ctx):
        for index in range(30):
            await bench.send(ctx, protocol.status(256 + index).encode(), src_ip=host.ip)
        await wait_for(ctx, lambda: ctx.get(bench.dut.o_counters.overflow)
                       + len(bench.replies) == 30, 5000)
        served = [Status.from_reply(payload) for payload, _ in bench.replies]
        qpns = [int.from_bytes(payload[1:5], "big") for payload, _ in bench.replies]
        assert qpns == sorted(qpns) and len(set(qpns)) == len(qpns)   # in order, no repeats
        assert all(status == expected_status(qpn - 256, open_=False)
                   for status, qpn in zip(served, qpns, strict=True))
        # The next datagram after the burst is answered.
        reply = await bench.exchange(ctx, protocol.status(260), host)
        assert reply[0] == expected_status(4, open_=False).reply(260)

    bench.run(steps)
    assert 0 < bench.counters["overflow"] < 30


def test_every_qp_open_then_no_qp():
    """Every QP of the table opened, one more refused (no QP), one closed and given to the
    waiting host; 32 QPs (``make bench``'s many_qps opens 1,024 through the whole core)."""
    qps, closed = 32, 20
    bench = Bench(qps=qps, seed=3)
    hosts = [Host(f"10.78.0.{index + 1}", index) for index in range(qps + 1)]

    async def steps(bench, ctx):
        for index, host in enumerate(hosts[:qps]):
            request = protocol.open_qp(host.info)
            check_open(bench, await bench.exchange(ctx, request, host), request, host, index,
                       PathMtu.MTU_4096)
        request = protocol.open_qp(hosts[qps].info)
        assert (await bench.exchange(ctx, request, hosts[qps]))[0] == no_qp(request)
        request = protocol.close_qp(protocol.FIRST_QPN + closed, hosts[closed].ip)
        await bench.exchange(ctx, request, hosts[closed])
        request = protocol.open_qp(hosts[qps].info)
        check_open(bench, await bench.exchange(ctx, request, hosts[qps]), request, hosts[qps],
                   closed, PathMtu.MTU_4096)
        last = protocol.FIRST_QPN + qps - 1
        reply = await bench.exchange(ctx, protocol.status(last), hosts[0])
        assert reply[0] == expected_status(qps - 1, open_=True).reply(last)

    bench.run(steps)
    assert bench.counters["opened"] == qps + 1


def close_all_reply(request, closed):
    return protocol.reply(request, Ack.ACK, QpInfo(ip=ENDPOINT_IP), count=closed).encode()


def test_only_the_host_steers_its_qp():
    """CM_PROTOCOL.md, "Who may steer a QP": OPEN_QP and the legacy steps only from the
    address in loc_ip; CLOSE_QP and a start only from the QP's host. Anything else is
    dropped and counted (``spoofed``) without a reply, and the QP runs on."""
    bench = Bench(qps=4, seed=7)
    a = Host("10.77.0.1", 0x11)
    mallory = Host("10.77.0.66", 0x11, port=40066)
    victim = Host("10.77.0.99", 0x99)       # a host that never asked for anything

    async def steps(bench, ctx):
        request = protocol.open_qp(a.info)
        psn = check_open(bench, await bench.exchange(ctx, request, a), request, a, 0,
                         PathMtu.MTU_4096)
        # OPEN_QP and the legacy steps naming another host, from mallory.
        for host in (a, victim):
            for kind in (Request.OPEN_QP, Request.SEND_QP_INFO, Request.MODIFY_QP_RTS):
                await bench.exchange(ctx, Datagram(kind, loc=host.info), mallory, reply=False)
        # CLOSE_QP and a start of a's QP, with loc_ip spoofed and not.
        for loc_ip in (a.ip, mallory.ip):
            await bench.exchange(ctx, protocol.close_qp(256, loc_ip), mallory, reply=False)
        await bench.exchange(ctx, protocol.start_run(256, length=64, count=9), mallory,
                             reply=False)
        assert len(bench.writes) == 1 and bench.closes == bench.stops == bench.starts == []
        # Closing all of mallory's QPs closes none; STATUS is answered to anyone.
        request = protocol.close_all(a.ip)
        assert (await bench.exchange(ctx, request, mallory))[0] == close_all_reply(request, 0)
        reply = await bench.exchange(ctx, protocol.status(256), mallory)
        assert reply[0] == expected_status(0, open_=True).reply(256)
        # a still steers its QP.
        await bench.exchange(ctx, protocol.start_run(256, length=64, count=9), a, reply=False)
        assert [start["qp"] for start in bench.starts] == [0]
        request = protocol.close_qp(256, a.ip)
        reply = await bench.exchange(ctx, request, a)
        assert reply[0] == open_reply(request, 0, psn, PathMtu.MTU_4096)
        assert bench.closes == bench.stops == [0]

    bench.run(steps)
    assert {name: value for name, value in bench.counters.items() if value} == {
        "opened": 1, "spoofed": 9, "starts": 1, "closed": 1}


def test_the_access_list_bounds_who_may_use_the_cm():
    """Only sources in the access list (10.77.0.0/24 here) are served; the list is changed
    at run time (to 10.78.0.0/16, then one address, then everyone)."""
    config = {**CONFIG, **access_list("10.77.0.0", "255.255.255.0")}
    bench = Bench(qps=2, seed=8, config=config)
    inside = [Host("10.77.0.0", 1), Host("10.77.0.255", 2)]
    outside = [Host("10.77.1.0", 3), Host("10.76.255.255", 4), Host("10.78.0.1", 5),
               Host("192.168.0.1", 6)]

    async def served(ctx, host):
        request = protocol.status(257)
        before = len(bench.replies)
        await bench.send(ctx, request.encode(), src_ip=host.ip, sport=host.port)
        for _ in range(100):
            await ctx.tick()
        assert len(bench.replies) <= before + 1
        return len(bench.replies) == before + 1

    async def steps(bench, ctx):
        assert [await served(ctx, host) for host in inside + outside] == [
            True, True, False, False, False, False]
        # An OPEN_QP from outside takes no QP.
        await bench.exchange(ctx, protocol.open_qp(outside[2].info), outside[2], reply=False)
        assert bench.writes == []
        ctx.set(bench.dut.i_config, {**config, **access_list("10.78.0.0", "255.255.0.0")})
        await ctx.tick()
        assert [await served(ctx, host) for host in inside + outside] == [
            False, False, False, False, True, False]
        request = protocol.open_qp(outside[2].info)
        check_open(bench, await bench.exchange(ctx, request, outside[2]), request, outside[2],
                   0, PathMtu.MTU_4096)
        ctx.set(bench.dut.i_config, {**config, "access_ip": parse_ipv4("192.168.0.1"),
                                     "access_prefix": 32})
        await ctx.tick()
        assert [await served(ctx, host) for host in inside + outside] == [
            False, False, False, False, False, True]
        ctx.set(bench.dut.i_config, {**config, "access_prefix": 0})
        await ctx.tick()
        assert all([await served(ctx, host) for host in inside + outside])

    bench.run(steps)
    assert bench.counters["access"] == 4 + 1 + 5 + 5
    assert bench.counters["opened"] == 1


def test_close_all_closes_every_qp_of_its_source():
    """CLOSE_QP with rem_qpn 0xFFFFFF: every QP whose host is the datagram's source is
    closed (whatever loc_ip says); the ACK counts them; other hosts' QPs stay open."""
    assert protocol.CLOSE_ALL_QPN == CLOSE_ALL_QPN
    bench = Bench(qps=6, seed=9)
    a = [Host("10.77.0.1", qpn) for qpn in (1, 2, 3)]
    b = Host("10.77.0.2", 1, port=40001)

    async def steps(bench, ctx):
        for index, host in enumerate([a[0], b, a[1], a[2]]):
            request = protocol.open_qp(host.info)
            check_open(bench, await bench.exchange(ctx, request, host), request, host, index,
                       PathMtu.MTU_4096)
        request = protocol.close_all(b.ip)          # loc_ip of b, from a: a's QPs
        assert (await bench.exchange(ctx, request, a[0]))[0] == close_all_reply(request, 3)
        assert bench.closes == bench.stops == [0, 2, 3]
        assert (await bench.exchange(ctx, request, a[0]))[0] == close_all_reply(request, 0)
        for index, open_ in enumerate([False, True, False, False, False, False]):
            reply = await bench.exchange(ctx, protocol.status(256 + index), b)
            assert Status.from_reply(reply[0]).open == open_
        # The freed QPs are taken again, lowest first.
        request = protocol.open_qp(a[2].info)
        check_open(bench, await bench.exchange(ctx, request, a[2]), request, a[2], 0,
                   PathMtu.MTU_4096)

    bench.run(steps)
    assert (bench.counters["closed"], bench.counters["opened"]) == (3, 5)


def test_a_lease_frees_idle_and_failed_qps_only():
    """With a lease of 16 sweeps of 60 cycles: a QP in ERROR and an idle QP are freed
    (as a close frees them) between one lease and one lease plus a sweep after their
    host's last request; a STATUS from another host does not keep a QP; a QP whose host
    asks STATUS, one with packets outstanding and one running a run stay open."""
    tick = 60
    lease = LEASE_SWEEPS * tick
    bench = Bench(qps=8, seed=10, config={**CONFIG, "lease_tick": tick})
    hosts = [Host(f"10.77.0.{index + 1}", 0x40 + index) for index in range(6)]
    failed, idle, stranger_kept, host_kept, outstanding, running = range(6)
    bench.status_of = lambda index: {
        "error": index == failed, "error_status": CompletionStatus.RETRY_EXCEEDED,
        "outstanding": 5 if index in (failed, outstanding) else 0, "counters": {}}
    bench.run_of = lambda index: {"running": index == running, "messages": 0}
    heard = {}                          # cycle of each QP's host's last request
    psns = []

    async def steps(bench, ctx):
        for index, host in enumerate(hosts):
            request = protocol.open_qp(host.info)
            psns.append(check_open(bench, await bench.exchange(ctx, request, host), request,
                                   host, index, PathMtu.MTU_4096))
            heard[index] = bench.cycle
        assert len(bench.writes) == 6
        while bench.cycle < heard[idle] + lease + 3 * tick:
            await bench.exchange(ctx, protocol.status(256 + host_kept), hosts[host_kept])
            await bench.exchange(ctx, protocol.status(256 + stranger_kept), hosts[idle])
            for _ in range(tick * 3):
                await ctx.tick()
        assert sorted(bench.stops) == sorted(bench.closes) == [failed, idle, stranger_kept]
        for qp, cycle in zip(bench.stops, bench.stop_cycles, strict=True):
            assert lease <= cycle - heard[qp] <= lease + tick + 3 * bench.qps + 20, qp
        for index in range(6):
            reply = await bench.exchange(ctx, protocol.status(256 + index), hosts[index])
            assert Status.from_reply(reply[0]).open == (index in (host_kept, outstanding,
                                                                  running))
        # A freed QP is free: its host opens again and gets the lowest free QP.
        request = protocol.open_qp(hosts[idle].info)
        psns.append(check_open(bench, await bench.exchange(ctx, request, hosts[idle]),
                               request, hosts[idle], failed, PathMtu.MTU_4096))

    bench.run(steps)
    assert (bench.counters["expired"], bench.counters["closed"]) == (3, 0)
    # Each open, each expiry (in the order of the sweeps), and the reopen.
    assert bench.events[:6] == [opened(host, index, psn) for index, (host, psn)
                                in enumerate(zip(hosts, psns, strict=False))]
    expired = sorted(bench.events[6:9], key=lambda event: event[0])
    assert expired == [(index, ConnectionEvent.EXPIRED, None, 0)
                       for index in (failed, idle, stranger_kept)]
    assert bench.events[9:] == [opened(hosts[idle], failed, psns[-1])]


def opened(host, index, psn):
    """The OPENED event of ``host``'s QP at endpoint QP ``index``."""
    return (index, ConnectionEvent.OPENED, qp_write(host, index, psn, PathMtu.MTU_4096)[1],
            host.base)


def test_connection_events_tell_each_qp_opened_and_closed():
    """OPENED with the QP's state and the host's buffer address for each QP an OPEN_QP
    takes (none for a repeated OPEN_QP answered again, nor for a refused one), CLOSED for
    a CLOSE_QP and for each QP of a close-all, none for a close that frees nothing."""
    bench = Bench(qps=3, seed=11)
    a = [Host("10.77.0.1", qpn, rkey=0x1000 + qpn, base=0x7F00_0000_0000 + (qpn << 20))
         for qpn in (1, 2)]
    b = Host("10.77.0.2", 1, rkey=0xB, base=0x5555_0000, port=40001)
    c = Host("10.77.0.3", 7)

    async def expect(ctx, events):
        await wait_for(ctx, lambda: len(bench.events) >= len(events), 200)
        await ctx.tick().repeat(20)
        assert bench.events == events

    async def steps(bench, ctx):
        psns, events = [], []
        for index, host in enumerate([a[0], b, a[1]]):
            request = protocol.open_qp(host.info)
            psns.append(check_open(bench, await bench.exchange(ctx, request, host), request,
                                   host, index, PathMtu.MTU_4096))
            events.append(opened(host, index, psns[-1]))
            await expect(ctx, events)
            assert bench.writes[-1] == (index, events[-1][2]), "the event's state is the QP's"
            # A retry of the same OPEN_QP is answered again, and makes no event.
            await bench.exchange(ctx, request, host)
            await expect(ctx, events)
        # No QP free: NO_QP, no event.
        await bench.exchange(ctx, protocol.open_qp(c.info), c)
        await expect(ctx, events)
        # CLOSE_QP of b's QP; a close that frees nothing (a retry) makes no event.
        request = protocol.close_qp(257, b.ip)
        await bench.exchange(ctx, request, b)
        events.append((1, ConnectionEvent.CLOSED, None, 0))
        await bench.exchange(ctx, request, b)
        await expect(ctx, events)
        # Close-all from a: each of its QPs, lowest first.
        assert (await bench.exchange(ctx, protocol.close_all(a[0].ip), a[0]))[0] == \
            close_all_reply(protocol.close_all(a[0].ip), 2)
        events += [(0, ConnectionEvent.CLOSED, None, 0), (2, ConnectionEvent.CLOSED, None, 0)]
        await expect(ctx, events)
        # The freed QP opens again: a new OPENED.
        request = protocol.open_qp(c.info)
        psn = check_open(bench, await bench.exchange(ctx, request, c), request, c, 0,
                         PathMtu.MTU_4096)
        events.append(opened(c, 0, psn))
        await expect(ctx, events)

    bench.run(steps)
    assert {name: value for name, value in bench.counters.items() if value} == {
        "opened": 4, "closed": 3, "no_qp": 2}


def test_connection_events_that_find_the_queue_full_are_dropped_and_counted():
    """User logic that takes no events stalls nothing: six OPEN_QPs are all answered, the
    queue keeps the first four events and counts two lost; once drained, the next event
    (a CLOSE_QP's) comes through."""
    bench = Bench(qps=8, seed=12)
    hosts = [Host(f"10.77.0.{index + 1}", 0x30 + index, base=0x1000 * (index + 1))
             for index in range(6)]

    async def steps(bench, ctx):
        bench.take_events = False
        psns = []
        for index, host in enumerate(hosts):
            request = protocol.open_qp(host.info)
            psns.append(check_open(bench, await bench.exchange(ctx, request, host), request,
                                   host, index, PathMtu.MTU_4096))
        assert ctx.get(bench.dut.o_counters.events_lost) == 2
        assert bench.events == []
        bench.take_events = True
        await wait_for(ctx, lambda: len(bench.events) == 4, 200)
        assert bench.events == [opened(host, index, psn) for index, (host, psn)
                                in enumerate(zip(hosts[:4], psns, strict=False))]
        await bench.exchange(ctx, protocol.close_qp(256 + 5, hosts[5].ip), hosts[5])
        await wait_for(ctx, lambda: len(bench.events) == 5, 200)
        await ctx.tick().repeat(20)
        assert bench.events[4:] == [(5, ConnectionEvent.CLOSED, None, 0)]

    bench.run(steps)
    assert (bench.counters["opened"], bench.counters["closed"],
            bench.counters["events_lost"]) == (6, 1, 2)


def ib_write(host, index, *, mtu=PathMtu.MTU_1024, timers=(18, 7, 6)):
    """The QP an IB open of ``host`` sets: the host's PSN, MTU and timers."""
    timeout, retry_count, rnr_retry = timers
    return (index, {"remote_qpn": host.qpn, "next_psn": host.psn, "rkey": host.rkey,
                    "remote_ip": parse_ipv4(host.ip), "path_mtu": mtu.value,
                    "src_port": index, "timeout": timeout, "retry_count": retry_count,
                    "rnr_retry": rnr_retry})


def test_a_qp_opened_on_the_ib_side_is_a_qp_as_any():
    """An IB open takes the first free QP and sets it from the request (PSN, MTU,
    timers), with an OPENED event; STATUS, a start and CLOSE_QP from its host serve it
    as an OPEN_QP's, and the close is reported on o_ib_closed; a UDP OPEN_QP takes the
    next QP; an IB open of the same host QP again takes another QP."""
    bench = Bench(qps=4, seed=20)
    a = Host("10.77.0.1", 0x4321, psn=0xABCDEF, rkey=0x55AA, base=0x7F00_0000_8000)
    b = Host("10.77.0.2", 0x99, port=40002)

    async def steps(bench, ctx):
        assert await bench.ib_open(ctx, a) == 0
        assert bench.writes == [ib_write(a, 0)]
        await wait_for(ctx, lambda: len(bench.events) == 1, 200)
        assert bench.events == [(0, ConnectionEvent.OPENED, ib_write(a, 0)[1], a.base)]
        request = protocol.open_qp(b.info)
        psn_b = check_open(bench, await bench.exchange(ctx, request, b), request, b, 1,
                           PathMtu.MTU_4096)
        assert bench.writes[1:] == [qp_write(b, 1, psn_b, PathMtu.MTU_4096)]
        reply = await bench.exchange(ctx, protocol.status(256), b)
        assert reply[0] == expected_status(0, open_=True).reply(256)
        await bench.exchange(ctx, protocol.start_run(256, length=64, count=3), a, reply=False)
        assert bench.starts[-1]["qp"] == 0 and bench.starts[-1]["base"] == a.base
        await bench.exchange(ctx, protocol.start_run(256, length=64, count=3), b, reply=False)
        assert len(bench.starts) == 1, "a start from another host"
        assert await bench.ib_open(ctx, a, mtu=PathMtu.MTU_256) == 2
        assert bench.writes[2:] == [ib_write(a, 2, mtu=PathMtu.MTU_256)]
        request = protocol.close_qp(256, a.ip)
        reply = await bench.exchange(ctx, request, a)
        assert reply[0] == open_reply(request, 0, a.psn, PathMtu.MTU_1024)
        assert bench.closes == bench.stops == bench.ib_closed == [0]
        reply = await bench.exchange(ctx, protocol.status(256), a)
        assert reply[0] == expected_status(0, open_=False).reply(256)

    bench.run(steps)
    assert {name: value for name, value in bench.counters.items() if value} == {
        "opened": 3, "closed": 1, "starts": 1, "spoofed": 1}


def test_an_ib_open_takes_another_qp_than_the_one_freed_last():
    """IB opens take the first free QP after the one they took last (wrapping round),
    the QP freed last only when no other is free; a UDP OPEN_QP takes the lowest."""
    bench = Bench(qps=4, seed=26)
    hosts = [Host(f"10.77.0.{index + 1}", 0x50 + index) for index in range(6)]

    async def close(ctx, qp):
        await bench.ib_close(ctx, qp)
        await wait_for(ctx, lambda: bench.ib_closed[-1:] == [qp], 100)

    async def steps(bench, ctx):
        assert await bench.ib_open(ctx, hosts[0]) == 0
        await close(ctx, 0)
        assert await bench.ib_open(ctx, hosts[0]) == 1      # the host connects again
        assert await bench.ib_open(ctx, hosts[1]) == 2
        await close(ctx, 1)
        assert await bench.ib_open(ctx, hosts[2]) == 3
        assert await bench.ib_open(ctx, hosts[3]) == 0      # round; 1 was freed last
        assert await bench.ib_open(ctx, hosts[4]) == 1      # the only one free
        await close(ctx, 3)
        await close(ctx, 2)
        request = protocol.open_qp(hosts[5].info)          # the lowest, though freed last
        check_open(bench, await bench.exchange(ctx, request, hosts[5]), request, hosts[5], 2,
                   PathMtu.MTU_4096)
        # the next after the last IB open's (2) is the QP freed last: the one after it
        await bench.exchange(ctx, protocol.close_qp(256 + 2, hosts[5].ip), hosts[5])
        assert await bench.ib_open(ctx, hosts[2]) == 3

    bench.run(steps)
    assert (bench.counters["opened"], bench.counters["closed"]) == (8, 5)


def test_ib_opens_refused_no_qp_when_full_and_denied_outside_the_access_list():
    bench = Bench(qps=2, seed=21)
    hosts = [Host(f"10.77.0.{index + 1}", 0x10 + index) for index in range(3)]
    outsider = Host("192.168.1.7", 0x10)

    async def steps(bench, ctx):
        await ctx.tick()                # the access list's mask, a register, takes a cycle
        assert await bench.ib_open(ctx, outsider) == OpenRefusal.DENIED
        assert [await bench.ib_open(ctx, host) for host in hosts] == [0, 1, OpenRefusal.NO_QP]
        assert await bench.ib_open(ctx, outsider) == OpenRefusal.DENIED
        assert bench.writes == [ib_write(hosts[0], 0), ib_write(hosts[1], 1)]
        # UDP OPEN_QP sees the same table: full.
        request = protocol.open_qp(hosts[2].info)
        assert (await bench.exchange(ctx, request, hosts[2]))[0] == no_qp(request)
        await bench.ib_close(ctx, 1)
        assert await bench.ib_open(ctx, hosts[2]) == 1
        assert bench.writes[2:] == [ib_write(hosts[2], 1)]
        assert bench.replies[1:] == []

    bench.run(steps)
    assert {name: value for name, value in bench.counters.items() if value} == {
        "opened": 3, "closed": 1, "no_qp": 2, "access": 2}


def test_an_ib_close_frees_its_qp_as_close_qp_does():
    """Stop, flush, CLOSED event, o_ib_closed, no datagram; a close of a free QP (or one
    out of range) does nothing."""
    bench = Bench(qps=3, seed=22)
    a, b = Host("10.77.0.1", 0x21), Host("10.77.0.2", 0x22)

    async def steps(bench, ctx):
        assert [await bench.ib_open(ctx, host) for host in (a, b)] == [0, 1]
        await bench.ib_close(ctx, 0)
        await wait_for(ctx, lambda: len(bench.events) == 3, 200)
        assert bench.events[2] == (0, ConnectionEvent.CLOSED, None, 0)
        assert bench.stops == bench.closes == bench.ib_closed == [0]
        for qp in (0, 2, 3):
            await bench.ib_close(ctx, qp)
        await ctx.tick().repeat(50)
        assert bench.stops == bench.closes == bench.ib_closed == [0]
        assert len(bench.events) == 3
        reply = await bench.exchange(ctx, protocol.status(256), a)
        assert reply[0] == expected_status(0, open_=False).reply(256)
        assert len(bench.replies) == 1

    bench.run(steps)
    assert {name: value for name, value in bench.counters.items() if value} == {
        "opened": 2, "closed": 1}


def test_every_qp_the_manager_frees_is_reported_on_o_ib_closed():
    """CLOSE_QP, close-all, the lease and an IB close, of QPs opened either way."""
    tick = 60
    bench = Bench(qps=4, seed=23, config={**CONFIG, "lease_tick": tick})
    bench.status_of = lambda index: {"error": 0, "error_status": CompletionStatus.SUCCESS,
                                     "outstanding": 0, "counters": {}}
    bench.run_of = lambda index: {"running": 0, "messages": 0}
    a, b = Host("10.77.0.1", 0x31), Host("10.77.0.2", 0x32, port=40002)
    a_udp, b_udp = dataclasses.replace(a, qpn=0x41), dataclasses.replace(b, qpn=0x42)

    async def steps(bench, ctx):
        assert await bench.ib_open(ctx, a) == 0
        await bench.exchange(ctx, protocol.open_qp(a_udp.info), a)             # QP 1
        assert await bench.ib_open(ctx, b) == 2
        await bench.exchange(ctx, protocol.open_qp(b_udp.info), b)             # QP 3
        await bench.exchange(ctx, protocol.close_qp(256 + 2, b.ip), b)
        assert bench.ib_closed == [2]
        await bench.exchange(ctx, protocol.close_all(a.ip), a)
        assert bench.ib_closed == [2, 0, 1]
        await bench.ib_close(ctx, 3)
        await wait_for(ctx, lambda: len(bench.ib_closed) == 4, 100)
        assert await bench.ib_open(ctx, b) == 0
        await wait_for(ctx, lambda: len(bench.ib_closed) == 5, (LEASE_SWEEPS + 2) * tick)
        assert bench.ib_closed == [2, 0, 1, 3, 0]
        assert bench.ib_closed == bench.closes

    bench.run(steps)
    assert (bench.counters["closed"], bench.counters["expired"]) == (4, 1)


def test_ib_requests_and_datagrams_interleaved_share_one_table():
    """IB opens and closes beside UDP OPEN_QPs, STATUS and CLOSE_QPs: every open gets a
    QP no one else holds, every QP is set as its requester asked, every reply is right."""
    qps = 16
    bench = Bench(qps=qps, seed=24)
    rng = random.Random(25)
    udp_hosts = [Host(f"10.77.1.{index + 1}", 0x200 + index, port=42000 + index)
                 for index in range(6)]
    ib_hosts = [Host(f"10.77.2.{index + 1}", 0x300 + index, psn=rng.getrandbits(24),
                     rkey=rng.getrandbits(32), base=rng.getrandbits(64)) for index in range(6)]
    holder = {}                         # QP → ("udp" or "ib", host index)
    done = []

    async def ib_side(ctx):
        for index, host in enumerate(ib_hosts):
            await ctx.tick().repeat(rng.randrange(1, 30))
            qp = await bench.ib_open(ctx, host)
            assert qp not in holder, f"QP {qp} given twice"
            holder[qp] = ("ib", index)
            assert (qp, ib_write(host, qp)[1]) in bench.writes
            if index % 3 == 2:
                await bench.ib_close(ctx, qp)
                await wait_for(ctx, lambda qp=qp: bench.ib_closed[-1:] == [qp], 100)
                del holder[qp]
        done.append(True)

    async def steps(bench, ctx):
        for index, host in enumerate(udp_hosts):
            request = protocol.open_qp(host.info)
            reply = await bench.exchange(ctx, request, host)
            qp = Datagram.decode(reply[0]).loc.qpn - protocol.FIRST_QPN
            assert qp not in holder, f"QP {qp} given twice"
            holder[qp] = ("udp", index)
            check_open(bench, reply, request, host, qp, PathMtu.MTU_4096)
            reply = await bench.exchange(ctx, protocol.status(256 + qp), host)
            assert Status.from_reply(reply[0]).open
            if index % 2:
                request = protocol.close_qp(256 + qp, host.ip)
                await bench.exchange(ctx, request, host)
                del holder[qp]
        await wait_for(ctx, lambda: done, 2000)
        for qp in range(qps):
            reply = await bench.exchange(ctx, protocol.status(256 + qp), udp_hosts[0])
            assert Status.from_reply(reply[0]).open == (qp in holder), qp
        assert sorted(bench.closes) == sorted(bench.ib_closed)
        assert len(bench.closes) == 5

    bench.run(steps, ib_side)
    assert (bench.counters["opened"], bench.counters["closed"]) == (12, 5)


def connect_request(host, port, mtu=protocol.PathMtu.MTU_1024):
    """CONNECT (request 6) from ``host`` for its rdma_cm listener on ``port``: the
    datagram's bytes from CM_PROTOCOL.md's table (``struct``)."""
    return struct.pack(">B20xI24xHBI8x", 0x01 | 6 << 1, parse_ipv4(host.ip), 0,
                       int(mtu) << 4, port)


def connect_reply(request, ack, *, qpn=0, psn=0, count=0, mtu=0):
    """The endpoint's answer to ``request``: request 6, ack_valid, ``ack``; loc_* its QP
    and address, rem_* the request's loc_* (its bytes 1-24), the MTU, ``count``."""
    return (struct.pack(">BIIIQI", 0x01 | 6 << 1 | 1 << 4 | int(ack) << 5, qpn, psn, 0, 0,
                        parse_ipv4(ENDPOINT_IP))
            + request[1:25] + struct.pack(">HBIII", 0, mtu << 4, 0, count, 0))


class Connect:
    """A CONNECT datagram that ``Bench.exchange`` sends as is."""

    def __init__(self, raw):
        self.raw = raw

    def encode(self):
        return self.raw


def test_connect_holds_a_qp_until_the_ib_cm_answers():
    """CONNECT takes a QP (as an IB open) and asks the IB CM for the REQ, no reply yet;
    a retry meanwhile takes no second QP; the IB CM's answer sets the QP from the REP
    (the host's QPN, its PSN as ours, RNR retry 6, the QP's MTU), makes an OPENED event
    (with the port and buffer length) and answers CONNECT/ACK; a CONNECT again gets the
    same ACK. A refused one frees its QP, makes a FAILED event and answers NAK with the
    reason; an MTU out of range or no QP free answers NAK at once; a CONNECT for another
    loc_ip is dropped; an answer for a QP its host freed meanwhile changes nothing."""
    bench = Bench(qps=3, seed=31)
    a = Host("10.77.0.1", 0x4321, psn=0x0ABCDE, rkey=0x55AA, base=0x7F00_0000_8000,
             port=41000)
    b = Host("10.77.0.5", 0x99, port=40002)

    async def steps(bench, ctx):
        request = connect_request(a, 7471)
        await bench.exchange(ctx, Connect(request), a, reply=False)
        assert bench.ib_connects == [(0, a.ip, 7471, PathMtu.MTU_1024)]
        await bench.exchange(ctx, Connect(request), a, reply=False)     # the host's retry
        assert len(bench.ib_connects) == 1 and bench.writes == []
        before = len(bench.replies)
        await bench.ib_connected(ctx, 0, host=a)
        await wait_for(ctx, lambda: len(bench.replies) > before, 200)
        payload, meta = bench.replies[-1]
        assert payload == connect_reply(request, Ack.ACK, qpn=256, psn=a.psn, mtu=3)
        assert meta["dst_ip"] == parse_ipv4(a.ip) and meta["dst_port"] == a.port
        write = (0, {"remote_qpn": a.qpn, "next_psn": a.psn, "rkey": a.rkey,
                     "remote_ip": parse_ipv4(a.ip), "path_mtu": 3, "src_port": 0,
                     "timeout": CONFIG["timeout"], "retry_count": CONFIG["retry_count"],
                     "rnr_retry": 6})
        assert bench.writes == [write]
        await wait_for(ctx, lambda: bench.events, 100)
        assert bench.events == [(0, ConnectionEvent.OPENED, write[1], a.base)]
        assert bench.event_details == [(1 << 16, 7471, 0)]
        assert (await bench.exchange(ctx, Connect(request), a))[0] == payload
        reply = await bench.exchange(ctx, protocol.status(256), a)
        assert reply[0] == expected_status(0, open_=True).reply(256)

        # refused by the host: NAK 8, the QP free again (STATUS), a FAILED event
        other = connect_request(a, 7472)
        await bench.exchange(ctx, Connect(other), a, reply=False)
        assert bench.ib_connects[-1] == (1, a.ip, 7472, PathMtu.MTU_1024)
        await bench.ib_connected(ctx, 1, reason=8)
        await wait_for(ctx, lambda: len(bench.replies) > 3, 200)
        assert bench.replies[-1][0] == connect_reply(other, Ack.NAK, count=8)
        await wait_for(ctx, lambda: len(bench.events) == 2, 100)
        assert bench.events[1] == (1, ConnectionEvent.FAILED,
                                   {**{name: 0 for name in write[1]},
                                    "remote_ip": parse_ipv4(a.ip)}, 0)
        assert bench.event_details[1] == (0, 7472, 8)
        reply = await bench.exchange(ctx, protocol.status(257), a)
        assert reply[0] == expected_status(1, open_=False).reply(257)

        # at once: an MTU out of range (26); a CONNECT for another loc_ip: dropped
        for mtu in (0, 6):
            bad = connect_request(b, 7471, mtu=mtu)
            assert (await bench.exchange(ctx, Connect(bad), b))[0] == \
                connect_reply(bad, Ack.NAK, count=26)
        await bench.exchange(ctx, Connect(connect_request(a, 7471)), b, reply=False)

        # the host frees a QP still connecting: the IB CM's late answer changes nothing
        late = connect_request(b, 7471)
        await bench.exchange(ctx, Connect(late), b, reply=False)
        qp = bench.ib_connects[-1][0]
        assert qp == 2
        await bench.exchange(ctx, protocol.close_qp(256 + qp, b.ip), b)
        await bench.ib_connected(ctx, qp, host=b)
        for _ in range(100):
            await ctx.tick()
        assert len(bench.writes) == 1

        # every QP taken: NAK 3 at once
        await bench.exchange(ctx, Connect(connect_request(b, 1)), b, reply=False)
        await bench.exchange(ctx, Connect(connect_request(b, 2)), b, reply=False)
        full = connect_request(b, 3)
        events = len(bench.events)
        assert (await bench.exchange(ctx, Connect(full), b))[0] == \
            connect_reply(full, Ack.NAK, count=3)
        # (the event sink takes events at random cycles: the FAILED event may come later)
        await wait_for(ctx, lambda: len(bench.events) > events, 200)
        assert bench.event_details[-1] == (0, 3, 3)

    bench.run(steps)
    assert {name: value for name, value in bench.counters.items() if value} == {
        "connects": 5, "connected": 1, "connect_failed": 4, "malformed": 2, "spoofed": 1,
        "closed": 1, "no_qp": 1}


def test_user_logic_connects_and_learns_the_answer_from_events():
    """``i_connect`` is served as a CONNECT from the host it names, answered by events
    alone: OPENED once the IB CM has connected it, FAILED with the reason; one for a
    host and port already connecting or connected makes nothing."""
    bench = Bench(qps=2, seed=32)
    a = Host("10.77.0.1", 0x4321)

    async def steps(bench, ctx):
        await bench.user_connect(ctx, a.ip, 7471)
        await wait_for(ctx, lambda: bench.ib_connects, 100)
        assert bench.ib_connects == [(0, a.ip, 7471, PathMtu.MTU_1024)]
        await bench.user_connect(ctx, a.ip, 7471)           # already connecting
        await bench.ib_connected(ctx, 0, host=a)
        await wait_for(ctx, lambda: bench.events, 200)
        await bench.user_connect(ctx, a.ip, 7471)           # already connected
        await bench.user_connect(ctx, a.ip, 9000, mtu=PathMtu.MTU_4096)
        await wait_for(ctx, lambda: len(bench.ib_connects) == 2, 200)
        assert bench.ib_connects[1] == (1, a.ip, 9000, PathMtu.MTU_4096)
        await bench.ib_connected(ctx, 1, reason=28)
        await wait_for(ctx, lambda: len(bench.events) == 2, 200)
        for _ in range(100):
            await ctx.tick()

    bench.run(steps)
    assert [event[:2] for event in bench.events] == [(0, ConnectionEvent.OPENED),
                                                    (1, ConnectionEvent.FAILED)]
    assert bench.event_details == [(1 << 16, 7471, 0), (0, 9000, 28)]
    assert bench.replies == [] and len(bench.writes) == 1
