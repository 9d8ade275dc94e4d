"""cocotb tests of the reliable requester of NetworkCore against a ConnectX-class peer
(sim/models/responder.py, ``ConnectX``); run through tests/sim/test_core.py.

The peer acknowledges every packet that asks at once, a round trip of 1 us later, so
at 100 Gb/s the acknowledgements of 64-byte messages arrive every 4 cycles; it pairs
an RNR NAK with a sequence NAK for the same PSN; it sends CNPs. Each test checks one
property: (a) nothing is lost at that rate, (b) RNR and sequence
NAK pairs do not use up the transport retries, (c) the ACK timer runs from the oldest
unacknowledged packet, (d) timers are served while acknowledgements stream in.
"""

import cocotb
from roce_bench import TICK, Qp, RoceRun, start
from scapy.contrib.roce import AETH, BTH
from scapy.layers.l2 import Ether

from gateware.roce.timers import rnr_delay_ticks
from sim.models.responder import OP_ACKNOWLEDGE, OP_CNP, ConnectX, Faults, round_trip_cycles

#: The peer's round trip: 1 us, 322 cycles.
ROUND_TRIP = round_trip_cycles(1)

#: ACK timeout of the QPs: 2^7 ticks of 16 cycles, 2048 cycles, six round trips.
TIMEOUT = 7
TIMEOUT_CYCLES = (1 << TIMEOUT) * TICK

#: How far from its time a timer may be served, seen on the wire: its start and
#: expiry fall on ticks, the engine's timer sweep finds it some cycles late, and a packet leaves
#: the wire some cycles after the engine counts it sent.
TIMER_SLACK = 2 * TICK + 32

#: A ConnectX-5 with every answer one round trip after its packet, and a CNP for
#: every 8th packet (a congested switch marks them).
PEER = ConnectX(round_trip=ROUND_TRIP, cnp_every=8)


def qp(index, **kwargs):
    return Qp(index, remote_qpn=0x300 + index, psn=(0xFFFFC0 + 0x11_1111 * index) % (1 << 24),
              rkey=0xC000 + index, path_mtu=4096, src_port=0xC200 + index, timeout=TIMEOUT,
              **kwargs)


def check_every_answer_taken(counters, model, context):
    """Every ACK and NAK the peer sent was taken: none lost, and none dropped (nothing
    was executed twice, so there are no duplicates); every CNP was counted."""
    assert counters["acks"] == model["frames_sent"] - model["cnps_sent"], context
    assert counters["acks_dropped"] == 0, context
    assert counters["cnps"] == model["cnps_sent"], context


async def check_clean_run(run, qp):
    """A QP whose peer lost nothing: every answer taken, nothing timed out."""
    status = await run.bench.qp_status(qp.index)
    counters, model = status["counters"], qp.responder.stats
    context = f"QP {qp.index}: {counters}\nmodel: {model}"
    assert (status["error"], status["outstanding"]) == (0, 0), context
    check_every_answer_taken(counters, model, context)
    assert counters["timeouts"] == 0, context


def answer_kind(frame):
    bth = Ether(frame)[BTH]
    if bth.opcode == OP_CNP:
        return "CNP"
    assert bth.opcode == OP_ACKNOWLEDGE
    return {0: "ACK", 1: "RNR", 3: "NAK"}[Ether(frame)[AETH].syndrome >> 5]


def sent_cycles(bench, qp, psn):
    """The cycles at which the core sent PSN ``psn`` of a QP, first and resends."""
    return [cycle for cycle, dqpn, sent in bench.roce_sent
            if dqpn == qp.remote_qpn and sent == psn]


@cocotb.test()
async def sixteen_qps_of_64_byte_messages_acknowledged_at_once(dut):
    """(a) 16 QPs, 64-byte WRITEs and SENDs back to back at 100 Gb/s, each acknowledged
    by the peer (and some CNPs): every message completes, no acknowledgement is lost,
    nothing times out, and the last completion follows the last ACK closely. DCQCN is
    off: the CNPs are only counted here (its reaction is dcqcn_bench's)."""
    bench = await start(dut, line=True, seed=41, dcqcn=False)
    run = RoceRun(bench)
    qps = [qp(index) for index in range(16)]
    for each in qps:
        await run.open(each, connectx=PEER)
    tag = 0
    for round_ in range(24):
        for each in qps:
            verb = ("RDMA_WRITE", "SEND")[(round_ + each.index) % 2]
            run.post(each, run.message(each, verb, bytes([tag % 256]) * 64), tag)
            tag += 1
    await run.finish(timeout_cycles=20_000)
    for each in qps:
        await check_clean_run(run, each)
    assert sum(each.responder.stats["cnps_sent"] for each in qps) >= 16 * 24 // 8
    last_ack = max(cycle for cycle, frame in bench.answers if answer_kind(frame) == "ACK")
    tail = max(bench.completion_cycles) - last_ack
    assert tail <= 300, f"the last completion came {tail} cycles after the last ACK"
    assert bench.counters()["roce_ack"]["unsupported"] == 0, bench.counters()["roce_ack"]
    bench.close()


