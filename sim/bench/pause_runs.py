"""The cocotb side of ``python -m sim.bench.pause``: how soon the core stops starting
frames after a PAUSE or a PFC for the RoCEv2 priority comes in.

BENCH_PARAMS gives the rows (``kind``: PAUSE or PFC, ``length``: the payload of the
RDMA WRITEs streaming on one QP) and the JSON file to write the measurements to. In
each row a pause comes in ``injections`` times, each a cycle later after a frame start
than the one before, and is ended ``hold`` cycles later by the same frame with quanta
0. Every run checks that nothing it pauses starts between the last start counted and
the end of the pause, and that every message completes.
"""

import json
import os

import cocotb

from sim.bench.connectx_runs import Run, fresh
from sim.models.pause import MacBoundaryWatch, pause_frame, pfc_frame
from sim.models.responder import round_trip_cycles

PARAMS = json.loads(os.environ["BENCH_PARAMS"])
ROCE_PRIORITY = 3
QUANTUM = 1 << 8                # 1 cycle a quantum: 0xFFFF quanta outlast every row


def pause(kind, quanta):
    if kind == "PAUSE":
        return pause_frame(quanta)
    return pfc_frame(1 << ROCE_PRIORITY, [quanta] * 8)


@cocotb.test()
async def pause_response(dut):
    bench = await fresh(dut)
    await bench.configure_pause(roce_priority=ROCE_PRIORITY, quantum_cycles=QUANTUM)
    watch = MacBoundaryWatch(bench)
    rows = []
    for number, row in enumerate(PARAMS["rows"]):
        run = Run(bench, number)
        await run.open(0, path_mtu=4096, round_trip=round_trip_cycles(1))
        await run.warm_up([0])
        for k in range(1, row["messages"] + 1):
            run.post(0, "RDMA_WRITE", row["length"], k)
        responses = []
        for injection in range(row["injections"]):
            started = len(watch.roce_starts(0))
            while len(watch.roce_starts(0)) == started:
                await bench.idle(1)
            await bench.idle(injection)
            paused = await watch.send_control(pause(row["kind"], 0xFFFF))
            await bench.idle(row["hold"])
            resumed = await watch.send_control(pause(row["kind"], 0))
            starts = watch.all_starts(paused, resumed) if row["kind"] == "PAUSE" else \
                watch.roce_starts(paused, resumed)
            response = max(starts, default=paused) - paused
            assert response < row["hold"] // 2, (row, starts, paused, resumed)
            responses.append(response)
        await run.finish(50_000)
        summary = await run.summary(0)
        assert summary["timeouts"] == summary["retransmitted"] == 0, summary
        rows.append({**row, "responses": responses})
        with open(PARAMS["results"], "w") as file:
            json.dump(rows, file, indent=1)
