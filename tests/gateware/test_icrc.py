# amaranth: UnusedElaboratable=no
"""IcrcInserter against Scapy's ICRC and Linux Soft-RoCE's frames: every position of
the ICRC in the last beat, long packets, gaps and backpressure, and the packets that
must pass unchanged."""

import random
from dataclasses import dataclass

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import ICMP, IP, UDP, IPOption_EOL, IPOption_NOP
from scapy.packet import Raw

from gateware.roce.icrc import IcrcInserter

from ..rxe_vectors import ETHERNET_HEADER, RXE_ACKNOWLEDGE, RXE_WRITE_ONLY
from .streams import get_packet, put_packet, run_testbenches, wait_for

WIDTH = 64
ICRC_BYTES = 4
HEADERS_AND_ICRC = len(IP() / UDP() / BTH())
OPCODES = (0x04, 0x0a, 0x06, 0x07, 0x08, 0x11)   # SEND ONLY, WRITE ONLY/FIRST/MIDDLE/LAST, ACK



@dataclass
class Case:
    """A packet in, what must come out, and its meta; ``loose`` lets the last 4 bytes differ."""
    packet: bytes
    expected: bytes
    meta: int
    loose: bool = False


def rocev2(rng, length):
    """A RoCEv2 packet of ``length`` bytes with its ICRC from Scapy, and random values in
    every field the ICRC masks."""
    packet = (IP(src="10.0.0.1", dst="10.0.0.2", id=rng.getrandbits(16), flags="DF",
                 tos=rng.getrandbits(8), ttl=rng.randrange(1, 256))
              / UDP(sport=rng.getrandbits(16), dport=4791,
                    chksum=rng.choice((0, rng.getrandbits(16))))
              / BTH(opcode=rng.choice(OPCODES), solicited=rng.getrandbits(1),
                    padcount=rng.getrandbits(2), pkey=rng.getrandbits(16),
                    fecn=rng.getrandbits(1), becn=rng.getrandbits(1), resv6=rng.getrandbits(6),
                    dqpn=rng.getrandbits(24), ackreq=rng.getrandbits(1),
                    resv7=rng.getrandbits(7), psn=rng.getrandbits(24))
              / Raw(rng.randbytes(length - HEADERS_AND_ICRC)))
    wire = bytes(packet)
    assert len(wire) == length
    return wire


def rocev2_case(rng, length):
    wire = rocev2(rng, length)
    return Case(wire[:-ICRC_BYTES] + bytes(ICRC_BYTES), wire, rng.getrandbits(32))


def unchanged_case(rng, packet):
    return Case(packet, packet, rng.getrandbits(32))


def other_packets(rng):
    """Packets that are not RoCEv2 and must pass as they are."""
    def payload():
        return Raw(rng.randbytes(rng.randrange(0, 3 * WIDTH)))
    ip = IP(src="10.0.0.1", dst="10.0.0.2", ttl=rng.randrange(1, 256))
    nops = [IPOption_NOP(), IPOption_NOP(), IPOption_NOP(), IPOption_EOL()]
    return [bytes(packet) for packet in (
        ip / ICMP() / payload(),
        ip / UDP(dport=4792) / payload(),
        ip / UDP(sport=4791, dport=53) / payload(),
        ip / UDP(dport=4791) / Raw(b"short"),                                # no room for BTH
        IP(options=nops) / UDP(dport=4791) / BTH() / Raw(bytes(20)),          # IHL 6
        IP(proto=6) / Raw(bytes(UDP(dport=4791)) + rng.randbytes(40)),      # TCP
    )] + [
        bytes([0x65]) + rocev2(rng, 4 * 20)[1:],                              # IP version 6
    ] + [rng.randbytes(length) for length in (0, 1, 3, 61, 65, 127, 131)]


