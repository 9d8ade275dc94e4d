# amaranth: UnusedElaboratable=no
"""StreamRegister and PacketRegister: payloads (packets) unchanged through a registered
slice, at one per cycle, with no combinational path across it."""

import random

import pytest
from amaranth.lib import data, stream

from gateware.packet.register import PacketRegister, StreamRegister
from gateware.stream import NO_META, beats_for, meta_with

from .streams import (
    check_tagged_packets,
    put_item,
    put_packet,
    run_testbenches,
    wait_for,
)

META = meta_with(NO_META, tag=16)


def lengths_for(width):
    """Packet lengths across the boundaries of the first three beats, and empty."""
    return sorted({0, 1} | {n for k in range(1, 4) for n in (k * width - 1, k * width,
                                                          k * width + 1)})


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("source_gaps, sink_gaps", [(True, True), (False, True), (True, False)])
def test_random(width, source_gaps, sink_gaps):
    """Random gaps in valid and ready: every packet comes out whole, unchanged and in order,
    with its meta; the output holds each beat until it is taken."""
    dut = PacketRegister(META, width=width)
    rng = random.Random(f"register{width}")
    payloads = [rng.randbytes(length) for length in lengths_for(width) for _ in range(3)]
    rng.shuffle(payloads)
    check_tagged_packets(dut, payloads, width=width, source_gaps=source_gaps,
                         sink_gaps=sink_gaps, cycles=20_000)


@pytest.mark.parametrize("width", [8, 64])
def test_throughput(width):
    """Source always valid, sink always ready: ``i.ready`` never falls, a beat leaves every
    cycle from the first to the last, and each leaves one cycle after it was taken."""
    dut = PacketRegister(META, width=width)
    rng = random.Random(f"throughput{width}")
    payloads = [rng.randbytes(length) for length in lengths_for(width)]
    total = sum(beats_for(len(payload), width) for payload in payloads)
    taken, given = [], []

    async def source(ctx):
        for tag, payload in enumerate(payloads):
            await put_packet(ctx, dut.i, payload, {"tag": tag}, width=width)

    async def monitor(ctx):
        cycle = 0
        async for _, _, i_valid, i_ready, o_valid, o_ready in ctx.tick().sample(
                dut.i.valid, dut.i.ready, dut.o.valid, dut.o.ready):
            assert i_ready, f"cycle {cycle}: i.ready fell with the sink always ready"
            if i_valid and i_ready:
                taken.append(cycle)
            if o_valid and o_ready:
                given.append(cycle)
            cycle += 1

    async def check(ctx):
        ctx.set(dut.o.ready, 1)
        await wait_for(ctx, lambda: len(given) == total, 1_000)

    run_testbenches(dut, check, source, monitor)
    assert given == [cycle + 1 for cycle in taken]
    assert given == list(range(given[0], given[0] + total))


#: A payload that is not a packet beat: a struct with a sub-byte field.
RECORD = data.StructLayout({"qp": 8, "length": 32, "flag": 1})


def packet_case(width):
    def random_beat(rng):
        return {"data": rng.getrandbits(8 * width), "keep": rng.getrandbits(width),
                "last": rng.getrandbits(1), "meta": {"tag": rng.getrandbits(16)}}
    return PacketRegister(META, width=width), random_beat


def record_case():
    def random_record(rng):
        return {"qp": rng.getrandbits(8), "length": rng.getrandbits(32),
                "flag": rng.getrandbits(1)}
    return StreamRegister(stream.Signature(RECORD)), random_record


def plain_case():
    return StreamRegister(stream.Signature(13)), lambda rng: rng.getrandbits(13)


@pytest.mark.parametrize("case", ["packet8", "packet64", "record", "plain"])
def test_no_combinational_path(case):
    """In every state the random traffic reaches, ``i.ready`` and all of ``o`` but its ready
    are the same whatever ``o.ready`` and ``i`` are in that cycle: they come from registers.
    Payloads pass in order against a queue (the model), at most two inside."""
    dut, random_payload = {"packet8": lambda: packet_case(8), "packet64": lambda: packet_case(64),
                           "record": record_case, "plain": plain_case}[case]()
    rng = random.Random(f"paths{case}")
    cycles = 2_000

    async def testbench(ctx):
        pending, sent, received, ready_low = None, [], [], 0
        for _ in range(cycles):
            outputs = []
            for o_ready, i_valid in ((0, 0), (1, 1), (1, 0), (0, 1)):
                ctx.set(dut.o.ready, o_ready)
                ctx.set(dut.i.valid, i_valid)
                ctx.set(dut.i.payload, random_payload(rng))
                outputs.append((ctx.get(dut.i.ready), ctx.get(dut.o.valid),
                                ctx.get(dut.o.payload)))
            assert all(output == outputs[0] for output in outputs), \
                "i.ready or o followed o.ready or i within the cycle"
            i_ready, o_valid, o_payload = outputs[0]
            ready_low += not i_ready

            if pending is None and rng.random() < 0.6:
                pending = random_payload(rng)
            o_ready = rng.random() < 0.5
            ctx.set(dut.i.valid, pending is not None)
            if pending is not None:
                ctx.set(dut.i.payload, pending)
            ctx.set(dut.o.ready, o_ready)
            if pending is not None and i_ready:
                sent.append(ctx.get(dut.i.payload))
                pending = None
            if o_valid and o_ready:
                received.append(o_payload)
            await ctx.tick()
        assert received == sent[:len(received)]
        assert len(sent) - len(received) <= 2, "more than two payloads inside"
        assert len(received) > cycles // 3 and ready_low > cycles // 20, "traffic too light"

    run_testbenches(dut, testbench)


def test_stream_throughput():
    """A plain stream, source always valid and sink always ready: ``i.ready`` never falls
    and each payload leaves one cycle after it was taken, one per cycle."""
    dut = StreamRegister(stream.Signature(RECORD))
    records = [{"qp": n, "length": 1000 * n, "flag": n & 1} for n in range(40)]
    taken, given = [], []

    async def source(ctx):
        for record in records:
            await put_item(ctx, dut.i, record)

    async def monitor(ctx):
        cycle = 0
        async for _, _, i_valid, i_ready, o_valid, o_ready, o_payload in ctx.tick().sample(
                dut.i.valid, dut.i.ready, dut.o.valid, dut.o.ready, dut.o.payload):
            assert i_ready, f"cycle {cycle}: i.ready fell with the sink always ready"
            if i_valid and i_ready:
                taken.append(cycle)
            if o_valid and o_ready:
                given.append((cycle, o_payload.qp, o_payload.length, o_payload.flag))
            cycle += 1

    async def check(ctx):
        ctx.set(dut.o.ready, 1)
        await wait_for(ctx, lambda: len(given) == len(records), 1_000)

    run_testbenches(dut, check, source, monitor)
    assert [cycle for cycle, *_ in given] == [cycle + 1 for cycle in taken]
    assert [cycle for cycle, *_ in given] == list(range(given[0][0], given[0][0] + len(records)))
    assert [tuple(rest) for _, *rest in given] == [(r["qp"], r["length"], r["flag"])
                                                   for r in records]


def test_arguments():
    with pytest.raises(ValueError, match="width"):
        PacketRegister(META, width=0)
    with pytest.raises(TypeError, match="meta"):
        PacketRegister(16)
    with pytest.raises(TypeError, match="stream.Signature"):
        StreamRegister(RECORD)
    with pytest.raises(ValueError, match="always_ready"):
        StreamRegister(stream.Signature(RECORD, always_ready=True))
