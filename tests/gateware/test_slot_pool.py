"""The pool of message slots: on its own against a model (a set of free slots), and in
the reliability engine: QPs share it, a QP's cap holds, a QP set again with messages
outstanding gets them all back, and a resend walk never strays into a slot another QP
has taken since."""

import random

import pytest

from gateware.roce.reliability import ReliabilityEngine
from gateware.roce.requests import CompletionStatus
from gateware.roce.slot_pool import SLOT_MARGIN, SlotPool

from .streams import run_testbenches
from .test_reliability_responder import NAK_SEQUENCE, qp_state, run


@pytest.mark.parametrize(("slots", "reserved", "seed"), [(16, 4, 1), (64, 8, 2), (32, 0, 3)])
def test_the_pool_never_hands_out_a_slot_in_use(slots, reserved, seed):
    """Takes while ``o_available`` (at most one every other cycle, as the planner loads)
    and frees of held slots at random: every slot taken is one not held, never a
    reserved one, ``o_free`` counts the slots not held (one given back counts from the
    cycle after next), and once all come back every slot but the reserved ones is there
    to take again."""
    dut = SlotPool(slots=slots, reserved=reserved)
    rng = random.Random(seed)

    async def main(ctx):
        held = []
        ever = set()
        last_take = -2
        for cycle in range(1500):
            take = (ctx.get(dut.o_available) and cycle - last_take >= 2 and cycle < 1000
                    and rng.random() < 0.7)
            free = held and rng.random() < (0.3 if cycle < 1000 else 0.9)
            slot = ctx.get(dut.o_slot)
            ctx.set(dut.i_take, take)
            ctx.set(dut.i_free.valid, bool(free))
            if free:
                ctx.set(dut.i_free.p, held.pop(rng.randrange(len(held))))
            in_flight = 1 if free else 0
            if take:
                assert slot not in held and slot >= reserved, (cycle, slot)
                held.append(slot)
                ever.add(slot)
                last_take = cycle
            await ctx.tick()
            assert ctx.get(dut.o_free) == slots - reserved - len(held) - in_flight, cycle
        ctx.set(dut.i_take, 0)
        ctx.set(dut.i_free.valid, 0)
        await ctx.tick()
        assert not held
        assert ever == set(range(reserved, slots))
        await ctx.tick()
        assert ctx.get(dut.o_available)

    run_testbenches(dut, main)


def test_a_pool_too_small_is_refused():
    with pytest.raises(ValueError, match="Reserved slots must be 0..8, not 9"):
        SlotPool(slots=16, reserved=9)


async def load_while_free(req, qp, *, tag=0, most=100, slots=None):
    """Loads one-packet messages on ``qp`` (and sends them), one every other cycle as
    the planner does, while its view shows a free slot: the count loaded. ``slots``, a
    list, gets the slot each message went into (the QP's empty slot before it)."""
    dut, ctx = req.dut, req.ctx
    ctx.set(dut.new_qp, qp)
    loaded = 0
    await req.cycle()
    while ctx.get(dut.new_view.slot_free) and loaded < most:
        if slots is not None:
            slots.append(ctx.get(dut.new_view.slot))
        await req.cycle(loaded=req.message(qp, tag=tag + loaded), sent=req.packet(qp))
        await req.cycle()
        loaded += 1
    await req.idle(3)
    return loaded


def test_qps_share_the_pool_each_up_to_its_cap():
    """16 slots for 4 QPs: each QP holds one empty, the pool keeps 4 back, so 8 messages
    are outstanding at most. QP 0 (cap 16) takes all 8; QP 1 then finds none; 3
    completions of QP 0 give QP 1 three. With a cap of 4, a QP stops at 4 while the
    pool has more."""
    dut = ReliabilityEngine(qps=4, messages=16, message_slots=16)
    free = 16 - 4 - SLOT_MARGIN

    async def body(req):
        for qp in (0, 1):
            await req.set_qp(qp, qp_state(next_psn=100 * qp))
        assert await load_while_free(req, 0) == free
        assert await load_while_free(req, 1) == 0
        await req.cycle(ack=req.ack(0, 2))
        await req.until(lambda: len(req.completions) == 3, 30)
        await req.idle(3)
        assert await load_while_free(req, 1, tag=50) == 3
        await req.cycle(ack=req.ack(0, req.nxt[0] - 1))
        await req.cycle(ack=req.ack(1, req.nxt[1] - 1))
        await req.until(lambda: len(req.completions) == free + 3, 40)
        assert [(qp, tag) for _, qp, tag, *_ in req.completions] == \
            [(0, tag) for tag in range(free)] + [(1, 50 + tag) for tag in range(3)]
        assert all(status == CompletionStatus.SUCCESS for _, _, _, status, *_ in req.completions)
        await req.idle(3)
        assert await load_while_free(req, 1, tag=60) == free

    run(dut, body)

    capped = ReliabilityEngine(qps=4, messages=4, message_slots=64)

    async def cap(req):
        await req.set_qp(2, qp_state())
        assert await load_while_free(req, 2) == 4
        await req.set_qp(3, qp_state())
        assert await load_while_free(req, 3) == 4

    run(capped, cap)


