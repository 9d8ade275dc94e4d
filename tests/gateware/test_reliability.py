"""ReliabilityEngine on its own: events of every source in the same cycle, each
counted; a QP set again while packets are sent; an ACK timeout."""

import random

import pytest

from gateware.roce.deadline_scan import scan_rows
from gateware.roce.reliability import ReliabilityEngine, check_message_count, check_message_slots
from gateware.roce.requests import QP_STATE

from .streams import get_item, put_item, run_testbenches
from .test_reliability_responder import qp_table

QPS = 4
PEER_IP = 0x0A4D0003


def qp_state(*, next_psn=0, timeout=0, remote_ip=PEER_IP):
    return QP_STATE.const({"next_psn": next_psn, "remote_ip": remote_ip, "path_mtu": 1,
                           "timeout": timeout, "retry_count": 3, "rnr_retry": 3})


async def status_of(ctx, dut, qp):
    ctx.set(dut.status_qp[1], qp)
    await ctx.tick()
    return ctx.get(dut.status[1])


def test_every_event_is_counted():
    """Packets sent, ICRC errors, CNPs and ACKs (from a stranger: dropped) every cycle, for
    any QPs, the same one back to back."""
    dut = ReliabilityEngine(qps=QPS, messages=4)
    rng = random.Random(1)
    expected = {qp: {"packets": 0, "bytes": 0, "retransmitted": 0, "icrc_errors": 0,
                     "cnps": 0, "acks_dropped": 0} for qp in range(QPS)}

    async def main(ctx):
        ctx.set(dut.i_config, {"tos": 0, "tick": 100})
        for qp in range(QPS):
            await put_item(ctx, dut.i_reset, {"qp": qp, "state": qp_state()})
        for _ in range(200):
            qp, replay, size = rng.choice([0, 0, 1, 3]), rng.random() < 0.3, rng.randrange(4097)
            ctx.set(dut.i_sent.valid, 1)
            ctx.set(dut.i_sent.p, {"qp": qp, "replay": replay, "bytes": size, "next_psn": 1})
            expected[qp]["retransmitted" if replay else "packets"] += 1
            expected[qp]["bytes"] += 0 if replay else size
            icrc = rng.random() < 0.7
            ctx.set(dut.i_icrc_error.valid, icrc)
            ctx.set(dut.i_icrc_error.p, qp if rng.random() < 0.5 else rng.randrange(QPS))
            if icrc:
                expected[ctx.get(dut.i_icrc_error.p)]["icrc_errors"] += 1
            cnp = rng.random() < 0.5
            ctx.set(dut.i_cnp.valid, cnp)
            ctx.set(dut.i_cnp.p, rng.randrange(QPS))
            if cnp:
                expected[ctx.get(dut.i_cnp.p)]["cnps"] += 1
            ack_qp = rng.randrange(QPS)
            ctx.set(dut.i_ack.valid, 1)
            ctx.set(dut.i_ack.p, {"qp": ack_qp, "src_ip": PEER_IP + 1, "psn": 0,
                                  "syndrome": 0x1F})
            expected[ack_qp]["acks_dropped"] += 1
            await ctx.tick()
        for stream in (dut.i_sent, dut.i_icrc_error, dut.i_cnp, dut.i_ack):
            ctx.set(stream.valid, 0)
        for _ in range(20):
            await ctx.tick()
        for qp in range(QPS):
            counters = (await status_of(ctx, dut, qp)).counters
            assert {name: getattr(counters, name) for name in expected[qp]} == expected[qp], qp

        # Set again, a QP counts from 0 (an event of it in every cycle up to the reset's,
        # that one's too, is not counted); the others keep their counts.
        ctx.set(dut.i_icrc_error.valid, 1)
        ctx.set(dut.i_icrc_error.p, 1)
        await put_item(ctx, dut.i_reset, {"qp": 1, "state": qp_state()})
        ctx.set(dut.i_icrc_error.valid, 0)
        counters = (await status_of(ctx, dut, 1)).counters
        assert all(getattr(counters, name) == 0 for name in expected[1])
        await put_item(ctx, dut.i_icrc_error, 1)
        counters = (await status_of(ctx, dut, 1)).counters
        assert counters.icrc_errors == 1
        counters = (await status_of(ctx, dut, 3)).counters
        assert counters.icrc_errors == expected[3]["icrc_errors"] > 0

    run_testbenches(dut, main, qp_table(dut))


