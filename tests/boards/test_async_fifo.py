"""RegisteredAsyncFIFO against a list, between clocks of the board's ratios: every entry
once, in order; never more held than it has room for; no stall where the reader keeps up;
and what each side's reset leaves."""

import random

import pytest
from amaranth import ClockDomain, Module
from amaranth.sim import Simulator

from boards.async_fifo import RegisteredAsyncFIFO

#: Clock periods in ns: the CMAC's 322.27 MHz and the core's 250 MHz.
CMAC_NS, CORE_NS = 1e3 / 322.265625, 4.0


def fifo_bench(depth, write_ns, read_ns):
    """The FIFO between a domain ``w`` and a domain ``r``, the two domains, and its
    simulator."""
    dut = RegisteredAsyncFIFO(width=16, depth=depth, w_domain="w", r_domain="r")
    m = Module()
    domains = {"w": ClockDomain("w"), "r": ClockDomain("r")}
    m.domains += domains.values()
    m.submodules.dut = dut
    sim = Simulator(m)
    sim.add_clock(write_ns * 1e-9, domain="w")
    sim.add_clock(read_ns * 1e-9, domain="r", phase=0.37 * read_ns * 1e-9)
    return dut, domains, sim


def writer(dut, words, written, *, rate, seed, stalls=None, start=0):
    """Offers ``words`` in order, each cycle with probability ``rate``; records the
    words taken (and in ``stalls`` the cycles it offered one and was not ready)."""
    async def testbench(ctx):
        chance = random.Random(seed)
        for _ in range(start):
            await ctx.tick("w")
        for word in words:
            while True:
                offer = chance.random() < rate
                ctx.set(dut.w_en, offer)
                ctx.set(dut.w_data, word)
                ready = ctx.get(dut.w_rdy)
                await ctx.tick("w")
                if offer and ready:
                    written.append(word)
                    break
                if offer and stalls is not None:
                    stalls.append(word)
        ctx.set(dut.w_en, 0)
    return testbench


def reader(dut, read, count, *, rate, seed, held=None, written=None):
    """Reads until ``count`` words came out, each cycle with probability ``rate``;
    checks (with ``written``) that it never holds more than ``held`` entries."""
    async def testbench(ctx):
        chance = random.Random(seed)
        while len(read) < count:
            take = chance.random() < rate
            ctx.set(dut.r_en, take)
            ready, data = ctx.get(dut.r_rdy), ctx.get(dut.r_data)
            await ctx.tick("r")
            if take and ready:
                read.append(data)
            if held is not None:
                assert len(written) - len(read) <= held
        ctx.set(dut.r_en, 0)
    return testbench


@pytest.mark.parametrize("write_ns, read_ns", [(CMAC_NS, CORE_NS), (CORE_NS, CMAC_NS)],
                         ids=["cmac-to-core", "core-to-cmac"])
@pytest.mark.parametrize("write_rate, read_rate", [(1.0, 0.3), (0.3, 1.0), (0.7, 0.7)],
                         ids=["reader-slow", "writer-slow", "both-random"])
def test_every_entry_once_in_order_never_more_than_its_room(write_ns, read_ns, write_rate,
                                                             read_rate):
    depth = 8
    dut, _, sim = fifo_bench(depth, write_ns, read_ns)
    words = random.Random(1).sample(range(1 << 16), 300)
    written, read = [], []
    sim.add_testbench(writer(dut, words, written, rate=write_rate, seed=2))
    sim.add_testbench(reader(dut, read, len(words), rate=read_rate, seed=3,
                             held=depth + 1, written=written))
    sim.run_until(300 * 8 * max(write_ns, read_ns) * 1e-9 / min(write_rate, read_rate))
    assert written == words
    assert read == words


def test_a_reader_that_keeps_up_never_stalls_the_writer():
    """The core writing every cycle into the transmit FIFO's 16 entries, the CMAC's faster
    clock reading every cycle: the Gray codes' round trip fits, so no write waits."""
    dut, _, sim = fifo_bench(16, CORE_NS, CMAC_NS)
    words = list(range(400))
    written, read, stalls = [], [], []
    sim.add_testbench(writer(dut, words, written, rate=1.0, seed=0, stalls=stalls))
    sim.add_testbench(reader(dut, read, len(words), rate=1.0, seed=0))
    sim.run_until(500 * CORE_NS * 1e-9)
    assert read == words
    assert stalls == []


def test_it_fills_to_its_depth_and_one_more_when_nothing_reads():
    dut, _, sim = fifo_bench(8, CMAC_NS, CORE_NS)
    written = []
    sim.add_testbench(writer(dut, range(20), written, rate=1.0, seed=0), background=True)
    sim.run_until(60 * CORE_NS * 1e-9)
    assert len(written) == 8 + 1


def test_a_write_side_reset_empties_it_and_the_next_entries_pass():
    """Entries before the reset may come out (the one in the output register) or not;
    after it, the entries written come out exactly, nothing of before between them."""
    dut, domains, sim = fifo_bench(8, CMAC_NS, CORE_NS)
    before, after = list(range(100, 106)), list(range(200, 240))
    written, read = [], []

    async def resets(ctx):
        for _ in range(12):
            await ctx.tick("w")
        ctx.set(domains["w"].rst, 1)
        for _ in range(3):
            await ctx.tick("w")
        ctx.set(domains["w"].rst, 0)

    sim.add_testbench(writer(dut, before, written, rate=1.0, seed=0))
    sim.add_testbench(resets)
    sim.add_testbench(writer(dut, after, [], rate=0.8, seed=1, start=30))

    async def late_reader(ctx):
        for _ in range(40):
            await ctx.tick("r")
        await reader(dut, read, len(after) + 1, rate=0.9, seed=4)(ctx)
    sim.add_testbench(late_reader, background=True)
    sim.run_until(400 * CORE_NS * 1e-9)
    old = [word for word in read if word < 200]
    assert len(old) <= 1 and set(old) <= set(before)
    assert [word for word in read if word >= 200] == after
    assert read[len(old):] == after


def test_a_read_side_reset_keeps_the_entries_in_memory():
    """A reset of the reader's domain alone loses at most the entry in its output register."""
    dut, domains, sim = fifo_bench(8, CMAC_NS, CORE_NS)
    words = list(range(1, 9))
    written, read = [], []
    sim.add_testbench(writer(dut, words, written, rate=1.0, seed=0))

    async def reset_then_read(ctx):
        for _ in range(20):
            await ctx.tick("r")
        ctx.set(domains["r"].rst, 1)
        await ctx.tick("r")
        ctx.set(domains["r"].rst, 0)
        await reader(dut, read, len(words) - 1, rate=1.0, seed=0)(ctx)
    sim.add_testbench(reset_then_read)
    sim.run_until(200 * CORE_NS * 1e-9)
    assert written == words
    assert read == words[1:]
