"""TimerSweep on its own, its QP state in a Python model read as the engine's memories
are (address registered, data a cycle later), written as the engine's parts write it:
every verdict is one the model agrees with, every timer that runs out is found within a
scan of the rows and a few cycles per other candidate, a QP whose hint says its timer runs
later is not checked again, and a verdict that waits holds the sweep without losing the
QP behind it."""

import random

import pytest

from gateware.roce.deadline_scan import SCAN_LANES, scan_lanes, scan_rows
from gateware.roce.timer_sweep import TimerSweep
from gateware.roce.timers import rnr_delay_ticks

from .streams import run_testbenches

#: Cycles from a timer's time, or from the end of the scan's pass that finds it, to its
#: verdict: the row read, its candidates registered, one picked, the state read, the
#: verdict.
LATENCY = 5


def idle_qp(**state):
    return {"una": 0, "nxt": 0, "start": 0, "rnr_code": 0, "sent_time": 0, "timeout": 0,
            "error": 0, "rnr_wait": 0, "from_sent": 0, **state}


def expired(qp, now):
    """The model: IBTA 9.7.6.1.3's ACK timeout, or table 45's RNR wait."""
    if qp["error"]:
        return False
    if qp["rnr_wait"]:
        return now - qp["start"] >= rnr_delay_ticks(qp["rnr_code"])
    started = qp["sent_time"] if qp["from_sent"] else qp["start"]
    return qp["una"] != qp["nxt"] and qp["timeout"] != 0 and now - started >= 1 << qp["timeout"]


class Harness:
    """Drives a TimerSweep from a model of every QP's state: the memories and flags read
    at the address the sweep gave a cycle before, and the writes of the engine's parts,
    each shown on the ports its writer drives and taking effect at the end of its cycle.
    Counts the cycles the sweep reads a QP that is not the one it read the cycle before
    (``reads``)."""

    def __init__(self, dut, qps):
        self.dut, self.qps, self.address, self.reads = dut, qps, 0, 0
        self.writes = {}

    def show(self, ctx, now):
        dut, qp = self.dut, self.qps[self.address]
        ctx.set(dut.i_now, now)
        ctx.set(dut.r_una.data, qp["una"])
        ctx.set(dut.r_nxt.data, qp["nxt"])
        ctx.set(dut.r_timer.data, {"start": qp["start"], "rnr_code": qp["rnr_code"]})
        ctx.set(dut.r_sent_time.data, qp["sent_time"])
        ctx.set(dut.r_peer.data, {"timeout": qp["timeout"]})
        ctx.set(dut.r_flags.data, {name: qp[name] for name in ("error", "rnr_wait", "from_sent")})

    def write(self, ctx, qp, state, *ports):
        """A part writes ``state`` to a QP this cycle, shown on ``ports``."""
        self.writes.setdefault(qp, {}).update(state)
        for port in ports:
            ctx.set(port.valid, 1)
            ctx.set(port.p, qp)

    def send(self, ctx, qp, now):
        """A new packet of the QP sent: it starts the ACK timer if none was outstanding."""
        state = self.qps[qp]
        if state["una"] == state["nxt"]:
            self.write(ctx, qp, {"nxt": state["nxt"] + 1, "sent_time": now, "from_sent": 1},
                       self.dut.i_sent, self.dut.i_timer_from_sent)
        else:
            self.write(ctx, qp, {"nxt": state["nxt"] + 1}, self.dut.i_sent)

    def step(self, ctx):
        address = ctx.get(self.dut.r_una.addr)
        self.reads += address != self.address
        self.address = address
        for reader in (self.dut.r_nxt, self.dut.r_timer, self.dut.r_sent_time,
                       self.dut.r_peer, self.dut.r_flags):
            assert ctx.get(reader.addr) == self.address

    def after_tick(self, ctx):
        dut = self.dut
        for port in (dut.i_busy, dut.i_reset, dut.i_sent, dut.i_timer_from_sent):
            ctx.set(port.valid, 0)
        ctx.set(dut.o_expired.ready, 0)
        for qp, state in self.writes.items():
            self.qps[qp].update(state)
        self.writes = {}