def test_a_qp_is_set_again_once_no_packet_is_sent():
    """While a reset waits on packets sent, the views show no free slot and block every
    QP (from its second cycle on, until the cycle after it went in); it goes in one or
    two cycles after the first cycle without one (the handler looks at the other writers
    in RESET, from a register, and between two looks waits in IDLE). (A packet sent
    passes a register: the engine sees it, and the reset waits on it, from the next
    cycle on.)"""
    dut = ReliabilityEngine(qps=QPS, messages=4)

    async def main(ctx):
        ctx.set(dut.i_config, {"tos": 0, "tick": 100})
        await put_item(ctx, dut.i_reset, {"qp": 2, "state": qp_state(next_psn=50)})
        ctx.set(dut.new_qp, 2)
        ctx.set(dut.i_sent.valid, 1)
        ctx.set(dut.i_sent.p, {"qp": 0, "next_psn": 9})
        await ctx.tick()
        ctx.set(dut.i_reset.valid, 1)
        ctx.set(dut.i_reset.p, {"qp": 2, "state": qp_state(next_psn=700)})
        for cycle in range(10):
            assert not ctx.get(dut.i_reset.ready)
            # The views block from the cycle after the reset's first on (a register).
            assert ctx.get(dut.new_view.blocked) == (cycle > 0)
            assert not ctx.get(dut.new_view.slot_free)
            assert ctx.get(dut.new_view.next_psn) == 50
            await ctx.tick()
        ctx.set(dut.i_sent.valid, 0)
        assert not ctx.get(dut.i_reset.ready)
        await ctx.tick()
        if not ctx.get(dut.i_reset.ready):
            assert ctx.get(dut.new_view.blocked) and not ctx.get(dut.new_view.slot_free)
            await ctx.tick()
        assert ctx.get(dut.i_reset.ready)
        await ctx.tick()
        ctx.set(dut.i_reset.valid, 0)
        assert ctx.get(dut.new_view.blocked) and ctx.get(dut.new_view.slot_free)
        await ctx.tick()
        assert not ctx.get(dut.new_view.blocked) and ctx.get(dut.new_view.slot_free)
        assert ctx.get(dut.new_view.next_psn) == 700

    run_testbenches(dut, main, qp_table(dut))


def test_an_acknowledgement_counts_only_from_the_peer_the_qp_was_set_with():
    """The engine looks a QP's peer address up in the QP table (here its model): set
    with one peer, an ACK from another is dropped and the peer's taken; set again with
    the other as its peer, the first one's ACK is dropped and the new peer's taken."""
    dut = ReliabilityEngine(qps=QPS, messages=4)
    other_ip = PEER_IP + 0x100

    async def main(ctx):
        ctx.set(dut.i_config, {"tos": 0, "tick": 100})
        for setting, (peer, stranger) in enumerate([(PEER_IP, other_ip),
                                                    (other_ip, PEER_IP)]):
            await put_item(ctx, dut.i_reset,
                           {"qp": 1, "state": qp_state(next_psn=10, remote_ip=peer)})
            ctx.set(dut.i_sent.valid, 1)
            ctx.set(dut.i_sent.p, {"qp": 1, "bytes": 64, "next_psn": 11, "next_tail": 1})
            await ctx.tick()
            ctx.set(dut.i_sent.valid, 0)
            for source in (stranger, peer):
                ctx.set(dut.i_ack.valid, 1)
                ctx.set(dut.i_ack.p, {"qp": 1, "src_ip": source, "psn": 10,
                                      "syndrome": 0x1F})
                await ctx.tick()
                ctx.set(dut.i_ack.valid, 0)
                for _ in range(12):
                    await ctx.tick()
                status = await status_of(ctx, dut, 1)
                taken = source == peer
                assert (status.counters.acks, status.counters.acks_dropped) == (
                    int(taken), 1), (setting, source)
                assert status.outstanding == (0 if taken else 1)

    run_testbenches(dut, main, qp_table(dut))