@cocotb.test()
async def ten_rounds_of_rnr_and_sequence_naks_with_one_retry(dut):
    """(b) The peer has no receive for 10 rounds: each round it answers the SEND with
    an RNR NAK and the 3 packets in flight behind it with a NAK sequence error for the
    same PSN. With ``retry_count`` 1 every message completes (the sequence NAK of an
    RNR round is not a transport retry), and the QP sends nothing during an RNR wait."""
    bench = await start(dut, seed=42)
    run = RoceRun(bench)
    rnr = qp(1, retry_count=1)
    await run.open(rnr, connectx=ConnectX(round_trip=ROUND_TRIP),
                   faults=Faults(rnr_burst=10), rnr_timer=1)
    run.post(rnr, run.message(rnr, "SEND", bytes(range(64))), 0)
    for tag in range(1, 4):
        run.post(rnr, run.message(rnr, "RDMA_WRITE", bytes([tag]) * 64), tag)
    await run.finish(timeout_cycles=10 * (ROUND_TRIP + 400) + TIMEOUT_CYCLES,
                     retransmissions=True)
    model = rnr.responder.stats
    assert model["naks_rnr"] == model["naks_sequence"] == 10, model
    status = await bench.qp_status(rnr.index)
    counters = status["counters"]
    assert (status["error"], status["outstanding"]) == (0, 0), status
    assert (counters["naks_rnr"], counters["rnr_waits"], counters["timeouts"]) == (10, 10, 0), \
        counters
    check_every_answer_taken(counters, model, f"{counters}\nmodel: {model}")
    # No packet of the QP leaves during an RNR wait (ticks round it down by one).
    wait = (rnr_delay_ticks(1) - 1) * TICK
    for cycle, frame in bench.answers:
        if answer_kind(frame) == "RNR":
            later = [sent for sent, dqpn, _ in bench.roce_sent
                     if dqpn == rnr.remote_qpn and sent > cycle]
            assert later and later[0] >= cycle + wait, \
                f"RNR NAK at {cycle}: sent at {later[:1]}, before the wait of {wait} ended"
    bench.close()


@cocotb.test()
async def lost_nak_on_a_slow_qp_is_resent_one_timeout_after_the_lost_packet(dut):
    """(c) One message per quarter of the ACK timeout; message 2 is lost and so is the
    NAK sequence error that message 3 draws, so the peer drops every later packet.
    The ACK timer runs from the oldest unacknowledged packet (IBTA 9.7.6.1.3), not from
    the newest one sent: the resend starts one timeout after message 2 left."""
    bench = await start(dut, seed=43)
    run = RoceRun(bench)
    slow = qp(2)
    await run.open(slow, connectx=ConnectX(round_trip=ROUND_TRIP),
                   faults=Faults(packet_drop_at=(2,), ack_drop_at=(2,)))
    first_psn = slow.psn
    for tag in range(10):
        run.post(slow, run.message(slow, "RDMA_WRITE", bytes([tag]) * 64), tag)
        await bench.idle(TIMEOUT_CYCLES // 4)
    await run.finish(timeout_cycles=4 * TIMEOUT_CYCLES, retransmissions=True)
    model = slow.responder.stats
    assert model["packets_dropped_fault"] == model["acks_dropped_fault"] == 1, model
    assert model["naks_sequence"] == 1 and model["out_of_sequence_dropped"] >= 1, model
    sends = sent_cycles(bench, slow, (first_psn + 2) % (1 << 24))
    assert len(sends) == 2, sends
    delay = sends[1] - sends[0]
    assert TIMEOUT_CYCLES - TICK <= delay <= 3 * TIMEOUT_CYCLES // 2, \
        f"the lost packet was resent {delay} cycles after it was sent (timeout {TIMEOUT_CYCLES})"
    counters = (await bench.qp_status(slow.index))["counters"]
    assert (counters["timeouts"], counters["retransmitted"]) == (1, slow.retransmitted), counters
    bench.close()


@cocotb.test()
async def timer_expires_on_time_while_other_qps_are_acknowledged(dut):
    """(d) QPs 3, 4 and 5 stream 64-byte WRITEs as fast as the core sends them, each
    acknowledged; meanwhile the one packet of QP 6 is lost. QP 6's ACK timer is served
    on time, although ACKs arrive every few cycles throughout."""
    bench = await start(dut, seed=44)
    run = RoceRun(bench)
    busy, quiet = [qp(index) for index in (3, 4, 5)], qp(6)
    for each in busy:
        await run.open(each, connectx=ConnectX(round_trip=ROUND_TRIP))
    await run.open(quiet, connectx=ConnectX(round_trip=ROUND_TRIP),
                   faults=Faults(packet_drop_at=(0,)))
    quiet_psn = quiet.psn
    run.post(quiet, run.message(quiet, "RDMA_WRITE", bytes(64)), 5000)
    for tag in range(1200):
        each = busy[tag % len(busy)]
        run.post(each, run.message(each, "RDMA_WRITE", bytes([tag % 256]) * 64), tag)
    await run.finish(timeout_cycles=30_000, retransmissions=True)
    sends = sent_cycles(bench, quiet, quiet_psn)
    assert len(sends) == 2, sends
    # The others' ACKs arrive every few cycles while the timer runs out.
    expiry = sends[0] + TIMEOUT_CYCLES
    acks = [cycle for cycle, frame in bench.answers
            if Ether(frame)[BTH].dqpn != quiet.qpn and expiry - 400 <= cycle < expiry]
    assert len(acks) >= 400 // 8, f"only {len(acks)} ACKs in the 400 cycles before the expiry"
    delay = sends[1] - sends[0]
    assert abs(delay - TIMEOUT_CYCLES) <= TIMER_SLACK, \
        f"resent {delay} cycles after it was sent (timeout {TIMEOUT_CYCLES})"
    for each in busy:
        await check_clean_run(run, each)
    counters = (await bench.qp_status(quiet.index))["counters"]
    assert (counters["timeouts"], counters["retransmitted"]) == (1, 1), counters
    bench.close()
