"""Transmit bus efficiency: beats the UDP → IPv4 → Ethernet path emits for
back-to-back frames, against the minimum (each frame's bytes over 64-byte
beats), with the MAC side always ready. Prints a table and writes it to
``docs/generated/bench/tx_efficiency.md``; ``make bench``."""

import sys

from amaranth import *
from amaranth.lib.wiring import connect
from amaranth.sim import Simulator

from gateware.config import config_value
from gateware.eth.tx import EthernetTransmitter
from gateware.headers import ETHERTYPE_IPV4
from gateware.ip.tx import IPv4Transmitter
from gateware.stream import BEAT_BYTES, beats_for
from gateware.udp.tx import UdpTransmitter
from sim.bench import report
from sim.bench.report import Column, Table

HEADERS = 14 + 20 + 8
FRAMES = 12


def measure(payload_length: int) -> tuple[int, int]:
    """(cycles from the first output beat to the last, minimum beats) for FRAMES frames."""
    m = Module()
    m.submodules.udp = udp = UdpTransmitter()
    m.submodules.ip = ip = IPv4Transmitter()
    m.submodules.eth = eth = EthernetTransmitter()
    config = config_value(mac="02:00:00:00:00:02", ip="10.77.0.2")
    connect(m, udp.o, ip.i)
    m.d.comb += [ip.i_config.eq(config), eth.i_config.eq(config), eth.o.ready.eq(1)]
    # In the core the ARP layer sits here; the benchmark gives every packet a known MAC.
    m.d.comb += [
        eth.i.valid.eq(ip.o.valid), ip.o.ready.eq(eth.i.ready),
        eth.i.p.data.eq(ip.o.p.data), eth.i.p.keep.eq(ip.o.p.keep),
        eth.i.p.last.eq(ip.o.p.last),
        eth.i.p.meta.dst_mac.eq(0x525400123456), eth.i.p.meta.ethertype.eq(ETHERTYPE_IPV4),
    ]
    beats = [(index == beats_for(payload_length) - 1,
              (1 << min(BEAT_BYTES, payload_length - BEAT_BYTES * index)) - 1)
             for index in range(beats_for(payload_length))]
    frame_length = max(60, HEADERS + payload_length)
    minimum = FRAMES * beats_for(frame_length)
    seen = {"first": None, "last": None, "beats": 0}

    async def source(ctx):
        ctx.set(udp.i.p.meta, {"dst_ip": 0x0A4D0001, "src_port": 0xC000, "dst_port": 4791,
                               "length": payload_length, "tos": 2})
        ctx.set(udp.i.valid, 1)
        for _ in range(FRAMES):
            for last, keep in beats:
                ctx.set(udp.i.p.last, last)
                ctx.set(udp.i.p.keep, keep)
                await ctx.tick().until(udp.i.ready)
        ctx.set(udp.i.valid, 0)

    async def sink(ctx):
        cycle = 0
        async for _, _, valid, last in ctx.tick().sample(eth.o.valid, eth.o.p.last):
            if valid:
                seen["first"] = cycle if seen["first"] is None else seen["first"]
                seen["beats"] += 1
                if last:
                    seen["last"] = cycle
            cycle += 1

    sim = Simulator(m)
    sim.add_clock(1e-9)
    sim.add_testbench(sink, background=True)
    sim.add_testbench(source)
    sim.run_until(1e-9 * (minimum * 3 + 50))
    return seen["last"] - seen["first"] + 1, minimum


def main() -> int:
    origin = report.provenance()
    table = Table("efficiency", [
        Column("payload", "UDP payload"), Column("frame", "frame"),
        Column("beats_per_frame", "beats/frame"), Column("cycles", "cycles"),
        Column("minimum", "minimum"), Column("efficiency", "efficiency", ".1%"),
        Column("idle", "idle")],
        caption=f"Beats emitted by the UDP → IPv4 → Ethernet path for {FRAMES} back-to-back "
                "frames, against the minimum, sink always ready:",
        note="Idle: cycles without a beat between the first and the last.")
    print(table.header())
    for payload in (18, 22, 23, 86, 87, 982, 1472, 4096, 8972):
        cycles, minimum = measure(payload)
        print(table.add({"payload": payload, "frame": max(60, HEADERS + payload),
                         "beats_per_frame": minimum // FRAMES, "cycles": cycles,
                         "minimum": minimum, "efficiency": minimum / cycles,
                         "idle": cycles - minimum}))
    print(f"{FRAMES} back-to-back frames per row, sink always ready; "
          f"idle = cycles without a beat between the first and the last.")
    report.write("tx_efficiency", [table], origin=origin)
    return 0 if min(row["efficiency"] for row in table.rows) == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
