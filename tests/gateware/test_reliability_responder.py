"""ReliabilityEngine driven with the packet events of a planner and the acknowledgements
a ConnectX-class responder sends: one ACK every cycle, RNR NAK paired with a sequence
NAK, a lost NAK, a timer expiring while another QP's ACKs stream in, a message of 2^23
packets. The rules checked come from IBTA vol. 1 9.7 and Linux rxe, not from the engine."""

import pytest

from gateware.roce.reliability import ReliabilityEngine
from gateware.roce.requests import QP_STATE, CompletionStatus, PathMtu
from gateware.roce.timers import rnr_delay_ticks

from .streams import run_testbenches

PEER_IP = 0x0A4D0003
ACK = 0x1F                  # AETH syndrome: ACK, credits unlimited
NAK_SEQUENCE = 0x60         # NAK, PSN sequence error
RNR_NAK = 0x21              # RNR NAK, timer code 1 (0.01 ms)
WIDTH = 64


def qp_state(*, next_psn=0, timeout=10, retry_count=3, rnr_retry=3):
    return QP_STATE.const({"next_psn": next_psn, "remote_ip": PEER_IP, "path_mtu": 1,
                           "timeout": timeout, "retry_count": retry_count,
                           "rnr_retry": rnr_retry})


class Requester:
    """What the planner does around the engine: loads messages and sends their packets
    (one-packet messages of 64 bytes unless told), resends what ``o_replay`` hands over,
    and notes every completion and resend (taken: ``o_replay.ready`` is the test's) with
    its cycle. One call of :meth:`cycle` is
    one clock cycle, with at most one message loaded, packet sent and acknowledgement."""

    def __init__(self, dut, ctx):
        self.dut, self.ctx = dut, ctx
        self.now = 0
        self.nxt = {}
        self.tail = {}
        self.completions = []       # (cycle, qp, tag, status, first_psn, packets)
        self.replays = []           # (cycle, qp, psn of the first packet resent, packets)
        self.resends = []           # packets to send again: (qp, psn)
        ctx.set(dut.o_completion.ready, 1)
        ctx.set(dut.o_replay.ready, 1)

    async def set_qp(self, qp, state, *, tick=4):
        ctx, dut = self.ctx, self.dut
        ctx.set(dut.i_config, {"tos": 0, "tick": tick})
        ctx.set(dut.i_reset.valid, 1)
        ctx.set(dut.i_reset.p, {"qp": qp, "state": state})
        while not ctx.get(dut.i_reset.ready):
            await self.cycle()
        await self.cycle()
        ctx.set(dut.i_reset.valid, 0)
        self.nxt[qp] = state.next_psn
        self.tail[qp] = 0

    def message(self, qp, *, tag=0, packets=1, length=64, path_mtu=PathMtu.MTU_256):
        """The next message of ``qp``, for ``loaded``; its packets are for ``send``."""
        first = self.nxt[qp]
        message = {"request": {"qp": qp, "tag": tag, "length": length}, "first_psn": first,
                   "packets": packets, "start": self.tail[qp], "path_mtu": path_mtu}
        return {"qp": qp, "message": message}

    def packet(self, qp, *, psns=1, beats=1):
        """The next new packet of ``qp`` (or ``psns`` of them at once: the engine keeps
        only the next PSN and ring position)."""
        self.nxt[qp] = (self.nxt[qp] + psns) % (1 << 24)
        self.tail[qp] = (self.tail[qp] + beats) % (1 << 22)
        return {"qp": qp, "replay": 0, "bytes": 64, "next_psn": self.nxt[qp],
                "next_tail": self.tail[qp]}

    @staticmethod
    def ack(qp, psn, syndrome=ACK):
        return {"qp": qp, "src_ip": PEER_IP, "psn": psn % (1 << 24), "syndrome": syndrome}

    async def cycle(self, *, loaded=None, sent=None, ack=None):
        ctx, dut = self.ctx, self.dut
        if sent is None and self.resends:
            qp, psn = self.resends.pop(0)
            sent = {"qp": qp, "replay": 1, "bytes": 64, "next_psn": psn + 1}
        for stream, value in ((dut.i_loaded, loaded), (dut.i_sent, sent), (dut.i_ack, ack)):
            ctx.set(stream.valid, value is not None)
            if value is not None:
                ctx.set(stream.p, value)
        if ctx.get(dut.o_completion.valid):
            done = ctx.get(dut.o_completion.p)
            self.completions.append((self.now, done.qp, done.tag, done.status,
                                     done.first_psn, done.packets))
        if ctx.get(dut.o_replay.valid) and ctx.get(dut.o_replay.ready):
            replay = ctx.get(dut.o_replay.p)
            first = replay.message.first_psn + replay.packet
            count = replay.message.packets - replay.packet
            self.replays.append((self.now, replay.qp, first, count))
            self.resends += [(replay.qp, first + index) for index in range(count)]
        await ctx.tick()
        self.now += 1

    async def idle(self, cycles):
        for _ in range(cycles):
            await self.cycle()

    async def until(self, condition, cycles):
        for _ in range(cycles):
            if condition():
                return
            await self.cycle()
        assert condition(), f"not within {cycles} cycles"

    async def status(self, qp):
        self.ctx.set(self.dut.status_qp[1], qp)
        await self.cycle()
        return self.ctx.get(self.dut.status[1])


