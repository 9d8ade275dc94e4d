"""The cocotb side of ``python -m sim.bench.connectx``: runs of the whole core against
ConnectX-like responder models (sim/models/responder.py), measured in cycles on a 100GbE line.

BENCH_PARAMS gives the runs to make (``rate`` or ``goodput`` rows) and the JSON file
to write each row's measurements to. Every run checks what it measures: every
message completes successfully, the models executed every packet once and the last
messages' bytes landed.
"""

import json
import os

import cocotb

from gateware.config import parse_ipv4
from gateware.roce.requests import FIRST_QPN, CompletionStatus, PathMtu, Verb
from sim.models.responder import ConnectX, Faults, Responder, spread_losses
from sim.models.rocev2 import generator_payload
from sim.testbench import NetworkBench

PARAMS = json.loads(os.environ["BENCH_PARAMS"])
PEER_MAC, PEER_IP = "52:54:00:12:34:56", "10.77.0.1"
TICK = 16                       # cycles of a 4.096 us timer tick: timers run ~80x faster
TIMEOUT = 8                     # ACK timeout 2^8 ticks, 4096 cycles (12.7 us): > 6 round trips
MEMORY = 1 << 20                # each model's memory; messages land in it in turn
SUCCESS = CompletionStatus.SUCCESS.value


class Run:
    """One measurement on the bench: the QPs it sets and the work requests it posts, to
    models at ``peer_ip`` (one of the bench's peers), each with ``memory`` bytes."""

    def __init__(self, bench, number, peer_ip=PEER_IP, memory=MEMORY):
        self.bench = bench
        self.memory = memory
        self.number = number            # the row: each row's QPs have their own peer QPNs
        self.peer_ip = peer_ip
        self.peers = {}                 # QP index → its responder model
        self.first = len(bench.completions)
        self.posted = 0
        self.tag = 0

    async def open(self, index, *, path_mtu, round_trip, faults=None, psn=0):
        """Set QP ``index`` and attach a fresh ConnectX-like model as its peer."""
        remote_qpn = 0x1000 * (self.number + 1) + index
        await self.bench.set_qp(index, {
            "remote_qpn": remote_qpn, "next_psn": psn, "rkey": 0x77,
            "remote_ip": parse_ipv4(self.peer_ip), "path_mtu": PathMtu.from_bytes(path_mtu),
            "src_port": 0xC300 + index, "timeout": TIMEOUT, "retry_count": 7, "rnr_retry": 7})
        peer = Responder(mac=self.bench.peers[self.peer_ip], ip=self.peer_ip,
                         peer_mac=self.bench.core_mac, peer_ip=self.bench.core_ip,
                         qpn=remote_qpn, peer_qpn=FIRST_QPN + index, expected_psn=psn,
                         rkey=0x77, memory_base=0, memory_size=self.memory,
                         path_mtu=path_mtu,
                         faults=faults, connectx=ConnectX(round_trip=round_trip))
        self.bench.attach(peer)
        self.peers[index] = peer
        return peer

    async def open_warm(self, qps, *, path_mtu, round_trip):
        """Open QPs 0 to ``qps`` - 1 (:meth:`open`) and warm them up (:meth:`warm_up`);
        returns their indices."""
        indices = range(qps)
        for index in indices:
            await self.open(index, path_mtu=path_mtu, round_trip=round_trip)
        await self.warm_up(indices)
        return indices

    def post(self, index, verb, length, k):
        """Message ``k`` (generator_payload) to the QP's model, at slot k of its memory."""
        payload = generator_payload(k, length)
        if verb == "SEND":
            self.peers[index].post_receive()
        self.bench.post({"verb": Verb[verb], "qp": index, "tag": self.tag % (1 << 16),
                         "remote_address": k * length % self.memory, "length": length,
                         "immediate": 0}, payload)
        self.tag += 1
        self.posted += 1

    async def finish(self, timeout_cycles):
        """Wait for every completion; check them all successful; forget the frames."""
        await self.bench.wait_completions(self.first + self.posted, timeout_cycles)
        completions = list(self.bench.completions)[self.first:]
        statuses = {completion["status"] for completion in completions}
        assert len(completions) == self.posted and statuses == {SUCCESS}, statuses
        self.bench.received.clear()

    async def warm_up(self, indices):
        """One message on each QP, so the peer's MAC is resolved and nothing of the
        setting up falls into a measurement; then measure the line from now on."""
        for index in indices:
            self.post(index, "RDMA_WRITE", 64, 0)
        await self.finish(20_000 + 10 * len(indices))
        self.bench.tx_first_cycle = self.bench.tx_last_cycle = None
        self.answers = len(self.bench.answers)

    def tail(self):
        """Cycles from the last answer sent into the core to the last completion."""
        last_answer = max(cycle for cycle, _ in self.bench.answers[self.answers:])
        return max(self.bench.completion_cycles) - last_answer

    async def summary(self, index):
        """What the core counted on a QP, and what its model saw."""
        counters = (await self.bench.qp_status(index))["counters"]
        peer = self.peers[index]
        return {"retransmitted": counters["retransmitted"], "timeouts": counters["timeouts"],
                "acks_dropped": counters["acks_dropped"],
                "frames": peer.stats["frames_received"],
                "lost": peer.stats["packets_dropped_fault"]}


