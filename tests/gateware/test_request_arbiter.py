# amaranth: UnusedElaboratable=no
"""RequestArbiter: every message's request paired with its own payload, whole messages,
round-robin grants, and outputs that hold still while offered and not taken."""

import random
from itertools import pairwise

import pytest
from amaranth import *
from amaranth.lib import wiring

from gateware.roce.generator import TrafficGenerator
from gateware.roce.request_arbiter import RequestArbiter
from gateware.roce.requests import Verb
from sim.models.rocev2 import generator_payload

from .streams import (
    StreamMonitor,
    get_item_random_ready,
    get_packet,
    put_item,
    put_packet,
    round_robin,
    run_testbenches,
    wait_for,
)
from .test_generator import make_run, model_request


def make_messages(rng, inputs, count, width):
    """Per input, ``count`` (request, payload) pairs: qp = input, tag = sequence number,
    lengths up to three beats, a quarter of them zero."""
    cases = []
    for source in range(inputs):
        messages = []
        for seq in range(count):
            length = 0 if rng.random() < 0.25 else rng.randrange(1, 3 * width + 1)
            request = {"verb": rng.choice(list(Verb)), "qp": source, "tag": seq,
                       "remote_address": rng.getrandbits(64), "length": length,
                       "immediate": rng.getrandbits(32)}
            messages.append((request, rng.randbytes(length)))
        cases.append(messages)
    return cases


def as_tuple(request):
    return (request["verb"], request["qp"], request["tag"], request["remote_address"],
            request["length"], request["immediate"])


class Bench:
    """Per input a request source and an independent payload source (so a payload may be
    offered before, with or after its request); a request sink and a payload sink, either
    independent or in the transmit engine's order (request, then its payload); and a
    monitor that checks the stream rule on both outputs and records grants and beats."""

    def __init__(self, cases, *, width, source_gaps, sink_gaps, engine=False,
                 registered_head=False):
        self.dut = RequestArbiter(inputs=len(cases), width=width,
                                  registered_head=registered_head)
        self.cases, self.width, self.engine = cases, width, engine
        self.source_gaps, self.sink_gaps = source_gaps, sink_gaps
        self.requests, self.payloads = [], []
        self.grants = []            # (source, input request valids) at each request's first offer
        self.streams = StreamMonitor(request=self.dut.o_request, payload=self.dut.o_payload)
        self.beats = self.streams.beats["payload"]      # cycle of every payload beat taken
        self.offers = self.streams.offers["request"]    # cycle of each request's first offer
        self.firsts = self.streams.firsts["payload"]    # cycle of each payload's first beat
        self.total = sum(len(messages) for messages in cases)

    def request_source(self, index):
        async def testbench(ctx):
            gaps = random.Random(f"request{index}") if self.source_gaps else None
            for request, _ in self.cases[index]:
                if gaps is not None and gaps.random() < 0.2:
                    await ctx.tick().repeat(gaps.randrange(1, 20))    # the payload goes first
                await put_item(ctx, self.dut.i_request[index], request, gaps=gaps)
        return testbench

    def payload_source(self, index):
        async def testbench(ctx):
            gaps = random.Random(f"payload{index}") if self.source_gaps else None
            for _, payload in self.cases[index]:
                await put_packet(ctx, self.dut.i_payload[index], payload, {}, width=self.width,
                                 gaps=gaps)
        return testbench

    async def get_request(self, ctx, gaps):
        self.requests.append(as_tuple(await get_item_random_ready(ctx, self.dut.o_request,
                                                                  gaps=gaps)))

    async def get_payload(self, ctx, gaps):
        payload, _ = await get_packet(ctx, self.dut.o_payload, width=self.width, gaps=gaps)
        self.payloads.append(payload)

    def sinks(self):
        def gaps(name):
            return random.Random(name) if self.sink_gaps else None

        async def engine(ctx):
            request_gaps, payload_gaps = gaps("request sink"), gaps("payload sink")
            for _ in range(self.total):
                await self.get_request(ctx, request_gaps)
                await self.get_payload(ctx, payload_gaps)

        async def request_sink(ctx):
            request_gaps = gaps("request sink")
            for _ in range(self.total):
                await self.get_request(ctx, request_gaps)

        async def payload_sink(ctx):
            payload_gaps = gaps("payload sink")
            for _ in range(self.total):
                await self.get_payload(ctx, payload_gaps)

        return [engine] if self.engine else [request_sink, payload_sink]

    async def monitor(self, ctx):
        valids = [port.valid for port in self.dut.i_request]
        async for _, seen, offered in self.streams.watch(ctx, *valids):
            if seen["request"].offer:
                self.grants.append((seen["request"].payload.qp, offered))

    def run(self, cycles=20_000):
        async def check(ctx):
            await wait_for(ctx, lambda: len(self.payloads) == self.total and
                           len(self.requests) == self.total, cycles)
            for _ in range(20):
                await ctx.tick()
                assert not ctx.get(self.dut.o_request.valid), "more requests than were sent"
                assert not ctx.get(self.dut.o_payload.valid), "more payloads than were sent"

        run_testbenches(self.dut, check, self.monitor, *self.sinks(),
                        *(source(index) for index in range(len(self.cases))
                          for source in (self.request_source, self.payload_source)))

        for index, (request, payload) in enumerate(zip(self.requests, self.payloads,
                                                        strict=True)):
            source, seq = request[1], request[2]
            expected_request, expected_payload = self.cases[source][seq]
            assert request == as_tuple(expected_request), f"request {index}"
            assert payload == expected_payload, f"payload {index} (input {source}, {seq})"
        for source, messages in enumerate(self.cases):
            seqs = [request[2] for request in self.requests if request[1] == source]
            assert seqs == list(range(len(messages))), f"input {source} out of order"
        for offer, start in zip(self.offers, self.firsts, strict=True):
            assert start >= offer, "a payload left before its request was offered"
        previous = None
        for source, offered in self.grants:
            assert offered[source], f"granted input {source} had no request"
            if previous is not None:
                assert source == round_robin(previous, offered), \
                    f"granted {source} after {previous} while {offered}"
            previous = source


