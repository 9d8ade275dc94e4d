# amaranth: UnusedElaboratable=no
"""IPv4Receiver on its own: packets built by Scapy, with random gaps, go up to ICMP or UDP
cut to their total length, or are dropped and counted by reason."""

import ipaddress
import random

import pytest
from amaranth.lib import data
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import Ether

from gateware.config import config_value
from gateware.headers import ETHERNET, IPV4
from gateware.ip.rx import IPv4Receiver

from .streams import get_packet, put_packet, run_testbenches, wait_for

OURS = "10.77.0.2"

#: Sources RFC 1122 §3.2.1.3 says to discard, and our subnet's host number zero (our
#: subnet is 10.77.0.0/24).
BAD_SOURCES = ["255.255.255.255", "10.77.0.255", "10.77.0.0", "224.0.0.1", "239.255.255.250",
               "0.0.0.0", "127.0.0.1", "127.255.0.9", "240.0.0.1", "250.1.2.3", OURS]


def frame(kind, rng):
    """An Ethernet frame (no FCS) of a kind, and where it should go: "icmp", "udp", or the
    reason it is dropped."""
    payload = rng.randbytes(rng.choice([0, 1, 17, 63, 64, 65, 200]))
    ip = IP(src="10.77.0.1", dst=OURS)
    if kind == "address":
        ip.dst = "10.77.0.9"
    elif kind == "source":
        ip.src = rng.choice(BAD_SOURCES)
    elif kind == "fragment":
        ip.flags = "MF"
    elif kind == "protocol":
        ip.proto = 6
    upper = ICMP() / payload if kind == "icmp" else UDP(sport=1, dport=7) / payload
    packet = Ether(dst="02:00:00:00:00:02") / ip / upper
    wire = bytearray(bytes(packet))
    if kind == "checksum":
        wire[ETHERNET.length + 10] ^= 0x01
    if len(wire) < 60:
        wire += bytes(60 - len(wire))               # Ethernet padding, cut by the receiver
    return bytes(wire), kind if kind in ("icmp", "udp") else kind


@pytest.mark.parametrize("gaps", [False, True])
def test_routes_and_drops(gaps):
    dut = IPv4Receiver(width=16)
    rng = random.Random(f"ip{gaps}")
    kinds = ["udp", "icmp", "checksum", "address", "source", "fragment", "protocol"]
    frames = [frame(rng.choice(kinds), rng) for _ in range(60)]
    expected = {"icmp": [], "udp": []}
    for wire, kind in frames:
        if kind in expected:
            ip = IP(wire[ETHERNET.length:])
            expected[kind].append(bytes(ip)[IPV4.length:ip.len])
    received = {"icmp": [], "udp": []}
    sent = []

    async def source(ctx):
        ctx.set(dut.i_config, config_value(mac="02:00:00:00:00:02", ip=OURS,
                                           netmask="255.255.255.0", gateway="0.0.0.0"))
        source_gaps = random.Random(1) if gaps else None
        for wire, _ in frames:
            meta = {"length": len(wire),
                    "eth": data.Const(ETHERNET, int.from_bytes(wire[:ETHERNET.length], "big"))}
            await put_packet(ctx, dut.i, wire[ETHERNET.length:], meta, width=16, gaps=source_gaps)
            sent.append(wire)

    def sink(port, name, seed):
        async def testbench(ctx):
            sink_gaps = random.Random(seed) if gaps else None
            while True:
                payload, _ = await get_packet(ctx, port, width=16, gaps=sink_gaps)
                received[name].append(payload)
        return testbench

    async def check(ctx):
        await wait_for(ctx, lambda: len(sent) == len(frames) and all(
            len(received[name]) == len(expected[name]) for name in expected), 20_000)
        for _ in range(20):
            await ctx.tick()
        assert received == expected
        counters = ctx.get(dut.o_counters)
        for reason in ("checksum", "address", "source", "fragment", "protocol"):
            assert getattr(counters, reason) == sum(kind == reason for _, kind in frames), reason

    run_testbenches(dut, check, source, sink(dut.o_icmp, "icmp", 2), sink(dut.o_udp, "udp", 3))


@pytest.mark.parametrize("netmask, zero, good", [
    ("255.255.255.0", "10.77.0.0", "10.77.0.1"),
    ("255.255.0.0", "10.77.0.0", "10.77.1.0"),       # .0 of a /16 is an ordinary host
    ("255.255.255.252", "10.77.0.0", "10.77.0.1"),
])
def test_subnet_zero_source(netmask, zero, good):
    """A datagram from our subnet's host number zero goes nowhere and counts as ``source``;
    the one from a good source after it comes out whole."""
    dut = IPv4Receiver(width=16)
    good_packet = IP(src=good, dst=OURS) / UDP(sport=9, dport=7) / b"good datagram"
    frames = [bytes(Ether(dst="02:00:00:00:00:02") / IP(src=zero, dst=OURS) /
                    UDP(sport=9, dport=7) / b"from the subnet's zero"),
              bytes(Ether(dst="02:00:00:00:00:02") / good_packet)]
    received = []

    async def source(ctx):
        ctx.set(dut.i_config, config_value(mac="02:00:00:00:00:02", ip=OURS, netmask=netmask,
                                           gateway="0.0.0.0"))
        for wire in frames:
            meta = {"length": len(wire),
                    "eth": data.Const(ETHERNET, int.from_bytes(wire[:ETHERNET.length], "big"))}
            await put_packet(ctx, dut.i, wire[ETHERNET.length:], meta, width=16)

    async def sink(ctx):
        while True:
            payload, meta = await get_packet(ctx, dut.o_udp, width=16)
            received.append((payload, int(meta.ip.src)))

    async def check(ctx):
        await wait_for(ctx, lambda: received, 200)
        for _ in range(20):
            await ctx.tick()
        assert received == [(bytes(good_packet[UDP]), int(ipaddress.IPv4Address(good)))]
        assert not ctx.get(dut.o_icmp.valid)
        assert ctx.get(dut.o_counters.source) == 1

    run_testbenches(dut, check, source, sink)