def landed(peer, verb, length, ks):
    """Messages ``ks``, the last of a run, are where they belong in the model."""
    if verb == "SEND":
        return [c.data for c in peer.receive_queue[-len(ks):]] == \
            [generator_payload(k, length) for k in ks]
    return all(peer.memory[k * length % len(peer.memory):][:length]
               == generator_payload(k, length) for k in ks)


async def fresh(dut):
    bench = NetworkBench(dut, pcap=PARAMS["pcap"], peers={PEER_IP: PEER_MAC}, line=True)
    await bench.reset()
    await bench.configure_roce(tos=0x02, tick=TICK)
    return bench


def write_rows(name, rows):
    """The rows measured so far (after each: a long run shows its progress)."""
    with open(PARAMS["results"][name], "w") as file:
        json.dump(rows, file, indent=1)


@cocotb.test()
async def message_rate(dut):
    """Rows {verb, qps, messages, round_trip}: 64-byte messages on ``qps`` QPs in turn,
    every one acknowledged by its model; the line's cycles from the first beat to the
    end of the last frame."""
    bench = await fresh(dut)
    rows = []
    for number, row in enumerate(PARAMS["rate"]):
        run = Run(bench, number)
        indices = await run.open_warm(row["qps"], path_mtu=4096, round_trip=row["round_trip"])
        ks = range(1, row["messages"] // row["qps"] + 1)
        for k in ks:
            for index in indices:
                run.post(index, row["verb"], 64, k)
        await run.finish(50_000 + 20 * row["messages"])
        totals = {}
        for index in indices:
            assert landed(run.peers[index], row["verb"], 64, ks)
            for name, value in (await run.summary(index)).items():
                totals[name] = totals.get(name, 0) + value
        rows.append({**row, **totals, "line_cycles": bench.line_cycles(), "tail": run.tail()})
        write_rows("rate", rows)
    bench.close()


@cocotb.test()
async def goodput_under_loss(dut):
    """Rows {length, path_mtu, messages, loss, round_trip, seed}: messages on one QP,
    packets lost on the way to the model by :func:`spread_losses` over the run's
    first-time packets (so that the rate is exact); the line's cycles from the first
    beat to the end of the last frame."""
    bench = await fresh(dut)
    rows = []
    for number, row in enumerate(PARAMS["goodput"]):
        run = Run(bench, number)
        packets = row["messages"] * -(-row["length"] // row["path_mtu"])
        losses = spread_losses(row["loss"], packets, seed=row["seed"]) if row["loss"] else ()
        # The warm-up message is the model's frame 0: the pattern starts after it.
        peer = await run.open(0, path_mtu=row["path_mtu"], round_trip=row["round_trip"],
                              faults=Faults(packet_drop_at=tuple(1 + i for i in losses)))
        await run.warm_up([0])
        for k in range(1, row["messages"] + 1):
            run.post(0, "RDMA_WRITE", row["length"], k)
        await run.finish(100_000 + 200 * packets)
        assert peer.stats["executed"] == packets + 1, peer.stats
        assert peer.stats["packets_dropped_fault"] == len(losses), peer.stats
        assert landed(peer, "RDMA_WRITE", row["length"],
                      range(row["messages"] - MEMORY // row["length"] + 1, row["messages"] + 1))
        summary = await run.summary(0)
        summary["frames"] -= 1
        rows.append({**row, **summary, "packets": packets, "line_cycles": bench.line_cycles(),
                     "naks": peer.stats["naks_sequence"], "tail": run.tail()})
        write_rows("goodput", rows)
    bench.close()
