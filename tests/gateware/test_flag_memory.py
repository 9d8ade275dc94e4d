"""FlagMemory against a model of flags in registers: random writes of three writers that
share flags (often to one entry in one cycle), every read kind checked every cycle."""

import random

import pytest

from gateware.roce.flag_memory import FlagMemory

from .streams import run_testbenches

FLAGS = ("a", "b", "c")
WRITERS = (("first", ("a", "b")), ("second", ("b", "c")), ("last", ("a", "b", "c")))
READS = ("comb", "transparent", "sync", "written")
DEPTH = 8


def test_against_registers():
    """Each cycle each writer writes (or not) some of its flags of an entry of a few, and
    each reader reads an entry: a comb read gives the flags as of the cycle's start, a
    written read as the cycle's writes leave them (the later writer winning), a
    transparent read the next cycle as they were left, a sync read the next cycle as
    they were."""
    dut = FlagMemory(flags=FLAGS, depth=DEPTH, writers=WRITERS, reads=READS, addr_bits=4)
    rng = random.Random(3)
    model = [dict.fromkeys(FLAGS, 0) for _ in range(DEPTH)]
    checked = {kind: 0 for kind in READS}

    async def body(ctx):
        for _ in range(600):
            writes = []
            for name, flags in WRITERS:
                port = getattr(dut, f"w_{name}")
                addr = rng.randrange(3)     # few entries: writers often meet
                ctx.set(port.addr, addr)
                for flag in flags:
                    en = rng.random() < 0.4
                    value = rng.randrange(2)
                    ctx.set(getattr(port, flag).en, en)
                    ctx.set(getattr(port, flag).value, value)
                    if en:
                        writes.append((addr, flag, value))
            after = [dict(entry) for entry in model]
            for addr, flag, value in writes:     # in writer order: the later wins
                after[addr][flag] = value
            addrs = [rng.randrange(DEPTH if kind == "sync" else 3) for kind in READS]
            for reader, addr in zip(dut.r, addrs, strict=True):
                ctx.set(reader.addr, addr)
            for kind, (reader, addr) in zip(READS, zip(dut.r, addrs, strict=True),
                                            strict=True):
                if kind in ("comb", "written"):
                    expected = (model if kind == "comb" else after)[addr]
                    got = {flag: ctx.get(reader.data[flag]) for flag in FLAGS}
                    assert got == expected, (kind, addr, got, expected)
                    checked[kind] += 1
            registered = [(kind, dict((after if kind == "transparent" else model)[addr]),
                           reader)
                          for kind, reader, addr in zip(READS, dut.r, addrs, strict=True)
                          if kind in ("transparent", "sync")]
            await ctx.tick()
            for kind, expected, reader in registered:
                got = {flag: ctx.get(reader.data[flag]) for flag in FLAGS}
                assert got == expected, (kind, got, expected)
                checked[kind] += 1
            model[:] = after
        assert min(checked.values()) > 500, checked

    run_testbenches(dut, body)


def test_a_flag_without_a_writer_is_refused():
    with pytest.raises(ValueError, match="Flag 'c' has no writer"):
        FlagMemory(flags=FLAGS, depth=4, writers=(("one", ("a", "b")),), reads=(),
                   addr_bits=2)
