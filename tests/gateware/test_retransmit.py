"""The retransmit buffer in Amaranth's simulator, its page tables played by the test (a
registered read of a dict): beats written at every address of two QPs' rings are read
back in order (reads that cross a page and wrap the ring included) with random gaps on
``o_read.ready``, each read's first beat :data:`READ_LATENCY` cycles after it is taken,
and the data held while the output is stalled. Between the writes and the reads two
pages change hands in the read side's table, and the reads follow it."""

import random

from gateware.roce.page_pool import page_beats
from gateware.roce.retransmit import READ_LATENCY, RetransmitBuffer

from .streams import held_while_stalled, put_item, run_testbenches

WIDTH = 8
PAGE = page_beats(WIDTH)            # 512 beats of 8 bytes
RING_BEATS = 2 * PAGE
QPS = 2
PAGES = 4


def test_reads_return_the_written_beats_through_the_page_tables():
    dut = RetransmitBuffer(qps=QPS, pages=PAGES, ring_beats=RING_BEATS, width=WIDTH)
    rng = random.Random(17)
    # (QP, page of its ring) → page of the buffer; table addresses are QP above page.
    tables = [{(0, 0): 2, (0, 1): 0, (1, 0): 3, (1, 1): 1}, None]
    tables[1] = dict(tables[0])
    values = {(qp, offset): rng.getrandbits(8 * WIDTH)
              for qp in range(QPS) for offset in range(RING_BEATS)}
    written = {}                    # address in the buffer → value

    def serve(port, side):
        """A registered read of ``tables[side]`` on a translation port."""
        async def testbench(ctx):
            async for _, _, addr, en in ctx.tick().sample(port.addr, port.en):
                if en:
                    ctx.set(port.data, tables[side][addr >> 1, addr & 1])
        return testbench

    reads = [(0, 0, 1), (1, 3, 4), (0, PAGE - 3, 7), (1, RING_BEATS - 2, 5),
             (0, PAGE + 5, RING_BEATS)]
    received = []

    async def writer_and_reader(ctx):
        for (qp, offset), value in values.items():
            ctx.set(dut.i_write.valid, 1)
            ctx.set(dut.i_write.p.address, qp * RING_BEATS + offset)
            ctx.set(dut.i_write.p.data, value)
            written[tables[0][qp, offset // PAGE] * PAGE + offset % PAGE] = value
            await ctx.tick()
        ctx.set(dut.i_write.valid, 0)
        await ctx.tick()
        # QP 0's second page and QP 1's second page trade places for the reads.
        tables[1][0, 1], tables[1][1, 1] = tables[0][1, 1], tables[0][0, 1]
        # The first read with the output always ready: its first beat comes READ_LATENCY
        # cycles after the read is taken, then one beat per cycle.
        ctx.set(dut.o_read.ready, 1)
        qp, offset, beats = reads[0]
        ctx.set(dut.i_read.valid, 1)
        ctx.set(dut.i_read.p, {"address": qp * RING_BEATS + offset, "beats": beats})
        await ctx.tick().until(dut.i_read.ready)
        ctx.set(dut.i_read.valid, 0)
        cycles = 0
        while not ctx.get(dut.o_read.valid) and cycles <= READ_LATENCY:
            await ctx.tick()
            cycles += 1
        assert cycles == READ_LATENCY, f"first beat after {cycles} cycles"
        assert ctx.get(dut.o_read.p.last)
        received.append([ctx.get(dut.o_read.p.data)])
        await ctx.tick()
        for qp, offset, beats in reads[1:]:
            await put_item(ctx, dut.i_read, {"address": qp * RING_BEATS + offset,
                                             "beats": beats}, gaps=rng)
        while len(received) < len(reads):
            await ctx.tick()
        expected = []
        for qp, offset, beats in reads:
            at = [(offset + n) % RING_BEATS for n in range(beats)]
            expected.append([written[tables[1][qp, a // PAGE] * PAGE + a % PAGE] for a in at])
        assert received == expected
        # The pages that traded places hold the other QP's beats: the reads did follow.
        assert expected[2][-1] == values[1, PAGE + 3]

    async def sink(ctx):
        while len(received) < 1:
            await ctx.tick()
        beats = []
        while True:
            ready = rng.random() >= 0.3
            ctx.set(dut.o_read.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(dut.o_read.valid, dut.o_read.p)
            if valid and ready:
                beats.append(payload.data)
                if payload.last:
                    received.append(beats)
                    beats = []

    run_testbenches(dut, writer_and_reader, sink, serve(dut.translate[0], 0),
                    serve(dut.translate[1], 1), held_while_stalled(dut.o_read))
