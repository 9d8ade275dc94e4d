"""cocotb tests of PAUSE and PFC through NetworkCore; run through tests/sim/test_core.py.

One QP streams 1 KiB RDMA WRITEs to a ConnectX-like peer while PAUSE or PFC frames
(sim/models/pause.py) come in. The pause quantum is set to 1/32 cycle, so 0xFFFF quanta are
2048 cycles, twice the QPs' ACK timeout (2^6 ticks of 16 cycles): the run must still
complete without a timeout, as the paused time counts against no timer: PAUSE holds
every frame, PFC only the RoCE priority.
"""

from collections import deque

import cocotb
from roce_bench import Qp, RoceRun, start
from scapy.layers.inet import ICMP, IP
from scapy.layers.l2 import Ether

from gateware.eth.mac_control import QUANTUM_FRACTION_BITS
from sim.models.pause import MacBoundaryWatch, pause_frame, pfc_frame
from sim.models.responder import ConnectX, round_trip_cycles

OUR_MAC, OUR_IP = "02:00:00:00:00:02", "10.77.0.2"
PEER_MAC, PEER_IP = "52:54:00:12:34:56", "10.77.0.1"

ROCE_PRIORITY = 3
TIMEOUT = 6                                 # ACK timeout: 2^6 ticks of 16 cycles
QUANTUM = 8                                 # 8/256 cycle a quantum
PAUSE_CYCLES = -(-0xFFFF * QUANTUM >> QUANTUM_FRACTION_BITS)    # 2048
MESSAGES = 96

#: Cycles from a MAC control frame's last beat in until no frame it pauses may start
#: (the receive FIFO, the header extractors, the timers' pipeline) or one may again.
RESPONSE = 16

#: Under PFC, RoCEv2 frames are held where they leave the requester (the frames already
#: past it leave, so the others behind them are not held): a resumed one goes through
#: UDP, IPv4, ICRC, ARP and Ethernet to the MAC first, 21 cycles at the most here.
PFC_RESUME = RESPONSE + 8


async def pausing_run(dut, seed):
    """A bench with one QP and its peer, MESSAGES 1 KiB WRITEs posted, and a watch on the
    MAC boundary that has seen the first few RoCEv2 frames leave."""
    bench = await start(dut, seed=seed)
    await bench.configure_pause(roce_priority=ROCE_PRIORITY, quantum_cycles=QUANTUM)
    watch = MacBoundaryWatch(bench)
    run = RoceRun(bench)
    qp = Qp(0, remote_qpn=0x400, psn=0xFFFFF0, rkey=0x55, path_mtu=1024, src_port=0xC100,
            timeout=TIMEOUT)
    await run.open(qp, connectx=ConnectX(round_trip=round_trip_cycles(1)))
    for tag in range(MESSAGES):
        run.post(qp, run.message(qp, "RDMA_WRITE", bytes([tag]) * 1024), tag)
    while len(watch.roce_starts(0)) < 4:
        await bench.idle(1)
    return bench, watch, run, qp


def check_held(watch, paused, until, *, everything):
    """No frame (``everything``) or no RoCEv2 frame starts from RESPONSE cycles after the
    pause came in until it ends, and RoCEv2 frames start again at once after (within
    RESPONSE cycles after a PAUSE, PFC_RESUME after a PFC)."""
    held = watch.all_starts(paused + RESPONSE, until) if everything else \
        watch.roce_starts(paused + RESPONSE, until)
    assert held == [], f"paused at {paused} until {until}: frames started at {held}"
    resumed = watch.roce_starts(paused + RESPONSE)[0]
    assert until <= resumed <= until + (RESPONSE if everything else PFC_RESUME), \
        f"paused at {paused} until {until}: the next RoCEv2 frame started at {resumed}"


async def finish_without_timeouts(run, qp):
    await run.finish(timeout_cycles=40_000)
    status = await run.check_status(qp)
    assert status["counters"]["timeouts"] == 0, status


@cocotb.test()
async def pause_holds_every_frame_longer_than_the_ack_timeout(dut):
    """(a) A PAUSE of 0xFFFF quanta (2048 cycles, twice the ACK timeout) holds every
    frame after the one under way until it ends; one ended by a PAUSE of quanta 0
    resumes at once; every message completes, none timed out or was sent twice."""
    bench, watch, run, qp = await pausing_run(dut, seed=61)
    paused = await watch.send_control(pause_frame(0xFFFF))
    await bench.idle(PAUSE_CYCLES + 2 * RESPONSE)
    check_held(watch, paused, paused + PAUSE_CYCLES, everything=True)

    paused = await watch.send_control(pause_frame(0xFFFF, dst=OUR_MAC))
    await bench.idle(PAUSE_CYCLES // 2)
    resumed = await watch.send_control(pause_frame(0))
    await bench.idle(2 * RESPONSE)
    check_held(watch, paused, resumed, everything=True)

    await finish_without_timeouts(run, qp)
    counters = bench.counters()["mac_control"]
    assert (counters["pause"], counters["pfc"]) == (3, 0), counters
    # The first pause ran its time out; the second one until the quanta-0 frame.
    paused_cycles = PAUSE_CYCLES + resumed - paused
    assert abs(counters["paused_cycles"] - paused_cycles) <= 2, (counters, paused_cycles)
    bench.close()


@cocotb.test()
async def pfc_holds_the_roce_priority_only(dut):
    """(b) A PFC of 0xFFFF quanta for priority 3 holds RoCEv2 frames (an echo reply
    still leaves meanwhile) until it ends; a PFC for every other priority pauses
    nothing; a PFC of quanta 0 for priority 3 resumes at once; no timeouts."""
    bench, watch, run, qp = await pausing_run(dut, seed=62)
    paused = await watch.send_control(pfc_frame(1 << ROCE_PRIORITY, [0xFFFF] * 8))
    await bench.idle(PAUSE_CYCLES // 4)
    ping = Ether(src=PEER_MAC, dst=OUR_MAC) / IP(src=PEER_IP, dst=OUR_IP) / ICMP(id=7, seq=1)
    await bench.send(bytes(ping))
    await bench.idle(PAUSE_CYCLES * 3 // 4 + 2 * RESPONSE)
    check_held(watch, paused, paused + PAUSE_CYCLES, everything=False)
    others = watch.all_starts(paused + RESPONSE, paused + PAUSE_CYCLES)
    replies = [frame for frame in bench.received if ICMP in Ether(frame)]
    assert len(others) == len(replies) == 1, "the echo reply left during the PFC pause"
    bench.received = deque(frame for frame in bench.received if ICMP not in Ether(frame))

    ignored = await watch.send_control(pfc_frame(0xFF & ~(1 << ROCE_PRIORITY), [0xFFFF] * 8))
    await bench.idle(300)
    sent = watch.roce_starts(ignored, ignored + 300)
    gaps = [later - earlier for earlier, later in zip([ignored, *sent[:-1]], sent, strict=True)]
    assert len(sent) >= 5 and max(gaps) <= RESPONSE + 20, \
        f"a PFC for other priorities held RoCEv2 frames: {sent}"

    paused = await watch.send_control(pfc_frame(1 << ROCE_PRIORITY, [0xFFFF] * 8))
    await bench.idle(PAUSE_CYCLES // 2)
    resumed = await watch.send_control(pfc_frame(1 << ROCE_PRIORITY, [0] * 8))
    await bench.idle(2 * RESPONSE)
    check_held(watch, paused, resumed, everything=False)

    await finish_without_timeouts(run, qp)
    counters = bench.counters()["mac_control"]
    assert (counters["pause"], counters["pfc"]) == (0, 4), counters
    bench.close()
