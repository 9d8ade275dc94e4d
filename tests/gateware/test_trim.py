"""PacketTrim against slicing: each packet comes out as ``payload[:length]``."""

import random

import pytest

from gateware.packet.trim import PacketTrim
from gateware.stream import NO_META, meta_with

from .streams import get_packet, idle, run_testbenches, to_beats, wait_for

META = meta_with(NO_META, tag=16)


def lengths_for(width):
    """Packet lengths across the boundaries of the first three beats, and empty."""
    return sorted({0, 1} | {n for k in range(1, 4) for n in (k * width - 1, k * width,
                                                          k * width + 1)})


async def put_with_length(ctx, dut, payload, tag, length, *, width, gaps, noise):
    """Drive one packet with ``length`` on ``i_length`` during its first beat only;
    later beats carry noise there."""
    for index, (data, keep, last) in enumerate(to_beats(payload, width)):
        await idle(ctx, gaps)
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.i.payload, {"data": data, "keep": keep, "last": last, "meta": {"tag": tag}})
        ctx.set(dut.i_length, length if index == 0 else noise.getrandbits(16))
        await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)


def whole_beats(stream):
    """A testbench failing on an empty beat anywhere but as a zero-byte packet's only beat."""
    async def testbench(ctx):
        first = True
        async for _, _, valid, ready, beat in ctx.tick().sample(stream.valid, stream.ready,
                                                               stream.payload):
            if valid and ready:
                assert beat.keep or (first and beat.last), "empty beat inside a packet"
                first = bool(beat.last)
    return testbench


@pytest.mark.parametrize("width", [8, 64])
def test_trim(width):
    """Lengths across beat boundaries, cut before, at and after every one of them;
    the bytes past the cut vanish and the next packet is intact."""
    dut = PacketTrim(META, width=width)
    rng = random.Random(f"trim{width}")
    cases = []
    for size in lengths_for(width) + [rng.randrange(0, 4 * width) for _ in range(20)]:
        cuts = {0, 1, size - 1, size, size + 1, size + width, rng.randrange(0, size + 2)}
        cuts |= {n for n in lengths_for(width) if n < size}
        cases += [(rng.randbytes(size), cut) for cut in sorted(cuts) if cut >= 0]
    rng.shuffle(cases)
    received = []

    async def source(ctx):
        gaps, noise = random.Random(1), random.Random(2)
        for tag, (payload, cut) in enumerate(cases):
            await put_with_length(ctx, dut, payload, tag, cut, width=width, gaps=gaps,
                                  noise=noise)

    async def sink(ctx):
        gaps = random.Random(3)
        for tag, (payload, cut) in enumerate(cases):
            got, meta = await get_packet(ctx, dut.o, width=width, gaps=gaps)
            assert (got, meta.tag) == (payload[:cut], tag), \
                f"packet {tag}: {len(payload)} bytes cut to {cut}, got {len(got)}"
            received.append(tag)

    async def check(ctx):
        await wait_for(ctx, lambda: len(received) == len(cases), 20_000)
        for _ in range(20):
            await ctx.tick()
            assert not ctx.get(dut.o.valid), "more packets than were sent"

    run_testbenches(dut, check, sink, source, whole_beats(dut.o))


def test_discard_while_sink_stalls():
    """The bytes past the length are taken a beat a cycle even while the sink stalls."""
    width, beats = 8, 6
    dut = PacketTrim(META, width=width)
    payload = bytes(range(beats * width))
    taken, sent = [], []

    async def monitor(ctx):
        async for _, _, valid, ready in ctx.tick().sample(dut.i.valid, dut.i.ready):
            taken.append(valid and ready)

    async def source(ctx):
        ctx.set(dut.o.ready, 1)
        await put_with_length(ctx, dut, payload, 0, 1, width=width, gaps=None,
                              noise=random.Random(4))
        sent.append(True)

    async def check(ctx):
        await wait_for(ctx, lambda: sent, 4 * beats)
        await ctx.tick()
        assert taken[:beats] == [True] * beats and sum(taken) == beats
        assert not ctx.get(dut.o.valid)

    async def stall(ctx):
        async for _, _, valid in ctx.tick().sample(dut.o.valid):
            if valid:
                ctx.set(dut.o.ready, 0)

    run_testbenches(dut, check, source, monitor, stall)
