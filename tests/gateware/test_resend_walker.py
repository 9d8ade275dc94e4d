"""ResendWalker on its own, its QPs' flags and memories in a Python model read as the
engine's are (address given a cycle ahead, data as that cycle's writes leave it): the
queue of QPs due walks each once, in the order they became due, however often each was
made due, and skips a QP no longer due when its turn comes."""

from gateware.roce.resend_walker import ResendWalker

from .streams import run_testbenches

QPS, SLOTS, COUNT_BITS = 8, 16, 4
PACKETS = 3


class Model:
    """Each QP has one outstanding message of ``PACKETS`` packets in slot ``qp``, and a
    resend due from its second packet once made due."""

    def __init__(self, dut):
        self.dut = dut
        self.flags = [{"resend": 0, "rnr_wait": 0, "error": 0} for _ in range(QPS)]
        self.addresses = {"qp": 0, "slot": 0}
        self.taken, self.replays = [], []

    @staticmethod
    def first_psn(qp):
        return 1000 + 100 * qp

    def show(self, ctx):
        """The registered reads, for the addresses given in the cycle before."""
        dut, qp, slot = self.dut, self.addresses["qp"], self.addresses["slot"]
        ctx.set(dut.r_flags.data, self.flags[qp])
        ctx.set(dut.r_una.data, self.first_psn(qp) + 1)
        ctx.set(dut.r_positions.data, {"first": {"slot": qp, "count": 0}})
        ctx.set(dut.r_end.data, {"slot": QPS + qp, "count": 1})
        owner = slot % QPS
        ctx.set(dut.r_ring.data, {"message": {"first_psn": self.first_psn(owner),
                                              "packets": PACKETS},
                                  "next": QPS + owner})

    async def cycle(self, ctx, *, due=None, hold=False):
        dut = self.dut
        ctx.set(dut.i_due.valid, due is not None)
        ctx.set(dut.i_due.p, due or 0)
        ctx.set(dut.i_hold, hold)
        ctx.set(dut.o_replay.ready, 1)
        if due is not None:             # the engine's write that made it due
            self.flags[due]["resend"] = 1
        self.show(ctx)
        if ctx.get(dut.o_taken.valid):
            qp = ctx.get(dut.o_taken.p)
            self.taken.append(qp)
            self.flags[qp]["resend"] = 0
        if ctx.get(dut.o_replay.valid):
            replay = ctx.get(dut.o_replay.p)
            self.replays.append((replay.qp, replay.packet))
        self.addresses = {"qp": ctx.get(dut.r_flags.addr), "slot": ctx.get(dut.r_ring.addr)}
        for reader in (dut.r_una, dut.r_positions, dut.r_end):
            assert ctx.get(reader.addr) == self.addresses["qp"]
        await ctx.tick()


def run(body):
    dut = ResendWalker(qps=QPS, slots=SLOTS, count_bits=COUNT_BITS)

    async def main(ctx):
        await body(Model(dut), ctx)
    run_testbenches(dut, main)


def test_each_qp_due_is_walked_once_in_the_order_it_became_due():
    """While held, QP 3 is made due five times, then every other QP once, then QP 3
    again: more than the queue holds, were a QP in it more than once. Released, each
    QP is walked once, from its oldest unacknowledged PSN (``una``), in the order it
    first became due; made due again, it is walked again."""
    order = [3, 5, 1, 7, 0, 2, 4, 6]

    async def body(model, ctx):
        for due in [3] * 5 + order[1:] + [3]:
            await model.cycle(ctx, due=due, hold=True)
        for _ in range(10):
            await model.cycle(ctx, hold=True)
        assert model.taken == [] and model.replays == []
        for _ in range(150):
            await model.cycle(ctx)
        assert model.taken == order
        assert model.replays == [(qp, 1) for qp in order]
        await model.cycle(ctx, due=5)       # out of the queue, a QP goes in again
        for _ in range(20):
            await model.cycle(ctx)
        assert model.taken == [*order, 5]

    run(body)


def test_a_qp_no_longer_due_when_taken_is_skipped():
    """QP 2 fails and QP 4 enters an RNR wait after being made due; when their turn
    comes neither is taken nor resent, and QP 6, due after them, is."""

    async def body(model, ctx):
        for due in (2, 4, 6):
            await model.cycle(ctx, due=due, hold=True)
        model.flags[2]["error"] = 1
        model.flags[4]["rnr_wait"] = 1
        for _ in range(60):
            await model.cycle(ctx)
        assert model.taken == [6]
        assert model.replays == [(6, 1)]

    run(body)
