"""Putting and getting whole packets on packet streams in Amaranth's simulator.

Every unit test of a stream block goes through these helpers, so the
handshake rules (payload held while valid and not ready; a beat moves on a
clock edge where both are high) are written once.
"""

import random
from typing import Any, NamedTuple

from amaranth.lib import data
from amaranth.sim import Simulator
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from gateware.headers import ETHERNET, IPV4
from gateware.headers import UDP as UDP_LAYOUT

__all__ = ["udp_delivery", "put_packet", "get_packet", "put_item", "get_item",
           "get_item_random_ready", "run_testbenches", "to_beats", "idle", "wait_for", "Seen",
           "StreamMonitor", "round_robin", "held_while_stalled", "check_tagged_packets"]


def to_beats(payload, width):
    """Split bytes into ``(data, keep, last)`` beats; lane 0 is the first byte."""
    chunks = [payload[offset:offset + width] for offset in range(0, len(payload), width)] or [b""]
    return [(int.from_bytes(chunk, "little"), (1 << len(chunk)) - 1, index == len(chunks) - 1)
            for index, chunk in enumerate(chunks)]


def udp_delivery(frame):
    """``(meta, payload)``: how the UDP receiver hands an Ethernet frame's datagram to
    the service on its port (meta: frame length and the Ethernet, IPv4, UDP headers)."""
    packet = Ether(frame)
    ip_header = bytes(packet[IP])[:IPV4.length]
    udp_header = bytes(packet[UDP])[:UDP_LAYOUT.length]
    meta = {"length": len(frame), "eth": data.Const(ETHERNET, 0),
            "ip": data.Const(IPV4, int.from_bytes(ip_header, "big")),
            "udp": data.Const(UDP_LAYOUT, int.from_bytes(udp_header, "big"))}
    payload = bytes(packet[UDP].payload)[:packet[UDP].len - UDP_LAYOUT.length]
    return meta, payload


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
    for beat_data, keep, last in to_beats(payload, width):
        await idle(ctx, gaps)
        ctx.set(stream.valid, 1)
        ctx.set(stream.payload, {"data": beat_data, "keep": keep, "last": last, "meta": meta})
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


def held_while_stalled(stream):
    """A testbench failing when a beat offered and not taken changes or goes away."""
    async def testbench(ctx):
        stalled = None
        async for _, _, valid, ready, beat in ctx.tick().sample(stream.valid, stream.ready,
                                                               stream.payload):
            if stalled is not None:
                assert valid, "valid fell before the beat was taken"
                assert beat == stalled, "payload changed before it was taken"
            stalled = beat if valid and not ready else None
    return testbench


def check_tagged_packets(dut, payloads, *, width, source_gaps, sink_gaps, cycles,
                         extra=()):
    """Send ``payloads`` through ``dut.i`` → ``dut.o`` (meta field ``tag``: the index),
    with random gaps on the source and/or the sink; every packet must come out whole,
    unchanged and in order with its tag, no beat after the last, every beat held until
    taken. ``extra``: more testbenches to run alongside."""
    received = []

    async def source(ctx):
        gaps = random.Random(1) if source_gaps else None
        for tag, payload in enumerate(payloads):
            await put_packet(ctx, dut.i, payload, {"tag": tag}, width=width, gaps=gaps)

    async def sink(ctx):
        gaps = random.Random(2) if sink_gaps else None
        for _ in payloads:
            payload, meta = await get_packet(ctx, dut.o, width=width, gaps=gaps)
            received.append((meta.tag, payload))

    async def check(ctx):
        await wait_for(ctx, lambda: len(received) == len(payloads), cycles)
        for _ in range(10):
            await ctx.tick()
            assert not ctx.get(dut.o.valid), "more beats than were sent"
        assert received == list(enumerate(payloads))

    run_testbenches(dut, check, source, sink, held_while_stalled(dut.o), *extra)


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