@pytest.mark.parametrize("width, inputs, registered_head",
                         [(8, 2, False), (8, 3, False), (64, 2, False), (8, 3, True)])
@pytest.mark.parametrize("engine", [False, True])
def test_random(width, inputs, registered_head, engine):
    """Random gaps at the sources and sinks; independent sinks, or a sink that takes a
    request and then its payload."""
    cases = make_messages(random.Random(f"{width}.{inputs}.{engine}"), inputs, 25, width)
    bench = Bench(cases, width=width, source_gaps=True, sink_gaps=True, engine=engine,
                  registered_head=registered_head)
    bench.run()


@pytest.mark.parametrize("width", [8, 64])
def test_fair(width):
    """Both inputs always offering: grants alternate."""
    cases = make_messages(random.Random(f"fair{width}"), 2, 20, width)
    bench = Bench(cases, width=width, source_gaps=False, sink_gaps=True)
    bench.run()
    order = [source for source, _ in bench.grants]
    assert all(a != b for a, b in pairwise(order)), order


@pytest.mark.parametrize("width,registered_head", [(8, False), (64, False), (64, True)])
def test_no_idle(width, registered_head):
    """Sources without gaps and ready sinks: a payload beat every cycle from the first to
    the last (requests run ahead of their payloads), the first the cycle after its
    request (two with the queue's head in a register)."""
    cases = make_messages(random.Random(f"idle{width}"), 2, 20, width)
    bench = Bench(cases, width=width, source_gaps=False, sink_gaps=False,
                  registered_head=registered_head)
    bench.run(5_000)
    beats = sum(max(1, -(-len(payload) // width)) for messages in cases
                for _, payload in messages)
    assert len(bench.beats) == beats
    assert bench.beats[-1] - bench.beats[0] + 1 == beats
    assert bench.firsts[0] == bench.offers[0] + 1 + registered_head


def test_with_generator():
    """The generator on input 1 and user logic on input 0, joined by ``connect``: both
    sets of messages come out whole and paired."""
    width = 8
    run = make_run(21, 12, verb=Verb.RDMA_WRITE_WITH_IMMEDIATE, qp=9, ring=100)
    user = make_messages(random.Random("user"), 1, 12, width)[0]

    class Top(Elaboratable):
        def __init__(self):
            self.generator = TrafficGenerator(width=width)
            self.arbiter = RequestArbiter(inputs=2, width=width)

        def elaborate(self, platform):
            m = Module()
            m.submodules.generator = self.generator
            m.submodules.arbiter = self.arbiter
            wiring.connect(m, self.generator.o_request, self.arbiter.i_request[1])
            wiring.connect(m, self.generator.o_payload, self.arbiter.i_payload[1])
            return m

    top = Top()
    arbiter, total = top.arbiter, run["count"] + len(user)
    received = []

    async def start(ctx):
        ctx.set(top.generator.i_start.valid, 1)
        ctx.set(top.generator.i_start.payload, run)
        await ctx.tick().until(top.generator.i_start.ready)
        ctx.set(top.generator.i_start.valid, 0)

    async def user_requests(ctx):
        gaps = random.Random(1)
        for request, _ in user:
            await put_item(ctx, arbiter.i_request[0], request, gaps=gaps)

    async def user_payloads(ctx):
        gaps = random.Random(2)
        for _, payload in user:
            await put_packet(ctx, arbiter.i_payload[0], payload, {}, width=width, gaps=gaps)

    async def engine(ctx):
        request_gaps, payload_gaps = random.Random(3), random.Random(4)
        for _ in range(total):
            request = as_tuple(await get_item_random_ready(ctx, arbiter.o_request,
                                                           gaps=request_gaps))
            payload, _ = await get_packet(ctx, arbiter.o_payload, width=width,
                                          gaps=payload_gaps)
            received.append((request, payload))

    async def check(ctx):
        await wait_for(ctx, lambda: len(received) == total, 10_000)

    run_testbenches(top, check, start, user_requests, user_payloads, engine)
    generated = [(model_request(run, k), generator_payload(k, run["length"]))
                 for k in range(run["count"])]
    assert [message for message in received if message[0][1] == run["qp"]] == generated
    assert [message for message in received if message[0][1] == 0] == \
        [(as_tuple(request), payload) for request, payload in user]
    order = [message[0][1] for message in received]
    assert order.count(0) == len(user) and order.count(run["qp"]) == run["count"]


def test_bad_inputs():
    with pytest.raises(ValueError, match="at least one input"):
        RequestArbiter(inputs=0)
