# amaranth: UnusedElaboratable=no
"""GeneratorPool: several runs at once, merged message by message, against the CM rule's
model; refusals, stops and what the pool tells of each QP's run."""

import random

from gateware.roce.generator_pool import GeneratorPool
from gateware.roce.requests import Verb
from host.protocol import generator_payload

from .streams import get_packet, run_testbenches, wait_for
from .test_generator import get_request, make_run, model_request

WIDTH = 16


class Bench:
    """The pool with a request sink and a payload sink (random ready on both) that
    pair each payload with its request, and the pacer's lookups answered: the QPs in
    ``paced`` are paced."""

    def __init__(self, *, qps=8, runs=3, seed=0):
        self.dut = GeneratorPool(qps=qps, runs=runs, width=WIDTH)
        self.rng = random.Random(seed)
        self.requests, self.payloads = [], []
        self.paced = set()

    async def pacer(self, ctx):
        """Each run's lookup answered a cycle later, as the pacer's registered read."""
        while True:
            looked_up = [ctx.get(port.addr) for port in self.dut.r_paced]
            await ctx.tick()
            for port, qp in zip(self.dut.r_paced, looked_up, strict=True):
                ctx.set(port.data, qp in self.paced)

    async def request_sink(self, ctx):
        while True:
            self.requests.append(await get_request(ctx, self.dut.o_request, self.rng))

    async def payload_sink(self, ctx):
        while True:
            payload, _ = await get_packet(ctx, self.dut.o_payload, width=WIDTH, gaps=self.rng)
            self.payloads.append(payload)

    async def start(self, ctx, run):
        """Offer a start for one cycle; returns whether the pool took it."""
        ctx.set(self.dut.i_start.valid, 1)
        ctx.set(self.dut.i_start.payload, run)
        _, _, taken = await ctx.tick().sample(self.dut.start_taken)
        ctx.set(self.dut.i_start.valid, 0)
        return bool(taken)

    async def stop(self, ctx, qp):
        ctx.set(self.dut.i_stop.valid, 1)
        ctx.set(self.dut.i_stop.payload, qp)
        await ctx.tick()
        ctx.set(self.dut.i_stop.valid, 0)

    async def query(self, ctx, qp):
        ctx.set(self.dut.query_qp, qp)
        await ctx.tick()
        return bool(ctx.get(self.dut.query.running)), ctx.get(self.dut.query.messages)

    def counters(self, ctx):
        return {name: ctx.get(getattr(self.dut.o_counters, name))
                for name in ("started", "refused_running", "refused_full")}

    def run(self, main):
        run_testbenches(self.dut, main, self.request_sink, self.payload_sink, self.pacer)

    def messages_of(self, qp):
        """``(request, payload)`` of ``qp``'s messages, in the order they came out."""
        return [(request, payload) for request, payload
                in zip(self.requests, self.payloads, strict=False) if request[1] == qp]


def test_three_runs_at_once_share_the_output_and_each_follows_the_rule():
    bench = Bench(seed=1)
    runs = [make_run(64, 5, verb=Verb.RDMA_WRITE, qp=1, base=0x1000),
            make_run(100, 6, verb=Verb.SEND_WITH_IMMEDIATE, qp=2),
            make_run(1, 7, verb=Verb.RDMA_WRITE_WITH_IMMEDIATE, qp=7, base=0x40, ring=3)]

    async def main(ctx):
        for run in runs:
            assert await bench.start(ctx, run)
        assert (await bench.query(ctx, 2))[0]
        total = sum(run["count"] for run in runs)
        await wait_for(ctx, lambda: len(bench.payloads) == total, 5000)
        for _ in range(30):
            await ctx.tick()
            assert not ctx.get(bench.dut.o_request.valid)
        for run in runs:
            assert await bench.query(ctx, run["qp"]) == (False, run["count"])
        assert bench.counters(ctx) == {"started": 3, "refused_running": 0, "refused_full": 0}

    bench.run(main)
    for run in runs:
        expected = [(model_request(run, k), generator_payload(k, run["length"]))
                    for k in range(run["count"])]
        assert bench.messages_of(run["qp"]) == expected
    # Round robin while all three run: the first six messages take turns.
    assert [request[1] for request in bench.requests[:6]] == [1, 2, 7, 1, 2, 7]


