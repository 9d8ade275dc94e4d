# amaranth: UnusedElaboratable=no
"""Header inserter and extractor against ``struct``-packed headers."""

import random
import struct

import pytest
from amaranth.lib import data

from gateware.headers import ETHERNET, UDP, NetworkLayout
from gateware.packet.extract import HeaderExtractor
from gateware.packet.insert import HeaderInserter
from gateware.stream import NO_META, meta_with

from .streams import get_packet, put_packet, run_testbenches

# (layout, struct format, field names in wire order) -- the golden model.
GOLDEN = {
    "ethernet": (ETHERNET, "!6s6sH", ("dst", "src", "ethertype")),
    "udp": (UDP, "!HHHH", ("src_port", "dst_port", "length", "checksum")),
}


def random_fields(rng, name):
    layout, fmt, names = GOLDEN[name]
    values = {}
    for field, code in zip(names, struct.Struct(fmt).format[1:].replace("6s", "s"), strict=True):
        if code == "s":
            values[field] = rng.randbytes(6)
        else:
            values[field] = rng.getrandbits(16)
    return values


def as_meta_value(name, values):
    """The header as a constant of its layout, built from ``struct`` bytes read big-endian
    (the layout's stated meaning, not its own packing code)."""
    layout, fmt, names = GOLDEN[name]
    return data.Const(layout, int.from_bytes(struct.pack(fmt, *(values[n] for n in names)), "big"))


def lengths_for(width):
    """Payload lengths across every beat boundary of the first few beats, and empty."""
    return sorted({0, 1} | {n for k in range(1, 4) for n in (k * width - 1, k * width,
                                                          k * width + 1)})


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("name", ["ethernet", "udp"])
def test_inserter(width, name):
    layout = GOLDEN[name][0]
    meta = meta_with(NO_META, hdr=layout, tag=8)
    dut = HeaderInserter("hdr", layout, meta, width=width)
    rng = random.Random(f"{width}{name}")
    cases = [(n, random_fields(rng, name), rng.getrandbits(8)) for n in lengths_for(width)]
    cases += [(rng.randrange(0, 4 * width), random_fields(rng, name), rng.getrandbits(8))
              for _ in range(20)]

    async def source(ctx):
        gaps = random.Random(1)
        for length, values, tag in cases:
            payload = bytes(rng.getrandbits(8) for _ in range(length))
            expected.append((struct.pack(GOLDEN[name][1],
                                         *(values[n] for n in GOLDEN[name][2])) + payload, tag))
            await put_packet(ctx, dut.i, payload,
                             {"hdr": as_meta_value(name, values), "tag": tag},
                             width=width, gaps=gaps)

    async def sink(ctx):
        gaps = random.Random(2)
        for index in range(len(cases)):
            got, meta = await get_packet(ctx, dut.o, width=width, gaps=gaps)
            while len(expected) <= index:
                await ctx.tick()
            assert got == expected[index][0], f"packet {index}"
            assert meta.tag == expected[index][1]

    expected = []
    run_testbenches(dut, sink, source)


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("name", ["ethernet", "udp"])
def test_extractor(width, name):
    layout, fmt, names = GOLDEN[name]
    meta = meta_with(NO_META, tag=8)
    dut = HeaderExtractor("hdr", layout, meta, width=width)
    rng = random.Random(f"x{width}{name}")
    cases = []
    for length in lengths_for(width) + [rng.randrange(0, 4 * width) for _ in range(20)]:
        values = random_fields(rng, name)
        header = struct.pack(fmt, *(values[n] for n in names))
        cases.append((header + rng.randbytes(length), rng.getrandbits(8), values))
    # Packets that end inside the header are dropped; the next one still comes out.
    truncated = [(rng.randbytes(n), 0, None) for n in (0, 1, layout.length - 1)]
    stream_in = [cases[0], *truncated, *cases[1:]]
    flagged = []

    async def source(ctx):
        gaps = random.Random(3)
        for packet, tag, _ in stream_in:
            await put_packet(ctx, dut.i, packet, {"tag": tag}, width=width, gaps=gaps)

    async def count_truncated(ctx):
        async for _, _, truncated_flag in ctx.tick().sample(dut.o_truncated):
            if truncated_flag:
                flagged.append(1)

    async def sink(ctx):
        gaps = random.Random(4)
        for packet, tag, values in cases:
            got, got_meta = await get_packet(ctx, dut.o, width=width, gaps=gaps)
            assert got == packet[layout.length:]
            assert got_meta.tag == tag
            header = as_meta_value(name, values)
            for field in names:
                assert getattr(got_meta.hdr, field) == getattr(header, field), field
        assert len(flagged) == len(truncated)

    run_testbenches(dut, sink, source, count_truncated)


@pytest.mark.parametrize("width,lengths", [(8, (2, 5, 7)), (64, (12, 16, 28, 32))])
def test_inserter_variable_length(width, lengths):
    """Only the first ``hdr_length`` bytes of the header go out, per packet."""
    layout = NetworkLayout({"bytes": 8 * max(lengths)})
    meta = meta_with(NO_META, hdr=layout, hdr_length=6, tag=8)
    dut = HeaderInserter("hdr", layout, meta, width=width, lengths=lengths)
    rng = random.Random(width)
    cases = [(rng.randbytes(max(lengths)), rng.choice(lengths), rng.randbytes(n))
             for n in lengths_for(width) + [rng.randrange(0, 4 * width) for _ in range(30)]]

    async def source(ctx):
        gaps = random.Random(5)
        for tag, (header, length, payload) in enumerate(cases):
            meta = {"hdr": data.Const(layout, int.from_bytes(header, "big")),
                    "hdr_length": length, "tag": tag}
            await put_packet(ctx, dut.i, payload, meta, width=width, gaps=gaps)

    async def sink(ctx):
        gaps = random.Random(6)
        for tag, (header, length, payload) in enumerate(cases):
            got, meta = await get_packet(ctx, dut.o, width=width, gaps=gaps)
            assert got == header[:length] + payload, f"packet {tag}"
            assert meta.tag == tag

    run_testbenches(dut, sink, source)


def test_inserter_rejects_bad_lengths():
    layout = NetworkLayout({"bytes": 64})
    meta = meta_with(NO_META, hdr=layout, hdr_length=6)
    with pytest.raises(ValueError, match="lengths"):
        HeaderInserter("hdr", layout, meta, width=8, lengths=(4, 8))
    with pytest.raises(ValueError, match="hdr_length"):
        HeaderInserter("hdr", layout, meta_with(NO_META, hdr=layout), width=8, lengths=(4,))
