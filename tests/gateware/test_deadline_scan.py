"""DeadlineScan on its own against a model of its hints and marks: every QP whose
deadline has come or that was marked is offered within a pass of the scan, none is
offered that was neither, a mark in the cycle of the check's write wins, and times wrap
modulo their range."""

import random

import pytest

from gateware.roce.deadline_scan import DeadlineScan

from .streams import run_testbenches

TIME_BITS = 16


def due(hint, now):
    """The model: a deadline has come when now − at is less than half the time range."""
    return hint["armed"] and (now - hint["at"]) % (1 << TIME_BITS) < 1 << (TIME_BITS - 1)


@pytest.mark.parametrize(("qps", "lanes"), [(40, 4), (16, None), (1, None)])
def test_every_qp_due_or_marked_is_offered_and_no_other(qps, lanes):
    """Marks at random (two ports), and a check of each QP offered that writes a new
    hint 1 to 3 cycles later, now and then marked again in that same cycle; time
    wraps. Each QP offered was due or marked when its row was read (at most ``lanes``
    and 3 cycles before: a row's candidates are offered one a cycle); each QP that stays
    due or marked is offered within a pass: a cycle per row and up to two per other QP
    (its own row's perhaps read twice), and 3 cycles. (With few rows a QP may be offered
    again before its check's write lands; that costs a check, nothing else.)"""
    dut = DeadlineScan(qps=qps, time_bits=TIME_BITS, marks=2, lanes=lanes)
    rng = random.Random(qps)
    hints = [{"armed": 0, "at": 0} for _ in range(qps)]
    dirty = [False] * qps
    bound = dut.rows + 2 * qps + 3

    async def main(ctx):
        now = (1 << TIME_BITS) - 300
        pending = []                # (cycle, qp, hint) of the checks under way
        eligible = [None] * qps     # the last cycle it was due or marked
        waiting = {}                # QP → cycle since which it has been due or marked
        offers = 0
        ctx.set(dut.o_candidate.ready, 1)
        for cycle in range(3000):
            ctx.set(dut.i_now, now % (1 << TIME_BITS))
            marked = set()
            for port in dut.i_mark:
                if rng.random() < 0.05:
                    qp = rng.randrange(qps)
                    ctx.set(port.valid, 1)
                    ctx.set(port.p, qp)
                    marked.add(qp)
            write = None
            if pending and pending[0][0] == cycle:
                _, qp, hint = pending.pop(0)
                ctx.set(dut.i_hint.valid, 1)
                ctx.set(dut.i_hint.p, {"qp": qp, "hint": hint})
                write = (qp, hint)
                if rng.random() < 0.3 and not ctx.get(dut.i_mark[0].valid):
                    ctx.set(dut.i_mark[0].valid, 1)
                    ctx.set(dut.i_mark[0].p, qp)
                    marked.add(qp)
            for qp in range(qps):
                if dirty[qp] or due(hints[qp], now):
                    eligible[qp] = cycle
                    since = waiting.setdefault(qp, cycle)
                    assert cycle - since <= bound, (cycle, qp, since)
                else:
                    waiting.pop(qp, None)
            if ctx.get(dut.o_candidate.valid):
                qp = ctx.get(dut.o_candidate.p)
                assert eligible[qp] is not None and cycle - eligible[qp] <= dut.lanes + 3, (
                    cycle, qp, eligible[qp])
                waiting.pop(qp, None)
                offers += 1
                new = {"armed": rng.random() < 0.7,
                       "at": (now + rng.randrange(60)) % (1 << TIME_BITS)}
                pending.append((cycle + rng.randint(1, 3), qp, new))
                pending.sort(key=lambda item: item[0])
                while len({c for c, _, _ in pending}) < len(pending):
                    pending = pending[:-1]      # one check's write a cycle
            await ctx.tick()
            for port in (*dut.i_mark, dut.i_hint):
                ctx.set(port.valid, 0)
            if write:
                hints[write[0]] = write[1]
                dirty[write[0]] = False
            for qp in marked:
                dirty[qp] = True
            now += rng.choice([0, 1])
        assert offers > 200

    run_testbenches(dut, main)


@pytest.mark.parametrize(("qps", "lanes"), [(16, 4), (40, 4), (8, 1), (256, 2)])
def test_a_hint_written_shows_in_the_row_read_the_cycle_after(qps, lanes):
    """With nothing else to do the scan reads a row a cycle, so a hint written in any
    cycle of a pass is read within a pass: a QP given a hint that has come is offered
    within ``rows`` + 2 cycles of the write (its row read a pass later at worst, loaded,
    then offered), whichever row the scan reads as it is written. Each QP offered gets
    an unarmed hint back, as its check would write. (Hint memories of 64 words or fewer
    pass the write on from a register of their own, deeper ones (256 QPs in 2 lanes:
    128 words) read it through a transparent port.)"""
    dut = DeadlineScan(qps=qps, time_bits=TIME_BITS, marks=1, lanes=lanes)
    rng = random.Random(qps)
    now = 1000

    async def main(ctx):
        ctx.set(dut.o_candidate.ready, 1)
        ctx.set(dut.i_now, now)
        latencies = []
        for trial in range(4 * dut.rows):
            await ctx.tick().repeat(trial % (dut.rows + 1) + 1)
            qp = rng.randrange(qps)
            ctx.set(dut.i_hint.valid, 1)
            ctx.set(dut.i_hint.p, {"qp": qp, "hint": {"armed": 1, "at": now - rng.randrange(5)}})
            await ctx.tick()
            ctx.set(dut.i_hint.valid, 0)
            waited = 1
            while not (ctx.get(dut.o_candidate.valid) and ctx.get(dut.o_candidate.p) == qp):
                assert not ctx.get(dut.o_candidate.valid), "offered a QP neither due nor marked"
                await ctx.tick()
                waited += 1
                assert waited <= dut.rows + 2, (trial, qp, waited)
            latencies.append(waited)
            ctx.set(dut.i_hint.valid, 1)
            ctx.set(dut.i_hint.p, {"qp": qp, "hint": {"armed": 0, "at": 0}})
            await ctx.tick()
            ctx.set(dut.i_hint.valid, 0)
        # The writes met every phase of the pass: the longest waits are a pass long.
        assert max(latencies) >= dut.rows

    run_testbenches(dut, main)
