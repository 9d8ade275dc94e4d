# amaranth: UnusedElaboratable=no
"""Two ports as the two-cage top holds them (a CmacPort each, in domains of their own,
sharing ``init``), against the CMAC status model of the bring-up tests: port 2's link lost
and recovered while port 1 carries frames both ways leaves port 1's link, its frames and its
receiver alone, and port 2's core is never held up. The addresses of the two-cage top's
ports. Timers are short."""

import random

import pytest
from amaranth import *
from amaranth.sim import Simulator

from boards.cmac_port import CmacPort
from boards.vcu118_top import PORT2_ADDRESS, VCU118DualTop
from gateware.config import parse_ipv4, parse_mac
from tests.boards.test_link_bring_up import CmacStatusModel
from tests.gateware.streams import run_testbenches, to_beats

WIDTH = 8
INIT_HZ = 1000        # the watchdog resets the receiver every 750 init cycles
PERIODS = {"init": 8e-9, "cmac1": 3.1e-9, "cmac2": 3.3e-9, "sync1": 4e-9, "sync2": 4e-9}


class TwoPorts(Elaboratable):
    """Two CmacPorts, port ``n`` in ``cmac<n>`` and ``sync<n>``, both in ``init``."""

    def __init__(self):
        self.ports = [CmacPort(width=WIDTH, init_hz=INIT_HZ, cmac_hz=INIT_HZ,
                               rx_fifo_depth=16, tx_fifo_depth=8) for _ in range(2)]

    def elaborate(self, platform):
        m = Module()
        m.domains += [ClockDomain(name) for name in PERIODS]
        for n, port in enumerate(self.ports, start=1):
            m.submodules[f"port{n}"] = DomainRenamer({"cmac": f"cmac{n}", "sync": f"sync{n}"})(
                port)
            m.d.comb += port.i_present.eq(1)
        return m


def frames(seed, count):
    rng = random.Random(seed)
    return [rng.randbytes(rng.randrange(1, 5 * WIDTH)) for _ in range(count)]


async def send(ctx, stream, payloads, domain, *, valid="tvalid", ready="tready"):
    """AXI-Stream frames into ``stream``; with ``ready`` None, a stream without one."""
    for payload in payloads:
        for data, keep, last in to_beats(payload, WIDTH):
            ctx.set(stream.tdata, data)
            ctx.set(stream.tkeep, keep)
            ctx.set(stream.tlast, last)
            ctx.set(getattr(stream, valid), 1)
            if ready is None:
                await ctx.tick(domain)
            else:
                await ctx.tick(domain).until(getattr(stream, ready))
            ctx.set(getattr(stream, valid), 0)


def collector(stream, domain, into):
    """A testbench that collects the frames of ``stream`` (always ready) into ``into``."""
    async def run(ctx):
        if hasattr(stream, "tready"):
            ctx.set(stream.tready, 1)
        frame = b""
        async for _, _, valid, data, keep, last in ctx.tick(domain).sample(
                stream.tvalid, stream.tdata, stream.tkeep, stream.tlast):
            if valid:
                frame += data.to_bytes(WIDTH, "little")[:bin(keep).count("1")]
                if last:
                    into.append(frame)
                    frame = b""
    return run