def qp_table(dut):
    """A background testbench answering the engine's lookups of a QP's peer address
    (``r_remote_ip``) as the transmitter's QP table does: with the address the QP was
    set with (written as the engine takes the reset), a cycle after the lookup, as it was
    before that cycle's write (0 for a QP never set)."""
    async def table(ctx):
        remote_ips = {}
        async for _, _, valid, ready, write, qp in ctx.tick().sample(
                dut.i_reset.valid, dut.i_reset.ready, dut.i_reset.p, dut.r_remote_ip.addr):
            ctx.set(dut.r_remote_ip.data, remote_ips.get(qp, 0))
            if valid and ready:
                remote_ips[write.qp] = write.state.remote_ip
    return table


def run(dut, body):
    async def main(ctx):
        await body(Requester(dut, ctx))
    run_testbenches(dut, main, qp_table(dut))


def test_rnr_nak_with_a_sequence_nak_for_ten_rounds_completes():
    """The receive queue empty, 3 packets in flight: each round the responder sends an
    RNR NAK for the first and a sequence NAK for it (the next arrived out of sequence).
    The sequence NAK is no new retry (a resend from that PSN is under way), so with
    ``retry_count`` 1 every message completes; one resend per round, after the wait."""
    dut = ReliabilityEngine(qps=2, messages=4)
    wait = rnr_delay_ticks(1) * 4

    async def body(req):
        await req.set_qp(1, qp_state(next_psn=0xFFFFFE, retry_count=1, rnr_retry=7))
        for tag in range(3):
            await req.cycle(loaded=req.message(1, tag=tag), sent=req.packet(1))
        for _ in range(10):
            replays = len(req.replays)
            await req.cycle(ack=req.ack(1, 0xFFFFFE, RNR_NAK))
            await req.cycle()
            await req.cycle(ack=req.ack(1, 0xFFFFFE, NAK_SEQUENCE))
            req.ctx.set(dut.replay_qp, 1)
            req.ctx.set(dut.new_qp, 1)
            await req.idle(7)
            assert req.ctx.get(dut.replay_view.rnr_wait), "no RNR wait"
            assert req.ctx.get(dut.new_view.blocked)
            assert len(req.replays) == replays, "resent during the RNR wait"
            await req.until(lambda count=replays + 3: len(req.replays) == count, wait + 40)
            assert req.replays[replays][2] == 0xFFFFFE
            await req.until(lambda: not req.resends, 10)
            await req.idle(20)
            assert len(req.replays) == replays + 3, "a second resend for one round"
        await req.cycle(ack=req.ack(1, 0))
        await req.until(lambda: len(req.completions) == 3, 30)
        assert [(qp, tag, status) for _, qp, tag, status, *_ in req.completions] == \
            [(1, tag, CompletionStatus.SUCCESS) for tag in range(3)]
        status = await req.status(1)
        assert not status.error and status.outstanding == 0
        assert status.counters.naks_rnr == status.counters.rnr_waits == 10
        assert status.counters.naks_sequence == 10
        assert status.counters.retransmitted == 30 and status.counters.timeouts == 0

    run(dut, body)


def check_acks_at_full_rate(period, latency_bound):
    """128 one-packet messages, each acknowledged at once, one ACK every ``period``
    cycles: none lost, none resent, the last completion at most ``latency_bound`` cycles
    after the last ACK. (The engine completes a message a cycle and spends 5 cycles on
    each ACK it takes, the newest of its QP: one ACK every cycle, 4 times the rate of
    64-byte messages on a 100 Gb/s wire, leaves it some 30 messages behind.)"""
    dut = ReliabilityEngine(qps=2, messages=128)

    async def body(req):
        await req.set_qp(0, qp_state(next_psn=0xFFFFC0))
        for tag in range(128):
            await req.cycle(loaded=req.message(0, tag=tag), sent=req.packet(0))
        last_ack = None
        for index in range(128):
            await req.cycle(ack=req.ack(0, 0xFFFFC0 + index))
            last_ack = req.now - 1
            await req.idle(period - 1)
        await req.until(lambda: len(req.completions) == 128, 300)
        assert [(tag, status) for _, _, tag, status, *_ in req.completions] == \
            [(tag, CompletionStatus.SUCCESS) for tag in range(128)]
        latency = req.completions[-1][0] - last_ack
        assert latency <= latency_bound, latency
        status = await req.status(0)
        counters = status.counters
        assert (counters.acks, counters.acks_dropped, counters.timeouts) == (128, 0, 0)
        assert status.outstanding == 0 and not req.replays

    run(dut, body)


def test_one_ack_every_cycle():
    check_acks_at_full_rate(1, latency_bound=40)


def test_one_ack_every_4_cycles():
    check_acks_at_full_rate(4, latency_bound=10)


