"""PAUSE and PFC frames through the Ethernet receiver into the MAC-control block.

The frames come from sim/models/pause.py: Scapy's ``Ether(type=0x8808)`` with the opcode and
times packed by ``struct`` (Scapy has no PFC layer).
The timers are checked against the durations computed here from the quanta and the
cycles per quantum, to the cycle.
"""

import math

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from gateware.config import NetworkConfig, config_value
from gateware.eth.mac_control import (
    PAUSE_CONFIG,
    QUANTUM_FRACTION_BITS,
    MacControl,
    quantum_cycles_at,
)
from gateware.eth.rx import EthernetReceiver
from gateware.stream import NO_META, packet_signature
from sim.models.pause import pause_frame, pfc_frame

from .streams import run_testbenches, to_beats

OUR_MAC = "02:00:00:00:00:02"
PEER_MAC = "52:54:00:12:34:56"
WIDTH = 64

#: 1.5 cycles a quantum (8.8 fixed point).
QUANTUM = 0x0180


def cycles(quanta, quantum=QUANTUM):
    return math.ceil(quanta * quantum / (1 << QUANTUM_FRACTION_BITS))


class PauseReceiver(wiring.Component):
    """The receiver and the MAC-control block as the core joins them."""

    def __init__(self):
        super().__init__({
            "i": In(packet_signature(NO_META, width=WIDTH, always_ready=True)),
            "i_error": In(1),
            "i_config": In(NetworkConfig),
            "i_pause_config": In(PAUSE_CONFIG),
            "o_pause_all": Out(1),
            "o_pause_roce": Out(1),
            "o_rx_counters": Out(EthernetReceiver.counters_layout()),
            "o_counters": Out(MacControl.counters_layout()),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.rx = rx = EthernetReceiver(depth=32, width=WIDTH)
        m.submodules.control = control = MacControl(width=WIDTH)
        connect(m, flipped(self.i), rx.i)
        connect(m, rx.o_mac_control, control.i)
        m.d.comb += [
            rx.i_error.eq(self.i_error),
            rx.i_config.eq(self.i_config),
            rx.o_arp.ready.eq(1),
            rx.o_ipv4.ready.eq(1),
            control.i_config.eq(self.i_pause_config),
            self.o_pause_all.eq(control.o_pause_all),
            self.o_pause_roce.eq(control.o_pause_roce),
            self.o_rx_counters.eq(rx.o_counters),
            self.o_counters.eq(control.o_counters),
        ]
        return m


class Bench:
    """Sends frames and records, per cycle, the two pause outputs."""

    def __init__(self):
        self.dut = PauseReceiver()
        self.cycle = 0
        self.trace = []             # (all, roce) per cycle

    async def setup(self, ctx, *, roce_priority=3, quantum=QUANTUM):
        ctx.set(self.dut.i_config, config_value(mac=OUR_MAC, ip="10.77.0.2"))
        ctx.set(self.dut.i_pause_config, {"roce_priority": roce_priority,
                                          "quantum_cycles": quantum})

    async def tick(self, ctx, count=1):
        for _ in range(count):
            await ctx.tick()
            self.cycle += 1
            self.trace.append((ctx.get(self.dut.o_pause_all), ctx.get(self.dut.o_pause_roce)))

    async def send(self, ctx, frame, *, error=False):
        """One frame, a beat a cycle; returns the cycle of its last beat."""
        beats = to_beats(frame, WIDTH)
        for index, (beat, keep, last) in enumerate(beats):
            ctx.set(self.dut.i.valid, 1)
            ctx.set(self.dut.i.payload, {"data": beat, "keep": keep, "last": last})
            ctx.set(self.dut.i_error, error and index == len(beats) - 1)
            await self.tick(ctx)
        ctx.set(self.dut.i.valid, 0)
        ctx.set(self.dut.i_error, 0)
        return self.cycle

    def runs(self, which):
        """``(first, end)`` cycles of each run of the output (0: all, 1: roce) being high."""
        result, start = [], None
        for cycle, values in enumerate(self.trace, 1):
            if values[which] and start is None:
                start = cycle
            elif not values[which] and start is not None:
                result.append((start, cycle))
                start = None
        if start is not None:
            result.append((start, None))
        return result


def run(body):
    bench = Bench()

    async def testbench(ctx):
        await body(ctx, bench)

    run_testbenches(bench.dut, testbench)
    return bench


def test_quantum_cycles_at_the_cmac_clock():
    # 512 bits at 100 Gb/s: 5.12 ns, 1.65 cycles of 322.265625 MHz, rounded up in 8.8.
    assert quantum_cycles_at(322_265_625) == math.ceil(1.65 * 256)
    assert quantum_cycles_at(156_250_000, 10e9) == 8 << QUANTUM_FRACTION_BITS


def test_pause_holds_everything_for_its_quanta():
    async def body(ctx, bench):
        await bench.setup(ctx)
        last = await bench.send(ctx, pause_frame(100))
        await bench.tick(ctx, 200)
        bench.last = last
        bench.counters = ctx.get(bench.dut.o_counters)

    bench = run(body)
    (start, end), = bench.runs(0)
    assert bench.runs(1) == [(start, end)], "a PAUSE pauses RoCEv2 frames too"
    assert end - start == cycles(100) == 150
    latency = start - bench.last
    assert 1 <= latency <= 8, f"the pause started {latency} cycles after the frame"
    counters = bench.counters
    assert (counters.pause, counters.pfc, counters.other) == (1, 0, 0)
    assert counters.paused_cycles == 150


def test_a_new_pause_refreshes_and_quanta_0_resumes_at_once():
    async def body(ctx, bench):
        await bench.setup(ctx)
        bench.first = await bench.send(ctx, pause_frame(100))
        await bench.tick(ctx, 50)
        bench.refresh = await bench.send(ctx, pause_frame(100, dst=OUR_MAC))   # ours: taken too
        await bench.tick(ctx, 200)
        bench.long = await bench.send(ctx, pause_frame(0xFFFF))
        await bench.tick(ctx, 40)
        bench.resume = await bench.send(ctx, pause_frame(0))
        await bench.tick(ctx, 20)
        bench.counters = ctx.get(bench.dut.o_counters)

    bench = run(body)
    (start, end), (long_start, long_end) = bench.runs(0)
    latency = start - bench.first
    assert end == bench.refresh + latency + cycles(100), "the second PAUSE set the time anew"
    assert long_start == bench.long + latency
    assert long_end == bench.resume + latency, "quanta 0 ends the pause as soon as it is in"
    assert bench.counters.pause == 4


def test_pfc_pauses_only_the_roce_priority():
    times = [10 * (priority + 1) for priority in range(8)]

    async def body(ctx, bench):
        await bench.setup(ctx)
        bench.ours = await bench.send(ctx, pfc_frame(1 << 3, times))
        await bench.tick(ctx, 100)
        # Other priorities enabled, ours not (its time set): nothing pauses.
        await bench.send(ctx, pfc_frame(0xFF & ~(1 << 3), [0xFFFF] * 8))
        await bench.tick(ctx, 100)
        # Every priority at once, ours with quanta 0: no pause either.
        await bench.send(ctx, pfc_frame(0xFF, [0xFFFF] * 3 + [0] + [0xFFFF] * 4))
        await bench.tick(ctx, 20)
        # The RoCE priority set to 5 at run time: priority 5's time counts.
        await bench.setup(ctx, roce_priority=5)
        bench.five = await bench.send(ctx, pfc_frame(1 << 5 | 1 << 3, times))
        await bench.tick(ctx, 100)
        bench.counters = ctx.get(bench.dut.o_counters)

    bench = run(body)
    assert bench.runs(0) == [], "a PFC never pauses every frame"
    (start, end), (five_start, five_end) = bench.runs(1)
    latency = start - bench.ours
    assert 1 <= latency <= 8
    assert end - start == cycles(times[3])
    assert five_start == bench.five + latency and five_end - five_start == cycles(times[5])
    assert (bench.counters.pfc, bench.counters.pause) == (4, 0)


def test_bad_frames_pause_nothing_and_are_counted():
    async def body(ctx, bench):
        await bench.setup(ctx)
        await bench.send(ctx, pause_frame(100, dst=PEER_MAC))              # not for us
        await bench.send(ctx, pause_frame(100, dst="ff:ff:ff:ff:ff:ff"))   # broadcast
        await bench.send(ctx, pause_frame(100), error=True)                # bad FCS
        await bench.send(ctx, pause_frame(100)[:59])                       # runt
        await bench.send(ctx, pause_frame(100, opcode=0x0002))             # another opcode
        await bench.send(ctx, pfc_frame(1 << 3, [0] * 8)[:18] + bytes(41))  # runt PFC
        await bench.tick(ctx, 30)
        bench.rx = ctx.get(bench.dut.o_rx_counters)
        bench.counters = ctx.get(bench.dut.o_counters)
        # And the next good frame is taken.
        bench.good = await bench.send(ctx, pause_frame(20))
        await bench.tick(ctx, 50)
        bench.after = ctx.get(bench.dut.o_counters)

    bench = run(body)
    (start, end), = bench.runs(0)
    assert start > bench.good and end - start == cycles(20), "only the good PAUSE paused"
    assert (bench.rx.address, bench.rx.mac_error, bench.rx.runt) == (2, 1, 2)
    assert (bench.counters.pause, bench.counters.pfc, bench.counters.other) == (0, 0, 1)
    assert bench.counters.paused_cycles == 0
    assert bench.after.pause == 1
