# amaranth: UnusedElaboratable=no
"""Link bring-up against a behavioural model of the CMAC's receive status: a peer that
starts late, a cable pulled and put back, a peer signalling remote fault; the RS-FEC
status; the QSFP28 module's reset and low-power sequence. Timers are short."""

import pytest
from amaranth import *

from boards.cmac_link import CmacLink
from boards.link_recovery import RxResetWatchdog
from boards.qsfp_module import QsfpModule
from tests.gateware.streams import put_packet, run_testbenches, wait_for

WIDTH = 8
INTERVAL = 40      # cycles between receiver resets while not aligned
LOCK = 7           # cycles from a receiver reset (with a signal) to alignment


class CmacStatusModel:
    """What the CMAC's receive status does, as far as bring-up is concerned.

    With a signal from the peer (``signal``), the receiver aligns ``LOCK``
    cycles after a GT receive datapath reset that came while the signal was
    there; a receiver that was last reset without a signal (its power-on
    reset, before the peer sends) stays unaligned. Alignment goes with the
    signal. While aligned, ``stat_rx_remote_fault`` is high while the peer
    does not receive us (``peer_fault``). ``resets`` counts the datapath
    resets seen.
    """

    def __init__(self, *, signal=False, peer_fault=False):
        self.signal = signal
        self.peer_fault = peer_fault
        self.resets = 0

    def testbench(self, bench):
        """The model on ``LinkBench``'s signals."""
        return self.drive(reset=bench.watchdog.o_reset, aligned=bench.aligned,
                          remote_fault=bench.remote_fault)

    def drive(self, *, reset, aligned, remote_fault, domain="sync"):
        """A testbench that reads the datapath ``reset`` and drives ``aligned`` and
        ``remote_fault`` in ``domain`` (the domain of ``reset``)."""
        async def run(ctx):
            locking = None
            async for _, _, pulse in ctx.tick(domain).sample(reset):
                self.resets += pulse
                if not self.signal:
                    locking = None
                    ctx.set(aligned, 0)
                elif pulse:
                    locking = LOCK
                    ctx.set(aligned, 0)
                elif locking is not None:
                    locking -= 1
                    if locking == 0:
                        ctx.set(aligned, 1)
                        locking = None
                ctx.set(remote_fault, ctx.get(aligned) and self.peer_fault)
        return run


class LinkBench(Elaboratable):
    """The board top's link pieces in one domain: the watchdog resets the receiver the
    model plays; CmacLink reads the model's status."""

    def __init__(self):
        self.watchdog = RxResetWatchdog(interval=INTERVAL)
        self.link = CmacLink(width=WIDTH)
        self.aligned = Signal()
        self.remote_fault = Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.watchdog = self.watchdog
        m.submodules.link = self.link
        m.d.comb += [
            self.watchdog.i_aligned.eq(self.aligned),
            self.link.i_rx_aligned.eq(self.aligned),
            self.link.i_rx_remote_fault.eq(self.remote_fault),
            self.link.o.ready.eq(1),
        ]
        return m


def status(ctx, bench):
    value = ctx.get(bench.link.o_status)
    return {"up": value.up, "ups": value.ups, "downs": value.downs,
            "resets": ctx.get(bench.watchdog.o_resets),
            "tx_enable": ctx.get(bench.link.o_tx_enable),
            "rfi": ctx.get(bench.link.o_tx_send_rfi)}


async def cycles_until_up(ctx, bench, limit):
    for cycle in range(limit):
        if ctx.get(bench.link.o_up):
            return cycle
        await ctx.tick()
    raise AssertionError(f"the link is not up after {limit} cycles: {status(ctx, bench)}")


async def frame_passes(ctx, bench):
    """Offer one frame; True if it went to the CMAC, False if it was dropped."""
    dropped = ctx.get(bench.link.o_dropped)
    await put_packet(ctx, bench.link.i, bytes(range(20)), {}, width=WIDTH)
    return ctx.get(bench.link.o_dropped) == dropped


def test_late_peer():
    """The peer's signal arrives after the receiver's reset: the watchdog resets the receiver
    every INTERVAL until it aligns, then never again; RFI until aligned, TX after."""
    bench = LinkBench()
    model = CmacStatusModel()

    async def testbench(ctx):
        await ctx.tick().repeat(3 * INTERVAL + 5)
        assert status(ctx, bench) == {"up": 0, "ups": 0, "downs": 0, "resets": 3,
                                      "tx_enable": 0, "rfi": 1}
        assert not await frame_passes(ctx, bench)
        model.signal = True
        waited = await cycles_until_up(ctx, bench, 2 * INTERVAL)
        assert waited <= INTERVAL + LOCK + 3
        assert status(ctx, bench) == {"up": 1, "ups": 1, "downs": 0, "resets": 4,
                                      "tx_enable": 1, "rfi": 0}
        assert await frame_passes(ctx, bench)
        await ctx.tick().repeat(5 * INTERVAL)
        assert status(ctx, bench)["resets"] == 4, "an aligned receiver was reset"

    run_testbenches(bench, testbench, model.testbench(bench))


