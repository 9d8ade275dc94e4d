"""PacketArbiter: whole packets from several inputs, per-input order, round-robin or priority."""

import random
from itertools import pairwise

import pytest

from gateware.packet.arbiter import PacketArbiter
from gateware.stream import NO_META, beats_for, meta_with

from .streams import StreamMonitor, get_packet, put_packet, round_robin, run_testbenches, wait_for

META = meta_with(NO_META, source=4, seq=12)


def make_cases(rng, inputs, count, width):
    """Per input, ``count`` packets of random length up to four beats."""
    return [[rng.randbytes(rng.randrange(0, 4 * width)) for _ in range(count)]
            for _ in range(inputs)]


class Bench:
    """Sources on every input, one sink, and a monitor that sees every beat taken from
    the output with the input valids of that cycle."""

    def __init__(self, dut, cases, *, width, source_gaps, sink_gaps):
        self.dut, self.cases, self.width = dut, cases, width
        self.source_gaps, self.sink_gaps = source_gaps, sink_gaps
        self.received = []          # (source, seq, payload) in output order
        self.starts = []            # (source, input valids) when a packet's first beat is offered
        self.streams = StreamMonitor(o=dut.o)
        self.beats = self.streams.beats["o"]        # cycle of every beat taken
        self.total = sum(len(packets) for packets in cases)

    def source(self, index):
        async def testbench(ctx):
            gaps = random.Random(100 + index) if self.source_gaps else None
            for seq, payload in enumerate(self.cases[index]):
                await put_packet(ctx, self.dut.i[index], payload, {"source": index, "seq": seq},
                                 width=self.width, gaps=gaps)
        return testbench

    async def sink(self, ctx):
        gaps = random.Random(200) if self.sink_gaps else None
        for _ in range(self.total):
            payload, meta = await get_packet(ctx, self.dut.o, width=self.width, gaps=gaps)
            self.received.append((meta.source, meta.seq, payload))

    async def monitor(self, ctx):
        """Checks, besides the stream rule, that every packet is whole. Records the input
        valids of the cycle where a packet's first beat is first offered, which is where the
        arbiter makes its choice."""
        packet_meta, offer = None, None
        valids = [port.valid for port in self.dut.i]
        async for _, seen, offered in self.streams.watch(ctx, *valids):
            out = seen["o"]
            if out.offer and out.first:
                offer = offered
            if not out.taken:
                continue
            meta = (out.payload.meta.source, out.payload.meta.seq)
            if out.first:
                packet_meta = meta
                self.starts.append((out.payload.meta.source, offer))
            assert meta == packet_meta, f"beat of {meta} inside packet {packet_meta}"

    def run(self, cycles):
        async def check(ctx):
            await wait_for(ctx, lambda: len(self.received) >= self.total, cycles)
            for _ in range(20):
                await ctx.tick()
                assert not ctx.get(self.dut.o.valid), "more packets than were sent"
            for index, packets in enumerate(self.cases):
                got = [(seq, payload) for source, seq, payload in self.received
                       if source == index]
                assert got == list(enumerate(packets)), f"input {index}"

        run_testbenches(self.dut, check, self.sink, self.monitor,
                        *(self.source(index) for index in range(len(self.cases))))


@pytest.mark.parametrize("width, inputs", [(8, 1), (8, 3), (64, 3)])
@pytest.mark.parametrize("priority", [False, True])
def test_random(width, inputs, priority):
    """Random gaps on every side: packets whole, per-input order kept, grants as specified
    (round-robin after the input served last, or input 0 first)."""
    dut = PacketArbiter(META, inputs=inputs, priority=priority, width=width)
    cases = make_cases(random.Random(f"{width}.{inputs}"), inputs, 30, width)
    bench = Bench(dut, cases, width=width, source_gaps=True, sink_gaps=True)
    bench.run(20_000)
    previous = None
    for source, offered in bench.starts:
        assert offered[source], f"granted input {source} had nothing"
        if priority:
            assert source == offered.index(1), f"granted {source} while {offered}"
        elif previous is not None:
            assert source == round_robin(previous, offered), \
                f"granted {source} after {previous} while {offered}"
        previous = source
    assert len(bench.starts) == bench.total


