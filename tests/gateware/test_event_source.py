# amaranth: UnusedElaboratable=no
"""The example EventSource against host/fragments.py (struct): every work request
field, every payload byte, the timestamps, and the fragments in flight bounded by the
window and the ring's slots while completions come back late."""

import random
from collections import deque
from itertools import pairwise

import pytest

from gateware.examples.event_source import EventSource
from gateware.roce.requests import CompletionStatus, Verb
from host import fragments

from .streams import StreamMonitor, get_item_random_ready, get_packet, run_testbenches, wait_for

QP = 5
BASE = 0x7F12_3456_7000


class Bench:
    """The source with random ready on both streams, and a completer that answers each
    request taken after a random delay (in order), failing the ones in ``fail``."""

    def __init__(self, *, fragment_bytes, window, slots, count, width=64, period=0,
                 slot_bytes=None, fail=(), seed=0, gaps=True):
        self.config = {"slot_bytes": slot_bytes or fragment_bytes + 64, "slots": slots,
                       "period": period, "count": count}
        self.dut = EventSource(fragment_bytes=fragment_bytes, window=window, width=width,
                               config=self.config)
        self.size, self.width, self.limit = fragment_bytes, width, min(window, slots)
        self.delay = 40 + 4 * -(-fragment_bytes // width)  # cycles a completion may take
        self.fail = set(fail)
        self.gaps = gaps                # random ready on the request and payload sinks
        self.rng = random.Random(seed)
        self.requests, self.payloads = [], []
        self.offer_cycles = []          # the cycle each request was first offered
        self.max_in_flight = 0
        self.completed = 0
        self.monitor = StreamMonitor(request=self.dut.o_request, payload=self.dut.o_payload)

    @staticmethod
    def enable(ctx, dut, base=BASE):
        """Enable the source on QP ``QP`` with its ring at ``base``."""
        ctx.set(dut.i_qp, QP)
        ctx.set(dut.i_base, base)
        ctx.set(dut.i_enable, 1)

    def request_fields(self, k):
        slot = k % self.config["slots"]
        return (Verb.RDMA_WRITE_WITH_IMMEDIATE, QP, k % (1 << 16),
                BASE + slot * self.config["slot_bytes"], self.size, k)

    async def requests_sink(self, ctx):
        gaps = random.Random(1) if self.gaps else None
        while True:
            request = await get_item_random_ready(ctx, self.dut.o_request, gaps=gaps)
            self.requests.append((request.verb, request.qp, request.tag,
                                  request.remote_address, request.length, request.immediate))

    async def payload_sink(self, ctx):
        gaps = random.Random(2) if self.gaps else None
        while True:
            payload, _ = await get_packet(ctx, self.dut.o_payload, width=self.width, gaps=gaps)
            self.payloads.append(payload)

    async def completer(self, ctx):
        """Watches the streams; completes each request taken up to ``delay`` cycles later, in order,
        with a completion of another QP now and then (to be ignored)."""
        due = deque()
        taken = 0
        async for cycle, seen, _ in self.monitor.watch(ctx):
            if seen["request"].offer:
                self.offer_cycles.append(cycle)
                in_flight = len(self.offer_cycles) - self.completed
                assert in_flight <= self.limit, f"cycle {cycle}: {in_flight} in flight"
                self.max_in_flight = max(self.max_in_flight, in_flight)
            if seen["request"].taken:
                at = max(cycle + self.rng.randrange(self.delay), due[-1][0] + 1 if due else 0)
                due.append((at, taken))
                taken += 1
            completion = self.dut.i_completion
            if due and due[0][0] <= cycle:
                _, k = due.popleft()
                status = CompletionStatus.REMOTE_ACCESS_ERROR if k in self.fail \
                    else CompletionStatus.SUCCESS
                ctx.set(completion.payload, {"qp": QP, "tag": k % (1 << 16), "status": status})
                ctx.set(completion.valid, 1)
                self.completed += 1
            elif self.rng.random() < 0.05:
                ctx.set(completion.payload, {"qp": QP + 1, "tag": 0})
                ctx.set(completion.valid, 1)
            else:
                ctx.set(completion.valid, 0)

    def check_run(self, first_offer=0):
        """Requests and payloads ``first_offer``… (one run) against the model."""
        stamps = []
        for k, (request, payload) in enumerate(zip(self.requests, self.payloads, strict=True)):
            assert request == self.request_fields(k), f"request {k}"
            header = fragments.check(payload, k)
            assert payload == fragments.fragment(k, header.timestamp, self.size)
            stamps.append(header.timestamp)
        offers = self.offer_cycles[first_offer:first_offer + len(stamps)]
        # The timestamp is the cycle count of the request's first offer.
        assert len({stamp - offer for stamp, offer in zip(stamps, offers, strict=True)}) == 1
        for earlier, later in pairwise(stamps):
            assert later - earlier >= max(1, self.config["period"])


@pytest.mark.parametrize("fragment_bytes, width", [
    (24, 64), (64, 64), (72, 64), (1000, 64), (4096, 64), (24, 24), (200, 24)])
def test_fragments_match_the_model(fragment_bytes, width):
    """A run of 20 events into 3 slots (window 8): each fragment byte-exact, each slot
    reused only after its fragment completed, then nothing more."""
    bench = Bench(fragment_bytes=fragment_bytes, window=8, slots=3, count=20, width=width)
    dut = bench.dut

    async def main(ctx):
        await ctx.tick().repeat(3)
        assert not ctx.get(dut.o_request.valid), "a request before the source was enabled"
        bench.enable(ctx, dut)
        await wait_for(ctx, lambda: bench.completed == 20 and len(bench.payloads) == 20, 20_000)
        for _ in range(50):
            await ctx.tick()
            assert not ctx.get(dut.o_request.valid), "a request past the run's count"
        status = ctx.get(dut.o_status)
        assert (status.running, status.events, status.completed, status.failed,
                status.in_flight, status.error) == (0, 20, 20, 0, 0, CompletionStatus.SUCCESS)
        bench.check_run()
        assert bench.max_in_flight == 3, "the slots never bounded the flight"

    run_testbenches(dut, main, bench.requests_sink, bench.payload_sink, bench.completer)


def test_window_bounds_the_flight_and_period_spaces_events():
    bench = Bench(fragment_bytes=128, window=2, slots=16, count=12, period=37,
                  slot_bytes=4096, seed=3)
    dut = bench.dut

    async def main(ctx):
        bench.enable(ctx, dut)
        await wait_for(ctx, lambda: bench.completed == 12 and len(bench.payloads) == 12, 20_000)
        bench.check_run()
        assert bench.max_in_flight == 2

    run_testbenches(dut, main, bench.requests_sink, bench.payload_sink, bench.completer)


@pytest.mark.parametrize("fragment_bytes", [24, 256, 1000])
def test_back_to_back_fragments_take_their_beats_and_two_cycles(fragment_bytes):
    """With both streams always ready and room in the window, the first beats of
    consecutive fragments are ``n`` + 2 cycles apart (``n`` beats each)."""
    bench = Bench(fragment_bytes=fragment_bytes, window=16, slots=16, count=8, gaps=False)
    dut = bench.dut

    async def main(ctx):
        bench.enable(ctx, dut)
        await wait_for(ctx, lambda: bench.completed == 8 and len(bench.payloads) == 8, 5000)
        bench.check_run()
        firsts = bench.monitor.firsts["payload"]
        beats = -(-fragment_bytes // bench.width)
        assert [later - earlier for earlier, later in pairwise(firsts)] == [beats + 2] * 7

    run_testbenches(dut, main, bench.requests_sink, bench.payload_sink, bench.completer)


def test_a_new_run_starts_at_event_0_and_failures_are_counted():
    """Events 1 and 2 fail: counted, the first error kept, nothing resent. Disabled and
    enabled again (with another ring address, and a count written through ``i_config``),
    the next run starts at event 0 in slot 0."""
    bench = Bench(fragment_bytes=96, window=4, slots=4, count=6, fail={1, 2}, seed=5)
    dut = bench.dut

    async def main(ctx):
        bench.enable(ctx, dut)
        await wait_for(ctx, lambda: bench.completed == 6 and len(bench.payloads) == 6, 5000)
        await ctx.tick().repeat(2)              # the last completion taken, and counted
        status = ctx.get(dut.o_status)
        assert (status.completed, status.failed, status.error) == \
            (4, 2, CompletionStatus.REMOTE_ACCESS_ERROR)
        bench.check_run()
        ctx.set(dut.i_enable, 0)
        await ctx.tick()
        assert ctx.get(dut.o_status.events) == 0
        ctx.set(dut.i_config.payload, {**bench.config, "count": 3})
        ctx.set(dut.i_config.valid, 1)
        await ctx.tick()
        ctx.set(dut.i_config.valid, 0)
        bench.enable(ctx, dut, BASE + 0x100_0000)
        await wait_for(ctx, lambda: bench.completed == 9 and len(bench.payloads) == 9, 5000)
        await ctx.tick().repeat(2)
        requests, payloads = bench.requests[6:], bench.payloads[6:]
        for k in range(3):
            assert requests[k] == (Verb.RDMA_WRITE_WITH_IMMEDIATE, QP, k,
                                   BASE + 0x100_0000 + k * bench.config["slot_bytes"], 96, k)
            fragments.check(payloads[k], k)
        status = ctx.get(dut.o_status)
        assert (status.events, status.completed, status.failed) == (3, 7, 2)

    run_testbenches(dut, main, bench.requests_sink, bench.payload_sink, bench.completer)


@pytest.mark.parametrize("kwargs", [{"fragment_bytes": 20}, {"fragment_bytes": 100},
                                    {"window": 0}, {"width": 16}, {"width": 60}])
def test_bad_parameters_are_refused(kwargs):
    with pytest.raises(ValueError):
        EventSource(**kwargs)
