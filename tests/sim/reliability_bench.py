"""cocotb tests of the reliable requester of NetworkCore against responder models that
misbehave on purpose (sim/models/responder.py, ``Faults``); run through tests/sim/test_core.py.

Each run posts a mix of every verb with lengths on the path-MTU boundaries to three
QPs at once (path MTUs 256, 1024 and 4096). Whatever the faults, every message must
land exactly once, in order and byte for byte in its model's memory or receive queue,
every work request must complete successfully, every frame must be the one Scapy
builds (a retransmission may only add AckReq), and the core's per-QP counters must
match what the models did. Then the failures: a peer that never answers, error NAKs.
"""

import random

import cocotb
from roce_bench import TICK, VERBS, Qp, RoceRun, start

from gateware.roce.requests import CompletionStatus
from gateware.roce.timers import rnr_delay_ticks
from sim.models.responder import Faults
from sim.models.rocev2 import Message

#: ACK timeout of the QPs: 2^6 ticks of 16 cycles, 1024 cycles, about ten times the
#: round trip of a packet and its ACK behind a long packet under backpressure.
TIMEOUT = 6
TIMEOUT_CYCLES = (1 << TIMEOUT) * TICK

#: RNR timer code of the models' RNR NAKs (code 2: 20 us, 5 ticks).
RNR_TIMER = 2
assert rnr_delay_ticks(RNR_TIMER) * TICK < TIMEOUT_CYCLES


def three_qps():
    """QPs with path MTUs 256, 1024 and 4096; QP 0 crosses the PSN wrap."""
    return [Qp(index, remote_qpn=0x200 + index, psn=(0xFFFFD0 + 0x10_0000 * index) % (1 << 24),
               rkey=0xA000 + index, path_mtu=mtu, src_port=0xC100 + index,
               memory_base=0x4000_0000 * (index + 1), timeout=TIMEOUT)
            for index, mtu in enumerate((256, 1024, 4096))]


def boundary_lengths(path_mtu):
    return [0, 1, path_mtu - 1, path_mtu, path_mtu + 1, 3 * path_mtu + 5]


def post_mix(run, qps, rounds, rng, first_tag=0):
    """Every verb with every boundary length on every QP, ``rounds`` times; each round
    shuffled across QPs, so that they interleave. Returns the next free tag."""
    tag = first_tag
    for _ in range(rounds):
        work = [(qp, verb, length) for qp in qps for verb in VERBS
                for length in boundary_lengths(qp.path_mtu)]
        rng.shuffle(work)
        for qp, verb, length in work:
            run.post(qp, run.message(qp, verb, rng.randbytes(length), rng.getrandbits(32)), tag)
            tag += 1
    return tag


async def survives(dut, faults, *, seed, happened, rounds=3, timeout_cycles=300_000):
    """The mix under ``faults`` (each model draws its own faults from its own seed);
    ``happened``: model counters that must have moved, so that the fault was tested."""
    bench = await start(dut, tx_ready=0.8, seed=seed)
    run = RoceRun(bench)
    qps = three_qps()
    for qp in qps:
        await run.open(qp, faults=faults, seed=seed * 100 + qp.index, rnr_timer=RNR_TIMER)
    post_mix(run, qps, rounds, random.Random(seed))
    await run.finish(timeout_cycles, retransmissions=True)
    for name in happened:
        assert sum(qp.responder.stats[name] for qp in qps) > 0, f"no {name}: raise the rate"
    statuses = [await bench.qp_status(qp.index) for qp in qps]
    for qp, status in zip(qps, statuses, strict=True):
        check_counters(qp, status, faults)
    # The ACK receiver passes on what has a good ICRC; the QPs take it or drop it.
    counters = [status["counters"] for status in statuses]
    assert bench.counters()["roce_ack"]["acks"] == \
        sum(qp["acks"] + qp["acks_dropped"] for qp in counters)
    assert bench.counters()["roce_ack"]["icrc_errors"] == sum(qp["icrc_errors"] for qp in counters)
    bench.close()


