"""cocotb test of DCQCN in the whole core; run through tests/sim/test_core.py.

Two generator runs of 1 KiB RDMA WRITEs through the CM, each to a ConnectX-class
peer; the first peer sends a CNP every 25 µs while its QP sends. That QP's rate,
measured on the wire between one CNP and the next, must follow the reference model
(sim.models.dcqcn fed with the same CNP arrival times) within 5 %, and the other QP must take
the bandwidth it frees. The settings are ConnectX's but for a faster recovery, scaled
to fit a 150 µs run: the first CNP sets 30 Gb/s, the target rate is clamped at each
cut, and a timer increase event comes every 15 µs (ConnectX: 300 µs) adding 500 Mb/s
(5); the byte counter is off.
"""

import dataclasses

import cocotb
from cm_bench import Host, open_qp, start_run
from roce_bench import RoceRun, start
from scapy.contrib.roce import BTH
from scapy.layers.l2 import Ether

from gateware.roce.pacer import WIRE_OVERHEAD
from sim.models.dcqcn import DcqcnSettings, ReactionPoint
from sim.models.responder import OP_CNP, ConnectX, round_trip_cycles
from sim.testbench import CLOCK_PERIOD_PS

CYCLES_PER_US = round(1e6 / CLOCK_PERIOD_PS)
SETTINGS = DcqcnSettings(rate_to_set_on_first_cnp=30_000, clamp_tgt_rate=1, rpg_time_reset=15,
                         rpg_byte_reset=0, rpg_ai_rate=500, rpg_hai_rate=5000)
LENGTH = 1024
#: An RDMA WRITE ONLY of LENGTH bytes on the wire: BTH, RETH, payload, ICRC, and the rest.
WIRE_BYTES = 12 + 16 + LENGTH + 4 + WIRE_OVERHEAD
LINE_MBPS = 100_000


def gateware_settings(settings):
    return {field.name: getattr(settings, field.name)
            for field in dataclasses.fields(settings) if field.name != "rpg_min_dec_fac"}


def model_rates(settings, cnps, windows):
    """The model's mean rate (Mb/s) over each (start, end) window, in µs, with CNPs at
    the times ``cnps``."""
    model = ReactionPoint(settings)
    pending = sorted(cnps)
    step = 0.25
    means = []
    for start_us, end_us in windows:
        total, now = 0.0, start_us
        while now < end_us:
            while pending and pending[0] <= now:
                model.cnp(pending.pop(0))
            model.advance(now)
            total += model.rate * step
            now += step
        means.append(total / (end_us - start_us))
    return means


@cocotb.test()
async def cnps_every_25_us_on_one_of_two_qps(dut):
    bench = await start(dut, line=True, seed=61)
    await bench.configure_dcqcn(**gateware_settings(SETTINGS))
    run = RoceRun(bench)
    round_trip = round_trip_cycles(2)
    hosts = [Host(0x61 + k, psn=0x100 * k, rkey=0x6100 + k, base=0x1000_0000 * (k + 1),
                  path_mtu=4096, ring=64 * LENGTH) for k in range(2)]
    marked = await open_qp(run, hosts[0], memory_size=hosts[0].ring, connectx=ConnectX(
        round_trip=round_trip, cnp_interval=round(25 * 1e6 / CLOCK_PERIOD_PS)))
    other = await open_qp(run, hosts[1], memory_size=hosts[1].ring,
                          connectx=ConnectX(round_trip=round_trip))
    for qp, host, count in ((marked, hosts[0], 600), (other, hosts[1], 1500)):
        await start_run(run, qp, host, length=LENGTH, count=count, write=True,
                        immediate=False)
    await run.finish(timeout_cycles=400_000)

    cnps = [cycle for cycle, frame in bench.answers
            if Ether(frame)[BTH].opcode == OP_CNP and Ether(frame)[BTH].dqpn == marked.qpn]
    sent = {qp.index: [cycle for cycle, dqpn, _ in bench.roce_sent if dqpn == qp.remote_qpn]
            for qp in (marked, other)}
    both_end = min(sent[marked.index][-1], sent[other.index][-1])
    edges = [cycle for cycle in cnps if cycle <= both_end]
    assert len(edges) >= 5, f"only {len(edges)} CNPs while both QPs sent"
    windows = list(zip(edges, edges[1:], strict=False))
    expected = model_rates(SETTINGS, [cycle / CYCLES_PER_US for cycle in cnps],
                           [(a / CYCLES_PER_US, b / CYCLES_PER_US) for a, b in windows])

    def rate(qp, start_cycle, end_cycle):
        frames = sum(start_cycle <= cycle < end_cycle for cycle in sent[qp.index])
        return frames * WIRE_BYTES * 8 / ((end_cycle - start_cycle) / CYCLES_PER_US)

    report = []
    for (start_cycle, end_cycle), want in zip(windows, expected, strict=True):
        got, freed = rate(marked, start_cycle, end_cycle), rate(other, start_cycle, end_cycle)
        report.append(f"{start_cycle / CYCLES_PER_US:8.1f} µs: model {want:8.0f} Mb/s, "
                      f"QP {marked.index} {got:8.0f}, QP {other.index} {freed:8.0f}")
    dut._log.info("rates between CNPs:\n" + "\n".join(report))
    for (start_cycle, end_cycle), want in zip(windows, expected, strict=True):
        got, freed = rate(marked, start_cycle, end_cycle), rate(other, start_cycle, end_cycle)
        assert abs(got - want) <= 0.05 * want, "\n".join(report)
        assert freed >= 0.9 * (LINE_MBPS - got), "\n".join(report)
    for qp in (marked, other):
        status = await bench.qp_status(qp.index)
        assert status["counters"]["timeouts"] == 0, status
    assert marked.responder.stats["cnps_sent"] == len(cnps)
    bench.close()
