"""The cocotb side of ``python -m sim.bench.latency``: one QP's RDMA WRITEs, each posted
while nothing is outstanding, timed at the core's ports on a 100GbE line.

BENCH_PARAMS gives the rows (``qps``: the QPs set, each with a ConnectX-like responder
model, sim/models/responder.py; ``qp``: the one that sends; ``length``, ``repetitions``,
``round_trip``) and the JSON file to write each row's cycle stamps to. Every QP of a row
sends one message first (so the peer's MAC is resolved), then ``repetitions`` times one
WRITE goes on ``qp`` after some idle cycles (a different number each time), and the
bench notes, in its cycles: the work request taken by the user request port, the first
beat of its frame taken from the MAC-side transmit stream, the model's ACK handed to the
MAC-side receive stream, and the completion taken from the completion stream. Every run
checks what it measures: one frame out and one ACK in per WRITE, no ARP, each WRITE
completed successfully and its bytes landed.
"""

import json
import os

import cocotb

from sim.bench.connectx_runs import MEMORY, Run, fresh, landed

PARAMS = json.loads(os.environ["BENCH_PARAMS"])
IDLE = 200                      # cycles before each measured WRITE: ACKs and timers settled


async def measure_one(run, qp, length, k):
    """Post WRITE ``k`` on ``qp`` and return its cycle stamps."""
    bench = run.bench
    seen = (len(bench.request_cycles), len(bench.tx_first_cycles), len(bench.answers),
            len(bench.arp_requests))
    run.post(qp, "RDMA_WRITE", length, k)
    await run.finish(20_000)
    requests = bench.request_cycles[seen[0]:]
    frames = bench.tx_first_cycles[seen[1]:]
    answers = bench.answers[seen[2]:]
    assert len(requests) == len(frames) == len(answers) == 1, (requests, frames, answers)
    assert len(bench.arp_requests) == seen[3], "an ARP request during a measurement"
    assert landed(run.peers[qp], "RDMA_WRITE", length, [k])
    return {"request": requests[0], "first_beat": frames[0][0], "ack": answers[0][0],
            "completion": bench.completion_cycles[-1]}


@cocotb.test()
async def write_latency(dut):
    bench = await fresh(dut)
    bench.record_timing()
    rows = []
    for number, row in enumerate(PARAMS["rows"]):
        run = Run(bench, number, memory=row["memory"] or MEMORY)
        await run.open_warm(row["qps"], path_mtu=4096, round_trip=row["round_trip"])
        stamps = []
        for k in range(1, row["repetitions"] + 1):
            await bench.idle(IDLE + k)
            stamps.append(await measure_one(run, row["qp"], row["length"], k))
        rows.append({**row, "stamps": stamps})
        with open(PARAMS["results"], "w") as file:
            json.dump(rows, file, indent=1)
    bench.close()
