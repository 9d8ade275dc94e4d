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
    return {"una": 0, "nxt": 0, "start": 0, "rnr_code": 0, "timeout": 0, "error": 0,
            "rnr_wait": 0, "timer_started": 0, **state}


def expired(qp, now, start=None):
    """The model: IBTA 9.7.6.1.3's ACK timeout, or table 45's RNR wait, from the tick of
    the timer's start (``start``, by default the tick of the write that started it)."""
    started = qp["start"] if start is None else start
    if qp["error"]:
        return False
    if qp["rnr_wait"]:
        return now - started >= rnr_delay_ticks(qp["rnr_code"])
    return qp["una"] != qp["nxt"] and qp["timeout"] != 0 and now - started >= 1 << qp["timeout"]


class Harness:
    """Drives a TimerSweep from a model of every QP's state: the memories and flags read
    at the address the sweep gave a cycle before, and the writes of the engine's parts,
    each shown on the ports its writer drives and taking effect at the end of its cycle;
    a write that starts a timer (on ``i_timer_from_sent`` or ``i_timer_restart``) sets
    the model's ``timer_started``, which the sweep's ``o_timer_taken`` clears (a start
    in the same cycle wins); a reset leaves it, as the sweep does. Counts the cycles the
    sweep reads a QP that is not the one it read the cycle before (``reads``)."""

    def __init__(self, dut, qps):
        self.dut, self.qps, self.address, self.reads = dut, qps, 0, 0
        self.writes = {}
        self.taken = None

    def show(self, ctx, now):
        dut, qp = self.dut, self.qps[self.address]
        ctx.set(dut.i_now, now)
        ctx.set(dut.r_una.data, qp["una"])
        ctx.set(dut.r_nxt.data, qp["nxt"])
        ctx.set(dut.r_rnr_code.data, qp["rnr_code"])
        ctx.set(dut.r_peer.data, {"timeout": qp["timeout"]})
        ctx.set(dut.r_flags.data, {name: qp[name] for name in ("error", "rnr_wait")})

    def write(self, ctx, qp, state, *ports):
        """A part writes ``state`` to a QP this cycle, shown on ``ports``."""
        self.writes.setdefault(qp, {}).update(state)
        for port in ports:
            ctx.set(port.valid, 1)
            ctx.set(port.p, qp)

    def restart(self, ctx, qp, now, **state):
        """The handler starts the QP's timer again (with ``state``)."""
        self.write(ctx, qp, {"start": now, "timer_started": 1, **state}, self.dut.i_busy,
                   self.dut.i_timer_restart)

    def send(self, ctx, qp, now):
        """A new packet of the QP sent: it starts the ACK timer if none was outstanding."""
        state = self.qps[qp]
        if state["una"] == state["nxt"]:
            self.write(ctx, qp, {"nxt": state["nxt"] + 1, "start": now, "timer_started": 1},
                       self.dut.i_sent, self.dut.i_timer_from_sent)
        else:
            self.write(ctx, qp, {"nxt": state["nxt"] + 1}, self.dut.i_sent)

    def step(self, ctx):
        dut = self.dut
        address = ctx.get(dut.r_una.addr)
        self.reads += address != self.address
        self.address = address
        for reader in (dut.r_nxt, dut.r_rnr_code, dut.r_peer, dut.r_flags):
            assert ctx.get(reader.addr) == self.address
        self.taken = ctx.get(dut.o_timer_taken.p) if ctx.get(dut.o_timer_taken.valid) else None

    def after_tick(self, ctx):
        dut = self.dut
        for port in (dut.i_busy, dut.i_reset, dut.i_sent, dut.i_timer_from_sent,
                     dut.i_timer_restart):
            ctx.set(port.valid, 0)
        ctx.set(dut.o_expired.ready, 0)
        if self.taken is not None:
            self.qps[self.taken]["timer_started"] = 0
        for qp, state in self.writes.items():
            self.qps[qp].update(state)
        self.writes = {}

    async def settle(self, ctx, now, cycles):
        """Cycles at tick ``now`` until the sweep has taken every timer's start."""
        for _ in range(cycles):
            if not any(qp["timer_started"] for qp in self.qps):
                return
            self.show(ctx, now)
            self.step(ctx)
            await ctx.tick()
            self.after_tick(ctx)
        assert not any(qp["timer_started"] for qp in self.qps), "starts not taken"


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
    model, counted from the write that started it, and each is taken, at random. The
    sweep takes each start (``o_timer_taken``) within ``bound`` cycles of the last
    write of its QP, and offers a timer within ``bound`` cycles of its running out
    counted from the tick the start was taken: a pass of the scan and 5 cycles, plus
    the cycles verdicts waited: a cycle for each row, and for each candidate on the way
    up to three (checked; offered, taken, and the QP checked behind it checked again),
    the QPs of its own row perhaps twice."""
    dut = TimerSweep(qps=qps, lanes=lanes)
    rng = random.Random(5)
    model = [idle_qp() for _ in range(qps)]
    harness = Harness(dut, model)
    verdicts = []
    bound = scan_rows(qps, lanes) + 3 * (qps + (lanes or scan_lanes(qps))) + LATENCY

    async def main(ctx):
        now = 100
        pending = {}                # QP → (cycle, waited) of its start or last write since
        taken_at = {}               # QP → the tick the sweep took its last start
        expired_since = {}          # QP → (cycle, waited) it has been expired since
        waited = 0                  # cycles a verdict waited, so far
        starts = taken = 0

        def late(since):
            return cycle - since[0] - (waited - since[1])

        for cycle in range(6000):
            for qp in range(qps):
                if qp in pending:
                    assert late(pending[qp]) <= bound, (cycle, qp, "start not taken")
                if qp in taken_at and expired(model[qp], now, taken_at[qp]):
                    since = expired_since.setdefault(qp, (cycle, waited))
                    assert late(since) <= bound, (cycle, qp, since)
            if rng.random() < 0.3:
                qp = rng.randrange(qps)
                action = rng.choice(["send", "send", "handler", "reset"])
                state = model[qp]
                if action == "send":
                    harness.send(ctx, qp, now)
                elif action == "handler":
                    change = rng.choice([
                        {"una": rng.randint(state["una"], state["nxt"]), "rnr_wait": 0},
                        {"rnr_code": rng.randrange(1, 3), "rnr_wait": 1},
                        {"rnr_wait": 0},
                        None])
                    if change is None:
                        harness.write(ctx, qp, {"error": 1, "rnr_wait": 0}, dut.i_busy)
                    else:
                        harness.restart(ctx, qp, now, **change)
                else:
                    reset = idle_qp(timeout=rng.choice([0, 2, 3, 4]), una=5, nxt=5)
                    del reset["timer_started"]          # the sweep's own flag stays
                    harness.write(ctx, qp, reset, dut.i_reset)
                expired_since.pop(qp, None)
                if harness.writes[qp].get("timer_started") or qp in pending:
                    pending[qp] = (cycle, waited)
                    taken_at.pop(qp, None)
                    starts += harness.writes[qp].get("timer_started", 0)
                if "error" in harness.writes[qp] and harness.writes[qp]["error"] == 0:
                    pending.pop(qp, None)           # a reset: no timer
                    taken_at.pop(qp, None)
            harness.show(ctx, now)
            if ctx.get(dut.o_expired.valid):
                qp = ctx.get(dut.o_expired.p.qp)
                assert expired(model[qp], now), (cycle, qp, model[qp], now)
                assert ctx.get(dut.o_expired.p.rnr_wait) == model[qp]["rnr_wait"]
                if rng.random() < 0.5 and not harness.writes:
                    # The handler takes it (if it did nothing else this cycle) and starts
                    # the timer again.
                    ctx.set(dut.o_expired.ready, 1)
                    harness.restart(ctx, qp, now, rnr_wait=0)
                    pending[qp] = (cycle, waited)
                    taken_at.pop(qp, None)
                    expired_since.pop(qp, None)
                    verdicts.append(qp)
                else:
                    waited += 1
            harness.step(ctx)
            qp = harness.taken
            if qp is not None and not harness.writes.get(qp, {}).get("timer_started"):
                # The sweep took the start (a start written this cycle wins over it).
                assert model[qp]["timer_started"]
                taken_at[qp] = now
                pending.pop(qp, None)
                taken += 1
            await ctx.tick()
            harness.after_tick(ctx)
            now += rng.choice([0, 0, 1])
        # Every QP had a verdict, but one the bench left in ERROR before its first.
        missing = {qp for qp in set(range(qps)) - set(verdicts) if not model[qp]["error"]}
        assert len(verdicts) > 50 and len(set(verdicts)) >= qps - 1 and not missing, missing
        assert starts > 200 and taken > 100, (starts, taken)

    run_testbenches(dut, main)


@pytest.mark.parametrize("lead", [1, 2, 5, 8, 9, 10])
def test_an_expired_timer_is_found_within_a_pass(lead):
    """Of 32 QPs in 8 rows, every one has its ACK timer running, started by the handler
    before the bench and taken by the sweep at tick 1000; QP 13's runs out ``lead``
    cycles after the first pass (so the scan is anywhere then), the others' much later.
    The verdict comes no earlier, and at most a pass of the rows and 5 cycles after: the
    other QPs, checked once in the first pass, are not checked again. In the first pass
    the sweep reads each QP once."""
    dut = TimerSweep(qps=32, lanes=4)
    model = [idle_qp(una=1, nxt=2, timeout=12) for _ in range(32)]
    model[13]["timeout"] = 6
    due = 1000 + 64
    harness = Harness(dut, model)

    async def main(ctx):
        for qp in range(32):
            harness.restart(ctx, qp, 1000)
            harness.show(ctx, 1000)
            harness.step(ctx)
            await ctx.tick()
            harness.after_tick(ctx)
        await harness.settle(ctx, 1000, scan_rows(32, 4) + 3 * 32 + LATENCY)
        harness.reads = 0
        now = due - scan_rows(32, 4) - 32 - LATENCY - lead
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


def test_a_timer_runs_from_the_check_that_takes_its_start():
    """QP 5 of 32 sends a packet while none is outstanding at tick 200, the timer's
    start, while the tick goes on a tick a cycle: the sweep takes the start within a
    pass of the rows and 3 cycles, and the timer (2^6 ticks) runs out 2^6 ticks after
    the tick it was taken at (the verdict within a pass and 5 cycles of it), never
    before 2^6 ticks after the packet."""
    dut = TimerSweep(qps=32, lanes=4)
    model = [idle_qp(timeout=6) for _ in range(32)]
    harness = Harness(dut, model)

    async def main(ctx):
        now, taken = 200, None
        harness.send(ctx, 5, now)
        for cycle in range(scan_rows(32, 4) + 3 + 64 + scan_rows(32, 4) + LATENCY + 2):
            harness.show(ctx, now)
            if ctx.get(dut.o_expired.valid):
                break
            harness.step(ctx)
            if harness.taken == 5:
                taken = now
                assert cycle <= scan_rows(32, 4) + 3, cycle
            await ctx.tick()
            harness.after_tick(ctx)
            now += 1
        assert ctx.get(dut.o_expired.valid) and ctx.get(dut.o_expired.p.qp) == 5
        assert taken is not None and now >= taken + 64 >= 200 + 64, (taken, now)
        assert now <= taken + 64 + scan_rows(32, 4) + LATENCY, (taken, now)

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
        await harness.settle(ctx, now, scan_rows(32, 4) + 3 * 32 + LATENCY)
        now += 8
        offered = []
        for _ in range(scan_rows(32, 4) + 3 * 32 + LATENCY):
            harness.show(ctx, now)
            if ctx.get(dut.o_expired.valid):
                qp = ctx.get(dut.o_expired.p.qp)
                offered.append(qp)
                ctx.set(dut.o_expired.ready, 1)
                harness.restart(ctx, qp, now)
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
            harness.restart(ctx, qp, now, una=1, nxt=2, timeout=2)
            harness.show(ctx, now)
            harness.step(ctx)
            await ctx.tick()
            harness.after_tick(ctx)
        await harness.settle(ctx, now, 20)
        now += 4
        offered = []
        for cycle in range(60):
            harness.show(ctx, now)
            if ctx.get(dut.o_expired.valid):
                qp = ctx.get(dut.o_expired.p.qp)
                offered.append((cycle, qp))
                if [q for _, q in offered].count(qp) >= 10 or qp == 3:
                    ctx.set(dut.o_expired.ready, 1)
                    harness.restart(ctx, qp, now)
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