@pytest.mark.parametrize("paused", [0, 50])
def test_an_unacknowledged_packet_times_out_and_is_resent(paused):
    """ACK timeout 2^3 ticks: the message is handed back for a resend from its packet,
    and completes once acknowledged. ``paused`` cycles of ``i_paused`` (a PAUSE or
    PFC, longer than the timeout) right after the packet do not count."""
    dut = ReliabilityEngine(qps=QPS, messages=4)
    message = {"request": {"qp": 3, "tag": 77, "length": 100}, "first_psn": 20, "packets": 1,
               "path_mtu": 1}

    async def main(ctx):
        ctx.set(dut.i_config, {"tos": 0, "tick": 2})
        await put_item(ctx, dut.i_reset, {"qp": 3, "state": qp_state(next_psn=20, timeout=3)})
        ctx.set(dut.i_loaded.valid, 1)
        ctx.set(dut.i_loaded.p, {"qp": 3, "message": message})
        await ctx.tick()
        ctx.set(dut.i_loaded.valid, 0)
        ctx.set(dut.i_sent.valid, 1)
        ctx.set(dut.i_sent.p, {"qp": 3, "bytes": 100, "next_psn": 21, "next_tail": 2})
        await ctx.tick()
        ctx.set(dut.i_sent.valid, 0)
        cycles = 0
        while not ctx.get(dut.o_replay.valid):
            ctx.set(dut.i_paused, cycles < paused)
            await ctx.tick()
            cycles += 1
            assert cycles < 200, "no resend"
        # The sweep takes the timer's start within a pass of its rows and 3 cycles, and
        # finds it run out within a pass and 5 cycles; then the handler's and the
        # walker's cycles (the resend due a cycle after the handler's write, the
        # walker's queue a cycle after that), and the packet sent within a tick of 2
        # cycles.
        late = (scan_rows(QPS) + 3) + (scan_rows(QPS) + 5) + 8
        assert paused + 2 * 8 <= cycles <= paused + 2 * 8 + late, cycles
        replay = await get_item(ctx, dut.o_replay)
        # QP 3's first message takes its own empty slot, slot 3
        assert (replay.qp, replay.slot, replay.packet, replay.message.first_psn) == (3, 3, 0, 20)
        status = await status_of(ctx, dut, 3)
        assert status.counters.timeouts == 1 and status.outstanding == 1
        ctx.set(dut.i_ack.valid, 1)
        ctx.set(dut.i_ack.p, {"qp": 3, "src_ip": PEER_IP, "psn": 20, "syndrome": 0x1F})
        await ctx.tick()
        ctx.set(dut.i_ack.valid, 0)
        completion = await get_item(ctx, dut.o_completion)
        assert (completion.qp, completion.tag, completion.packets) == (3, 77, 1)
        status = await status_of(ctx, dut, 3)
        assert status.outstanding == 0 and status.counters.acks == 1

    run_testbenches(dut, main, qp_table(dut))


@pytest.mark.parametrize("messages", [0, 1, 3, 96, 1 << 16, 2.0])
def test_a_message_count_the_engine_cannot_have_is_refused(messages):
    with pytest.raises(ValueError, match=r"power of 2, 2\.\.32768, not"):
        ReliabilityEngine(qps=QPS, messages=messages)
    assert check_message_count(2) == 2 and check_message_count(32768) == 32768


@pytest.mark.parametrize(("slots", "qps", "match"), [
    (8, 4, r"power of 2, 16\.\.65536, not 8"),
    (48, 4, r"power of 2, 16\.\.65536, not 48"),
    (1 << 17, 4, r"power of 2, 16\.\.65536"),
    (256, 256, r"256 message slots are too few for 256 QPs: .* at least 512"),
])
def test_a_slot_pool_the_engine_cannot_have_is_refused(slots, qps, match):
    with pytest.raises(ValueError, match=match):
        ReliabilityEngine(qps=qps, message_slots=slots)
    assert check_message_slots(512, 256) == 512
