"""PacketFIFO against a list of packets: what goes in, what must come out, what must be dropped."""

import random

import pytest

from gateware.packet.fifo import PacketFIFO
from gateware.stream import NO_META, beats_for, meta_with

from .streams import get_packet, idle, run_testbenches, to_beats, wait_for

META = meta_with(NO_META, tag=16)


def lengths_for(width):
    """Packet lengths across the boundaries of the first four beats, and empty."""
    return sorted({0, 1} | {n for k in range(1, 5) for n in (k * width - 1, k * width,
                                                          k * width + 1)})


async def put_unready(ctx, dut, payload, tag, *, width, error=False, gaps=None, noise=None,
                      beats=None):
    """Drive one packet (``payload``, or raw ``(data, keep, last)`` ``beats``) into the
    always-ready input, never looking at ``ready``.

    Only the first beat carries ``tag``; later beats carry noise in ``meta``, as
    does ``i_error`` before the last beat. Returns ``(error_drop, overflow_drop)``
    as the FIFO shows them with the last beat.
    """
    noise = noise or random.Random(0)
    for index, (data, keep, last) in enumerate(beats or to_beats(payload, width)):
        await idle(ctx, gaps)
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.i.payload, {"data": data, "keep": keep, "last": last,
                                "meta": {"tag": tag if index == 0 else noise.getrandbits(16)}})
        ctx.set(dut.i_error, error if last else noise.getrandbits(1))
        if last:
            drops = ctx.get(dut.o_error_drop), ctx.get(dut.o_overflow_drop)
        await ctx.tick()
        ctx.set(dut.i.valid, 0)
        ctx.set(dut.i_error, 0)
    return drops


async def next_packet(ctx, stream, *, width, gaps=None):
    """``get_packet`` once ``stream`` offers a beat (so a sink left waiting when the
    run ends is idle, not inside ``get_packet``)."""
    while not ctx.get(stream.valid):
        await ctx.tick()
    return await get_packet(ctx, stream, width=width, gaps=gaps)


def beats_in(packets, width):
    return sum(beats_for(len(payload), width) for payload, _ in packets)


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


def count_pulses(dut, pulses):
    async def testbench(ctx):
        async for _, _, error, overflow in ctx.tick().sample(dut.o_error_drop,
                                                             dut.o_overflow_drop):
            pulses["error"] += error
            pulses["overflow"] += overflow
    return testbench


@pytest.mark.parametrize("depth, max_packets", [(8, 4), (4, 2)])
@pytest.mark.parametrize("width", [8, 64])
def test_random(width, depth, max_packets):
    """Lengths across beat boundaries, bad and oversized packets, a sink that stalls.

    A packet must pass when the beats and packets not yet read out leave room
    for it, must be dropped when it has ``i_error`` or more than ``depth``
    beats, and may be dropped for lack of room otherwise. Whatever passes
    comes out whole and in order, and each drop pulses once.
    """
    dut = PacketFIFO(META, depth=depth, max_packets=max_packets, width=width)
    rng = random.Random(f"{width}.{depth}.{max_packets}")
    lengths = lengths_for(width) * 2 + [rng.randrange(0, (depth + 2) * width) for _ in range(80)]
    cases = [(rng.randbytes(n), tag, rng.random() < 0.15) for tag, n in enumerate(lengths)]
    passed, received = [], []
    outcome = {"error": 0, "oversize": 0, "full": 0}
    pulses = {"error": 0, "overflow": 0}
    done = []

    async def source(ctx):
        gaps, noise = random.Random(1), random.Random(2)
        for payload, tag, error in cases:
            beats = beats_for(len(payload), width)
            fits = (beats_in(passed, width) - beats_in(received, width) + beats <= depth
                    and len(passed) - len(received) < max_packets)
            error_drop, overflow_drop = await put_unready(
                ctx, dut, payload, tag, width=width, error=error, gaps=gaps, noise=noise)
            assert not (error_drop and overflow_drop), f"packet {tag}: two drop pulses"
            if error:
                assert error_drop, f"packet {tag}: i_error but no o_error_drop"
                outcome["error"] += 1
            elif beats > depth:
                assert overflow_drop, f"packet {tag}: {beats} beats but no o_overflow_drop"
                outcome["oversize"] += 1
            else:
                assert not error_drop, f"packet {tag}: o_error_drop without i_error"
                if fits:
                    assert not overflow_drop, f"packet {tag}: dropped though it fits"
                if overflow_drop:
                    outcome["full"] += 1
                else:
                    passed.append((payload, tag))
        done.append(True)

    async def sink(ctx):
        gaps, stalls = random.Random(3), random.Random(4)
        while True:
            if stalls.random() < 0.2:
                await ctx.tick().repeat(stalls.randrange(1, 6 * depth))
            payload, meta = await next_packet(ctx, dut.o, width=width, gaps=gaps)
            received.append((payload, meta.tag))
            assert meta.length == len(payload), f"packet {meta.tag}: length {meta.length}"

    async def check(ctx):
        await wait_for(ctx, lambda: done and len(received) >= len(passed), 20_000)
        await ctx.tick().repeat(4 * depth)
        assert received == passed
        assert pulses == {"error": outcome["error"],
                          "overflow": outcome["oversize"] + outcome["full"]}
        assert all(outcome.values()), f"not every kind of drop happened: {outcome}"

    run_testbenches(dut, check, source, sink, count_pulses(dut, pulses),
                    whole_beats(dut.o))