def run_inserter(cases, *, width=WIDTH, source_gaps=None, sink_gaps=None):
    """Send ``cases`` through an IcrcInserter and check what comes out.

    Checks every beat's meta against its packet's and, when the sink never
    stalls, that every beat takes exactly :attr:`IcrcInserter.latency` cycles.
    Returns the cycles of the beats accepted on ``i`` and offered on ``o``.
    """
    dut = IcrcInserter(width=width)
    received, cycles = [], {"i": [], "o": []}

    async def source(ctx):
        for case in cases:
            await put_packet(ctx, dut.i, case.packet, {"dst_ip": case.meta}, width=width,
                             gaps=source_gaps)

    async def sink(ctx):
        while True:
            while not ctx.get(dut.o.valid):     # so that the run never ends inside get_packet
                await ctx.tick()
            received.append(await get_packet(ctx, dut.o, width=width, gaps=sink_gaps))

    def monitor(name, stream, metas):
        async def testbench(ctx):
            packet, cycle = 0, 0
            async for _, _, valid, ready, beat in ctx.tick().sample(stream.valid, stream.ready,
                                                                   stream.payload):
                if valid and ready:
                    assert beat.meta.dst_ip == metas[packet], f"{name}: meta of packet {packet}"
                    cycles[name].append(cycle)
                    packet += bool(beat.last)
                cycle += 1
        return testbench

    async def check(ctx):
        beats = sum(max(1, -(-len(case.packet) // width)) for case in cases)
        await wait_for(ctx, lambda: len(received) >= len(cases), 4 * beats + 100)
        await ctx.tick().repeat(2 * dut.latency)
        assert len(received) == len(cases)
        for index, (case, (packet, meta)) in enumerate(zip(cases, received, strict=True)):
            assert meta.dst_ip == case.meta, f"packet {index}: meta"
            assert len(packet) == len(case.expected), f"packet {index}: length"
            if case.loose:
                assert packet[:-ICRC_BYTES] == case.expected[:-ICRC_BYTES], f"packet {index}"
            else:
                assert packet.hex() == case.expected.hex(), f"packet {index}"
        if sink_gaps is None:
            latencies = {out - into for into, out in zip(cycles["i"], cycles["o"], strict=True)}
            assert latencies == {dut.latency}

    metas = [case.meta for case in cases]
    run_testbenches(dut, check, source, sink, monitor("i", dut.i, metas),
                    monitor("o", dut.o, metas))
    return cycles


def assert_back_to_back(cycles):
    for name, transfers in cycles.items():
        assert transfers == list(range(transfers[0], transfers[0] + len(transfers))), \
            f"idle cycle on {name}"


@pytest.mark.parametrize("width", [WIDTH, 48])
def test_every_last_beat_fill(width):
    """The ICRC at every 4-byte position of the last beat, alone in it included, in
    packets of one to three beats sent back to back: Scapy's bytes, no idle cycle,
    fixed latency."""
    rng = random.Random(f"fill{width}")
    lengths = [beats * width + fill for beats in range(3) for fill in range(4, width + 1, 4)
               if beats * width + fill >= HEADERS_AND_ICRC]
    cases = [rocev2_case(rng, length) for length in lengths]
    assert_back_to_back(run_inserter(cases, width=width))


def test_latency():
    assert IcrcInserter(width=WIDTH).latency == 6


def test_long_packets():
    """Packets of a 4096-byte MTU and longer, back to back with short ones."""
    rng = random.Random("long")
    cases = [rocev2_case(rng, length) for length in (4200, 44, 4096 + HEADERS_AND_ICRC, 48, 1072)]
    assert_back_to_back(run_inserter(cases))


def test_rxe_frames():
    """The ICRC of frames Linux Soft-RoCE sent and accepted."""
    rng = random.Random("rxe")
    cases = []
    for frame in (RXE_WRITE_ONLY, RXE_ACKNOWLEDGE, RXE_WRITE_ONLY):
        packet = frame[ETHERNET_HEADER:]
        cases.append(Case(packet[:-ICRC_BYTES] + bytes(ICRC_BYTES), packet, rng.getrandbits(32)))
    run_inserter(cases)


def test_other_packets_unchanged():
    """Packets that are not RoCEv2 pass as they are, back to back between RoCEv2 ones."""
    rng = random.Random("other")
    cases = []
    for packet in other_packets(rng):
        cases += [unchanged_case(rng, packet), rocev2_case(rng, 4 * rng.randrange(11, 60))]
    assert_back_to_back(run_inserter(cases))


def test_malformed_rocev2():
    """RoCEv2 packets whose length is not a multiple of 4 change in their last 4 bytes at
    most, and the packets after them are right."""
    rng = random.Random("malformed")
    cases = []
    for length in (45, 46, 47, WIDTH + 1, WIDTH + 2, WIDTH + 3, WIDTH + 5, 2 * WIDTH - 1):
        wire = rocev2(rng, length - length % 4)
        packet = wire + rng.randbytes(length % 4)
        cases += [Case(packet, packet, rng.getrandbits(32), loose=True),
                  rocev2_case(rng, 4 * rng.randrange(11, 40))]
    run_inserter(cases)


@pytest.mark.parametrize("seed", range(2))
def test_gaps_and_backpressure(seed):
    """RoCEv2 and other packets mixed, random gaps in the input and stalls at the output."""
    rng = random.Random(f"gaps{seed}")
    cases = [rocev2_case(rng, 4 * rng.randrange(11, 100)) for _ in range(24)]
    cases += [unchanged_case(rng, packet) for packet in other_packets(rng)]
    rng.shuffle(cases)
    run_inserter(cases, source_gaps=random.Random(2 * seed), sink_gaps=random.Random(2 * seed + 1))


@pytest.mark.parametrize("width", [8, 40, 42, 66, "64"])
def test_bad_width(width):
    with pytest.raises(ValueError, match="Beat width"):
        IcrcInserter(width=width)
