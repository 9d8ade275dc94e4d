"""The cocotb side of ``python -m sim.bench.cm_setup``: connections set up through the
passive IB CM of the whole core by a peer playing rdma_cm (REQ, and RTU on each REP),
measured in cycles of the bench's clock.

BENCH_PARAMS gives the JSON file to write the rows to. Every row checks what it
measures: each REQ answered with the REP of its QP, every connection established.
"""

import json
import os

import cocotb
from cocotb.triggers import ClockCycles
from scapy.contrib.roce import BTH
from scapy.layers.l2 import Ether

from gateware.cm.datagram import CM_PORT
from gateware.roce.requests import FIRST_QPN
from host import protocol
from sim.models import ib_cm
from sim.testbench import NetworkBench

PARAMS = json.loads(os.environ["BENCH_PARAMS"])
PEER_MAC, PEER_IP = "52:54:00:12:34:56", "10.77.0.1"
QPS = 16


class Peer:
    """The host's rdma_cm: a REQ per connection (comm IDs from ``first``), an RTU for
    each REP at once."""

    def __init__(self, bench, first):
        self.bench = bench
        self.first = first
        self.reps = {}                  # the host's comm ID → the REP's fields
        self.established = bench.counters()["ib_cm"]["established"]
        self.rtus = {}                  # the host's comm ID → its RTU frame
        self.rtus_again = 0             # RTUs sent again

    def req(self, number, **fields):
        comm_id = self.first + number
        message = ib_cm.connect_request(
            comm_id=comm_id, port=CM_PORT, src_ip=PEER_IP, dst_ip=self.bench.core_ip,
            qpn=0x100 + number, psn=number, rkey=number, base=0, length=1 << 16, **fields)
        return self.frame("REQ", message, comm_id)

    def frame(self, kind, message, comm_id):
        return ib_cm.gsi_frame(ib_cm.mad(kind, message, transaction_id=comm_id),
                               src_ip=PEER_IP, dst_ip=self.bench.core_ip, src_mac=PEER_MAC,
                               dst_mac=self.bench.core_mac, sport=0xC000 | comm_id & 0x3FFF)

    def take_reps(self):
        """The REPs the core has sent: each answered with its RTU at once. Returns them."""
        taken = []
        while self.bench.received:
            frame = self.bench.received.popleft()
            header, message = ib_cm.parse_mad(ib_cm.parse_gsi_frame(frame).datagram)
            assert header.attribute_id == ib_cm.ATTRIBUTE_IDS["REP"], Ether(frame).summary()
            rep = ib_cm.parse_cm_message("REP", message)
            self.reps[rep["remote_comm_id"]] = rep
            rtu = ib_cm.cm_message("RTU", local_comm_id=rep["remote_comm_id"],
                                   remote_comm_id=rep["local_comm_id"])
            self.rtus[rep["remote_comm_id"]] = self.frame("RTU", rtu, rep["remote_comm_id"])
            self.bench.queue(self.rtus[rep["remote_comm_id"]])
            taken.append(frame)
        return taken

    def pending(self):
        """Connections with a REP the core has not counted established (their RTU dropped
        as busy)."""
        return len(self.reps) - (self.bench.counters()["ib_cm"]["established"]
                                 - self.established)

    def check(self):
        """Every connection has its own QP, and the core counts them all established."""
        assert sorted(rep["local_qpn"] for rep in self.reps.values()) == \
            list(range(FIRST_QPN, FIRST_QPN + QPS)), self.reps
        counters = self.bench.counters()["ib_cm"]
        assert counters["established"] - self.established == QPS, counters


def served(counters):
    """MADs the passive CM has finished with (taken by QP1's receiver: ``received``)."""
    ib = counters["ib_cm"]
    return (ib["rep_sent"] + ib["rep_repeated"] + ib["established"] + ib["rejected_by_host"]
            + ib["attribute"] + ib["unknown"]
            + sum(value for name, value in ib.items() if name.startswith("rej_")))


#: Cycles the passive CM must have had nothing to do before a new round of REQs (a MAD
#: takes a few cycles from its last beat through QP1's receiver).
QUIET_CYCLES = 32
#: Once an RTU has been sent again (its connection may have been established: a repeated
#: RTU is not counted), cycles without a change of QP1's and the CM's counters instead.
STILL_CYCLES = 128