def check_counters(qp, status, faults):
    """The core's counters of a QP against what its model did."""
    counters, model = status["counters"], qp.responder.stats
    context = f"QP {qp.index}: {counters}\nmodel: {model}"
    assert (status["error"], status["outstanding"]) == (0, 0), status
    assert (counters["packets"], counters["bytes"]) == (qp.packets, qp.bytes), context
    # Every frame the core sent reached the model, which counts it before any fault.
    assert counters["retransmitted"] == qp.retransmitted == \
        model["frames_received"] - qp.packets, context
    # Every ACK frame the model sent reached the core (the bench loses nothing): it
    # was taken, dropped outside the window, or dropped for its ICRC.
    assert counters["acks"] + counters["acks_dropped"] + counters["icrc_errors"] == \
        model["frames_sent"], context
    # Only the model's corruption makes a bad ICRC; a corrupted ACK that is also
    # duplicated arrives twice, and the model counts it once.
    corrupted = model["acks_corrupted_fault"]
    if faults.ack_duplicate:
        assert corrupted <= counters["icrc_errors"] <= 2 * corrupted, context
    else:
        assert counters["icrc_errors"] == corrupted, context
    # A ghost ACK is 2^22 or more ahead: outside any window. Without losses and RNR
    # there are no NAKs and nothing is resent, so the second copy of a duplicated ACK
    # is behind the window (the first took it) and nothing else is dropped. With them,
    # the model re-ACKs every duplicate packet it gets, and a NAK's PSN stays in the
    # window until the resent packet is acknowledged: more may be dropped or taken.
    lossy = faults.packet_drop or faults.ack_drop or faults.ack_corrupt or \
        faults.stall_at is not None
    rnr = faults.rnr_burst or faults.rnr_rate
    if lossy or rnr:
        assert counters["acks_dropped"] >= model["ghost_acks"], context
    else:
        assert counters["acks_dropped"] == \
            model["ghost_acks"] + model["acks_duplicated_fault"], context
        assert counters["retransmitted"] == 0, context
    # NAKs: exactly those the model sent, unless ACK frames are lost (fewer arrive)
    # or duplicated (a NAK's copy may be taken too).
    for core, ours in (("naks_sequence", "naks_sequence"), ("naks_rnr", "naks_rnr")):
        if faults.ack_drop or faults.ack_corrupt or faults.ack_duplicate:
            assert counters[core] <= model[ours] + model["acks_duplicated_fault"], context
        else:
            assert counters[core] == model[ours], context
    assert counters["naks_invalid"] == counters["naks_access"] == \
        counters["naks_operational"] == 0, context
    # An RNR wait starts with an RNR NAK taken, unless one is running already.
    assert (counters["rnr_waits"] > 0) == (counters["naks_rnr"] > 0), context
    assert counters["rnr_waits"] <= counters["naks_rnr"], context
    # Without a lost packet or ACK nothing may time out: the timeout is long enough.
    if not lossy:
        assert counters["timeouts"] == 0, context
    if model["dropped_stall"]:
        assert counters["timeouts"] > 0, context


@cocotb.test()
async def packet_loss_1_percent(dut):
    await survives(dut, Faults(packet_drop=0.01), seed=11, happened=["packets_dropped_fault"])


@cocotb.test()
async def packet_loss_10_percent(dut):
    await survives(dut, Faults(packet_drop=0.1), seed=12, happened=["packets_dropped_fault"],
                   rounds=2)


@cocotb.test()
async def ack_loss(dut):
    await survives(dut, Faults(ack_drop=0.1), seed=13, happened=["acks_dropped_fault"])


@cocotb.test()
async def duplicated_and_ghost_acks(dut):
    await survives(dut, Faults(ack_duplicate=0.2, ghost_ack=0.2), seed=14,
                   happened=["acks_duplicated_fault", "ghost_acks"], rounds=2)


@cocotb.test()
async def corrupted_acks(dut):
    await survives(dut, Faults(ack_corrupt=0.1), seed=15, happened=["acks_corrupted_fault"])


@cocotb.test()
async def rnr_bursts(dut):
    await survives(dut, Faults(rnr_burst=4, rnr_rate=0.1), seed=16, happened=["rnr_by_fault"],
                   rounds=2)


@cocotb.test()
async def responder_stalls_longer_than_the_timeout(dut):
    await survives(dut, Faults(stall_at=1500, stall_cycles=3 * TIMEOUT_CYCLES), seed=17,
                   happened=["dropped_stall"], rounds=2)


@cocotb.test()
async def every_fault_at_once(dut):
    faults = Faults(packet_drop=0.03, ack_drop=0.05, ack_duplicate=0.05, ghost_ack=0.05,
                    ack_corrupt=0.05, rnr_burst=3, rnr_rate=0.05, stall_at=3000,
                    stall_cycles=2 * TIMEOUT_CYCLES)
    await survives(dut, faults, seed=18, rounds=3,
                   happened=["packets_dropped_fault", "acks_dropped_fault",
                             "acks_duplicated_fault", "ghost_acks", "acks_corrupted_fault",
                             "rnr_by_fault", "dropped_stall"])


async def expect_error(run, qp, status):
    """The QP's counters once it failed, checked to be in ERROR for ``status``."""
    result = await run.bench.qp_status(qp.index)
    assert result["error"] == 1 and result["error_status"] == status.value, result
    return result["counters"]