def test_lanes():
    """A row holds up to :data:`SCAN_LANES` QPs and the scan has two rows at least
    (one for one QP); other lane counts are refused."""
    assert [scan_lanes(qps) for qps in (1, 2, 16, 17, 64, 65, 4096)] == [
        1, 1, 8, 16, 32, SCAN_LANES, SCAN_LANES]
    for lanes in (0, 3, 32, 64):
        with pytest.raises(ValueError, match="Lanes must be a power of two up to 16"):
            TimerSweep(qps=20, lanes=lanes)


@pytest.mark.parametrize(("qps", "lanes"), [(8, None), (40, 2), (3, 1)])
def test_every_verdict_agrees_with_the_model_and_every_expiry_is_found(qps, lanes):
    """The engine's parts write the QPs' state at random: packets sent (the first of
    several outstanding starts the timer), the handler's work (progress, an RNR wait,
    a restart, a failure), resets. Every verdict offered is an expired timer in the
    model, and each is taken, at random; a QP whose timer runs out is offered within a
    pass of the scan and 5 cycles, plus the cycles verdicts waited: a cycle for each
    row, and for each candidate on the way up to three (checked; offered, taken, and
    the QP checked behind it checked again), the QPs of its own row perhaps twice."""
    dut = TimerSweep(qps=qps, lanes=lanes)
    rng = random.Random(5)
    model = [idle_qp() for _ in range(qps)]
    harness = Harness(dut, model)
    verdicts = []
    bound = scan_rows(qps, lanes) + 3 * (qps + (lanes or scan_lanes(qps))) + LATENCY

    async def main(ctx):
        now = 100
        expired_since = {}          # QP → the cycle it was found expired in the model
        waited = 0                  # cycles a verdict waited, so far
        for cycle in range(6000):
            for qp in range(qps):
                if expired(model[qp], now):
                    since = expired_since.setdefault(qp, (cycle, waited))
                    assert cycle - since[0] - (waited - since[1]) <= bound, (cycle, qp, since)
            if rng.random() < 0.3:
                qp = rng.randrange(qps)
                action = rng.choice(["send", "send", "handler", "reset"])
                if action == "send":
                    harness.send(ctx, qp, now)
                elif action == "handler":
                    state = model[qp]
                    harness.write(ctx, qp, rng.choice([
                        {"una": rng.randint(state["una"], state["nxt"]), "start": now,
                         "from_sent": 0, "rnr_wait": 0},
                        {"start": now, "rnr_code": rng.randrange(1, 3), "rnr_wait": 1,
                         "from_sent": 0},
                        {"start": now, "rnr_wait": 0, "from_sent": 0},
                        {"error": 1, "rnr_wait": 0}]), dut.i_busy)
                else:
                    harness.write(ctx, qp, idle_qp(timeout=rng.choice([0, 2, 3, 4]),
                                                   una=5, nxt=5), dut.i_reset)
                expired_since.pop(qp, None)
            harness.show(ctx, now)
            if ctx.get(dut.o_expired.valid):
                qp = ctx.get(dut.o_expired.p.qp)
                assert expired(model[qp], now), (cycle, qp, model[qp], now)
                assert ctx.get(dut.o_expired.p.rnr_wait) == model[qp]["rnr_wait"]
                if rng.random() < 0.5 and not harness.writes:
                    # The handler takes it (if it did nothing else this cycle) and starts
                    # the timer again.
                    ctx.set(dut.o_expired.ready, 1)
                    harness.write(ctx, qp, {"start": now, "rnr_wait": 0, "from_sent": 0},
                                  dut.i_busy)
                    verdicts.append(qp)
                    expired_since.pop(qp, None)
                else:
                    waited += 1
            harness.step(ctx)
            await ctx.tick()
            harness.after_tick(ctx)
            now += rng.choice([0, 0, 1])
        assert len(verdicts) > 50 and len(set(verdicts)) == qps

    run_testbenches(dut, main)