async def until_idle(bench, peer, poll=4, timeout_cycles=50_000):
    """Answer REPs until the bench's source is empty and the passive CM has served every
    MAD QP1 took, for :data:`QUIET_CYCLES` (or, once RTUs went again, its counters
    have not changed for :data:`STILL_CYCLES`); the REPs that came."""
    reps = []
    quiet = still = 0
    last = None
    for _ in range(timeout_cycles // poll):
        await ClockCycles(bench.dut.clk, poll)
        reps += peer.take_reps()
        counters = bench.counters()
        idle = bench.source.idle()
        seen = (counters["qp1"], counters["ib_cm"])
        still = still + poll if idle and seen == last else 0
        last = seen
        served_all = served(counters) == counters["qp1"]["received"]
        quiet = quiet + poll if idle and served_all else 0
        if quiet >= QUIET_CYCLES or (peer.rtus_again and still >= STILL_CYCLES):
            return reps
    raise AssertionError(f"the passive CM never went idle: {bench.counters()['ib_cm']}")


async def close_all(bench):
    """Every QP of the peer closed through the UDP CM (CLOSE_QP, remote QPN 0xFFFFFF)."""
    await bench.cm_request(protocol.close_all(PEER_IP).encode(), host_ip=PEER_IP)
    await bench.idle(200)
    bench.received.clear()


@cocotb.test()
async def connection_setup(dut):
    """Rows: ``idle`` (each REQ sent to an idle endpoint, its REP awaited, its RTU sent,
    then a pause: the cycles from each REQ's last beat in to its REP's first beat out);
    ``window`` (the next REQ sent as each REP comes, its RTU too); ``back_to_back`` (all
    REQs at once; the REQs that got no REP are sent again, all at once, each time the
    passive CM has served every MAD it took, and all RTUs again, from the next one on
    each round, while a connection lacks its RTU: see :func:`until_idle`).
    Each row sets up a connection on every QP; all are closed through the UDP CM between
    rows."""
    bench = NetworkBench(dut, pcap=PARAMS["pcap"], peers={PEER_IP: PEER_MAC})
    await bench.reset()
    bench.record_timing()
    warm = Peer(bench, 0x100)                       # the peer's MAC resolved: REJ 8
    await bench.send(warm.req(0, service_id=ib_cm.service_id(CM_PORT + 1)))
    assert BTH in Ether(await bench.recv())
    rows = []

    peer = Peer(bench, 0x1000)
    latencies = []
    for number in range(QPS):
        await bench.send(peer.req(number))
        frame = await bench.recv()
        bench.received.appendleft(frame)
        latencies.append(bench.first_beat_cycle(frame) - bench.rx_last_cycles[-1])
        peer.take_reps()
        await bench.idle(200)
    peer.check()
    rows.append({"peer": "idle", "reqs": QPS, "rtus_again": 0, "busy": 0, "rounds": None,
                 "min_latency": min(latencies), "max_latency": max(latencies),
                 "cycles": None})
    await close_all(bench)

    for name, first in (("window", 0x2000), ("back_to_back", 0x3000)):
        peer = Peer(bench, first)
        busy_before = bench.counters()["qp1"]["busy"]
        start = len(bench.rx_last_cycles)
        sent, rounds, last_out = 0, 0, None     # rounds: of back_to_back
        if name == "window":
            for number in range(QPS):
                await bench.send(peer.req(number))
                frame = await bench.recv()
                bench.received.appendleft(frame)
                last_out = bench.first_beat_cycle(frame)
                peer.take_reps()
                sent += 1
            rounds = None
            await until_idle(bench, peer)
        else:
            waiting = list(range(QPS))
            while waiting or peer.pending():
                for number in waiting:
                    bench.queue(peer.req(number))
                if peer.pending():
                    # Which RTUs were dropped is not known: all again, each round from the
                    # next one on (the first of a burst finds the CM idle).
                    rtus = list(peer.rtus.values())
                    for rtu in rtus[rounds % len(rtus):] + rtus[:rounds % len(rtus)]:
                        bench.queue(rtu)
                    peer.rtus_again += len(rtus)
                sent += len(waiting)
                rounds += 1
                for frame in await until_idle(bench, peer):
                    last_out = bench.first_beat_cycle(frame)
                waiting = [number for number in range(QPS)
                           if peer.first + number not in peer.reps]
                assert rounds <= 3 * QPS, "connections never established"
        peer.check()
        rows.append({"peer": name, "reqs": sent, "rtus_again": peer.rtus_again,
                     "busy": bench.counters()["qp1"]["busy"] - busy_before, "rounds": rounds,
                     "min_latency": None, "max_latency": None,
                     "cycles": last_out - bench.rx_last_cycles[start]})
        await close_all(bench)
    with open(PARAMS["results"], "w") as file:
        json.dump(rows, file, indent=1)
    bench.close()
