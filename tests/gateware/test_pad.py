"""PacketPad against ``bytes.ljust``: short packets padded with zeros, the rest unchanged."""

import random

import pytest

from gateware.packet.pad import PacketPad
from gateware.stream import NO_META, meta_with

from .streams import get_packet, idle, run_testbenches, to_beats, wait_for

META = meta_with(NO_META, tag=16)


def lengths_for(width):
    """Packet lengths across the boundaries of the first three beats, and empty."""
    return sorted({0, 1} | {n for k in range(1, 4) for n in (k * width - 1, k * width,
                                                          k * width + 1)})


async def put_dirty(ctx, stream, payload, tag, *, width, gaps, noise):
    """Drive one packet whose byte lanes past ``keep`` hold noise, not zeros."""
    for data, keep, last in to_beats(payload, width):
        await idle(ctx, gaps)
        lanes = bin(keep).count("1")
        data |= noise.getrandbits(8 * (width - lanes)) << (8 * lanes)
        ctx.set(stream.valid, 1)
        ctx.set(stream.payload, {"data": data, "keep": keep, "last": last, "meta": {"tag": tag}})
        await ctx.tick().until(stream.ready)
        ctx.set(stream.valid, 0)


@pytest.mark.parametrize("width, minimum", [(8, 0), (8, 1), (8, 5), (8, 8), (64, 60), (64, 64)])
def test_pad(width, minimum):
    """Every length around ``minimum`` and the beat boundaries, with noise in unused lanes."""
    dut = PacketPad(META, minimum=minimum, width=width)
    rng = random.Random(f"pad{width}.{minimum}")
    sizes = set(lengths_for(width)) | {n for n in (minimum - 1, minimum, minimum + 1) if n >= 0}
    sizes |= {rng.randrange(0, 3 * width) for _ in range(10)}
    cases = [rng.randbytes(size) for size in sorted(sizes) for _ in range(2)]
    rng.shuffle(cases)
    received = []

    async def source(ctx):
        gaps, noise = random.Random(1), random.Random(2)
        for tag, payload in enumerate(cases):
            await put_dirty(ctx, dut.i, payload, tag, width=width, gaps=gaps, noise=noise)

    async def sink(ctx):
        gaps = random.Random(3)
        for tag, payload in enumerate(cases):
            got, meta = await get_packet(ctx, dut.o, width=width, gaps=gaps)
            assert (got, meta.tag) == (payload.ljust(minimum, b"\0"), tag), \
                f"packet {tag} of {len(payload)} bytes"
            received.append(tag)

    async def check(ctx):
        await wait_for(ctx, lambda: len(received) == len(cases), 20_000)
        for _ in range(20):
            await ctx.tick()
            assert not ctx.get(dut.o.valid), "more packets than were sent"

    run_testbenches(dut, check, sink, source)

