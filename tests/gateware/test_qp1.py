# amaranth: UnusedElaboratable=no
"""QP1 (gateware.cm.qp1) against the IB CM model (sim.models.ib_cm) and Scapy's ICRC:
valid MADs delivered whole with their sender, every drop reason counted, the next good
packet after a bad one delivered, a busy consumer and the queue, random gaps in valid and
ready; MADs sent framed as the model frames them, with an ICRC Scapy agrees with."""

import ipaddress
import random

import pytest
from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from gateware.cm.qp1 import (
    GSI_PAYLOAD_BYTES,
    QP1_SEND,
    Qp1Receiver,
    Qp1Split,
    Qp1Transmitter,
)
from gateware.config import NetworkConfig, config_value
from gateware.headers import MAD
from gateware.ip.tx import NEXT_HOP_META, IPv4Transmitter
from gateware.roce.icrc import IcrcInserter
from gateware.stream import beats_for, packet_signature
from gateware.udp.tx import UdpTransmitter
from sim.models import ib_cm

from .streams import (
    get_item,
    get_packet,
    put_item,
    put_packet,
    run_testbenches,
    udp_delivery,
    wait_for,
)

HOST, ENDPOINT = "10.77.0.1", "10.77.0.2"


def random_mad(rng, kind=None):
    kind = kind or rng.choice(list(ib_cm.CM_MESSAGES))
    fields = {name: (rng.randbytes(field.width // 8) if name in ib_cm.BYTES_FIELDS
                     else rng.getrandbits(field.width))
              for name, field in ib_cm.CM_MESSAGES[kind].items()}
    return ib_cm.mad(kind, ib_cm.cm_message(kind, **fields),
                     transaction_id=rng.getrandbits(64))


def good_frame(rng, **overrides):
    """A valid GSI frame from a random host; returns ``(frame, expected record)``."""
    datagram = random_mad(rng)
    options = {"src_ip": f"10.77.0.{rng.randrange(1, 255)}", "dst_ip": ENDPOINT,
               "sport": rng.randrange(0xC000, 0x10000), "src_qp": rng.choice((1, 0xABCDEF)),
               "psn": rng.getrandbits(24), "pkey": rng.choice((0xFFFF, 0x7FFF)),
               "ttl": rng.randrange(1, 256), "tos": rng.getrandbits(8)}
    options.update(overrides)
    frame = ib_cm.gsi_frame(datagram, **options)
    return frame, (options["src_ip"], options["sport"], options["src_qp"], datagram)


def bad_frame(rng, reason):
    """A GSI frame dropped for ``reason``."""
    if reason == "length":
        datagram = random_mad(rng)
        return ib_cm.gsi_frame(datagram[:rng.choice((0, 200, 252, 255))] if rng.random() < 0.5
                               else datagram + rng.randbytes(rng.choice((1, 4, 64))),
                               src_ip=HOST, dst_ip=ENDPOINT)
    if reason == "icrc":
        frame = bytearray(good_frame(rng)[0])
        position = rng.randrange(14 + 20 + 8, len(frame))      # anywhere from the BTH on
        frame[position] ^= 1 << rng.randrange(8)
        return bytes(frame)
    if reason == "mad":
        header = bytearray(random_mad(rng))
        field, value = rng.choice([(0, 2), (1, 0x04), (2, 1), (3, 0x83), (3, 0x01)])
        header[field] = value
        return ib_cm.gsi_frame(bytes(header), src_ip=HOST, dst_ip=ENDPOINT)
    changed = {"opcode": {"opcode": rng.choice((0x04, 0x65, 0x0A))},
               "version": {"version": rng.randrange(1, 16)},
               "qp": {"dest_qp": rng.choice((0, 2, 0x100, 0xFFFFFF))},
               "pkey": {"pkey": rng.choice((0x1234, 0x8001, 0x7FFE))},
               "qkey": {"qkey": rng.choice((0, 0x80010001, 0x12345678))}}[reason]
    return good_frame(rng, **changed)[0]


def record_of(item):
    mad = item.mad.as_bits().to_bytes(MAD.length, "big")
    return str(ipaddress.IPv4Address(item.src_ip)), item.src_port, item.src_qp, mad


REASONS = Qp1Receiver.drop_reasons()


@pytest.mark.parametrize("width, gaps", [(64, False), (64, True), (16, True)])
def test_receiver_delivers_and_drops(width, gaps):
    """Good frames and frames bad for every reason, each bad one followed by a good one;
    every good one delivered in order, every bad one counted by its reason."""
    rng = random.Random(f"qp1 rx {width} {gaps}")
    sequence = []                                    # (frame, record or reason)
    for reason in [reason for reason in REASONS if reason != "busy"] * 3:
        for _ in range(rng.randrange(0, 2)):
            sequence.append(good_frame(rng))
        sequence.append((bad_frame(rng, reason), reason))
        sequence.append(good_frame(rng))
    expected = [record for _, record in sequence if not isinstance(record, str)]
    dut = Qp1Receiver(width=width)
    received = []

    async def source(ctx):
        source_gaps = random.Random(1) if gaps else None
        for frame, _ in sequence:
            meta, payload = udp_delivery(frame)
            await put_packet(ctx, dut.i, payload, meta, width=width, gaps=source_gaps)
            # Time for the consumer to take the record before the next last beat.
            for _ in range(12):
                await ctx.tick()

    async def sink(ctx):
        sink_gaps = random.Random(2) if gaps else None
        while True:
            received.append(record_of(await get_item(ctx, dut.o, gaps=sink_gaps)))

    async def check(ctx):
        await wait_for(ctx, lambda: len(received) == len(expected), 40 * len(sequence) * 10)
        await ctx.tick().repeat(50)
        assert received == expected
        counters = ctx.get(dut.o_counters)
        assert counters.received == len(expected)
        for reason in REASONS:
            wanted = sum(outcome == reason for _, outcome in sequence)
            assert counters[reason] == wanted, (reason, counters[reason], wanted)

    run_testbenches(dut, check, source, sink)


def test_receiver_queues_while_the_record_is_held():
    """Good frames back to back while the consumer holds off: one waits in the record and
    ``queue`` more in the queue, the rest are dropped as busy; once the consumer takes
    them, the queued ones follow in order, and a later one is delivered."""
    rng = random.Random("busy")
    held = [good_frame(rng) for _ in range(5)]
    later = good_frame(rng)
    dut = Qp1Receiver(width=64, queue=2)
    received = []

    async def source(ctx):
        for frame, _ in held:
            meta, payload = udp_delivery(frame)
            await put_packet(ctx, dut.i, payload, meta, width=64)
        await ctx.tick().repeat(20)
        for _ in range(3):
            received.append(record_of(await get_item(ctx, dut.o)))
        meta, payload = udp_delivery(later[0])
        await put_packet(ctx, dut.i, payload, meta, width=64)
        received.append(record_of(await get_item(ctx, dut.o)))

    async def check(ctx):
        await wait_for(ctx, lambda: len(received) == 4, 500)
        assert received == [record for _, record in held[:3]] + [later[1]]
        counters = ctx.get(dut.o_counters)
        assert (counters.received, counters.busy) == (4, 2)

    run_testbenches(dut, check, source)


def test_receiver_latency():
    """The record is offered after the fourth clock edge after the one that takes the
    datagram's last beat from the queue, which passes the datagram's first beat on two
    cycles after its last is in and the others one a cycle."""
    rng = random.Random("latency")
    frame, record = good_frame(rng)
    dut = Qp1Receiver(width=64)

    async def testbench(ctx):
        meta, payload = udp_delivery(frame)
        await put_packet(ctx, dut.i, payload, meta, width=64)
        edges = 0
        while not ctx.get(dut.o.valid):
            await ctx.tick()
            edges += 1
        assert edges == 2 + (beats_for(GSI_PAYLOAD_BYTES, 64) - 1) + 4
        assert record_of(ctx.get(dut.o.p)) == record

    run_testbenches(dut, testbench)


class TransmitPath(wiring.Component):
    """QP1's transmitter through UDP, IPv4 and the ICRC inserter, as in the core."""

    def __init__(self, width):
        self._width = width
        super().__init__({
            "i": In(stream.Signature(QP1_SEND)),
            "i_tos": In(8),
            "i_config": In(NetworkConfig),
            "o": Out(packet_signature(NEXT_HOP_META, width=width)),
        })

    def elaborate(self, platform):
        m = Module()
        width = self._width
        m.submodules.qp1 = qp1 = Qp1Transmitter(width=width)
        m.submodules.udp = udp = UdpTransmitter(width=width)
        m.submodules.ip = ip = IPv4Transmitter(width=width)
        m.submodules.icrc = icrc = IcrcInserter(width=width)
        connect(m, flipped(self.i), qp1.i)
        connect(m, qp1.o, udp.i)
        connect(m, udp.o, ip.i)
        connect(m, ip.o, icrc.i)
        connect(m, icrc.o, flipped(self.o))
        m.d.comb += [qp1.i_tos.eq(self.i_tos), ip.i_config.eq(self.i_config)]
        return m


@pytest.mark.parametrize("gaps", [False, True])
def test_transmitter_frames_with_icrc(gaps):
    """Records with random MADs, flows, QPs and addresses: each comes out as the IPv4
    packet the model frames for it (BTH, DETH, MAD; the PSN counting), UDP source port in
    0xC000-0xFFFF, and an ICRC that Scapy computes the same."""
    rng = random.Random(f"qp1 tx {gaps}")
    records = [{"dst_ip": f"10.77.0.{rng.randrange(1, 255)}", "dest_qp": rng.choice((1, 7)),
                "flow": rng.getrandbits(14), "mad": random_mad(rng)} for _ in range(12)]
    dut = TransmitPath(64)
    received = []

    async def source(ctx):
        ctx.set(dut.i_config, config_value(mac="02:00:00:00:00:02", ip=ENDPOINT))
        ctx.set(dut.i_tos, 0x6A)
        await ctx.tick()                # the address holds for packets from the next cycle
        source_gaps = random.Random(1) if gaps else None
        for record in records:
            await put_item(ctx, dut.i, {
                "dst_ip": int(ipaddress.IPv4Address(record["dst_ip"])),
                "dest_qp": record["dest_qp"], "flow": record["flow"],
                "mad": data.Const(MAD, int.from_bytes(record["mad"], "big"))}, gaps=source_gaps)

    async def sink(ctx):
        sink_gaps = random.Random(2) if gaps else None
        while True:
            received.append(await get_packet(ctx, dut.o, width=64, gaps=sink_gaps))

    async def check(ctx):
        await wait_for(ctx, lambda: len(received) == len(records), 5000)
        await ctx.tick().repeat(30)
        assert len(received) == len(records)
        for psn, (record, (packet, meta)) in enumerate(zip(records, received, strict=True)):
            frame = bytes(Ether(src="02:00:00:00:00:02", dst="02:00:00:00:00:01",
                                 type=0x0800)) + packet
            parsed = ib_cm.parse_gsi_frame(frame)
            assert parsed.icrc_ok, psn
            assert (parsed.src_ip, parsed.dst_ip, parsed.dport) == (ENDPOINT, record["dst_ip"],
                                                                     4791)
            assert parsed.sport == 0xC000 | record["flow"]
            assert IP(packet).tos == 0x6A and len(packet) == 20 + 8 + GSI_PAYLOAD_BYTES
            expected = ib_cm.gsi_frame(record["mad"], src_ip=ENDPOINT, dst_ip=record["dst_ip"],
                                       dest_qp=record["dest_qp"], psn=psn)
            assert packet[28:-4] == expected[14 + 28:-4], psn           # BTH, DETH, MAD
            assert meta.dst_ip == int(ipaddress.IPv4Address(record["dst_ip"]))

    run_testbenches(dut, check, source, sink)


@pytest.mark.parametrize("gaps", [False, True])
def test_split_by_destination_qp(gaps):
    """Datagrams of UDP 4791 for QP1 and for other QPs (and one too short for a BTH),
    mixed: each comes out whole, in order, on its side."""
    rng = random.Random(f"split {gaps}")
    frames = []
    for _ in range(30):
        kind = rng.choice(("qp1", "other", "other"))
        if kind == "qp1":
            frames.append((good_frame(rng)[0], "qp1"))
        else:
            frames.append((bytes(Ether() / IP(src=HOST, dst=ENDPOINT) /
                                 UDP(sport=0xC000, dport=4791) /
                                 BTH(opcode=0x11, dqpn=rng.choice((0, 2, 0x101, 0x10000)))
                                 / Raw(rng.randbytes(rng.choice((4, 16, 100))))), "other"))
    frames.append((bytes(Ether() / IP(src=HOST, dst=ENDPOINT) / UDP(sport=1, dport=4791) /
                         Raw(b"\x11\x00\xff\xff\x00\x00\x00\x02")), "other"))
    expected = {side: [udp_delivery(frame)[1] for frame, to in frames if to == side]
                for side in ("qp1", "other")}
    dut = Qp1Split(width=64)
    received = {"qp1": [], "other": []}

    async def source(ctx):
        source_gaps = random.Random(1) if gaps else None
        for frame, _ in frames:
            meta, payload = udp_delivery(frame)
            await put_packet(ctx, dut.i, payload, meta, width=64, gaps=source_gaps)

    def sink(side, port, seed):
        async def testbench(ctx):
            sink_gaps = random.Random(seed) if gaps else None
            while True:
                received[side].append((await get_packet(ctx, port, width=64,
                                                        gaps=sink_gaps))[0])
        return testbench

    async def check(ctx):
        await wait_for(ctx, lambda: all(len(received[side]) == len(expected[side])
                                        for side in expected), 5000)
        await ctx.tick().repeat(20)
        assert received == expected

    run_testbenches(dut, check, source, sink("qp1", dut.o_qp1, 2),
                    sink("other", dut.o_other, 3))