async def stopped_sending(run, qp, tag):
    """A QP in ERROR sends nothing: not after a wait of a few timeouts, and not for a
    work request posted now, which completes FLUSHED at once. Returns the next tag."""
    frames = qp.responder.stats["frames_received"]
    counters = (await run.bench.qp_status(qp.index))["counters"]
    run.post(qp, run.message(qp, "RDMA_WRITE", bytes(300)), tag, CompletionStatus.FLUSHED.value)
    await run.bench.wait_completions(len(run.completions), timeout_cycles=500)
    await run.bench.idle(3 * TIMEOUT_CYCLES)
    assert qp.responder.stats["frames_received"] == frames, f"QP {qp.index} sent after ERROR"
    assert (await run.bench.qp_status(qp.index))["counters"] == counters
    return tag + 1


@cocotb.test()
async def never_answering_peer_exhausts_retries(dut):
    """A peer that never answers: after the first timeout and ``retry_count`` resends
    the QP is in ERROR, its first work request RETRY_EXCEEDED and the rest FLUSHED;
    the other QPs keep working; set again, the QP works."""
    bench = await start(dut, tx_ready=0.8, seed=21)
    run = RoceRun(bench)
    qps = three_qps()
    silent, others = qps[0], qps[1:]
    silent.retry_count = 2
    await run.open(silent, faults=Faults(silent=True))
    for qp in others:
        await run.open(qp)
    rng = random.Random(21)
    statuses = [CompletionStatus.RETRY_EXCEEDED] + [CompletionStatus.FLUSHED] * 3
    for tag, (verb, status) in enumerate(zip(VERBS, statuses, strict=True)):
        run.post(silent, run.message(silent, verb, rng.randbytes(300)), tag, status.value)
    tag = post_mix(run, others, 1, rng, first_tag=len(statuses))
    await run.finish(timeout_cycles=(silent.retry_count + 2) * TIMEOUT_CYCLES + 50_000,
                     retransmissions=True)
    for qp in others:
        await run.check_status(qp)

    counters = await expect_error(run, silent, CompletionStatus.RETRY_EXCEEDED)
    sent = len(silent.sent)
    assert sent == len(statuses) * 2, "every packet is sent before the first timeout"
    assert counters["packets"] == sent
    assert counters["timeouts"] == silent.retry_count + 1, counters
    # Go-back-N resends every packet after each timeout but the last.
    assert counters["retransmitted"] == silent.retry_count * sent == silent.retransmitted
    assert silent.responder.stats["frames_received"] == sent + silent.retransmitted
    assert counters["acks"] == counters["acks_dropped"] == 0, counters
    tag = await stopped_sending(run, silent, tag)

    silent.retry_count = 7
    await run.open(silent)
    run.post(silent, run.message(silent, "SEND", rng.randbytes(700)), tag)
    await run.finish()
    await run.check_status(silent)
    bench.close()


@cocotb.test()
async def error_naks_stop_the_qp(dut):
    """NAK remote access error (a WRITE outside the peer's memory) and NAK invalid
    request (a SEND longer than its receive): each QP goes to ERROR with that status,
    the work request completes with it and later ones FLUSHED, the packet is not
    resent and the QP sends nothing more; a third QP keeps working."""
    bench = await start(dut, tx_ready=0.8, seed=31)
    run = RoceRun(bench)
    access, invalid, good = qps = three_qps()
    for qp in qps:
        await run.open(qp)
    rng = random.Random(31)
    flushed = CompletionStatus.FLUSHED.value

    run.post(access, run.message(access, "SEND", rng.randbytes(100)), 0)
    outside = access.memory_base + len(access.responder.memory) - 10
    run.post(access, Message("RDMA_WRITE", rng.randbytes(1500), remote_address=outside), 1,
             CompletionStatus.REMOTE_ACCESS_ERROR.value)
    run.post(access, run.message(access, "RDMA_WRITE", rng.randbytes(40)), 2, flushed)

    run.post(invalid, run.message(invalid, "RDMA_WRITE", rng.randbytes(2000)), 10)
    invalid.responder.post_receive(length=16)
    run.post(invalid, run.message(invalid, "SEND", rng.randbytes(1500)), 11,
             CompletionStatus.REMOTE_INVALID_REQUEST.value)
    run.post(invalid, run.message(invalid, "SEND_WITH_IMMEDIATE", rng.randbytes(8)), 12,
             flushed)

    tag = post_mix(run, [good], 1, rng, first_tag=20)
    await run.finish(retransmissions=False)
    await run.check_status(good)

    for qp, status, nak in ((access, CompletionStatus.REMOTE_ACCESS_ERROR, "naks_access"),
                            (invalid, CompletionStatus.REMOTE_INVALID_REQUEST, "naks_invalid")):
        assert qp.responder.state == "ERROR"
        counters = await expect_error(run, qp, status)
        assert counters[nak] == 1, counters
        assert counters["retransmitted"] == qp.retransmitted == 0, counters
        assert counters["timeouts"] == 0, counters
        tag = await stopped_sending(run, qp, tag)
    await run.finish()
    # What came before the failing message landed.
    assert access.responder.receive_queue == access.receives
    assert invalid.responder.memory == invalid.image
    bench.close()
