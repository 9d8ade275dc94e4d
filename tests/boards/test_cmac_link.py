# amaranth: UnusedElaboratable=no
"""CmacLink: the bring-up sequence (RX on, RFI until aligned, then TX on) and frames passed
whole while the link is up, dropped whole and counted while it is down."""

import random

from boards.cmac_link import CmacLink
from tests.gateware.streams import (
    get_packet,
    held_while_stalled,
    put_packet,
    run_testbenches,
    to_beats,
    wait_for,
)

WIDTH = 8


def controls(ctx, dut):
    return (ctx.get(dut.o_rx_enable), ctx.get(dut.o_tx_send_rfi), ctx.get(dut.o_tx_enable))


def test_bring_up_and_loss_of_alignment():
    """RX enabled throughout; RFI and no TX until aligned; TX and no RFI a cycle after;
    back when alignment goes."""
    dut = CmacLink(width=WIDTH)

    async def testbench(ctx):
        for _ in range(5):
            assert controls(ctx, dut) == (1, 1, 0)
            await ctx.tick()
        ctx.set(dut.i_rx_aligned, 1)
        assert controls(ctx, dut) == (1, 1, 0)
        await ctx.tick()
        assert controls(ctx, dut) == (1, 0, 1)
        assert ctx.get(dut.o_up)
        ctx.set(dut.i_rx_aligned, 0)
        await ctx.tick()
        assert controls(ctx, dut) == (1, 1, 0)

    run_testbenches(dut, testbench)


def test_frames_pass_only_while_up():
    """Frames offered while down are dropped and counted, never offered to the CMAC; while
    up they pass unchanged; a frame under way when alignment goes is finished, and the one
    after it is dropped; a beat offered to a stalled CMAC stays offered."""
    dut = CmacLink(width=WIDTH)
    rng = random.Random("cmac-link")
    frames = [rng.randbytes(rng.randrange(1, 6 * WIDTH)) for _ in range(12)]
    long_frame = rng.randbytes(20 * WIDTH)
    received = []

    async def source(ctx):
        for frame in frames[:3]:                 # down: dropped
            await put_packet(ctx, dut.i, frame, {}, width=WIDTH)
        assert ctx.get(dut.o_dropped) == 3
        ctx.set(dut.i_rx_aligned, 1)
        await ctx.tick()
        for frame in frames[3:9]:                # up: passed
            await put_packet(ctx, dut.i, frame, {}, width=WIDTH, gaps=random.Random(1))
        ctx.set(dut.i.valid, 1)                  # alignment lost inside a frame
        for index, (beat_data, keep, last) in enumerate(to_beats(long_frame, WIDTH)):
            ctx.set(dut.i.payload, {"data": beat_data, "keep": keep, "last": last})
            await ctx.tick().until(dut.i.ready)
            if index == 5:
                ctx.set(dut.i_rx_aligned, 0)
        ctx.set(dut.i.valid, 0)
        for frame in frames[9:]:                 # down again: dropped
            await put_packet(ctx, dut.i, frame, {}, width=WIDTH)

    async def sink(ctx):
        while True:
            received.append((await get_packet(ctx, dut.o, width=WIDTH,
                                              gaps=random.Random(2)))[0])

    async def check(ctx):
        await wait_for(ctx, lambda: ctx.get(dut.o_dropped) == 6, 4000)
        await ctx.tick().repeat(10)
        assert received == frames[3:9] + [long_frame]

    async def never_offered_while_down(ctx):
        async for _, _, valid, dropped in ctx.tick().sample(dut.o.valid, dut.o_dropped):
            if dropped < 3:
                assert not valid, "a frame went to the CMAC before the link was up"

    run_testbenches(dut, check, source, sink, held_while_stalled(dut.o), never_offered_while_down)
