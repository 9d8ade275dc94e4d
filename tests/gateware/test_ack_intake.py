"""AckIntake on its own: what it keeps of a QP's acknowledgements (the newest ACK, the
NAK that says most), round-robin offers, and at any rate with any taking, the newest
acknowledgement of every QP reaches the engine."""

import random

from gateware.roce.ack_intake import AckIntake

from .streams import run_testbenches

PEER_IP = 0x0A4D0003
STRANGER_IP = 0x0A4D0009
ACK, NAK_SEQUENCE, RNR_NAK, NAK_INVALID, RESERVED = 0x1F, 0x60, 0x21, 0x61, 0x40


class Bench:
    """Drives ``i`` one acknowledgement a cycle at most, answers ``window_qp`` from
    ``windows`` (QP → (una, nxt)), and notes verdicts and what the engine took."""

    def __init__(self, dut, ctx, windows):
        self.dut, self.ctx, self.windows = dut, ctx, windows
        self.verdicts = []          # (qp, taken)
        self.taken = []             # (qp, psn, syndrome)

    async def cycle(self, event=None, *, ready=False):
        ctx, dut = self.ctx, self.dut
        ctx.set(dut.i.valid, event is not None)
        if event is not None:
            qp, psn, syndrome, *source = event
            ctx.set(dut.i.p, {"qp": qp, "psn": psn % (1 << 24), "syndrome": syndrome,
                              "src_ip": source[0] if source else PEER_IP})
        una, nxt = self.windows.get(ctx.get(dut.window_qp), (0, 0))
        ctx.set(dut.window, {"una": una, "nxt": nxt, "remote_ip": PEER_IP, "error": 0})
        ctx.set(dut.o.ready, ready)
        if ready and ctx.get(dut.o.valid):
            offer = ctx.get(dut.o.p)
            self.taken.append((offer.qp, offer.psn, offer.syndrome))
        if ctx.get(dut.o_verdict.valid):
            verdict = ctx.get(dut.o_verdict.p)
            self.verdicts.append((verdict.qp, verdict.taken))
        await ctx.tick()

    async def drain(self, cycles=12):
        for _ in range(cycles):
            await self.cycle(ready=True)


def run(windows, body, qps=4):
    dut = AckIntake(qps=qps)

    async def main(ctx):
        await body(Bench(dut, ctx, windows))
    run_testbenches(dut, main)


def test_the_newest_ack_and_the_nak_that_says_most_are_kept():
    events = [  # (qp, psn, syndrome[, source]), kept or not
        ((2, 110, ACK), True),
        ((2, 105, ACK), False),                 # behind the one kept
        ((2, 120, ACK), True),
        ((2, 120, ACK), False),                 # a duplicate
        ((2, 250, ACK), False),                 # a ghost: beyond the PSNs sent
        ((2, 99, ACK), False),                  # before the window
        ((2, 130, ACK, STRANGER_IP), False),
        ((2, 150, RESERVED), False),
        ((2, 140, NAK_SEQUENCE), True),
        ((2, 140, RNR_NAK), True),              # the packet arrived: says more
        ((2, 140, NAK_SEQUENCE), False),        # the RNR NAK's sequence NAK
        ((3, 7, NAK_INVALID), True),
        ((3, 9, NAK_SEQUENCE), False),          # an error NAK stays
        ((3, 8, ACK), True),
    ]

    async def body(bench):
        for event, _ in events:
            await bench.cycle(event)
        await bench.drain()
        assert bench.verdicts == [(event[0], kept) for event, kept in events]
        assert bench.taken == [(2, 140, RNR_NAK), (3, 7, NAK_INVALID), (2, 120, 0), (3, 8, 0)]

    run({2: (100, 200), 3: (5, 10)}, body)


def test_a_qp_acknowledged_every_cycle_does_not_hold_the_others():
    """The engine takes an offer every 4 cycles while QP 0 gets a new ACK every cycle:
    QP 1's one ACK and QP 3's are taken within a few offers."""

    async def body(bench):
        for cycle in range(60):
            event = (0, cycle, ACK)
            if cycle == 10:
                event = (1, 50, ACK)
            elif cycle == 11:
                event = (3, 70, ACK)
            await bench.cycle(event, ready=cycle % 4 == 0)
        await bench.drain()
        qps = [qp for qp, *_ in bench.taken]
        assert 1 in qps[:6] and 3 in qps[:6], qps
        assert bench.taken[-1] == (0, 59, 0)

    run({0: (0, 100), 1: (40, 60), 3: (60, 80)}, body)


def test_at_any_rate_the_newest_acknowledgement_of_each_qp_is_taken():
    """Random acknowledgements (inside and outside the windows) on 3 QPs every cycle and
    offers taken at random, also in the cycle a newer one arrives: every one gets a
    verdict, and the last ACK taken of a QP is the furthest one inside its window, the
    last NAK the last one inside (their PSNs rise, as a responder sends them)."""
    rng = random.Random(7)
    windows = {0: (1000, 1100), 1: (0xFFFFF0, 0x50), 2: (300, 301)}

    async def body(bench):
        sent = []
        psns = {qp: una - 5 for qp, (una, _) in windows.items()}
        for _ in range(400):
            event = None
            if rng.random() < 0.8:
                qp = rng.randrange(3)
                psns[qp] += rng.randrange(3)
                syndrome = rng.choice([ACK, ACK, ACK, NAK_SEQUENCE, RNR_NAK])
                event = (qp, psns[qp], syndrome)
                sent.append(event)
            await bench.cycle(event, ready=rng.random() < 0.3)
        await bench.drain(40)
        assert len(bench.verdicts) == len(sent)
        for qp, (una, nxt) in windows.items():
            inside = [(psn % (1 << 24), syndrome) for event_qp, psn, syndrome in sent
                      if event_qp == qp and (psn - una) % (1 << 24) < (nxt - una) % (1 << 24)]
            taken = [(psn, syndrome) for taken_qp, psn, syndrome in bench.taken
                     if taken_qp == qp]
            acks = [psn for psn, syndrome in inside if syndrome == ACK]
            if acks:
                assert [psn for psn, syndrome in taken if syndrome == 0][-1] == max(
                    acks, key=lambda psn: (psn - una) % (1 << 24))
            naks = [psn for psn, syndrome in inside if syndrome != ACK]
            if naks:
                assert [psn for psn, syndrome in taken if syndrome != 0][-1] == naks[-1]

    run(windows, body)