def test_a_qp_set_again_with_messages_outstanding_completes_them_first():
    """A QP set again while 5 messages are outstanding: each completes (FLUSHED, in
    order) before the reset goes in, and its slots are back in the pool: another QP
    can take all of them."""
    dut = ReliabilityEngine(qps=4, messages=16, message_slots=16)
    free = 16 - 4 - SLOT_MARGIN

    async def body(req):
        await req.set_qp(0, qp_state(next_psn=10))
        assert await load_while_free(req, 0, most=5) == 5
        await req.set_qp(0, qp_state(next_psn=900))
        assert [(qp, tag, status) for _, qp, tag, status, *_ in req.completions] == \
            [(0, tag, CompletionStatus.FLUSHED) for tag in range(5)]
        status = await req.status(0)
        assert not status.error and status.outstanding == 0 and status.counters.packets == 0
        await req.set_qp(1, qp_state())
        assert await load_while_free(req, 1, tag=20) == free
        assert await load_while_free(req, 0, tag=40) == 0
        await req.cycle(ack=req.ack(1, req.nxt[1] - 1))
        await req.until(lambda: len(req.completions) == 5 + free, 30)
        await req.idle(3)
        # QP 0 starts again from its new PSN
        req.ctx.set(req.dut.new_qp, 0)
        await req.cycle()
        assert req.ctx.get(req.dut.new_view.next_psn) == 900

    run(dut, body)


def test_a_resend_walk_never_hands_over_a_slot_another_qp_took():
    """QP 0's two messages are due a resend (a NAK for the first); the walker offers the
    first while the planner holds it off, and meanwhile an ACK completes both. Their
    slots go back to the pool, and QP 1 goes around the pool until its messages fill
    both. Let go, the walker hands over the message it offered and nothing of QP 1's."""
    dut = ReliabilityEngine(qps=4, messages=16, message_slots=16)
    free = 16 - 4 - SLOT_MARGIN

    async def body(req):
        ctx = req.ctx
        await req.set_qp(0, qp_state(next_psn=10))
        await req.set_qp(1, qp_state(next_psn=500))
        taken = []
        assert await load_while_free(req, 0, tag=70, most=2, slots=taken) == 2
        ctx.set(req.dut.o_replay.ready, 0)
        await req.cycle(ack=req.ack(0, 10, NAK_SEQUENCE))
        await req.until(lambda: ctx.get(req.dut.o_replay.valid), 30)
        await req.cycle(ack=req.ack(0, 11))
        await req.until(lambda: len(req.completions) == 2, 30)
        await req.idle(3)
        filled = []
        for round_ in range(8):
            assert await load_while_free(req, 1, tag=10 * round_, slots=filled) == free
            if set(taken) <= set(filled):
                break
            done = len(req.completions) + free
            await req.cycle(ack=req.ack(1, req.nxt[1] - 1))
            await req.until(lambda done=done: len(req.completions) == done, 40)
            await req.idle(3)
            filled.clear()
        assert set(taken) <= set(filled), (taken, filled)
        replays = len(req.replays)
        ctx.set(req.dut.o_replay.ready, 1)
        await req.idle(30)
        handed = req.replays[replays:]
        assert [(qp, psn) for _, qp, psn, _ in handed] == [(0, 10)], handed
        assert all(qp == 0 for _, qp, *_ in req.replays)

    run(dut, body)