def test_link_loss_on_port_2_leaves_port_1_alone():
    dut = TwoPorts()
    one, two = dut.ports
    models = [CmacStatusModel(signal=True), CmacStatusModel(signal=True)]
    received = {n: {"cmac": [], "core": []} for n in (1, 2)}
    port1_downs = []
    finished = set()

    async def up_on_both(ctx):
        for _ in range(5000):
            if ctx.get(one.o_status.up) and ctx.get(two.o_status.up):
                return
            await ctx.tick("init")
        raise AssertionError("the links did not come up")

    async def port1_monitor(ctx):
        """Port 1's link, once up, never goes down (in its own domain, every cycle)."""
        was_up = False
        async for _, _, up in ctx.tick("cmac1").sample(one.o_leds.up):
            if was_up and not up:
                port1_downs.append(up)
            was_up = was_up or up

    # Port 1 carries frames both ways throughout; port 2 before, during and after its loss.
    port1_tx, port1_rx = frames(1, 40), frames(2, 40)
    port2_before, port2_during, port2_after = frames(3, 4), frames(4, 6), frames(5, 4)

    async def scenario(ctx):
        await up_on_both(ctx)
        resets = [model.resets for model in models]
        await send(ctx, two.i_tx, port2_before, "sync2")
        await ctx.tick("init").repeat(40)
        assert received[2]["cmac"] == port2_before
        # Port 2 loses the peer's signal: its link goes down, its frames are dropped whole
        # and its core is not held up; its watchdog resets its receiver.
        models[1].signal = False
        await ctx.tick("init").repeat(10)
        assert not ctx.get(two.o_status.up)
        await send(ctx, two.i_tx, port2_during, "sync2")
        await ctx.tick("init").repeat(2000)
        status = ctx.get(two.o_status)
        assert (status.up, status.ups, status.downs) == (0, 1, 1)
        assert status.tx_dropped == len(port2_during)
        assert received[2]["cmac"] == port2_before
        assert models[1].resets >= resets[1] + 2
        # The signal back: port 2 recovers by itself.
        models[1].signal = True
        for _ in range(2000):
            if ctx.get(two.o_status.up):
                break
            await ctx.tick("init")
        await send(ctx, two.i_tx, port2_after, "sync2")
        await ctx.tick("init").repeat(40)
        status = ctx.get(two.o_status)
        assert (status.up, status.ups, status.downs) == (1, 2, 1)
        assert received[2]["cmac"] == port2_before + port2_after
        while len(finished) < 2:
            await ctx.tick("init")
        await ctx.tick("init").repeat(40)
        # Port 1 meanwhile: up throughout, no receiver reset, every frame through both ways.
        status = ctx.get(one.o_status)
        assert (status.up, status.ups, status.downs, status.tx_dropped) == (1, 1, 0, 0)
        assert models[0].resets == resets[0]
        assert received[1]["cmac"] == port1_tx
        assert received[1]["core"] == port1_rx
        assert port1_downs == []
        finished.add("scenario")

    async def port1_transmit(ctx):
        await up_on_both(ctx)
        for payload in port1_tx:
            await send(ctx, one.i_tx, [payload], "sync1")
            await ctx.tick("sync1").repeat(100)
        finished.add("transmit")

    async def port1_receive(ctx):
        await up_on_both(ctx)
        for payload in port1_rx:
            await send(ctx, one.cmac.rx, [payload], "cmac1", ready=None)
            await ctx.tick("cmac1").repeat(150)
        finished.add("receive")

    sim = Simulator(dut)
    for domain, period in PERIODS.items():
        sim.add_clock(period, domain=domain)
    for n, (port, model) in enumerate(zip(dut.ports, models, strict=True), start=1):
        sim.add_testbench(model.drive(reset=port.cmac.rx_datapath_reset,
                                      aligned=port.cmac.rx_aligned,
                                      remote_fault=port.cmac.rx_remote_fault, domain="init"),
                          background=True)
        sim.add_testbench(collector(port.cmac.tx, f"cmac{n}", received[n]["cmac"]),
                          background=True)
        sim.add_testbench(collector(port.o_rx, f"sync{n}", received[n]["core"]),
                          background=True)
    sim.add_testbench(port1_monitor, background=True)
    for testbench in (port1_transmit, port1_receive, scenario):
        sim.add_testbench(testbench)
    # A core held up by the other port would hang the run: it has a deadline instead.
    sim.run_until(200e-6)
    assert finished == {"transmit", "receive", "scenario"}


def test_each_port_has_its_own_addresses():
    """The switches add to both ports' addresses; port 2's defaults differ from port 1's
    (the core's) and can be given."""
    for port2, expected in [(None, PORT2_ADDRESS),
                            ({"ip": "192.168.7.10"}, {**PORT2_ADDRESS, "ip": "192.168.7.10"})]:
        top = VCU118DualTop(qps=2, retransmit_beats=128, retransmit_pages=4, messages=8,
                            message_slots=16, port2=port2)
        switches = 0b0101
        written = []

        async def testbench(ctx, top=top, written=written, switches=switches):
            for address in (top.port1.address, top.port2.address):
                ctx.set(address.i_switches, switches)
                ctx.set(address.o_config.ready, 1)
            for _ in range(20):
                for address in (top.port1.address, top.port2.address):
                    if ctx.get(address.o_config.valid):
                        written.append(ctx.get(address.o_config.payload))
                await ctx.tick()

        class Both(Elaboratable):
            def elaborate(self, platform, top=top):
                m = Module()
                m.submodules.one = top.port1.address
                m.submodules.two = top.port2.address
                return m

        run_testbenches(Both(), testbench)
        assert [(config.mac, config.ip) for config in written] == [
            (parse_mac("02:00:00:00:00:02") + switches, parse_ipv4("10.77.0.2") + switches),
            (parse_mac(expected["mac"]) + switches, parse_ipv4(expected["ip"]) + switches)]


def test_port_timers_are_checked():
    for arguments in ({"init_hz": 999}, {"cmac_hz": 19}):
        with pytest.raises(ValueError, match=next(iter(arguments))):
            CmacPort(**arguments)
