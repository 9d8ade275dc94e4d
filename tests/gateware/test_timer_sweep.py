"""TimerSweep on its own, its QP state in a Python model read as the engine's memories
are (address registered, data a cycle later): every verdict is one the model agrees
with, an expired timer is found within ``qps`` + 3 cycles, and a verdict that waits
holds the sweep without losing the QP behind it."""

import random

import pytest

from gateware.roce.timer_sweep import TimerSweep
from gateware.roce.timers import rnr_delay_ticks

from .streams import run_testbenches

QPS = 8


def idle_qp():
    return {"una": 0, "nxt": 0, "start": 0, "rnr_code": 0, "sent_time": 0, "timeout": 0,
            "error": 0, "rnr_wait": 0, "from_sent": 0}


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
    at the address the sweep gave a cycle before."""

    def __init__(self, dut, qps):
        self.dut, self.qps, self.address = dut, qps, 0

    def show(self, ctx, now):
        dut, qp = self.dut, self.qps[self.address]
        ctx.set(dut.i_now, now)
        ctx.set(dut.r_una.data, qp["una"])
        ctx.set(dut.r_nxt.data, qp["nxt"])
        ctx.set(dut.r_timer.data, {"start": qp["start"], "rnr_code": qp["rnr_code"]})
        ctx.set(dut.r_sent_time.data, qp["sent_time"])
        ctx.set(dut.r_peer.data, {"timeout": qp["timeout"]})
        ctx.set(dut.r_flags.data, {name: qp[name] for name in ("error", "rnr_wait", "from_sent")})

    def step(self, ctx):
        self.address = ctx.get(self.dut.r_una.addr)
        for reader in (self.dut.r_nxt, self.dut.r_timer, self.dut.r_sent_time,
                       self.dut.r_peer, self.dut.r_flags):
            assert ctx.get(reader.addr) == self.address


def test_every_verdict_agrees_with_the_model():
    """QPs' state changes at random, each change shown on the port that writes it; every
    verdict offered is an expired timer in the model, and each is taken, at random."""
    dut = TimerSweep(qps=QPS)
    rng = random.Random(5)
    qps = [idle_qp() for _ in range(QPS)]
    harness = Harness(dut, qps)
    verdicts = []

    async def main(ctx):
        now = 100
        for cycle in range(3000):
            write = {}
            if rng.random() < 0.3:
                qp = rng.randrange(QPS)
                write[qp] = {"una": rng.randrange(3), "nxt": rng.randrange(3),
                             "start": now - rng.randrange(40), "rnr_code": rng.randrange(3),
                             "sent_time": now - rng.randrange(40),
                             "timeout": rng.choice([0, 2, 3, 4, 5]),
                             "error": rng.random() < 0.1, "rnr_wait": rng.random() < 0.3,
                             "from_sent": rng.random() < 0.5}
                port = rng.choice([dut.i_busy, dut.i_reset, dut.i_sent])
                ctx.set(port.valid, 1)
                ctx.set(port.p, qp)
            harness.show(ctx, now)
            if ctx.get(dut.o_expired.valid):
                qp = ctx.get(dut.o_expired.p.qp)
                assert expired(qps[qp], now), (cycle, qp, qps[qp], now)
                assert ctx.get(dut.o_expired.p.rnr_wait) == qps[qp]["rnr_wait"]
                taken = rng.random() < 0.5
                ctx.set(dut.o_expired.ready, taken)
                if taken:
                    verdicts.append(qp)
            harness.step(ctx)
            await ctx.tick()
            for port in (dut.i_busy, dut.i_reset, dut.i_sent):
                ctx.set(port.valid, 0)
            ctx.set(dut.o_expired.ready, 0)
            for qp, state in write.items():
                qps[qp].update(state)
            now += rng.choice([0, 0, 1])
        assert len(verdicts) > 50 and len(set(verdicts)) == QPS

    run_testbenches(dut, main)


@pytest.mark.parametrize("lead", range(16, 16 + QPS))
def test_an_expired_timer_is_found_within_qps_and_3_cycles(lead):
    """One QP's ACK timer runs out ``lead`` cycles after the bench starts (so the sweep
    is anywhere then); the others have none. The verdict comes no earlier and at most
    ``qps`` + 3 cycles after."""
    dut = TimerSweep(qps=QPS)
    qps = [idle_qp() for _ in range(QPS)]
    qps[5].update({"una": 1, "nxt": 2, "start": 1000, "timeout": 5})   # due at 1032
    harness = Harness(dut, qps)

    async def main(ctx):
        now = 1032 - lead
        while not ctx.get(dut.o_expired.valid):
            harness.show(ctx, now)
            harness.step(ctx)
            await ctx.tick()
            now += 1
            assert now <= 1032 + QPS + 3, "no verdict"
        assert now >= 1032 and ctx.get(dut.o_expired.p.qp) == 5

    run_testbenches(dut, main)


def test_a_waiting_verdict_holds_the_sweep_and_loses_no_qp():
    """QPs 2 and 3 expired at once: 2 is offered first and waits 10 cycles; once it is
    taken (and its timer restarted, as the handler does), 3 follows within 4 cycles."""
    dut = TimerSweep(qps=QPS)
    qps = [idle_qp() for _ in range(QPS)]
    for qp in (2, 3):
        qps[qp].update({"una": 1, "nxt": 2, "start": 0, "timeout": 2})
    harness = Harness(dut, qps)

    async def main(ctx):
        now = 10
        offered = []
        for cycle in range(60):
            harness.show(ctx, now)
            restart = None
            if ctx.get(dut.o_expired.valid):
                qp = ctx.get(dut.o_expired.p.qp)
                offered.append((cycle, qp))
                if [q for _, q in offered].count(qp) >= 10 or qp == 3:
                    ctx.set(dut.o_expired.ready, 1)
                    ctx.set(dut.i_busy.valid, 1)
                    ctx.set(dut.i_busy.p, qp)
                    restart = qp
            harness.step(ctx)
            await ctx.tick()
            ctx.set(dut.o_expired.ready, 0)
            ctx.set(dut.i_busy.valid, 0)
            if restart is not None:
                qps[restart]["start"] = now
            if any(qp == 3 for _, qp in offered):
                break
        twos = [cycle for cycle, qp in offered if qp == 2]
        [three] = [cycle for cycle, qp in offered if qp == 3]
        assert offered[0][1] == 2 and twos == list(range(twos[0], twos[0] + 10))
        assert three - twos[-1] <= 4, offered

    run_testbenches(dut, main)
