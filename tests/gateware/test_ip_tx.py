# amaranth: UnusedElaboratable=no
"""IPv4Transmitter on its own: every packet leaves with the IPv4 header Scapy builds for it
(checksum, length, identification counting packets, our address as source, also after it
changes), with random gaps on both sides; and the one's-complement helpers against their
arithmetic definition."""

import ipaddress
import random

import pytest
from amaranth import Module, Signal
from amaranth.sim import Simulator
from scapy.layers.inet import IP

from gateware.config import config_value
from gateware.ip.checksum import folds_to_ones, ones_complement_add, ones_complement_fold, word_sum
from gateware.ip.tx import IPv4Transmitter

from .streams import get_packet, held_while_stalled, put_packet, run_testbenches, wait_for

ADDRESSES = ["10.77.0.2", "192.168.255.254"]


def config(ip):
    return config_value(mac="02:00:00:00:00:02", ip=ip, netmask="255.255.255.0",
                        gateway="0.0.0.0")


@pytest.mark.parametrize("width,gaps", [(16, True), (64, False), (64, True)])
def test_each_header_is_the_one_scapy_builds(width, gaps):
    dut = IPv4Transmitter(width=width)
    rng = random.Random(f"iptx{width}{gaps}")
    # Packets of all kinds of length (a header longer than a beat, and shorter), the last
    # third sent after our address changed; all-ones words make the sum carry.
    packets = []
    for index in range(48):
        payload = rng.randbytes(rng.choice([0, 1, 15, 16, 17, 44, 64, 65, 200, 1480]))
        packets.append({
            "src": ADDRESSES[index >= 32],
            "dst": rng.choice(["255.255.255.255", "10.77.0.1",
                               str(ipaddress.IPv4Address(rng.getrandbits(32)))]),
            "proto": rng.choice([1, 17, 255]),
            "tos": rng.choice([0, 2, 0xFF, rng.getrandbits(8)]),
            "payload": payload,
        })
    expected = [bytes(IP(src=packet["src"], dst=packet["dst"], id=index & 0xFFFF,
                         flags="DF", ttl=64, proto=packet["proto"], tos=packet["tos"])
                      / packet["payload"])
                for index, packet in enumerate(packets)]
    received = []

    async def source(ctx):
        source_gaps = random.Random(1) if gaps else None
        for index, packet in enumerate(packets):
            if index in (0, 32):        # a new address holds for packets a cycle later
                ctx.set(dut.i_config, config(packet["src"]))
                await ctx.tick()
            meta = {"dst_ip": int(ipaddress.IPv4Address(packet["dst"])),
                    "protocol": packet["proto"], "length": len(packet["payload"]),
                    "tos": packet["tos"]}
            await put_packet(ctx, dut.i, packet["payload"], meta, width=width,
                             gaps=source_gaps)

    async def sink(ctx):
        sink_gaps = random.Random(2) if gaps else None
        while True:
            payload, meta = await get_packet(ctx, dut.o, width=width, gaps=sink_gaps)
            received.append((payload, str(ipaddress.IPv4Address(int(meta.dst_ip)))))

    async def check(ctx):
        await wait_for(ctx, lambda: len(received) == len(packets), 40_000)
        await ctx.tick().repeat(20)
        assert len(received) == len(packets), "more packets than were sent"
        for index, ((payload, dst), want) in enumerate(zip(received, expected, strict=True)):
            assert payload == want, (
                f"packet {index}: {IP(payload).show2(dump=True)} != {IP(want).show2(dump=True)}")
            assert dst == packets[index]["dst"]

    run_testbenches(dut, check, source, sink, held_while_stalled(dut.o))


def _sums(widths, cases):
    """Run ``ones_complement_add`` and ``ones_complement_fold`` on ``cases``, in simulation."""
    m = Module()
    a, b = Signal(widths[0]), Signal(widths[1])
    total = Signal(20)
    add, fold = Signal(16), Signal(16)
    m.d.comb += [add.eq(ones_complement_add(a, b)), fold.eq(ones_complement_fold(total))]
    results = []

    async def testbench(ctx):
        for x, y, t in cases:
            ctx.set(a, x)
            ctx.set(b, y)
            ctx.set(total, t)
            results.append((ctx.get(add), ctx.get(fold)))

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()
    return results


def reference_fold(value):
    """The one's-complement sum of a plain sum of 16-bit words, by its definition."""
    while value >> 16:
        value = (value & 0xFFFF) + (value >> 16)
    return value


@pytest.mark.parametrize("words", [1, 2, 3, 4, 7, 10])
def test_word_sum_is_the_plain_sum_of_the_words(words):
    """``word_sum`` of a header of ``words`` words and of a wider term: groups of three,
    two and one at each level of its tree."""
    rng = random.Random(words)
    value, term = Signal(16 * words), Signal(20)
    total = Signal(24)
    m = Module()
    m.d.comb += total.eq(word_sum(value, term))
    cases = [(0, 0), ((1 << 16 * words) - 1, (1 << 20) - 1)]
    cases += [(rng.getrandbits(16 * words), rng.getrandbits(20)) for _ in range(100)]
    results = []

    async def testbench(ctx):
        for header, extra in cases:
            ctx.set(value, header)
            ctx.set(term, extra)
            results.append(ctx.get(total))

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()
    assert results == [sum((header >> 16 * index) & 0xFFFF for index in range(words)) + extra
                       for header, extra in cases]


@pytest.mark.parametrize("widths", [(16, 16), (16, 4)])
def test_ones_complement_sums_carry_around(widths):
    rng = random.Random(widths[1])
    edges = [0, 1, 0xFFFE, 0xFFFF, 0x8000, 0x7FFF]
    cases = [(x & ((1 << widths[0]) - 1), y & ((1 << widths[1]) - 1), t)
             for x in edges for y in edges for t in [0, 0xFFFF, 0x10000, 0x1FFFE, 0x9FFF6]]
    cases += [(rng.getrandbits(widths[0]), rng.getrandbits(widths[1]), rng.getrandbits(20))
              for _ in range(300)]
    for (x, y, t), (add, fold) in zip(cases, _sums(widths, cases), strict=True):
        assert add == reference_fold(x + y), (x, y)
        assert fold == reference_fold(t), t


@pytest.mark.parametrize("width", [20, 32])
def test_folds_to_ones_is_the_fold_compared(width):
    """``folds_to_ones`` (compares only) against the fold of its definition: every sum that
    folds to 0xFFFF among the edges (``lo`` the complement of ``hi``, both halves all ones)
    and random sums, most of them a word off one that does."""
    rng = random.Random(width)
    mask = (1 << width) - 1
    highs = [0, 1, 9, 0xF, 0xFFFE & (mask >> 16), mask >> 16]
    cases = [t & mask for high in highs for low in [0, 1, 0xFFFE, 0xFFFF, ~high & 0xFFFF]
             for t in [(high << 16) | low]]
    cases += [mask, 0x1FFFE & mask]
    for _ in range(300):
        high = rng.getrandbits(width - 16)
        cases.append(((high << 16) | (~high & 0xFFFF)) + rng.choice([0, 0, 1, -1]) & mask)
    m = Module()
    total, ok = Signal(width), Signal()
    m.d.comb += ok.eq(folds_to_ones(total))
    results = []

    async def testbench(ctx):
        for value in cases:
            ctx.set(total, value)
            results.append(ctx.get(ok))

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()
    assert results == [int(reference_fold(value) == 0xFFFF) for value in cases]
    assert 0 < sum(results) < len(cases)
