# amaranth: UnusedElaboratable=no
"""ArpLayer transmit: each IPv4 packet leaves with its next hop's MAC, at one beat per
cycle across packets to different destinations; a miss waits beside the stream (the
parking slot) or is dropped, and never holds a packet to another next hop; bindings in
use are refreshed before they expire; the next hop follows the configuration. ARP
payloads are packed with ``struct`` (the golden model)."""

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


def patient(payload, dport=4791):
    """An IPv4 packet with a UDP header to ``dport`` (RoCEv2: it may wait for ARP)."""
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28 + len(payload), 0, 0x4000, 64, 17, 0,
                     bytes(4), bytes(4))
    return ip + struct.pack("!HHHH", 49152, dport, 8 + len(payload), 0) + payload


def arp_target(payload):
    fields = struct.unpack(ARP_FORMAT, payload[:28])
    assert fields[4] == 1
    return ".".join(str(byte) for byte in fields[8])


def run_layer(dut, sent, *, answer, until, cycles, gateway=None, pace=0, sink_gaps=None):
    """Teach the peers, send ``sent`` [(destination, payload), or (None, a pause in
    cycles)] (``pace`` cycles apart) and
    collect what leaves: ("request", address) and (MAC, payload); ``answer`` lists the
    addresses whose requests are answered (MAC 02:00:00:00:00:<last byte>). Returns that
    list and the counters at the end."""
    received = []
    counters = {}

    async def source(ctx):
        ctx.set(dut.i_config, config_value(**OURS) if gateway is None
                else config_value(**OURS, gateway=gateway))
        for ip, mac in PEERS.items():
            await teach(ctx, dut, ip, mac)
        await ctx.tick().repeat(5)
        for destination, payload in sent:
            if destination is None:                 # a pause of ``payload`` cycles
                await ctx.tick().repeat(payload)
                continue
            await put_packet(ctx, dut.i_ip, payload, {"dst_ip": parse_ipv4(destination)},
                             width=WIDTH)
            if pace:
                await ctx.tick().repeat(pace)

    async def sink(ctx):
        while True:
            payload, meta = await get_packet(ctx, dut.o, width=WIDTH, gaps=sink_gaps)
            if meta.ethertype == ETHERTYPE_ARP:
                assert meta.dst_mac == (1 << 48) - 1
                target = arp_target(payload)
                received.append(("request", target))
                if target in answer:
                    mac = PEERS.get(target, f"02:00:00:00:00:{int(target.split('.')[-1]):02x}")
                    await teach(ctx, dut, target, mac)
            else:
                received.append((int(meta.dst_mac), payload))

    async def check(ctx):
        try:
            await wait_for(ctx, lambda: until(received), cycles)
        except AssertionError:
            raise AssertionError(f"still waiting; received: {received}") from None
        await ctx.tick().repeat(50)
        counters.update({name: ctx.get(getattr(dut.o_counters, name))
                         for name in ("unresolved", "unreachable", "requests")})

    run_testbenches(dut, check, source, sink)
    return received, counters


