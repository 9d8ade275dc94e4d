"""The retransmit page pool in Amaranth's simulator against a model of the QPs' ring
positions: QPs take pages as their packets enter pages of their rings and move their
oldest position as the model acknowledges them, the engine's positions played by the
test. Every page the pool hands out was free, behind its last QP's older position, or the
page an idle QP sends into; every page behind the positions comes back, hinted or not,
and so does the page of an idle QP that no context works on; a QP waiting to be set
is cleared and moved to position 0."""

import random

import pytest

from gateware.roce.descriptor import POINTER_BITS
from gateware.roce.page_pool import ACTIVE_CYCLES, PagePool, check_retransmit_pages, page_beats

from .streams import run_testbenches

PAGE = page_beats()                 # 64 beats of 64 bytes
QPS = 4
PAGES = 8
RING_BEATS = 2 * PAGE               # a QP holds 2 pages at most


def enters_page(tail, beats):
    """The planner's rule: a packet of ``beats`` at ``tail`` starts a page or crosses
    into one."""
    return beats > 0 and (tail % PAGE == 0 or tail % PAGE + beats > PAGE)


@pytest.mark.parametrize("seed, hint_share", [(1, 1.0), (2, 0.5), (3, 0.0)])
def test_pages_go_out_free_and_come_back_behind_the_older_position(seed, hint_share):
    """``hint_share``: the share of moves of a QP's oldest position the test hints (the
    rest only the pool's sweep finds)."""
    dut = PagePool(qps=QPS, pages=PAGES, ring_beats=RING_BEATS)
    rng = random.Random(seed)
    head = [0] * QPS
    tail = [0] * QPS
    owner = {}                      # page → (QP, page of its ring) it was last taken for
    taken = []
    agains = []                     # QPs that took the page they send into again

    async def engine(ctx):
        """The engine's positions: a registered read of the model (a QP whose packets
        are all acknowledged has no message outstanding)."""
        async for _, _, qp in ctx.tick().sample(dut.state_qp):
            ctx.set(dut.state, {"head": head[qp], "tail": tail[qp],
                                "idle": head[qp] == tail[qp]})

    def releasable(qp, vpage):
        """Whether a page of a QP's ring may be given back: behind its older position, or
        the one it sends into with nothing outstanding."""
        return vpage < min(head[qp], tail[qp]) // PAGE or (
            head[qp] == tail[qp] and vpage == tail[qp] // PAGE)

    async def take(ctx, qp, vpage, again=False):
        """Take a page; the page it got, read from the page table two cycles later (the
        take goes in a cycle after it)."""
        ctx.set(dut.i_take.valid, 1)
        ctx.set(dut.i_take.p, {"qp": qp, "vpage": vpage, "again": again})
        await ctx.tick()
        ctx.set(dut.i_take.valid, 0)
        await ctx.tick()
        ctx.set(dut.translate[0].addr, qp << 1 | vpage & 1)
        ctx.set(dut.translate[0].en, 1)
        await ctx.tick()
        page = ctx.get(dut.translate[0].data)
        if page in owner:
            last_qp, last_vpage = owner[page]
            assert releasable(last_qp, last_vpage), \
                f"page {page} handed out while QP {last_qp} holds it"
        # The page this one maps again was given back: nobody owns it any more.
        for other in [other for other, held in owner.items() if held == (qp, vpage)]:
            del owner[other]
        owner[page] = (qp, vpage)
        taken.append(page)

    async def driver(ctx):
        for _ in range(3000):
            qp = rng.randrange(QPS)
            if rng.random() < 0.5:
                # A packet of the QP, as the planner's new context sends it: the page it
                # starts in again if the pool took it back, then a page when it enters
                # one, if the pool has one and the QP holds fewer than its ring's.
                ctx.set(dut.i_active[0].valid, 1)
                ctx.set(dut.i_active[0].p, qp)
                ctx.set(dut.view_qp, qp)            # a cycle ahead, as the planner does
                await ctx.tick()
                beats = rng.choice([1, 7, PAGE // 2, PAGE])
                vpage = (tail[qp] + beats - 1) // PAGE
                if tail[qp] % PAGE and ctx.get(dut.view_released) == tail[qp] // PAGE + 1:
                    if not ctx.get(dut.o_available):
                        await ctx.tick()
                        continue
                    await take(ctx, qp, tail[qp] // PAGE, again=True)
                    agains.append(qp)
                if enters_page(tail[qp], beats):
                    held = vpage - ctx.get(dut.view_released) + 1
                    if not ctx.get(dut.o_available) or held > RING_BEATS // PAGE:
                        await ctx.tick()
                        continue
                    await take(ctx, qp, vpage)
                tail[qp] += beats
            elif head[qp] < tail[qp]:
                head[qp] = rng.randint(head[qp], tail[qp])
                ctx.set(dut.i_hint.valid, rng.random() < hint_share)
                ctx.set(dut.i_hint.p, qp)
            await ctx.tick()
            ctx.set(dut.i_hint.valid, 0)
            ctx.set(dut.i_active[0].valid, 0)
        # Everything acknowledged, and QP 1 still worked on: the pool takes back every page
        # but the one QP 1 sends into (a sweep of 4 QPs, a few cycles each).
        for qp in range(QPS):
            head[qp] = tail[qp]
        ctx.set(dut.i_active[0].valid, 1)
        ctx.set(dut.i_active[0].p, 1)
        for _ in range(20 * QPS * PAGES):
            await ctx.tick()
        for qp in range(QPS):
            ctx.set(dut.view_qp, qp)
            await ctx.tick()
            kept = qp == 1 and tail[qp] % PAGE != 0
            assert ctx.get(dut.view_released) == -(-tail[qp] // PAGE) - kept, qp
        # QP 1 waits to be set: once its context is gone, it is cleared.
        ctx.set(dut.reset_qp.valid, 1)
        ctx.set(dut.reset_qp.p, 1)
        await ctx.tick()
        assert not ctx.get(dut.o_reset_clear) or tail[1] % PAGE == 0
        ctx.set(dut.i_active[0].valid, 0)
        for _ in range(40):
            await ctx.tick()
        assert ctx.get(dut.o_reset_clear)
        ctx.set(dut.i_rebase.valid, 1)
        ctx.set(dut.i_rebase.p, 1)
        await ctx.tick()
        ctx.set(dut.i_rebase.valid, 0)
        ctx.set(dut.reset_qp.valid, 0)
        head[1] = tail[1] = 0
        ctx.set(dut.view_qp, 1)
        await ctx.tick()
        assert ctx.get(dut.view_released) == 0
        # The free pages: all of them; QP 0 takes them one by one past its tail.
        free, vpage = 0, -(-tail[0] // PAGE)
        while ctx.get(dut.o_available):
            ctx.set(dut.i_take.valid, 1)
            ctx.set(dut.i_take.p, {"qp": 0, "vpage": vpage + free})
            await ctx.tick()
            ctx.set(dut.i_take.valid, 0)
            free += 1
            assert free <= PAGES
        assert free == PAGES
        assert len(set(taken)) == PAGES and len(taken) > 10 * PAGES and agains

    run_testbenches(dut, driver, engine)


def test_a_pool_too_small_for_a_ring_is_refused():
    """One QP must be able to fill its ring."""
    assert check_retransmit_pages(16, ring_beats=16 * PAGE) == 16
    with pytest.raises(ValueError, match=r"too few for rings of 128 KiB.* at least 32"):
        check_retransmit_pages(16, ring_beats=32 * PAGE)
    for pages in (1, 3, 1 << 17):
        with pytest.raises(ValueError, match="power of 2"):
            check_retransmit_pages(pages)


def test_no_page_comes_back_while_its_qp_is_resent():
    """While a resend of QP 0 is under way (the planner's replay context) or offered (by
    the engine), its pages stay, whatever its acknowledgements say; once it is over,
    they come back."""
    dut = PagePool(qps=QPS, pages=PAGES, ring_beats=4 * PAGE)
    head, tail = [0] * QPS, [0] * QPS

    async def engine(ctx):
        async for _, _, qp in ctx.tick().sample(dut.state_qp):
            ctx.set(dut.state, {"head": head[qp], "tail": tail[qp], "idle": False})

    async def driver(ctx):
        ctx.set(dut.view_qp, 0)
        for port, first in ((1, 0), (2, 2)):
            # QP 0 holds pages ``first`` to ``first`` + 2 of its ring, sends into the last.
            for vpage in range(first, first + 3):
                if vpage * PAGE >= tail[0]:
                    ctx.set(dut.i_take.valid, 1)
                    ctx.set(dut.i_take.p, {"qp": 0, "vpage": vpage})
                    await ctx.tick()
            ctx.set(dut.i_take.valid, 0)
            head[0], tail[0] = first * PAGE, (first + 2) * PAGE + 10
            ctx.set(dut.i_active[port].valid, 1)
            ctx.set(dut.i_active[port].p, 0)
            await ctx.tick()
            head[0] = tail[0]                   # everything acknowledged
            for _ in range(100):
                await ctx.tick()
            assert ctx.get(dut.view_released) == first, f"given back during resend ({port})"
            ctx.set(dut.i_active[port].valid, 0)
            for _ in range(100):
                await ctx.tick()
            assert ctx.get(dut.view_released) == first + 2

    run_testbenches(dut, driver, engine)


def test_a_qp_whose_positions_wrap_is_cleared_for_its_setting():
    """Positions run on modulo 2^22 beats: a QP sending into the last page of that range
    gives it back when idle and is then clear to be set again."""
    dut = PagePool(qps=QPS, pages=PAGES, ring_beats=RING_BEATS)
    last = (1 << POINTER_BITS) // PAGE - 1
    position = [0] * QPS

    async def engine(ctx):
        async for _, _, qp in ctx.tick().sample(dut.state_qp):
            ctx.set(dut.state, {"head": position[qp], "tail": position[qp], "idle": True})

    async def driver(ctx):
        ctx.set(dut.i_take.valid, 1)
        ctx.set(dut.i_take.p, {"qp": 2, "vpage": last, "again": True})
        await ctx.tick()
        ctx.set(dut.i_take.valid, 0)
        position[2] = last * PAGE + 10
        ctx.set(dut.reset_qp.valid, 1)
        ctx.set(dut.reset_qp.p, 2)
        for _ in range(40):
            await ctx.tick()
        ctx.set(dut.view_qp, 2)
        assert ctx.get(dut.view_released) == 0      # the page after the last: page 0
        assert ctx.get(dut.o_reset_clear)

    run_testbenches(dut, driver, engine)


@pytest.mark.parametrize("given_back", [0, 3, PAGES])
def test_takes_a_cycle_apart_get_every_free_page_once(given_back):
    """A take goes in a cycle after it, so ``o_available`` counts the page the take
    waiting gets. QP 0 takes ``given_back`` pages, all of which the pool takes back
    behind its acknowledgements; then QPs take a page every cycle while one is
    available: each free page once (those given back from the queue, the rest never
    taken), and no take without one."""
    dut = PagePool(qps=QPS, pages=PAGES, ring_beats=PAGES * PAGE)
    head, tail = [0] * QPS, [0] * QPS

    async def engine(ctx):
        async for _, _, qp in ctx.tick().sample(dut.state_qp):
            ctx.set(dut.state, {"head": head[qp], "tail": tail[qp], "idle": False})

    async def driver(ctx):
        for vpage in range(given_back):
            ctx.set(dut.i_take.valid, 1)
            ctx.set(dut.i_take.p, {"qp": 0, "vpage": vpage})
            await ctx.tick()
        ctx.set(dut.i_take.valid, 0)
        head[0] = tail[0] = given_back * PAGE           # all acknowledged: back they come
        ctx.set(dut.view_qp, 0)
        for _ in range(20 * QPS * PAGES):
            await ctx.tick()
        assert ctx.get(dut.view_released) == given_back
        takes = []
        while ctx.get(dut.o_available):
            qp, vpage = 1 + len(takes) % 3, len(takes) // 3
            takes.append((qp, vpage))
            ctx.set(dut.i_take.valid, 1)
            ctx.set(dut.i_take.p, {"qp": qp, "vpage": vpage})
            await ctx.tick()
            assert len(takes) <= PAGES, "a take without a free page"
        ctx.set(dut.i_take.valid, 0)
        assert len(takes) == PAGES
        await ctx.tick()
        pages = []
        for qp, vpage in takes:
            ctx.set(dut.translate[0].addr, qp << 3 | vpage)
            ctx.set(dut.translate[0].en, 1)
            await ctx.tick()
            pages.append(ctx.get(dut.translate[0].data))
        assert sorted(pages) == list(range(PAGES)), pages

    run_testbenches(dut, driver, engine)


def test_the_page_an_idle_qp_sends_into_stays_in_any_cycle_a_context_works_on_it():
    """QP 0, idle, sends into the middle of a page, and the planner's new context works
    on it now and then, a cycle at a time: the pool takes that page back only once the
    context has left it alone for ``ACTIVE_CYCLES`` cycles, never in a cycle it works on
    it (``view_released`` a cycle later shows the cycle's write), and once taken back
    the planner takes it again."""
    dut = PagePool(qps=QPS, pages=PAGES, ring_beats=RING_BEATS)
    rng = random.Random(5)
    tail = PAGE // 2

    async def engine(ctx):
        async for _, _, qp in ctx.tick().sample(dut.state_qp):
            position = tail if qp == 0 else 0
            ctx.set(dut.state, {"head": position, "tail": position, "idle": True})

    async def take(ctx, again):
        ctx.set(dut.i_take.valid, 1)
        ctx.set(dut.i_take.p, {"qp": 0, "vpage": 0, "again": again})
        await ctx.tick()
        ctx.set(dut.i_take.valid, 0)
        await ctx.tick().repeat(3)

    async def driver(ctx):
        ctx.set(dut.view_qp, 0)
        await take(ctx, again=False)
        given_back = worked = 0
        last_worked = -ACTIVE_CYCLES - 1     # (no context worked on it yet)
        for cycle in range(4000):
            working = rng.random() < 0.1
            ctx.set(dut.i_active[0].valid, working)
            ctx.set(dut.i_active[0].p, 0)
            before = ctx.get(dut.view_released)
            await ctx.tick()
            ctx.set(dut.i_active[0].valid, 0)
            if working:
                worked += 1
                last_worked = cycle
                assert ctx.get(dut.view_released) == before, "given back while worked on"
            if ctx.get(dut.view_released) == 1:
                assert cycle - last_worked > ACTIVE_CYCLES, "given back too soon"
                given_back += 1
                await take(ctx, again=True)
                assert ctx.get(dut.view_released) == 0
        assert given_back > 20 and worked > 300

    run_testbenches(dut, driver, engine)
