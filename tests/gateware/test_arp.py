# amaranth: UnusedElaboratable=no
"""ArpLayer transmit: each IPv4 packet leaves with its next hop's MAC, at one beat per
cycle across packets to different destinations; a miss sends requests, waits for the
reply, and after the retries drops the packet; the next hop follows the configuration.
ARP payloads are packed with ``struct`` (the golden model)."""

import random
import struct

import pytest

from gateware.arp.layer import ArpLayer
from gateware.config import config_value, parse_ipv4, parse_mac
from gateware.headers import ETHERTYPE_ARP, ETHERTYPE_IPV4

from .streams import StreamMonitor, get_packet, put_packet, run_testbenches, wait_for

WIDTH = 64
OURS = {"mac": "02:00:00:00:00:01", "ip": "10.0.0.1"}
GATEWAY = "10.0.0.254"
PEERS = {"10.0.0.2": "02:00:00:00:00:02", "10.0.0.3": "02:00:00:00:00:03",
         GATEWAY: "02:00:00:00:00:fe"}
ARP_FORMAT = "!HHBBH6s4s6s4s"


def arp_payload(oper, sha, spa, tha, tpa):
    return struct.pack(ARP_FORMAT, 1, 0x0800, 6, 4, oper,
                       parse_mac(sha).to_bytes(6, "big"), parse_ipv4(spa).to_bytes(4, "big"),
                       parse_mac(tha).to_bytes(6, "big"), parse_ipv4(tpa).to_bytes(4, "big"))


async def teach(ctx, dut, ip, mac):
    """A reply from ``ip`` at ``mac``, as the Ethernet layer hands it up."""
    await put_packet(ctx, dut.i_rx, arp_payload(2, mac, ip, OURS["mac"], OURS["ip"]),
                     {"length": 28}, width=WIDTH)


@pytest.mark.parametrize("sink_gaps", [False, True])
def test_back_to_back(sink_gaps):
    """Packets of 1 to 3 beats to three next hops (two on the subnet, one through the
    gateway), with no gap at the source: each packet leaves unchanged with its next hop's
    MAC, a beat offered is held until taken, and with the sink always ready every beat
    leaves on consecutive cycles."""
    dut = ArpLayer(lifetime=1 << 20, retry_interval=100, width=WIDTH)
    rng = random.Random(4)
    destinations = ["10.0.0.2", "10.0.0.3", "192.168.7.7"]
    packets = [(rng.choice(destinations), rng.randbytes(rng.randrange(1, 3 * WIDTH + 1)))
               for _ in range(60)]
    monitor = StreamMonitor(o=dut.o)
    received = []

    async def source(ctx):
        ctx.set(dut.i_config, config_value(**OURS, gateway=GATEWAY))
        for ip, mac in PEERS.items():
            await teach(ctx, dut, ip, mac)
        await ctx.tick().repeat(5)
        for destination, payload in packets:
            await put_packet(ctx, dut.i_ip, payload, {"dst_ip": parse_ipv4(destination)},
                             width=WIDTH)

    async def sink(ctx):
        gaps = random.Random(5) if sink_gaps else None
        for _ in packets:
            received.append(await get_packet(ctx, dut.o, width=WIDTH, gaps=gaps))

    async def check(ctx):
        await wait_for(ctx, lambda: len(received) == len(packets), 5_000)
        for (destination, payload), (got, meta) in zip(packets, received, strict=True):
            hop = destination if destination.startswith("10.0.0.") else GATEWAY
            assert meta.ethertype == ETHERTYPE_IPV4
            assert meta.dst_mac == parse_mac(PEERS[hop])
            assert got == payload
        beats = monitor.beats["o"]
        assert len(beats) == sum(-(-len(payload) // WIDTH) for _, payload in packets)
        if not sink_gaps:
            assert beats[-1] - beats[0] + 1 == len(beats), "an idle cycle between beats"

    run_testbenches(dut, check, source, sink, monitor.run)


def test_resolution_retries_and_config():
    """A miss sends a request and the packet waits for the reply, while a later packet to
    a known peer waits behind it; an unanswered peer gets ``retries`` requests, then its
    packet is dropped and counted; a packet waiting for resolution follows a gateway set
    meanwhile."""
    dut = ArpLayer(lifetime=1 << 20, retry_interval=40, retries=2, width=WIDTH)
    sent = [("10.0.0.9", b"first"), ("10.0.0.2", b"second"), ("10.0.0.77", b"lost"),
            ("10.0.0.3", b"third"), ("192.168.7.7", b"routed"), ("10.0.0.2", b"last")]
    received = []

    async def source(ctx):
        ctx.set(dut.i_config, config_value(**OURS))          # no gateway yet
        for ip, mac in PEERS.items():
            await teach(ctx, dut, ip, mac)
        await ctx.tick().repeat(5)
        for destination, payload in sent:
            await put_packet(ctx, dut.i_ip, payload, {"dst_ip": parse_ipv4(destination)},
                             width=WIDTH)

    async def sink(ctx):
        while len(received) < 9:
            payload, meta = await get_packet(ctx, dut.o, width=WIDTH)
            if meta.ethertype == ETHERTYPE_ARP:
                fields = struct.unpack(ARP_FORMAT, payload[:28])
                assert fields[4] == 1 and meta.dst_mac == (1 << 48) - 1
                target = ".".join(str(byte) for byte in fields[8])
                received.append(("request", target))
                if target == "10.0.0.9":
                    await teach(ctx, dut, target, "02:00:00:00:00:09")
                elif target == "192.168.7.7":
                    ctx.set(dut.i_config, config_value(**OURS, gateway=GATEWAY))
            else:
                received.append((int(meta.dst_mac), payload))

    async def check(ctx):
        await wait_for(ctx, lambda: len(received) == 9, 2_000)
        assert received == [
            ("request", "10.0.0.9"),
            (parse_mac("02:00:00:00:00:09"), b"first"),
            (parse_mac(PEERS["10.0.0.2"]), b"second"),
            ("request", "10.0.0.77"),
            ("request", "10.0.0.77"),
            (parse_mac(PEERS["10.0.0.3"]), b"third"),
            ("request", "192.168.7.7"),
            (parse_mac(PEERS[GATEWAY]), b"routed"),
            (parse_mac(PEERS["10.0.0.2"]), b"last"),
        ]
        assert ctx.get(dut.o_counters.unresolved) == 1
        assert ctx.get(dut.o_counters.requests) == 4

    run_testbenches(dut, check, source, sink)
