"""The retransmit buffer in Amaranth's simulator: beats written at random addresses of
two QPs' rings are read back in order (reads that wrap the ring included) with random
gaps on ``o_read.ready``, each read's first beat :data:`READ_LATENCY` cycles after it
is taken, and the data held while the output is stalled."""

import random

from gateware.roce.retransmit import READ_LATENCY, RetransmitBuffer

from .streams import held_while_stalled, put_item, run_testbenches

WIDTH = 8
RING_BEATS = 16
QPS = 2


def test_reads_return_the_written_beats_after_the_read_latency():
    dut = RetransmitBuffer(qps=QPS, ring_beats=RING_BEATS, width=WIDTH)
    rng = random.Random(17)
    model = {address: rng.getrandbits(8 * WIDTH) for address in range(QPS * RING_BEATS)}
    reads = [(qp * RING_BEATS + offset, beats)
             for qp, offset, beats in [(0, 0, 1), (1, 3, 4), (0, 14, 5), (1, 15, 2),
                                       (0, 5, RING_BEATS)]]
    expected = [[model[address - address % RING_BEATS + (address + n) % RING_BEATS]
                 for n in range(beats)] for address, beats in reads]
    received = []

    async def writer_and_reader(ctx):
        for address, value in model.items():
            ctx.set(dut.i_write.valid, 1)
            ctx.set(dut.i_write.p.address, address)
            ctx.set(dut.i_write.p.data, value)
            await ctx.tick()
        ctx.set(dut.i_write.valid, 0)
        # The first read with the output always ready: its first beat comes READ_LATENCY
        # cycles after the read is taken, then one beat per cycle.
        ctx.set(dut.o_read.ready, 1)
        address, beats = reads[0]
        ctx.set(dut.i_read.valid, 1)
        ctx.set(dut.i_read.p, {"address": address, "beats": beats})
        await ctx.tick().until(dut.i_read.ready)
        ctx.set(dut.i_read.valid, 0)
        cycles = 0
        while not ctx.get(dut.o_read.valid) and cycles <= READ_LATENCY:
            await ctx.tick()
            cycles += 1
        assert cycles == READ_LATENCY, f"first beat after {cycles} cycles"
        assert ctx.get(dut.o_read.p.data) == expected[0][0]
        assert ctx.get(dut.o_read.p.last)
        await ctx.tick()
        received.append([expected[0][0]])
        for address, beats in reads[1:]:
            await put_item(ctx, dut.i_read, {"address": address, "beats": beats}, gaps=rng)
        while len(received) < len(reads):
            await ctx.tick()
        assert received == expected

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

    run_testbenches(dut, writer_and_reader, sink, held_while_stalled(dut.o_read))