def test_refusals_stops_and_what_the_query_keeps():
    bench = Bench(runs=2, seed=2)
    slow = make_run(8, 50, qp=3, divider=40)

    async def main(ctx):
        assert await bench.start(ctx, slow)
        assert not await bench.start(ctx, make_run(8, 1, qp=3))           # QP 3 is running
        assert await bench.start(ctx, make_run(8, 50, qp=4, divider=40))
        assert not await bench.start(ctx, make_run(8, 1, qp=5))           # both generators busy
        assert bench.counters(ctx) == {"started": 2, "refused_running": 1, "refused_full": 1}
        assert await bench.query(ctx, 5) == (False, 0)

        # Stop QP 4 in its run: the message on offer still ends, nothing follows.
        await wait_for(ctx, lambda: len(bench.messages_of(4)) >= 3, 2000)
        await bench.stop(ctx, 4)
        await wait_for(ctx, lambda: not ctx.get(bench.dut.query.running), 500)
        sent = len(bench.messages_of(4))
        for _ in range(200):
            await ctx.tick()
        assert len(bench.messages_of(4)) == sent < 50
        assert await bench.query(ctx, 4) == (False, 0), "a stop forgets the count"

        # QP 5 now runs on the freed generator; QP 3's count is kept when it ends, and
        # stays after its generator takes a run of another QP.
        assert await bench.start(ctx, make_run(8, 2, qp=5))
        await wait_for(ctx, lambda: len(bench.messages_of(3)) == 50, 5000)
        await wait_for(ctx, lambda: len(bench.messages_of(5)) == 2, 500)
        for _ in range(5):
            await ctx.tick()
        assert await bench.query(ctx, 3) == (False, 50)
        assert await bench.start(ctx, make_run(8, 1, qp=6))
        assert await bench.start(ctx, make_run(8, 1, qp=7))
        await wait_for(ctx, lambda: len(bench.messages_of(7)) == 1, 500)
        for _ in range(5):
            await ctx.tick()
        assert await bench.query(ctx, 3) == (False, 50)
        assert await bench.query(ctx, 5) == (False, 2)
        await bench.stop(ctx, 3)
        assert await bench.query(ctx, 3) == (False, 0)

    bench.run(main)
    for qp, count in ((3, 50), (5, 2)):
        run = make_run(8, count, qp=qp)
        assert bench.messages_of(qp) == [(model_request(run, k), generator_payload(k, 8))
                                         for k in range(count)]
    stopped = bench.messages_of(4)
    run = make_run(8, 50, qp=4)
    assert stopped == [(model_request(run, k), generator_payload(k, 8))
                       for k in range(len(stopped))]




def test_a_paced_qps_run_is_passed_over_while_the_other_sends():
    """While QP 1 is paced, only QP 2's messages come (QP 1's first, offered before it
    was paced, may be one more); once it is not, both take turns again."""
    bench = Bench(seed=3)
    runs = [make_run(64, 12, qp=1, base=0x1000), make_run(64, 12, qp=2, base=0x2000)]

    async def main(ctx):
        bench.paced = {1}
        for run in runs:
            assert await bench.start(ctx, run)
        await wait_for(ctx, lambda: len(bench.requests) >= 8, 2000)
        assert sum(request[1] == 1 for request in bench.requests) <= 1, bench.requests
        bench.paced = set()
        await wait_for(ctx, lambda: len(bench.payloads) == 24, 5000)

    bench.run(main)
    for run in runs:
        assert len(bench.messages_of(run["qp"])) == run["count"]


def test_a_credit_reaches_only_the_run_of_its_qp():
    """Two credited runs into rings of 2 slots: each stops after 2 messages; credits for
    QP 5 (and one for QP 6, which has no run) move only QP 5's run."""
    bench = Bench(seed=4)
    runs = {qp: make_run(16, 6, qp=qp, ring=32) | {"credited": 1} for qp in (3, 5)}

    async def credit(ctx, qp, count):
        ctx.set(bench.dut.i_credit.valid, 1)
        ctx.set(bench.dut.i_credit.payload, {"qp": qp, "count": count})
        await ctx.tick()
        ctx.set(bench.dut.i_credit.valid, 0)
        for _ in range(100):
            await ctx.tick()

    def sent(qp):
        return len(bench.messages_of(qp))

    async def main(ctx):
        for run in runs.values():
            assert await bench.start(ctx, run)
        for _ in range(100):
            await ctx.tick()
        assert (sent(3), sent(5)) == (2, 2)
        await credit(ctx, 6, 4)
        await credit(ctx, 5, 3)
        assert (sent(3), sent(5)) == (2, 5)
        await credit(ctx, 5, 4)
        await credit(ctx, 3, 1)
        assert (sent(3), sent(5)) == (3, 6)
        assert await bench.query(ctx, 5) == (False, 6)
        assert (await bench.query(ctx, 3))[0]

    bench.run(main)
    for qp in (3, 5):
        messages = bench.messages_of(qp)
        assert messages == [(model_request(runs[qp], k), generator_payload(k, 16))
                            for k in range(len(messages))]
