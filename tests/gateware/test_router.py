"""PacketRouter: packets go to the output their verdict names, or are dropped and counted."""

import random

import pytest

from gateware.packet.router import PacketRouter
from gateware.stream import NO_META, meta_with

from .streams import get_packet, idle, run_testbenches, to_beats, wait_for

META = meta_with(NO_META, tag=16, kind=8)
OUTPUTS = 3
REASONS = ("bad_checksum", "unknown_port")


def verdict(kind):
    """The golden model's routing rule: ``(output, None)`` or ``(None, reason)``."""
    choice = kind % (OUTPUTS + len(REASONS))
    return (choice, None) if choice < OUTPUTS else (None, REASONS[choice - OUTPUTS])


def lengths_for(width):
    """Packet lengths across the boundaries of the first three beats, and empty."""
    return sorted({0, 1} | {n for k in range(1, 4) for n in (k * width - 1, k * width,
                                                          k * width + 1)})


async def put_routed(ctx, dut, payload, meta, route, drop, *, width, gaps, noise):
    """Drive one packet with its verdict on ``i_route``/``i_drop`` during the first
    beat only; later beats carry noise there."""
    for index, (data, keep, last) in enumerate(to_beats(payload, width)):
        await idle(ctx, gaps)
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.i.payload, {"data": data, "keep": keep, "last": last, "meta": meta})
        if index == 0:
            ctx.set(dut.i_route, route)
            ctx.set(dut.i_drop, drop)
        else:
            ctx.set(dut.i_route, noise.randrange(OUTPUTS))
            ctx.set(dut.i_drop, noise.randrange(len(REASONS) + 1))
        await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)


@pytest.mark.parametrize("registered", [False, True])
@pytest.mark.parametrize("width", [8, 64])
def test_route(width, registered):
    """Each output gets exactly its packets, in order; each reason counts its drops (also
    with the router's input register slice)."""
    dut = PacketRouter(META, outputs=OUTPUTS, drop_reasons=REASONS, width=width,
                       registered=registered)
    rng = random.Random(f"route{width}")
    lengths = [n for n in lengths_for(width) for _ in range(OUTPUTS + len(REASONS))]
    lengths += [rng.randrange(0, 4 * width) for _ in range(60)]
    cases = [(rng.randbytes(n), tag, rng.getrandbits(8)) for tag, n in enumerate(lengths)]
    expected = [[] for _ in range(OUTPUTS)]
    dropped = dict.fromkeys(REASONS, 0)
    for payload, tag, kind in cases:
        output, reason = verdict(kind)
        if reason is None:
            expected[output].append((payload, tag, kind))
        else:
            dropped[reason] += 1
    received = [[] for _ in range(OUTPUTS)]
    done = []

    async def source(ctx):
        gaps, noise = random.Random(1), random.Random(2)
        for payload, tag, kind in cases:
            output, reason = verdict(kind)
            drop = 0 if reason is None else dut.drop_code(reason)
            await put_routed(ctx, dut, payload, {"tag": tag, "kind": kind},
                             output if reason is None else noise.randrange(OUTPUTS), drop,
                             width=width, gaps=gaps, noise=noise)
        done.append(True)

    def sink(index):
        async def testbench(ctx):
            gaps = random.Random(10 + index)
            for _ in expected[index]:
                payload, meta = await get_packet(ctx, dut.o[index], width=width, gaps=gaps)
                received[index].append((payload, meta.tag, meta.kind))
        return testbench

    async def check(ctx):
        await wait_for(ctx, lambda: done and list(map(len, received)) == list(map(len, expected)),
                       20_000)
        for _ in range(20):
            await ctx.tick()
            assert not any(ctx.get(port.valid) for port in dut.o), "more packets than sent"
        for index in range(OUTPUTS):
            assert received[index] == expected[index], f"output {index}"
        assert {reason: ctx.get(dut.o_drops[reason]) for reason in REASONS} == dropped
        assert all(dropped.values()) and all(expected)

    run_testbenches(dut, check, source, *(sink(index) for index in range(OUTPUTS)))


@pytest.mark.parametrize("registered", [False, True])
def test_drops_while_outputs_stall(registered):
    """A dropped packet is taken a beat a cycle and reaches no output, even while every
    output stalls."""
    width = 8
    dut = PacketRouter(META, outputs=OUTPUTS, drop_reasons=REASONS, width=width,
                       registered=registered)
    cycles = {"valid": 0, "taken": 0, "offered": 0}

    async def monitor(ctx):
        async for _, _, valid, ready, *offered in ctx.tick().sample(
                dut.i.valid, dut.i.ready, *(port.valid for port in dut.o)):
            cycles["valid"] += valid
            cycles["taken"] += valid & ready
            cycles["offered"] += any(offered)

    async def check(ctx):
        noise = random.Random(3)
        for reason in REASONS:
            for length in (0, 1, width, 3 * width + 1):
                await put_routed(ctx, dut, bytes(length), {"tag": 0, "kind": 0}, 0,
                                 dut.drop_code(reason), width=width, gaps=None, noise=noise)
        await ctx.tick()
        beats = len(REASONS) * (1 + 1 + 1 + 4)
        assert cycles == {"valid": beats, "taken": beats, "offered": 0}
        assert {reason: ctx.get(dut.o_drops[reason]) for reason in REASONS} == \
            dict.fromkeys(REASONS, 4)

    run_testbenches(dut, check, monitor)
