# amaranth: UnusedElaboratable=no
"""TrafficGenerator against a pure-Python model of CM_PROTOCOL's "Start a run" and
"Generator payload": every request field, every payload byte, and the timing."""

import random
from itertools import pairwise

import pytest

from gateware.roce.generator import TrafficGenerator
from gateware.roce.requests import Verb
from sim.models.rocev2 import generator_payload

from .streams import (
    StreamMonitor,
    get_item_random_ready,
    get_packet,
    put_item,
    run_testbenches,
    wait_for,
)


def model_address(run, k):
    """Remote address of message ``k``: ``base + k·length``, or modulo the ring's slots.
    A ring shorter than one message (no whole slot) keeps every message at ``base``."""
    base, length, ring = run["base"], run["length"], run["ring"]
    if ring == 0:
        return (base + k * length) % (1 << 64)
    if length == 0 or ring < length:
        return base
    return base + (k % (ring // length)) * length


def model_request(run, k):
    return (run["verb"], run["qp"], k % (1 << 16), model_address(run, k), run["length"], k)


def make_run(length, count, *, verb=Verb.RDMA_WRITE, qp=5, divider=0, base=0x1_2345_6000,
             ring=0):
    return {"qp": qp, "verb": verb, "length": length, "count": count, "divider": divider,
            "base": base, "ring": ring}


async def get_request(ctx, port, gaps):
    """Take one request from ``port`` as a tuple; ``ready`` is random every cycle when
    ``gaps`` is a Random, so requests also wait while offered."""
    request = await get_item_random_ready(ctx, port, gaps=gaps)
    return (request.verb, request.qp, request.tag, request.remote_address, request.length,
            request.immediate)


class Bench:
    """A starter that offers the runs one after the other (each held until taken), a
    request sink, a payload sink, and a monitor that checks that no stream changes while
    valid and not ready and records, by cycle, the start handshakes, the first offer of
    every request, every payload beat taken and every payload's first beat."""

    def __init__(self, runs, *, width, request_gaps=None, payload_gaps=None):
        self.dut = TrafficGenerator(width=width)
        self.runs, self.width = runs, width
        self.request_gaps, self.payload_gaps = request_gaps, payload_gaps
        self.requests, self.payloads = [], []
        self.streams = StreamMonitor(start=self.dut.i_start, request=self.dut.o_request,
                                     payload=self.dut.o_payload)
        self.starts = self.streams.beats["start"]
        self.offers = self.streams.offers["request"]
        self.beats = self.streams.beats["payload"]
        self.firsts = self.streams.firsts["payload"]
        self.total = sum(run["count"] for run in runs)

    async def starter(self, ctx):
        for run in self.runs:
            ctx.set(self.dut.i_start.valid, 1)
            ctx.set(self.dut.i_start.payload, run)
            await ctx.tick().until(self.dut.i_start.ready)
            ctx.set(self.dut.i_start.valid, 0)

    async def request_sink(self, ctx):
        for _ in range(self.total):
            self.requests.append(await get_request(ctx, self.dut.o_request, self.request_gaps))

    async def payload_sink(self, ctx):
        for _ in range(self.total):
            payload, _ = await get_packet(ctx, self.dut.o_payload, width=self.width,
                                          gaps=self.payload_gaps)
            self.payloads.append(payload)

    def run(self, cycles=50_000):
        async def check(ctx):
            await wait_for(ctx, lambda: len(self.payloads) == self.total and
                           len(self.requests) == self.total, cycles)
            await wait_for(ctx, lambda: not ctx.get(self.dut.o_running), 10)
            for _ in range(10):
                await ctx.tick()
                assert not ctx.get(self.dut.o_request.valid), "more requests than the runs"
                assert not ctx.get(self.dut.o_payload.valid), "more payloads than the runs"
            assert len(self.starts) == len(self.runs)
            assert ctx.get(self.dut.o_messages) == self.runs[-1]["count"]

        run_testbenches(self.dut, check, self.starter, self.request_sink, self.payload_sink,
                        self.streams.run)
        expected = [(model_request(run, k), generator_payload(k, run["length"]))
                    for run in self.runs for k in range(run["count"])]
        for index, (request, payload) in enumerate(expected):
            assert self.requests[index] == request, f"request {index}"
            assert self.payloads[index] == payload, f"payload {index}"
        assert self.firsts == sorted(self.firsts)
        for offer, first in zip(self.offers, self.firsts, strict=True):
            assert first >= offer, "a payload began before its request was offered"


LENGTHS = [0, 1, 7, 8, 63, 64, 65, 4096 + 3]


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("length", LENGTHS)
def test_messages(width, length):
    """Every request field and payload byte, random backpressure on both outputs."""
    count = 3 if length > 1000 and width == 8 else 6
    run = make_run(length, count, verb=Verb.SEND_WITH_IMMEDIATE, qp=201)
    bench = Bench([run], width=width, request_gaps=random.Random(f"r{length}"),
                  payload_gaps=random.Random(f"p{length}"))
    bench.run()


@pytest.mark.parametrize("length, ring, base", [
    (64, 256, 0x1000),                  # a multiple of the length: 4 slots
    (24, 100, 0x7000_0000_0000),        # not a multiple: 4 slots, 4 bytes unused
    (65, 65, 0x40),                     # one slot
    (100, 64, 0x40),                    # shorter than a message: always the base
    (0, 4096, 0x40),                    # zero-length messages: always the base
    (64, 0, (1 << 64) - 3 * 64),        # no ring: the address wraps around 2^64
    (0, 0, 0x99),
])
def test_addresses(length, ring, base):
    """Remote addresses with and without a ring, under backpressure."""
    run = make_run(length, 11, base=base, ring=ring)
    bench = Bench([run], width=8, request_gaps=random.Random(1), payload_gaps=random.Random(2))
    bench.run()


def test_verbs_and_runs():
    """Back-to-back runs on different QPs and verbs: each begins at k = 0 and its base,
    and the start is only taken once the previous run has ended."""
    runs = [make_run(length, count, verb=verb, qp=qp, base=base, ring=ring)
            for length, count, verb, qp, base, ring in [
                (10, 5, Verb.RDMA_WRITE_WITH_IMMEDIATE, 1, 0x100, 30),
                (0, 0, Verb.SEND, 2, 0x200, 0),
                (17, 4, Verb.SEND, 255, 0x300, 0),
                (0, 3, Verb.RDMA_WRITE, 0, 0x400, 0),
            ]]
    bench = Bench(runs, width=8, request_gaps=random.Random(3), payload_gaps=random.Random(4))
    bench.run()


@pytest.mark.parametrize("divider", [2, 5, 17])
@pytest.mark.parametrize("gaps", [False, True])
def test_divider(divider, gaps):
    """Requests are first offered at least ``divider`` cycles apart; exactly that when the
    sinks keep up (payloads of two beats, shorter than the divider)."""
    run = make_run(16, 12, divider=divider)
    bench = Bench([run], width=8, request_gaps=random.Random(5) if gaps else None,
                  payload_gaps=random.Random(6) if gaps else None)
    bench.run()
    spacing = [b - a for a, b in pairwise(bench.offers)]
    assert min(spacing) >= divider, spacing
    if not gaps:
        assert spacing == [divider] * len(spacing), spacing
    assert bench.offers[0] == bench.starts[0] + 1


@pytest.mark.parametrize("width, length", [(8, 0), (8, 8), (8, 65), (64, 64), (64, 200)])
def test_throughput(width, length):
    """Divider 0 and ready sinks: one payload beat every cycle from the first to the last,
    no idle cycle between messages."""
    count = 20
    bench = Bench([make_run(length, count)], width=width)
    bench.run()
    beats = count * max(1, -(-length // width))
    assert len(bench.beats) == beats
    assert bench.beats[-1] - bench.beats[0] + 1 == beats
    assert bench.beats[0] == bench.starts[0] + 1


def test_start_ignored_while_running():
    """A start offered during a run is not taken and changes nothing; ``o_running`` and
    ``i_start.ready`` are complements throughout."""
    width = 8
    dut = TrafficGenerator(width=width)
    first = make_run(40, 6, divider=9, base=0x1000)
    second = make_run(3, 2, verb=Verb.SEND, qp=7, base=0x9000)
    requests, payloads = [], []

    async def bench(ctx):
        ctx.set(dut.i_start.valid, 1)
        ctx.set(dut.i_start.payload, first)
        await ctx.tick()
        ctx.set(dut.i_start.payload, second)        # offered while running, then withdrawn
        for _ in range(20):
            assert ctx.get(dut.o_running) and not ctx.get(dut.i_start.ready)
            await ctx.tick()
        ctx.set(dut.i_start.valid, 0)
        await wait_for(ctx, lambda: len(payloads) == first["count"], 2_000)
        await wait_for(ctx, lambda: not ctx.get(dut.o_running), 10)
        assert ctx.get(dut.o_messages) == first["count"]
        for _ in range(10):
            assert ctx.get(dut.i_start.ready)
            assert not ctx.get(dut.o_request.valid) and not ctx.get(dut.o_payload.valid)
            await ctx.tick()
        assert len(requests) == first["count"]

    async def request_sink(ctx):
        gaps = random.Random(7)
        for _ in range(first["count"]):
            requests.append(await get_request(ctx, dut.o_request, gaps))

    async def payload_sink(ctx):
        for _ in range(first["count"]):
            payloads.append((await get_packet(ctx, dut.o_payload, width=width))[0])

    run_testbenches(dut, bench, request_sink, payload_sink)
    assert requests == [model_request(first, k) for k in range(first["count"])]
    assert payloads == [generator_payload(k, first["length"]) for k in range(first["count"])]


def test_tag_wraps():
    """The tag is k mod 2^16 and the immediate k, past 2^16 messages (zero-length ones,
    one per cycle)."""
    count = (1 << 16) + 5
    dut = TrafficGenerator(width=8)
    seen = []

    async def bench(ctx):
        ctx.set(dut.i_start.valid, 1)
        ctx.set(dut.i_start.payload, make_run(0, count))
        await ctx.tick()
        ctx.set(dut.i_start.valid, 0)
        ctx.set(dut.o_request.ready, 1)
        ctx.set(dut.o_payload.ready, 1)
        async for _, _, valid, tag, immediate in ctx.tick().sample(
                dut.o_request.valid, dut.o_request.p.tag, dut.o_request.p.immediate):
            if valid and (immediate < 3 or immediate >= (1 << 16) - 2):
                seen.append((tag, immediate))
            if immediate == count - 1:
                break

    run_testbenches(dut, bench)
    wrap = 1 << 16
    assert seen == [(k % wrap, k) for k in [0, 1, 2, *range(wrap - 2, count)]]


def test_bad_width():
    with pytest.raises(ValueError, match="multiple of 8"):
        TrafficGenerator(width=12)


@pytest.mark.parametrize("length, ring", [(64, 256), (24, 100), (65, 65)])
def test_a_credited_run_sends_message_k_once_k_minus_slots_is_consumed(length, ring):
    """The host's credits, offered at once after the start (before the ring first
    wraps), repeated, lower than one taken, and in steps: after each, exactly
    ``consumed + slots`` requests (at most the run's count) have been taken, with the
    ring's addresses and payloads of an uncredited run."""
    slots = ring // length
    count = 3 * slots + 2
    run = make_run(length, count, ring=ring) | {"credited": 1}
    dut = TrafficGenerator(width=8)
    requests, payloads = [], []

    async def credit(ctx, consumed):
        ctx.set(dut.i_credit.valid, 1)
        ctx.set(dut.i_credit.payload, consumed)
        await ctx.tick()
        ctx.set(dut.i_credit.valid, 0)
        for _ in range(30 + 12 * length):
            await ctx.tick()

    async def bench(ctx):
        await put_item(ctx, dut.i_start, run)
        most = 0
        for consumed in (1, 1, 0, slots, slots - 1, 2 * slots + 1, count):
            await credit(ctx, consumed)
            most = max(most, consumed)
            assert len(requests) == min(count, most + slots), (consumed, len(requests))
        await wait_for(ctx, lambda: not ctx.get(dut.o_running), 100)

    async def request_sink(ctx):
        gaps = random.Random(length)
        for _ in range(count):
            requests.append(await get_request(ctx, dut.o_request, gaps))

    async def payload_sink(ctx):
        for _ in range(count):
            payloads.append((await get_packet(ctx, dut.o_payload, width=8,
                                              gaps=random.Random(ring)))[0])

    run_testbenches(dut, bench, request_sink, payload_sink)
    assert requests == [model_request(run, k) for k in range(count)]
    assert payloads == [generator_payload(k, length) for k in range(count)]


@pytest.mark.parametrize("seed", range(3))
def test_credits_at_any_cycle_never_let_a_run_pass_the_host(seed):
    """Credits offered at random cycles, often in the cycle a request is taken, with the
    ring wrapped or not, and requests taken with random gaps: the run never has taken
    more than ``consumed + slots`` requests, and once quiet it has taken exactly that
    many (at most the run's count)."""
    length, ring = 16, 64
    slots = ring // length
    count = 12 * slots
    run = make_run(length, count, ring=ring) | {"credited": 1}
    dut = TrafficGenerator(width=8)
    rng = random.Random(seed)
    requests = []
    most = [0]                          # the most consumed offered so far

    async def bench(ctx):
        await put_item(ctx, dut.i_start, run)
        consumed = 0
        while consumed < count:
            consumed = min(count, consumed + rng.choice([0, 1, 1, 2, slots]))
            most[0] = max(most[0], consumed)
            ctx.set(dut.i_credit.valid, 1)
            ctx.set(dut.i_credit.payload, consumed)
            await ctx.tick()
            ctx.set(dut.i_credit.valid, 0)
            for _ in range(rng.choice([0, 0, 1, 3, 10, 40])):
                await ctx.tick()
            if rng.random() < 0.1:
                for _ in range(30 + 12 * length):
                    await ctx.tick()
                assert len(requests) == min(count, most[0] + slots), (most, len(requests))
        await wait_for(ctx, lambda: not ctx.get(dut.o_running), 2000)
        assert len(requests) == count

    async def request_sink(ctx):
        gaps = random.Random(seed + 10)
        for _ in range(count):
            requests.append(await get_request(ctx, dut.o_request, gaps))
            assert len(requests) <= most[0] + slots, (most, len(requests))

    async def payload_sink(ctx):
        for _ in range(count):
            await get_packet(ctx, dut.o_payload, width=8, gaps=random.Random(seed))

    run_testbenches(dut, bench, request_sink, payload_sink)
    assert requests == [model_request(run, k) for k in range(count)]
