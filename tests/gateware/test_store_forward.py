# amaranth: UnusedElaboratable=no
"""PacketStoreForward: packets unchanged and in order; none starts before all of it is in,
so none pauses inside; packets longer than the buffer still pass."""

import random

import pytest

from gateware.packet.store_forward import PacketStoreForward
from gateware.stream import NO_META, beats_for, meta_with

from .streams import check_tagged_packets, run_testbenches, to_beats

META = meta_with(NO_META, tag=16)
DEPTH = 8


def no_gap_inside_packets(stream, width, lengths):
    """A testbench that fails when ``valid`` falls inside a packet that fits the buffer
    (the sink is always ready in the tests that use it)."""
    async def testbench(ctx):
        packet, beats = 0, 0
        async for _, _, valid, ready, beat in ctx.tick().sample(stream.valid, stream.ready,
                                                               stream.payload):
            if packet >= len(lengths):
                return
            if beats and beats_for(lengths[packet], width) <= DEPTH:
                assert valid, f"packet {packet} paused after {beats} beats"
            if valid and ready:
                beats += 1
                if beat.last:
                    packet, beats = packet + 1, 0
    return testbench


def lengths_for(width):
    """Across the first beat boundaries, the buffer's size and beyond it."""
    return sorted({0, 1, width - 1, width, width + 1, 3 * width + 1,
                   DEPTH * width - 1, DEPTH * width, DEPTH * width + 1, 2 * DEPTH * width})


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("source_gaps, sink_gaps", [(True, False), (True, True), (False, True)])
def test_random(width, source_gaps, sink_gaps):
    """Random gaps in valid and ready: every packet comes out whole, unchanged and in order
    with its meta, each beat held until taken; with the sink always ready, no packet that
    fits the buffer pauses, however its input came."""
    dut = PacketStoreForward(META, depth=DEPTH, width=width)
    rng = random.Random(f"store-forward{width}")
    payloads = [rng.randbytes(length) for length in lengths_for(width) for _ in range(2)]
    rng.shuffle(payloads)
    extra = [] if sink_gaps else [no_gap_inside_packets(dut.o, width, [len(p) for p in payloads])]
    check_tagged_packets(dut, payloads, width=width, source_gaps=source_gaps,
                         sink_gaps=sink_gaps, cycles=40 * len(payloads) * DEPTH, extra=extra)


def test_waits_for_the_whole_packet():
    """The first beat is offered in the cycle after the edge that took the last one in, and
    not before."""
    width = 8
    dut = PacketStoreForward(depth=DEPTH, width=width)
    payload = bytes(range(4 * width))

    async def testbench(ctx):
        ctx.set(dut.o.ready, 1)
        for beat_data, keep, last in to_beats(payload, width):
            assert not ctx.get(dut.o.valid), "a beat left before the packet was whole"
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload, {"data": beat_data, "keep": keep, "last": last})
            await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)
        assert ctx.get(dut.o.valid), "the whole packet is in, and not offered"

    run_testbenches(dut, testbench)


def test_rejects_a_bad_depth():
    with pytest.raises(ValueError, match="Depth must be"):
        PacketStoreForward(depth=1)
