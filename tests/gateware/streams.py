"""Putting and getting whole packets on packet streams in Amaranth's simulator.

Every unit test of a stream block goes through these helpers, so the
handshake rules (payload held while valid and not ready; a beat moves on a
clock edge where both are high) are written once.
"""

import random

from amaranth.sim import Simulator

__all__ = ["put_packet", "get_packet", "run_testbenches", "to_beats", "idle", "wait_for"]


def to_beats(payload, width):
    """Split bytes into ``(data, keep, last)`` beats; lane 0 is the first byte."""
    chunks = [payload[offset:offset + width] for offset in range(0, len(payload), width)] or [b""]
    return [(int.from_bytes(chunk, "little"), (1 << len(chunk)) - 1, index == len(chunks) - 1)
            for index, chunk in enumerate(chunks)]


async def idle(ctx, gaps):
    """Idle a random number of cycles when ``gaps`` is a Random (none when it is None)."""
    while gaps is not None and gaps.random() < 0.3:
        await ctx.tick()


async def wait_for(ctx, condition, cycles):
    """Tick until ``condition()`` holds; fail after ``cycles``."""
    for _ in range(cycles):
        if condition():
            return
        await ctx.tick()
    raise AssertionError(f"still waiting after {cycles} cycles")


async def put_packet(ctx, stream, payload, meta=0, *, width, gaps=None):
    """Drive one packet into ``stream``, idling at random when ``gaps`` is a Random."""
    for data, keep, last in to_beats(payload, width):
        await idle(ctx, gaps)
        ctx.set(stream.valid, 1)
        ctx.set(stream.payload, {"data": data, "keep": keep, "last": last, "meta": meta})
        await ctx.tick().until(stream.ready)
        ctx.set(stream.valid, 0)


async def get_packet(ctx, stream, *, width, gaps=None):
    """Receive one packet from ``stream``; returns ``(bytes, meta of the first beat)``.

    Checks the beat rules on the way: ``keep`` contiguous, full on every beat
    but the last.
    """
    payload, meta = b"", None
    while True:
        await idle(ctx, gaps)
        ctx.set(stream.ready, 1)
        beat, = await ctx.tick().sample(stream.payload).until(stream.valid)
        ctx.set(stream.ready, 0)
        keep = int(beat.keep)
        count = bin(keep).count("1")
        assert keep == (1 << count) - 1, f"keep {keep:#x} is not contiguous"
        if meta is None:
            meta = beat.meta
        if not beat.last:
            assert count == width, f"keep {keep:#x} is not full on a beat before the last"
        payload += int(beat.data).to_bytes(width, "little")[:count]
        if beat.last:
            return payload, meta


def run_testbenches(dut, *testbenches, vcd=None, deadline=None):
    """Run async testbenches on ``dut`` with a 1 ns clock; the first one ends the run."""
    sim = Simulator(dut)
    sim.add_clock(1e-9)
    for testbench in testbenches[1:]:
        sim.add_testbench(testbench, background=True)
    sim.add_testbench(testbenches[0])
    if vcd:
        with sim.write_vcd(vcd):
            sim.run_until(deadline) if deadline else sim.run()
    else:
        sim.run()


def seeded(seed):
    return random.Random(seed)