@pytest.mark.parametrize("width", [8, 64])
def test_fair(width):
    """With every input always holding a packet, grants rotate through the inputs."""
    inputs = 4
    dut = PacketArbiter(META, inputs=inputs, width=width)
    bench = Bench(dut, make_cases(random.Random(f"fair{width}"), inputs, 20, width),
                  width=width, source_gaps=False, sink_gaps=True)
    bench.run(20_000)
    order = [source for source, _ in bench.starts]
    assert all(b == (a + 1) % inputs for a, b in pairwise(order)), order


def test_priority_starves():
    """With priority, input 0 holding packets back to back wins every packet boundary."""
    width, inputs = 8, 3
    dut = PacketArbiter(META, inputs=inputs, priority=True, width=width)
    cases = make_cases(random.Random(3), inputs, 15, width)
    bench = Bench(dut, cases, width=width, source_gaps=False, sink_gaps=True)
    bench.run(20_000)
    order = [source for source, _ in bench.starts]
    assert order[:len(cases[0])] == [0] * len(cases[0]), order


@pytest.mark.parametrize("width", [8, 64])
def test_no_idle(width):
    """Sink always ready, inputs always valid: a beat leaves every cycle from the first
    to the last, with no idle cycle between packets."""
    inputs = 3
    dut = PacketArbiter(META, inputs=inputs, width=width)
    cases = make_cases(random.Random(f"idle{width}"), inputs, 20, width)
    bench = Bench(dut, cases, width=width, source_gaps=False, sink_gaps=False)
    bench.run(5_000)
    beats = sum(beats_for(len(payload), width) for packets in cases for payload in packets)
    assert len(bench.beats) == beats
    assert bench.beats[-1] - bench.beats[0] + 1 == beats


@pytest.mark.parametrize("priority", [False, True])
def test_hold_while_stalled(priority):
    """A first beat offered while the sink is not ready stays on the output until taken,
    even when an input the arbiter would prefer becomes valid meanwhile; that input is
    served next."""
    width = 8
    dut = PacketArbiter(META, inputs=2, priority=priority, width=width)
    held = {"data": 0x1122, "keep": 0x3, "last": 1, "meta": {"source": 1, "seq": 1}}
    later = {"data": 0x3344, "keep": 0xff, "last": 1, "meta": {"source": 0, "seq": 0}}

    async def testbench(ctx):
        if not priority:
            # Serve input 1 once, so that round-robin prefers input 0 from now on.
            ctx.set(dut.o.ready, 1)
            await put_packet(ctx, dut.i[1], b"", {"source": 1, "seq": 0}, width=width)
            ctx.set(dut.o.ready, 0)
        ctx.set(dut.i[1].valid, 1)
        ctx.set(dut.i[1].payload, held)
        await ctx.tick()
        offered = ctx.get(dut.o.payload)
        assert ctx.get(dut.o.valid) and offered.meta.source == 1
        ctx.set(dut.i[0].valid, 1)
        ctx.set(dut.i[0].payload, later)
        for _ in range(3):
            assert ctx.get(dut.o.valid), "valid fell before the beat was taken"
            assert ctx.get(dut.o.payload) == offered, "payload changed before it was taken"
            await ctx.tick()
        ctx.set(dut.o.ready, 1)
        assert ctx.get(dut.o.payload) == offered
        assert ctx.get(dut.i[1].ready) and not ctx.get(dut.i[0].ready)
        await ctx.tick()
        ctx.set(dut.i[1].valid, 0)
        assert ctx.get(dut.o.valid) and ctx.get(dut.o.payload.meta.source) == 0
        assert ctx.get(dut.i[0].ready) and not ctx.get(dut.i[1].ready)

    run_testbenches(dut, testbench)
