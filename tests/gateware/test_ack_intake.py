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
    """Drives ``i`` one acknowledgement a cycle at most, answers ``window_qp`` a cycle
    later from ``windows`` (QP → (una, nxt)), as the engine's registered ports do, and
    notes verdicts and what the engine took."""

    def __init__(self, dut, ctx, windows):
        self.dut, self.ctx, self.windows = dut, ctx, windows
        self.verdicts = []          # (qp, taken)
        self.taken = []             # (qp, psn, syndrome)
        self.window_qp = None       # the QP whose window the intake asked for last cycle

    async def cycle(self, event=None, *, ready=False):
        ctx, dut = self.ctx, self.dut
        ctx.set(dut.i.valid, event is not None)
        if event is not None:
            qp, psn, syndrome, *source = event
            ctx.set(dut.i.p, {"qp": qp, "psn": psn % (1 << 24), "syndrome": syndrome,
                              "src_ip": source[0] if source else PEER_IP})
        una, nxt = self.windows.get(self.window_qp, (0, 0))
        ctx.set(dut.window, {"una": una, "nxt": nxt, "remote_ip": PEER_IP, "error": 0})
        self.window_qp = ctx.get(dut.window_qp)
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


def test_what_is_taken_and_what_is_kept():
    """Taken: inside the window and beyond what the QP's acknowledgements acknowledged
    so far (a NAK for p acknowledges up to p - 1). Kept: the newest ACK, and the NAK
    that says most (an RNR NAK over the sequence NAK of its PSN; an error NAK for good)."""
    events = [  # (qp, psn, syndrome[, source]), taken or not
        ((2, 110, ACK), True),
        ((2, 105, ACK), False),                 # behind the one taken
        ((2, 120, ACK), True),
        ((2, 120, ACK), False),                 # a duplicate
        ((2, 250, ACK), False),                 # a ghost: beyond the PSNs sent
        ((2, 99, ACK), False),                  # before the window
        ((2, 130, ACK, STRANGER_IP), False),
        ((2, 150, RESERVED), False),
        ((2, 140, NAK_SEQUENCE), True),
        ((2, 140, RNR_NAK), True),              # kept: the packet arrived
        ((2, 140, NAK_SEQUENCE), True),         # the RNR NAK's sequence NAK: not kept
        ((2, 139, ACK), False),                 # acknowledged by the NAKs
        ((3, 7, NAK_INVALID), True),
        ((3, 9, NAK_SEQUENCE), True),           # not kept: an error NAK stays
        ((3, 8, ACK), False),                   # acknowledged by that NAK
        ((3, 9, ACK), True),
    ]

    async def body(bench):
        for event, _ in events:
            await bench.cycle(event)
        await bench.drain()
        assert bench.verdicts == [(event[0], taken) for event, taken in events]
        assert bench.taken == [(2, 140, RNR_NAK), (3, 7, NAK_INVALID), (2, 139, 0), (3, 9, 0)]

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


def test_a_qp_back_in_line_takes_turns_with_those_arriving():
    """QP 0 has an ACK and a NAK waiting when QPs 1 to 10 get an ACK each: its NAK is
    taken first; with its ACK still waiting it goes back in line (QP 1 is offered
    meanwhile), and the QPs back in line take turns with those that arrived, so its ACK
    (up to 59, as the NAK says) comes after QP 1's, before QP 2's."""

    async def body(bench):
        for event in [(0, 55, ACK), (0, 60, NAK_SEQUENCE),
                      *((qp, 100, ACK) for qp in range(1, 11))]:
            await bench.cycle(event)
        for cycle in range(60):
            await bench.cycle(ready=cycle % 4 == 0)
        assert bench.taken == [(0, 60, NAK_SEQUENCE), (1, 100, 0), (0, 59, 0),
                               *((qp, 100, 0) for qp in range(2, 11))]

    run({0: (0, 100), **{qp: (90, 110) for qp in range(1, 11)}}, body, qps=16)


def test_at_any_rate_every_verdict_is_right_and_the_newest_is_taken():
    """Random acknowledgements (inside and outside the windows) on 3 QPs every cycle and
    offers taken at random, also in the cycle a newer one arrives: the verdicts are
    those of acting on each in turn (the model), and what the engine takes last of a
    QP is what the last ones taken say (their PSNs rise, as a responder sends them)."""
    rng = random.Random(7)
    windows = {0: (1000, 1100), 1: (0xFFFFF0, 0x50), 2: (300, 301)}

    def distance(psn, una):
        return (psn - una) % (1 << 24)

    async def body(bench):
        sent = []
        psns = {qp: una - 5 for qp, (una, _) in windows.items()}
        for _ in range(400):
            event = None
            if rng.random() < 0.8:
                qp = rng.randrange(3)
                psns[qp] += rng.randrange(3)
                syndrome = rng.choice([ACK, ACK, ACK, NAK_SEQUENCE, RNR_NAK])
                event = (qp, psns[qp] % (1 << 24), syndrome)
                sent.append(event)
            await bench.cycle(event, ready=rng.random() < 0.3)
        await bench.drain(40)
        # The model: what each QP's acknowledgements taken so far acknowledge.
        furthest, verdicts, last = {}, [], {}
        for qp, psn, syndrome in sent:
            una, nxt = windows[qp]
            lowest = distance(furthest[qp] + 1, una) if qp in furthest else 0
            taken = lowest <= distance(psn, una) < distance(nxt, una)
            verdicts.append((qp, taken))
            if taken:
                furthest[qp] = (psn - (syndrome != ACK)) % (1 << 24)
                last[qp] = syndrome
        assert bench.verdicts == verdicts
        for qp in windows:
            taken = [(psn, syndrome) for taken_qp, psn, syndrome in bench.taken
                     if taken_qp == qp]
            if last.get(qp) == ACK:
                assert taken[-1] == (furthest[qp], 0), qp
            elif qp in last:        # the NAK; after it, at most the ACK slot up to it
                naks = [index for index, (_, syndrome) in enumerate(taken) if syndrome]
                assert taken[naks[-1]][0] == (furthest[qp] + 1) % (1 << 24), qp
                assert all(item == (furthest[qp], 0) for item in taken[naks[-1] + 1:]), qp

    run(windows, body)