def test_the_ack_timer_runs_from_the_oldest_unacknowledged_packet():
    """A NAK lost, the responder discards what follows: a QP sending one message per
    quarter of its ACK timeout resends within 1.5 timeouts of the lost packet (IBTA
    9.7.6.1.3), not once it stops sending."""
    dut = ReliabilityEngine(qps=4, messages=16)
    tick, timeout = 16, 8 * 16             # 2^3 ticks of 16 cycles

    async def body(req):
        await req.set_qp(2, qp_state(next_psn=40, timeout=3), tick=tick)
        first_sent = req.now
        loaded = 0
        while not req.replays and loaded < 12:
            if (req.now - first_sent) % (timeout // 4) == 0:
                await req.cycle(loaded=req.message(2, tag=loaded), sent=req.packet(2))
                loaded += 1
            else:
                await req.cycle()
        assert req.replays, "no resend while the QP kept sending"
        cycle, qp, psn, _ = req.replays[0]
        assert qp == 2 and psn == 40
        assert cycle - first_sent <= timeout * 3 // 2, cycle - first_sent
        await req.until(lambda: len(req.replays) == loaded and not req.resends, 50)
        await req.cycle(ack=req.ack(2, req.nxt[2] - 1))
        await req.until(lambda: len(req.completions) == loaded, 50)
        assert all(status == CompletionStatus.SUCCESS for _, _, _, status, *_ in req.completions)
        status = await req.status(2)
        assert status.outstanding == 0 and status.counters.timeouts == 1

    run(dut, body)


@pytest.mark.parametrize("lead", [20, 23, 26])
def test_a_timer_expires_on_time_while_another_qps_acks_stream_in(lead):
    """QP 0's one packet is never acknowledged; QP 1's 128 messages are acknowledged one
    ACK a cycle from ``lead`` cycles before QP 0's timeout: QP 0 is resent on time. The
    streams of these leads start on either side of the sweep's check of QP 0, the worst
    places: its resend came 16 to 33 cycles after its timeout. The bound, 36 cycles, is a
    small fraction of any real timeout (4.096 µs × 2, 2,048 cycles at 250 MHz, the least);
    a check of QP 0 that QP 1's stream held would take longer."""
    dut = ReliabilityEngine(qps=4, messages=128)
    tick, timeout = 8, 8 * 8                # 2^3 ticks of 8 cycles

    async def body(req):
        await req.set_qp(1, qp_state(next_psn=500), tick=tick)
        await req.set_qp(0, qp_state(next_psn=7, timeout=3), tick=tick)
        for tag in range(128):
            await req.cycle(loaded=req.message(1, tag=tag), sent=req.packet(1))
        await req.cycle(loaded=req.message(0, tag=99), sent=req.packet(0))
        sent = req.now - 1
        await req.idle(timeout - lead)
        for index in range(128):
            await req.cycle(ack=req.ack(1, 500 + index))
        resent = [cycle for cycle, qp, *_ in req.replays if qp == 0]
        assert resent, "QP 0 not resent while QP 1's ACKs stream in"
        assert resent[0] - sent <= timeout + 36, resent[0] - sent
        await req.until(lambda: len(req.completions) == 128, 300)
        assert {qp for _, qp, *_ in req.completions} == {1}

    run(dut, body)


def test_a_message_of_2_to_the_23_packets_completes():
    """2^31 bytes at path MTU 256: 2^23 packets, from a PSN that wraps. (The planner's
    packets are given in two strides: the engine keeps only the next PSN and ring
    position.) Acknowledged in part, its oldest ring position moves on, and it completes
    once its last packet is acknowledged."""
    dut = ReliabilityEngine(qps=2, messages=4)
    first, packets = 0xFFF000, 1 << 23
    beats = 256 // WIDTH

    async def body(req):
        await req.set_qp(1, qp_state(next_psn=first))
        await req.cycle(loaded=req.message(1, tag=5, packets=packets, length=1 << 31),
                        sent=req.packet(1, psns=(1 << 22) + 8, beats=((1 << 22) + 8) * beats))
        await req.idle(4)
        await req.cycle(ack=req.ack(1, first + (1 << 22) + 2))
        await req.idle(12)
        assert not req.completions
        req.ctx.set(dut.pages_qp, 1)
        await req.idle(1)
        assert req.ctx.get(dut.pages_state.head) == ((1 << 22) + 3) * beats % (1 << 22)
        await req.cycle(sent=req.packet(1, psns=packets - (1 << 22) - 8,
                                        beats=(packets - (1 << 22) - 8) * beats))
        await req.idle(4)
        await req.cycle(ack=req.ack(1, first + packets - 1))
        await req.until(lambda: req.completions, 20)
        _, qp, tag, status, first_psn, count = req.completions[0]
        assert (qp, tag, status, first_psn, count) == \
            (1, 5, CompletionStatus.SUCCESS, first, packets)
        status = await req.status(1)
        assert status.outstanding == 0 and status.counters.acks == 2

    run(dut, body)