@pytest.mark.parametrize("width", [8, 64])
def test_in_order(width):
    """No drops when the source leaves room: every packet comes out whole, in order,
    with its first beat's meta and its length."""
    depth = 16
    dut = PacketFIFO(META, depth=depth, width=width)
    rng = random.Random(f"order{width}")
    lengths = lengths_for(width) + [rng.randrange(0, 6 * width) for _ in range(30)]
    cases = [(rng.randbytes(n), tag) for tag, n in enumerate(lengths)]
    pulses = {"error": 0, "overflow": 0}
    received = []

    async def source(ctx):
        gaps = random.Random(5)
        for payload, tag in cases:
            while beats_in(cases[:tag], width) - beats_in(received, width) > depth - 6:
                await ctx.tick()
            assert await put_unready(ctx, dut, payload, tag, width=width, gaps=gaps) == (0, 0)

    async def sink(ctx):
        gaps = random.Random(6)
        while True:
            payload, meta = await next_packet(ctx, dut.o, width=width, gaps=gaps)
            received.append((payload, meta.tag))
            assert meta.length == len(payload), f"packet {meta.tag}: length {meta.length}"

    async def check(ctx):
        await wait_for(ctx, lambda: len(received) >= len(cases), 10_000)
        await ctx.tick().repeat(20)
        assert received == cases
        assert pulses == {"error": 0, "overflow": 0}

    run_testbenches(dut, check, source, sink, count_pulses(dut, pulses),
                    whole_beats(dut.o))


def test_overflow_and_limit():
    """Scripted, with the sink reading only when told: a full FIFO drops what does
    not fit and keeps what does; ``depth`` beats pass and ``depth + 1`` do not;
    with ``max_packets`` packets waiting the next one is dropped."""
    width, depth, max_packets = 8, 8, 4
    dut = PacketFIFO(META, depth=depth, max_packets=max_packets, width=width)
    rng = random.Random(7)
    script = [  # (beats, let the sink drain the FIFO first, passes)
        (3, False, True), (4, False, True),               # 7 of 8 beats used
        (2, False, False), (1, False, True),              # 2 do not fit, 1 does
        (1, False, False),                                # full
        (depth, True, True),
        (depth + 1, True, False),                         # too long even when empty
        (0, False, True),
        (1, True, True), (1, False, True), (1, False, True), (1, False, True),
        (1, False, False),                                # max_packets are waiting
        (2, True, True),
    ]
    cases = [(rng.randbytes(max(0, beats * width - rng.randrange(width))), drain, passes)
             for beats, drain, passes in script]
    expected = [(payload, tag) for tag, (payload, _, passes) in enumerate(cases) if passes]
    pulses = {"error": 0, "overflow": 0}
    received, allowed, sent = [], [0], []

    async def source(ctx):
        for tag, (payload, drain, passes) in enumerate(cases):
            if drain:
                allowed[0] = len(sent)
                await wait_for(ctx, lambda: len(received) == len(sent), 1000)
            drops = await put_unready(ctx, dut, payload, tag, width=width)
            assert drops == (0, not passes), f"packet {tag}"
            if passes:
                sent.append(tag)
        allowed[0] = len(sent)

    async def sink(ctx):
        while True:
            while len(received) >= allowed[0]:
                await ctx.tick()
            payload, meta = await next_packet(ctx, dut.o, width=width)
            received.append((payload, meta.tag))

    async def check(ctx):
        await wait_for(ctx, lambda: len(received) >= len(expected), 2000)
        await ctx.tick().repeat(20)
        assert received == expected
        assert pulses == {"error": 0, "overflow": 4}

    run_testbenches(dut, check, source, sink, count_pulses(dut, pulses),
                    whole_beats(dut.o))


def test_realigns_after_bad_keep():
    """A packet whose beats before the last are not full (against the stream's rule)
    comes out with the length of its whole beats and its last beat's bytes (here none and
    2), and the packets after it come out intact."""
    width = 8
    dut = PacketFIFO(META, depth=16, width=width)
    rng = random.Random(8)
    bad = [(rng.getrandbits(16), 0b11, False), (rng.getrandbits(16), 0b11, False),
           (rng.getrandbits(16), 0b11, True)]
    good = [rng.randbytes(n) for n in (1, width, 2 * width + 3)]
    received = []

    async def source(ctx):
        assert await put_unready(ctx, dut, b"", 0, width=width, beats=bad) == (0, 0)
        for tag, payload in enumerate(good, 1):
            assert await put_unready(ctx, dut, payload, tag, width=width) == (0, 0)

    async def sink(ctx):
        while True:
            payload, meta = await next_packet(ctx, dut.o, width=width)
            received.append((payload, meta.tag, meta.length))

    async def check(ctx):
        await wait_for(ctx, lambda: len(received) >= 1 + len(good), 200)
        await ctx.tick().repeat(20)
        assert [(tag, length) for _, tag, length in received[:1]] == [(0, 2)]
        assert received[1:] == [(payload, tag, len(payload)) for tag, payload in enumerate(good, 1)]

    run_testbenches(dut, check, source, sink, whole_beats(dut.o))


def test_two_packet_limit():
    """With ``max_packets=2`` two one-beat packets back to back both pass, a third
    right behind them (two still waiting) is dropped."""
    width = 8
    dut = PacketFIFO(META, depth=16, max_packets=2, width=width)
    received = []

    async def source(ctx):
        for tag, verdict in enumerate(((0, 0), (0, 0), (0, 1))):
            assert await put_unready(ctx, dut, bytes([tag]), tag, width=width) == verdict, tag

    async def sink(ctx):
        while True:
            payload, meta = await next_packet(ctx, dut.o, width=width)
            received.append((payload, meta.tag))

    async def check(ctx):
        await wait_for(ctx, lambda: len(received) >= 2, 50)
        await ctx.tick().repeat(20)
        assert received == [(b"\0", 0), (b"\1", 1)]

    run_testbenches(dut, check, source, sink)
