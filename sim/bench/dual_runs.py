"""The cocotb side of ``python -m sim.bench.dual``: both cores of
:class:`~sim.bench.dual.DualCores` at once, each port with its own bench on its own
100GbE line and its own ConnectX-like responder model (sim/models/responder.py).

BENCH_PARAMS gives the ports (the prefix of their signals, their addresses, their
peer's, their pcap), the messages per port, their length, path MTU and round trip, and
the JSON file to write each port's measurements to. The run checks what it measures:
every message on each port completes successfully, each model executed every packet
once, and every message's bytes landed.
"""

import json
import os

import cocotb

from sim.bench.connectx_runs import MEMORY, TICK, Run, landed
from sim.testbench import NetworkBench

PARAMS = json.loads(os.environ["BENCH_PARAMS"])


@cocotb.test()
async def both_ports_at_line_rate(dut):
    """``messages`` RDMA WRITEs posted on each port at once, one QP a port."""
    ports, messages, length = PARAMS["ports"], PARAMS["messages"], PARAMS["length"]
    assert messages * length <= MEMORY, "every message's bytes must stay in the model"
    benches = [NetworkBench(dut, pcap=port["pcap"], peers={port["peer_ip"]: port["peer_mac"]},
                            line=True, port=port["prefix"], clock=index == 0,
                            address=(port["mac"], port["ip"]))
               for index, port in enumerate(ports)]
    for bench in benches:                   # one reset, which every bench's inputs await
        await bench.reset()
    runs, peers = [], []
    for bench, port in zip(benches, ports, strict=True):
        await bench.configure_roce(tos=0x02, tick=TICK)
        run = Run(bench, 0, peer_ip=port["peer_ip"])
        peers.append(await run.open(0, path_mtu=PARAMS["path_mtu"],
                                    round_trip=PARAMS["round_trip"]))
        await run.warm_up([0])
        runs.append(run)
    ks = range(1, messages + 1)
    for k in ks:
        for run in runs:
            run.post(0, "RDMA_WRITE", length, k)
    packets = messages * -(-length // PARAMS["path_mtu"])
    for run in runs:
        await run.finish(100_000 + 200 * packets)
    rows = []
    for bench, run, peer, port in zip(benches, runs, peers, ports, strict=True):
        assert peer.stats["executed"] == packets + 1, peer.stats     # and the warm-up's
        assert landed(peer, "RDMA_WRITE", length, ks), port
        summary = await run.summary(0)
        rows.append({"port": ports.index(port) + 1, "ip": port["ip"], "messages": messages,
                     "length": length, "path_mtu": PARAMS["path_mtu"],
                     "round_trip": PARAMS["round_trip"], "first_cycle": bench.tx_first_cycle,
                     "line_cycles": bench.line_cycles(), "tail": run.tail(),
                     "retransmitted": summary["retransmitted"],
                     "timeouts": summary["timeouts"], "frames": summary["frames"] - 1})
    with open(PARAMS["results"], "w") as file:
        json.dump(rows, file, indent=1)
    for bench in benches:
        bench.close()