@pytest.mark.parametrize("lead", [1, 2, 5, 8, 9, 10])
def test_an_expired_timer_is_found_within_a_pass(lead):
    """Of 32 QPs in 8 rows, every one has its ACK timer running, written by the handler
    before the bench; QP 13's runs out ``lead`` cycles after the first pass (so the scan
    is anywhere then), the others' much later. The verdict comes no earlier, and at most
    a pass of the rows and 5 cycles after: the other QPs, checked once in the first
    pass, are not checked again. In the first pass the sweep reads each QP once."""
    dut = TimerSweep(qps=32, lanes=4)
    model = [idle_qp(una=1, nxt=2, start=0, timeout=12) for _ in range(32)]
    model[13].update({"start": 1000, "timeout": 6})
    due = 1064
    harness = Harness(dut, model)

    async def main(ctx):
        now = due - scan_rows(32, 4) - 32 - LATENCY - lead
        for qp in range(32):
            harness.write(ctx, qp, {}, dut.i_busy)
            harness.show(ctx, now)
            harness.step(ctx)
            await ctx.tick()
            harness.after_tick(ctx)
        harness.reads = 0
        while not ctx.get(dut.o_expired.valid):
            harness.show(ctx, now)
            harness.step(ctx)
            await ctx.tick()
            harness.after_tick(ctx)
            now += 1
            assert now <= due + scan_rows(32, 4) + LATENCY, "no verdict"
        assert now >= due and ctx.get(dut.o_expired.p.qp) == 13
        assert harness.reads <= 32 + 1, harness.reads

    run_testbenches(dut, main)


def test_timers_that_run_out_together_are_all_found():
    """Every QP of 32 in 8 rows has a timer that runs out at one tick: each is offered,
    taken at once, within a pass and three cycles per QP (checked, offered and taken,
    the QP checked behind it checked again). The ACK handler takes more than that to
    act on each."""
    dut = TimerSweep(qps=32, lanes=4)
    model = [idle_qp(timeout=3) for _ in range(32)]
    harness = Harness(dut, model)

    async def main(ctx):
        now = 100
        for qp in range(32):
            harness.send(ctx, qp, now)
            harness.show(ctx, now)
            harness.step(ctx)
            await ctx.tick()
            harness.after_tick(ctx)
        now += 8
        offered = []
        for _ in range(scan_rows(32, 4) + 3 * 32 + LATENCY):
            harness.show(ctx, now)
            if ctx.get(dut.o_expired.valid):
                qp = ctx.get(dut.o_expired.p.qp)
                offered.append(qp)
                ctx.set(dut.o_expired.ready, 1)
                harness.write(ctx, qp, {"start": now, "from_sent": 0}, dut.i_busy)
            harness.step(ctx)
            await ctx.tick()
            harness.after_tick(ctx)
        assert sorted(offered) == list(range(32)), offered

    run_testbenches(dut, main)


def test_a_waiting_verdict_holds_the_sweep_and_loses_no_qp():
    """QPs 2 and 3 expired at once: 2 is offered first and waits 10 cycles; once it is
    taken (and its timer restarted, as the handler does), 3 follows within 4 cycles."""
    dut = TimerSweep(qps=8, lanes=4)
    model = [idle_qp() for _ in range(8)]
    harness = Harness(dut, model)

    async def main(ctx):
        now = 10
        for qp in (2, 3):
            harness.write(ctx, qp, {"una": 1, "nxt": 2, "start": 0, "timeout": 2}, dut.i_busy)
            harness.show(ctx, now)
            harness.step(ctx)
            await ctx.tick()
            harness.after_tick(ctx)
        offered = []
        for cycle in range(60):
            harness.show(ctx, now)
            if ctx.get(dut.o_expired.valid):
                qp = ctx.get(dut.o_expired.p.qp)
                offered.append((cycle, qp))
                if [q for _, q in offered].count(qp) >= 10 or qp == 3:
                    ctx.set(dut.o_expired.ready, 1)
                    harness.write(ctx, qp, {"start": now}, dut.i_busy)
            harness.step(ctx)
            await ctx.tick()
            harness.after_tick(ctx)
            if any(qp == 3 for _, qp in offered):
                break
        twos = [cycle for cycle, qp in offered if qp == 2]
        [three] = [cycle for cycle, qp in offered if qp == 3]
        assert offered[0][1] == 2 and twos == list(range(twos[0], twos[0] + 10))
        assert three - twos[-1] <= 4, offered

    run_testbenches(dut, main)