def test_cable_pulled_and_put_back():
    """Alignment lost: down (counted), frames dropped, the watchdog resets the receiver again;
    the signal back: up again after the next reset, frames pass."""
    bench = LinkBench()
    model = CmacStatusModel(signal=True)

    async def testbench(ctx):
        await cycles_until_up(ctx, bench, 2 * INTERVAL)
        assert await frame_passes(ctx, bench)
        model.signal = False
        await ctx.tick().repeat(3)
        assert status(ctx, bench) == {"up": 0, "ups": 1, "downs": 1, "resets": 1,
                                      "tx_enable": 0, "rfi": 1}
        assert not await frame_passes(ctx, bench)
        await ctx.tick().repeat(2 * INTERVAL + 5)
        assert status(ctx, bench)["resets"] == 3
        model.signal = True
        await cycles_until_up(ctx, bench, 2 * INTERVAL)
        assert status(ctx, bench) == {"up": 1, "ups": 2, "downs": 1, "resets": 4,
                                      "tx_enable": 1, "rfi": 0}
        assert await frame_passes(ctx, bench)

    run_testbenches(bench, testbench, model.testbench(bench))


def test_remote_fault_holds_the_transmitter():
    """Aligned while the peer signals remote fault: RFI stops (we receive the peer) but TX
    stays off and frames are dropped; the receiver is not reset. TX once the fault goes,
    off again (a down counted) when it returns."""
    bench = LinkBench()
    model = CmacStatusModel(signal=True, peer_fault=True)

    async def testbench(ctx):
        await wait_for(ctx, lambda: ctx.get(bench.aligned), 2 * INTERVAL)
        await ctx.tick().repeat(3 * INTERVAL)
        assert status(ctx, bench) == {"up": 0, "ups": 0, "downs": 0, "resets": 1,
                                      "tx_enable": 0, "rfi": 0}
        assert not await frame_passes(ctx, bench)
        model.peer_fault = False
        await cycles_until_up(ctx, bench, 5)
        assert await frame_passes(ctx, bench)
        model.peer_fault = True
        await ctx.tick().repeat(3)
        assert status(ctx, bench) == {"up": 0, "ups": 1, "downs": 1, "resets": 1,
                                      "tx_enable": 0, "rfi": 0}

    run_testbenches(bench, testbench, model.testbench(bench))


def test_rsfec_status():
    """Lock and alignment flags follow the CMAC's a cycle later; each corrected and
    uncorrected codeword strobe is counted."""
    dut = CmacLink(width=WIDTH)
    corrected = [1, 1, 0, 1, 0, 0, 1, 1, 1, 0]
    uncorrected = [0, 1, 0, 0, 0, 1, 0, 0, 0, 0]

    async def testbench(ctx):
        ctx.set(dut.i_rsfec_am_lock, 0b1011)
        ctx.set(dut.i_rsfec_hi_ser, 1)
        await ctx.tick()
        value = ctx.get(dut.o_status)
        assert (value.rsfec_am_lock, value.rsfec_aligned, value.rsfec_hi_ser) == (0b1011, 0, 1)
        ctx.set(dut.i_rsfec_am_lock, 0b1111)
        ctx.set(dut.i_rsfec_aligned, 1)
        ctx.set(dut.i_rsfec_hi_ser, 0)
        for good, bad in zip(corrected, uncorrected, strict=True):
            ctx.set(dut.i_rsfec_corrected, good)
            ctx.set(dut.i_rsfec_uncorrected, bad)
            await ctx.tick()
        ctx.set(dut.i_rsfec_corrected, 0)
        ctx.set(dut.i_rsfec_uncorrected, 0)
        await ctx.tick()
        value = ctx.get(dut.o_status)
        assert (value.rsfec_am_lock, value.rsfec_aligned, value.rsfec_hi_ser) == (0b1111, 1, 0)
        assert (value.rsfec_corrected, value.rsfec_uncorrected) == (sum(corrected),
                                                                    sum(uncorrected))

    run_testbenches(dut, testbench)


def test_qsfp_module_sequence():
    """Absent: reset and low power. Present: reset for RESET more cycles, then low power for
    INIT more, then high power (ready). Pulled: back to reset and low power at once."""
    reset_cycles, init_cycles = 5, 12
    dut = QsfpModule(reset_cycles=reset_cycles, init_cycles=init_cycles)
    trace = []

    async def testbench(ctx):
        await ctx.tick().repeat(4)
        ctx.set(dut.i_present, 1)
        for _ in range(reset_cycles + init_cycles + 6):
            await ctx.tick()
            trace.append((ctx.get(dut.o_reset), ctx.get(dut.o_lpmode), ctx.get(dut.o_ready)))
        ctx.set(dut.i_present, 0)
        await ctx.tick()
        assert (ctx.get(dut.o_reset), ctx.get(dut.o_lpmode), ctx.get(dut.o_ready)) == (1, 1, 0)

    async def absent(ctx):
        for _ in range(4):
            assert (ctx.get(dut.o_reset), ctx.get(dut.o_lpmode)) == (1, 1)
            await ctx.tick()

    run_testbenches(dut, testbench, absent)
    in_reset = [reset for reset, _, _ in trace].index(0)
    in_low_power = [lpmode for _, lpmode, _ in trace].index(0)
    assert in_reset >= reset_cycles
    assert in_low_power - in_reset >= init_cycles
    assert all(lpmode for reset, lpmode, _ in trace if reset), "high power before reset ended"
    assert trace[-1] == (0, 0, 1)


@pytest.mark.parametrize("make", [lambda: RxResetWatchdog(interval=1),
                                  lambda: QsfpModule(reset_cycles=0),
                                  lambda: QsfpModule(init_cycles=0)])
def test_timer_arguments_are_checked(make):
    with pytest.raises(ValueError):
        make()