async def put_item(ctx, stream, value, *, gaps=None):
    """Drive one payload (a whole transfer of a non-packet stream) into ``stream``."""
    await idle(ctx, gaps)
    ctx.set(stream.valid, 1)
    ctx.set(stream.payload, value)
    await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


async def get_item(ctx, stream, *, gaps=None):
    """Take one payload from ``stream``."""
    await idle(ctx, gaps)
    ctx.set(stream.ready, 1)
    item, = await ctx.tick().sample(stream.payload).until(stream.valid)
    ctx.set(stream.ready, 0)
    return item


async def get_item_random_ready(ctx, stream, *, gaps=None):
    """Take one payload from ``stream`` with ``ready`` random every cycle when ``gaps`` is a
    Random, so the payload may also wait while offered."""
    while True:
        ready = gaps is None or gaps.random() >= 0.3
        ctx.set(stream.ready, ready)
        _, _, valid, item = await ctx.tick().sample(stream.valid, stream.payload)
        if valid and ready:
            ctx.set(stream.ready, 0)
            return item


class Seen(NamedTuple):
    """One stream on one cycle, as `StreamMonitor.watch` saw it."""
    valid: bool
    ready: bool
    payload: Any
    offer: bool     # valid, and not held over from the previous cycle: a payload's first offer
    taken: bool     # valid and ready
    first: bool     # the payload is a packet's first beat (always, without a ``last`` field)


class StreamMonitor:
    """Watches streams, named by the keywords, from a background testbench.

    After every clock edge it checks that a payload offered with ``valid`` and not taken
    is offered again, unchanged, on the next cycle, and records by cycle (0 = the first
    edge), per stream name:

    - ``offers``: the cycle each payload is first offered;
    - ``beats``: every cycle a payload is taken;
    - ``firsts``: every cycle a packet's first beat is taken (a stream whose payload has no
      ``last`` field carries one-beat items, so every cycle one is taken).
    """

    def __init__(self, **streams):
        self.streams = streams
        self.offers = {name: [] for name in streams}
        self.beats = {name: [] for name in streams}
        self.firsts = {name: [] for name in streams}

    async def watch(self, ctx, *signals):
        """Check and record every cycle, then yield ``(cycle, seen, values)``: ``seen`` maps
        each stream name to a `Seen`, ``values`` are those of ``signals`` at that edge."""
        names = list(self.streams)
        packets = {name: "last" in getattr(stream.payload.shape(), "members", {})
                   for name, stream in self.streams.items()}
        held = dict.fromkeys(names)             # payload offered and not taken last cycle
        first = dict.fromkeys(names, True)
        cycle = 0
        async for _, _, *values in ctx.tick().sample(
                *(value for stream in self.streams.values()
                  for value in (stream.valid, stream.ready, stream.payload)), *signals):
            seen = {}
            for index, name in enumerate(names):
                valid, ready, payload = values[3 * index:3 * index + 3]
                if held[name] is not None:
                    assert valid, f"{name}, cycle {cycle}: valid fell before the payload was taken"
                    assert payload == held[name], \
                        f"{name}, cycle {cycle}: payload changed before it was taken"
                offer, taken = bool(valid) and held[name] is None, bool(valid and ready)
                if offer:
                    self.offers[name].append(cycle)
                if taken:
                    self.beats[name].append(cycle)
                    if first[name]:
                        self.firsts[name].append(cycle)
                seen[name] = Seen(bool(valid), bool(ready), payload, offer, taken, first[name])
                held[name] = payload if valid and not ready else None
                if taken and packets[name]:
                    first[name] = bool(payload.last)
            yield cycle, seen, values[3 * len(names):]
            cycle += 1

    async def run(self, ctx):
        """A testbench that only checks and records."""
        async for _ in self.watch(ctx):
            pass


def round_robin(previous, offered):
    """The golden round-robin grant: the first input offering after ``previous``."""
    count = len(offered)
    return next(index % count for index in range(previous + 1, previous + 1 + count)
                if offered[index % count])