def test_misses_never_hold_the_stream():
    """A miss never holds a packet to another next hop. It waits in the parking slot if
    that is free, joined by later packets to its hop, and leaves with the MAC learnt, or
    is dropped after the retries; a patient packet (RoCEv2) takes the slot from packets
    that may not wait (an echo reply), which are dropped; a miss that finds the slot taken
    is dropped; with no gateway, an off-subnet destination is unreachable, not asked for."""
    dut = ArpLayer(lifetime=1 << 20, retry_interval=200, retries=2, patient_ports=(4791,),
                   width=WIDTH)
    sent = [("10.0.0.9", b"echo reply"), ("10.0.0.2", b"one"),
            ("10.0.0.77", patient(b"silent 1")), ("10.0.0.3", b"two"),
            ("10.0.0.77", b"silent 2"), ("10.0.0.8", patient(b"slot taken")),
            ("10.0.0.9", b"echo again"), ("192.168.7.7", b"unreachable"),
            ("10.0.0.2", b"three")]
    # Once the slot is free again (after .77's two tries): an echo reply waits for its
    # hop, which answers, and a packet to it joins.
    later = [("10.0.0.10", b"parked"), ("10.0.0.10", b"right behind"), ("10.0.0.2", b"four"),
             ("10.0.0.10", patient(b"joins"))]
    received, counters = run_layer(
        dut, sent + [(None, 500)] + later, answer={"10.0.0.10"},
        until=lambda got: sum(1 for item in got if item[0] != "request") == 7,
        cycles=2_000)
    packets = [item for item in received if item[0] != "request"]
    requests = [item[1] for item in received if item[0] == "request"]
    peer2, peer3 = parse_mac(PEERS["10.0.0.2"]), parse_mac(PEERS["10.0.0.3"])
    mac10 = parse_mac("02:00:00:00:00:0a")
    parked = [b"parked", b"right behind", patient(b"joins")]
    assert [item for item in packets if item[1] not in parked] == [
        (peer2, b"one"), (peer3, b"two"), (peer2, b"three"), (peer2, b"four")], packets
    assert [item for item in packets if item[1] in parked] == [
        (mac10, payload) for payload in parked], packets
    # .9 is asked for by the first echo reply, then abandoned for the patient packet to
    # .77, asked for twice; .10 once; .8 and the second .9 (slot taken) and 192.168.7.7
    # never.
    assert requests == ["10.0.0.9", "10.0.0.77", "10.0.0.77", "10.0.0.10"], requests
    # The first echo reply (slot taken from it), the two parked to .77, the packets that
    # found the slot taken.
    assert counters["unresolved"] == 5 and counters["unreachable"] == 1, counters


def test_gateway_and_refresh_of_bindings_in_use():
    """Off-subnet packets go to the gateway once one is set; bindings in use are asked for
    again before they expire, so a stream to them never misses; one not in use expires."""
    lifetime = 1600
    dut = ArpLayer(lifetime=lifetime, retry_interval=40, retries=2, width=WIDTH)
    sent = []
    for index in range(30):
        sent += [("10.0.0.2", bytes([index]) * 3), ("192.168.7.7", bytes([index]) * 5)]
    sent.append(("10.0.0.3", b"expired"))
    received, counters = run_layer(
        dut, sent, answer={"10.0.0.2", GATEWAY}, gateway=GATEWAY, pace=60,
        until=lambda got: got.count(("request", "10.0.0.3")) == 2, cycles=3 * lifetime)
    packets = [item for item in received if item[0] != "request"]
    requests = [item[1] for item in received if item[0] == "request"]
    assert packets == [(parse_mac(PEERS[hop]), payload) for destination, payload in sent[:-1]
                       for hop in [destination if destination.startswith("10.") else GATEWAY]]
    assert requests.count("10.0.0.2") >= 2 and requests.count(GATEWAY) >= 2, requests
    assert requests[-2:] == ["10.0.0.3"] * 2      # expired: asked for, no answer, dropped
    assert counters["unresolved"] == 1, counters


def test_a_stream_to_a_hop_being_resolved_loses_nothing():
    """A stream of RoCEv2 packets to a next hop not yet resolved, with the sink slower
    than the source: the first ones wait in the parking slot, the rest wait in place
    while it drains once the hop answered; every packet leaves once, in order."""
    dut = ArpLayer(lifetime=1 << 20, retry_interval=200, patient_ports=(4791,), width=WIDTH)
    sent = [("10.0.0.10", patient(bytes([index]) * 80)) for index in range(120)]
    received, counters = run_layer(
        dut, sent, answer={"10.0.0.10"}, sink_gaps=random.Random(9),
        until=lambda got: sum(1 for item in got if item[0] != "request") == len(sent),
        cycles=5_000)
    mac10 = parse_mac("02:00:00:00:00:0a")
    assert [item for item in received if item[0] != "request"] == [
        (mac10, payload) for _, payload in sent]
    assert counters["unresolved"] == 0, counters
