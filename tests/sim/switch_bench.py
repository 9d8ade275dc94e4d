"""cocotb test of the whole core behind a congested switch; run through
tests/sim/test_core.py.

Four generator runs of 1 KiB RDMA WRITEs through the CM, each QP to its own
ConnectX-class peer, all through one switch port of half the line rate
(sim/models/switch.py, between the core's transmit side and the peers) that marks ECN CE
with RED; each peer sends a CNP for a marked packet of its QP, at most one per
``CNP_GAP``. DCQCN in the core must bring the four QPs to within 10 % of each other
while the queue stays below K_max after the first cuts, and nothing is dropped.

The run is scaled ten times faster than real time to fit about 250,000 cycles
(``SCALED`` of sim/bench/dcqcn.py, which runs the same settings through the
reference model): DCQCN's time base is 32 clock cycles a "microsecond"
(``cycles_per_us``; rates in the settings are then in units of 10 Mb/s: the line is
9,930 of them), and the switch's thresholds and the peers' ``min_time_between_cnps``
(4 of those µs) are scaled alike: K_min 500 B, K_max 20 KB, P_max 100 %. The DCQCN
settings are ConnectX's but for a faster recovery (the target rate clamped at each
cut, the byte counter off, a timer event every 15 µs), and the first CNP sets the
QP to 20 % of the line.
"""

import cocotb
from cm_bench import Host, open_qp, start_run
from roce_bench import RoceRun, start

from sim.bench.dcqcn import SCALED
from sim.models.responder import ConnectX, round_trip_cycles
from sim.models.switch import CongestedSwitch

RED = SCALED.red
SWITCH = SCALED.switch()
MESSAGES = 1000


@cocotb.test()
async def four_qps_converge_behind_a_marking_switch(dut):
    bench = await start(dut, line=True, seed=71)
    await bench.configure_dcqcn(**SCALED.gateware_config())
    switch = CongestedSwitch(SWITCH)
    bench.attach_switch(switch)
    run = RoceRun(bench)
    hosts = [Host(0x71 + k, psn=0x100 * k, rkey=0x7100 + k, base=0x1000_0000 * (k + 1),
                  path_mtu=4096, ring=64 * SCALED.payload) for k in range(4)]
    qps = [await open_qp(run, host, memory_size=host.ring,
                         connectx=ConnectX(round_trip=round_trip_cycles(1),
                                           cnp_gap=SCALED.cnp_gap))
           for host in hosts]
    for qp, host in zip(qps, hosts, strict=True):
        await start_run(run, qp, host, length=SCALED.payload, count=MESSAGES, write=True,
                        immediate=False)
    await run.finish(timeout_cycles=600_000)

    arrivals = [arrival for arrival in switch.arrivals if arrival.dqpn is not None]
    first = {qp.remote_qpn: min(a.time for a in arrivals if a.dqpn == qp.remote_qpn)
             for qp in qps}
    last = {qp.remote_qpn: max(a.time for a in arrivals if a.dqpn == qp.remote_qpn)
            for qp in qps}
    # While all four send: from the last one's start to the first one's end; the
    # second half of that is the steady state.
    begin, end = max(first.values()), min(last.values())
    steady = (begin + end) // 2
    rates = {qpn: sum(a.size for a in arrivals if a.dqpn == qpn and steady <= a.time < end)
             / (end - steady) for qpn in first}
    mean = sum(rates.values()) / len(rates)
    depth = max(a.depth for a in arrivals if steady <= a.time < end)
    cnps = [qp.responder.stats["cnps_sent"] for qp in qps]
    deepest = max(arrivals, key=lambda arrival: arrival.depth)
    report = (f"all four from {begin} to {end} cycles; steady from {steady}: rates "
              f"{ {hex(q): round(r, 2) for q, r in rates.items()} } B/cycle (mean {mean:.2f}, "
              f"bottleneck {SWITCH.rate:.2f}); queue at most {depth} B then, "
              f"{switch.queue.stats.max_depth} B over the run (at cycle {deepest.time}); "
              f"CNPs {cnps}; "
              f"{switch.queue.stats}")
    dut._log.info(report)
    assert end - steady >= 50_000, report
    assert all(abs(rate - mean) <= 0.1 * mean for rate in rates.values()), report
    assert sum(rates.values()) >= 0.9 * SWITCH.rate, report
    assert depth < RED.k_max, report
    assert switch.queue.stats.dropped == 0, report
    assert all(count > 0 for count in cnps), report
    for qp in qps:
        status = await bench.qp_status(qp.index)
        assert status["counters"]["timeouts"] == 0, status
        assert status["counters"]["cnps"] == qp.responder.stats["cnps_sent"], status
    bench.close()
