"""cocotb tests of the connection manager in the whole core; run through
tests/sim/test_core.py.

Hosts open QPs with CM datagrams built by host/protocol.py (the golden model),
start generator runs and read STATUS; a responder model plays each host QP, so
every frame is compared with Scapy's and every message must land (roce_bench's
RoceRun does the checking).
"""

import random
from ipaddress import IPv4Address
from pathlib import Path
from types import SimpleNamespace

import cocotb
from roce_bench import OUR_IP, OUR_MAC, PARAMS, PEER_IP, PEER_MAC, Qp, RoceRun, start
from scapy.layers.inet import IP
from scapy.layers.l2 import Ether

from gateware.cm.ib_cm import TARGET_ACK_DELAY
from gateware.cm.qp1 import SOURCE_PORT_BASE
from gateware.core import CMAC_CLOCK_HZ
from host import protocol
from host.protocol import Ack, Datagram, QpInfo, Status
from sim import tshark
from sim.models import ib_cm
from sim.models.rocev2 import Message, generator_payload
from sim.testbench import CORE_PARAMS

VERB_NAMES = {(True, False): "RDMA_WRITE", (True, True): "RDMA_WRITE_WITH_IMMEDIATE",
              (False, False): "SEND", (False, True): "SEND_WITH_IMMEDIATE"}


class Host:
    """A host QP on the peer: what it announces, and what it expects from runs."""

    def __init__(self, qpn, *, psn, rkey, base, path_mtu, ring=0):
        self.qpn, self.psn, self.rkey, self.base = qpn, psn, rkey, base
        self.path_mtu, self.ring = path_mtu, ring
        self.runs = 0           # messages the host expects from runs, over all runs

    @property
    def info(self):
        return QpInfo(self.qpn, self.psn, self.rkey, self.base, PEER_IP)


async def cm(bench, datagram, **kwargs):
    """Send a CM datagram from the peer; its reply's bytes (None: no reply awaited)."""
    return await bench.cm_request(datagram.encode(), host_ip=PEER_IP, **kwargs)


async def open_qp(run, host, *, memory_size=1 << 16, **responder_params):
    """OPEN_QP through the CM; checks the reply against the codec and attaches a
    responder model as the host QP (``responder_params``: its mode). Returns the
    endpoint's Qp."""
    request = protocol.open_qp(host.info, mtu=protocol.PathMtu.from_size(host.path_mtu))
    raw = await cm(run.bench, request)
    reply = Datagram.decode(raw)
    mtu = protocol.PathMtu.from_size(host.path_mtu)
    assert raw == protocol.reply(request, Ack.ACK, QpInfo(reply.loc.qpn, reply.loc.psn,
                                                          ip=OUR_IP), mtu=mtu).encode(), reply
    index = reply.loc.qpn - protocol.FIRST_QPN
    qp = Qp(index, remote_qpn=host.qpn, psn=reply.loc.psn, rkey=host.rkey,
            path_mtu=host.path_mtu, src_port=0xC000 + index, memory_base=host.base,
            timeout=14)
    qp.opened_psn = reply.loc.psn
    run.attach_peer(qp, memory_size=memory_size, **responder_params)
    return qp


async def start_run(run, qp, host, *, length, count, write, immediate, divider=0,
                    credited=False, settle_cycles=500):
    """Expect a run's messages (k from 0; the host model posts its receives), then start
    it through the CM (which does not answer START_RUN) and wait ``settle_cycles``."""
    verb = VERB_NAMES[write, immediate]
    slots = host.ring // length if host.ring else None
    for k in range(count):
        address = host.base + (k % slots if slots else k) * length
        run.expect(qp, Message(verb, generator_payload(k, length), address, k), tag=k)
    await cm(run.bench, protocol.start_run(qp.qpn, length=length, count=count, divider=divider,
                                           write=write, immediate=immediate, ring=host.ring,
                                           credited=credited),
             reply=False, settle_cycles=settle_cycles)


async def status(bench, qp):
    raw = await cm(bench, protocol.status(qp.qpn))
    assert raw[:5] == Datagram(protocol.Request.STATUS, Ack.ACK, loc=QpInfo(qp.qpn)).encode()[:5]
    return Status.from_reply(raw)


async def check_status(bench, qp, *, messages, open_=True):
    """STATUS after a run without faults agrees with what the host model saw."""
    got = await status(bench, qp)
    model = qp.responder.stats
    assert (got.open, got.running, got.error, got.outstanding) == (open_, False, False, 0), got
    assert (got.messages, got.packets, got.bytes) == (messages, qp.packets, qp.bytes), got
    assert got.acks == model["frames_sent"] and got.retransmitted == got.timeouts == 0, got
    return got


@cocotb.test()
async def generator_run_through_the_cm(dut):
    """OPEN_QP, a run of WRITEs with immediate into a ring (payload words (k << 32) | j,
    immediate k), then STATUS: the counters agree with the host model."""
    bench = await start(dut, tx_ready=0.8, seed=5)
    run = RoceRun(bench)
    host = Host(0x42, psn=0x77, rkey=0xBEEF, base=0x7F00_0000_0000, path_mtu=1024, ring=8000)
    qp = await open_qp(run, host, memory_size=host.ring)
    await start_run(run, qp, host, length=3000, count=5, write=True, immediate=True)
    await run.finish()
    await check_status(bench, qp, messages=5)
    bench.close()


@cocotb.test()
async def a_credited_run_writes_a_slot_only_once_the_host_has_consumed_it(dut):
    """A credited run of WRITEs into a ring of 4 slots and a host that consumes slowly:
    each message lands, stays in its slot while the host holds it (no later message
    overwrites it), and the next lap into that slot follows the host's CREDIT."""
    bench = await start(dut, seed=11)
    run = RoceRun(bench)
    length, count, slots = 256, 13, 4
    host = Host(0x44, psn=0x1000, rkey=0xC0DE, base=0x7E00_0000_0000, path_mtu=1024,
                ring=slots * length)
    qp = await open_qp(run, host, memory_size=host.ring)
    await start_run(run, qp, host, length=length, count=count, write=True, immediate=False,
                    credited=True)
    memory = qp.responder.memory

    def holds(k):
        at = (k % slots) * length
        return bytes(memory[at:at + length]) == generator_payload(k, length)

    for k in range(count):
        for _ in range(40):
            if holds(k):
                break
            await bench.idle(100)
        assert holds(k), f"message {k} did not land in its slot"
        await bench.idle(1500)                      # the host is slow to consume it
        assert holds(k), f"message {k} was overwritten before the host consumed it"
        await cm(bench, protocol.credit(qp.qpn, k + 1), reply=False, settle_cycles=0)
    await run.finish()
    await check_status(bench, qp, messages=count)
    bench.close()


@cocotb.test()
async def runs_on_several_qps_and_a_reopened_qp(dut):
    """Three host QPs (path MTU 256, 1024, 4096) run at once; one is closed and opened
    again from the same host QP: a new PSN, a fresh state, and its run lands too.
    Malformed datagrams in between are dropped and counted."""
    bench = await start(dut, tx_ready=0.9, seed=11)
    run = RoceRun(bench)
    hosts = [Host(0x100 + index, psn=0x1000 * index + 1, rkey=0xAB00 + index,
                  base=0x10_0000 * (index + 1), path_mtu=mtu)
             for index, mtu in enumerate((256, 1024, 4096))]
    qps = [await open_qp(run, host) for host in hosts]
    assert [qp.index for qp in qps] == [0, 1, 2]
    shapes = [(700, 6, False, False), (2100, 4, True, False), (9000, 2, True, True)]
    for qp, host, (length, count, write, immediate) in zip(qps, hosts, shapes, strict=True):
        await start_run(run, qp, host, length=length, count=count, write=write,
                        immediate=immediate)
    await run.finish(timeout_cycles=100_000)
    for qp, (_, count, _, _) in zip(qps, shapes, strict=True):
        await check_status(bench, qp, messages=count)

    # Close QP 1: ACK, then STATUS says closed; a second close gets NO_QP.
    close = protocol.close_qp(qps[1].qpn, PEER_IP)
    assert await cm(bench, close) == protocol.reply(
        close, Ack.ACK, QpInfo(qps[1].qpn, qps[1].opened_psn, ip=OUR_IP),
        mtu=protocol.PathMtu.MTU_1024).encode()
    assert not (await status(bench, qps[1])).open
    assert Datagram.decode(await cm(bench, close)).ack == Ack.NO_QP

    # Malformed: a short datagram and an unknown request are dropped and counted.
    good = protocol.status(qps[0].qpn).encode()
    await cm(bench, Datagram(), reply=False)                 # NULL without a start
    await bench.cm_request(good[:60], host_ip=PEER_IP, reply=False)
    cm_counters = bench.counters()["cm"]
    assert (cm_counters["request"], cm_counters["length"]) == (1, 1), cm_counters

    # Reopen from the same host QP with a new PSN: QP 1 again, a new endpoint PSN.
    old_psn = qps[1].psn
    hosts[1].psn = 0xFFFFF0
    reopened = await open_qp(run, hosts[1])
    assert reopened.index == 1 and reopened.psn != old_psn
    fresh = await status(bench, reopened)
    assert (fresh.open, fresh.packets, fresh.bytes, fresh.messages) == (True, 0, 0, 0), fresh
    await start_run(run, reopened, hosts[1], length=1500, count=3, write=False, immediate=True)
    await run.finish(timeout_cycles=100_000)
    await check_status(bench, reopened, messages=3)
    bench.close()


@cocotb.test()
async def the_generator_pool_refuses_a_fifth_run(dut):
    """With four runs in progress a fifth start is refused and counted; STATUS shows it
    not running; started again once the others end, it runs."""
    bench = await start(dut, seed=13)
    run = RoceRun(bench)
    hosts = [Host(0x200 + index, psn=index, rkey=0xCC00 + index, base=0x20_0000 * (index + 1),
                  path_mtu=1024) for index in range(5)]
    qps = [await open_qp(run, host) for host in hosts]
    for qp, host in zip(qps[:4], hosts[:4], strict=True):
        await start_run(run, qp, host, length=256, count=3, write=True, immediate=False,
                        divider=4000)
    await cm(bench, protocol.start_run(qps[4].qpn, length=256, count=3), reply=False)
    assert bench.counters()["generator"] == {"started": 4, "refused_running": 0,
                                            "refused_full": 1}
    refused = await status(bench, qps[4])
    assert (refused.open, refused.running, refused.messages) == (True, False, 0), refused
    assert (await status(bench, qps[0])).running
    await run.finish(timeout_cycles=100_000)
    await start_run(run, qps[4], hosts[4], length=256, count=3, write=True, immediate=False)
    await run.finish(timeout_cycles=50_000)
    for qp in qps:
        await check_status(bench, qp, messages=3)
    bench.close()


@cocotb.test()
async def sixteen_qps_opened_used_and_closed_in_random_order(dut):
    """All 16 QPs opened in a random order (a 17th host gets NO_QP), each used by a
    generator run, closed in a random order, and half of them opened again from the
    same host QPs with new PSNs and used again."""
    bench = await start(dut, tx_ready=0.9, seed=19)
    run = RoceRun(bench)
    rng = random.Random(23)
    hosts = [Host(0x400 + index, psn=rng.getrandbits(24), rkey=rng.getrandbits(32),
                  base=0x100_0000 * (index + 1), path_mtu=rng.choice((256, 1024, 4096)))
             for index in range(16)]
    qps = {}
    for host in rng.sample(hosts, len(hosts)):
        qps[host.qpn] = await open_qp(run, host)
    assert sorted(qp.index for qp in qps.values()) == list(range(16))
    extra = Host(0x999, psn=1, rkey=2, base=0, path_mtu=1024)
    request = protocol.open_qp(extra.info, mtu=protocol.PathMtu.MTU_1024)
    assert await cm(bench, request) == protocol.reply(request, Ack.NO_QP,
                                                      QpInfo(ip=OUR_IP)).encode()

    async def use(chosen, messages):
        for first in range(0, len(chosen), 4):              # the pool runs four at once
            for host in chosen[first:first + 4]:
                write, immediate = rng.choice(list(VERB_NAMES))
                await start_run(run, qps[host.qpn], host, length=rng.choice((1, 64, 1500)),
                                count=messages, write=write, immediate=immediate)
            await run.finish(timeout_cycles=100_000)

    await use(rng.sample(hosts, len(hosts)), 2)
    for host in rng.sample(hosts, len(hosts)):
        qp = qps[host.qpn]
        await check_status(bench, qp, messages=2)
        close = protocol.close_qp(qp.qpn, PEER_IP)
        assert await cm(bench, close) == protocol.reply(
            close, Ack.ACK, QpInfo(qp.qpn, qp.opened_psn, ip=OUR_IP),
            mtu=protocol.PathMtu.from_size(host.path_mtu)).encode()
    reopened = rng.sample(hosts, 8)
    for index, host in enumerate(reopened):
        old = qps[host.qpn]
        host.psn = rng.getrandbits(24)
        qps[host.qpn] = await open_qp(run, host)
        assert qps[host.qpn].index == index, "the lowest free QP first"
        assert qps[host.qpn].opened_psn != old.opened_psn
    await use(reopened, 1)
    for host in reopened:
        await check_status(bench, qps[host.qpn], messages=1)
    assert bench.counters()["cm"]["opened"] == 24
    bench.close()



@cocotb.test()
async def only_the_qps_host_steers_it(dut):
    """CM_PROTOCOL.md, "Who may steer a QP": another host on the subnet sends CLOSE_QP and
    a start for the peer's QP with loc_ip = the peer's address, and an OPEN_QP that would
    aim RoCEv2 at a third host; a host outside the access list (the endpoint's subnet)
    asks STATUS and OPEN_QP. All dropped and counted, no reply, no frame to anyone; the
    QP is unaffected and its host's run lands byte for byte."""
    bench = await start(dut, seed=29)
    run = RoceRun(bench)
    host = Host(0x77, psn=0x4242, rkey=0xFEED, base=0x5000_0000, path_mtu=1024)
    qp = await open_qp(run, host)
    mallory, outsider = "10.77.0.66", "10.78.0.1"
    bench.peers.update({mallory: "52:54:00:00:00:66", outsider: "52:54:00:00:00:78"})
    spoofed = [protocol.close_qp(qp.qpn, PEER_IP),
               protocol.start_run(qp.qpn, length=64, count=5),
               protocol.open_qp(QpInfo(0x55, 1, 2, 3, "10.77.0.99"))]
    outside = [protocol.status(qp.qpn), protocol.open_qp(QpInfo(0x56, 1, 2, 3, outsider))]
    arp_before, frames_before = len(bench.arp_requests), len(bench.received)
    for source, datagrams in ((mallory, spoofed), (outsider, outside)):
        for datagram in datagrams:
            assert await bench.cm_request(datagram.encode(), host_ip=source,
                                          reply=False) is None
            assert not bench.cm_replies and len(bench.received) == frames_before
    assert len(bench.arp_requests) == arp_before
    counters = bench.counters()["cm"]
    assert (counters["spoofed"], counters["access"]) == (3, 2), counters
    assert (counters["opened"], counters["closed"], counters["starts"]) == (1, 0, 0), counters
    got = await status(bench, qp)
    assert (got.open, got.runs, got.messages) == (True, 0, 0), got
    await start_run(run, qp, host, length=2000, count=3, write=True, immediate=False)
    await run.finish()
    await check_status(bench, qp, messages=3)
    bench.close()


@cocotb.test()
async def a_host_that_restarts_closes_all_its_qps(dut):
    """CLOSE_QP with rem_qpn 0xFFFFFF from the peer closes its three QPs (ACK, count 3)
    and none of another host's; the freed QPs are opened again and run."""
    bench = await start(dut, seed=31)
    run = RoceRun(bench)
    hosts = [Host(0x300 + index, psn=index + 5, rkey=0xDD00 + index,
                  base=0x40_0000 * (index + 1), path_mtu=4096) for index in range(3)]
    qps = [await open_qp(run, host) for host in hosts]
    other_ip = "10.77.0.7"
    bench.peers[other_ip] = "52:54:00:00:00:07"
    other = protocol.open_qp(QpInfo(0x99, 1, 2, 3, other_ip))
    other_qpn = Datagram.decode(await bench.cm_request(other.encode(), host_ip=other_ip)).loc.qpn
    request = protocol.close_all(PEER_IP)
    assert await cm(bench, request) == protocol.reply(request, Ack.ACK, QpInfo(ip=OUR_IP),
                                                      count=3).encode()
    assert [(await status(bench, qp)).open for qp in qps] == [False] * 3
    raw = await bench.cm_request(protocol.status(other_qpn).encode(), host_ip=other_ip)
    assert Status.from_reply(raw).open
    for host in hosts:
        host.psn += 0x100
    qps = [await open_qp(run, host) for host in hosts]
    assert sorted(qp.index for qp in qps) == [0, 1, 2]
    for qp, host in zip(qps, hosts, strict=True):
        await start_run(run, qp, host, length=700, count=2, write=False, immediate=True)
    await run.finish(timeout_cycles=100_000)
    assert bench.counters()["cm"]["closed"] == 3
    bench.close()


def connect_request(host, comm_id, **fields):
    """The REQ of the peer's ``rdma_connect`` for ``host`` (its QP, PSN and buffer)."""
    return ib_cm.connect_request(comm_id=comm_id, port=protocol.CM_PORT, src_ip=PEER_IP,
                                 dst_ip=OUR_IP, qpn=host.qpn, psn=host.psn, rkey=host.rkey,
                                 base=host.base, length=1 << 16,
                                 **{"path_mtu": ib_cm_mtu(host.path_mtu), **fields})


def gsi_to_core(kind, message, *, transaction_id, src_ip=PEER_IP):
    """A CM MAD of ``kind`` from a host's QP1 to the core's, as rdma_cm frames it."""
    mad = ib_cm.mad(kind, message, transaction_id=transaction_id)
    return ib_cm.gsi_frame(mad, src_ip=src_ip, dst_ip=OUR_IP, src_mac=PEER_MAC,
                           dst_mac=OUR_MAC, sport=0xC0DE)


def ib_cm_mtu(size):
    """The IBTA path MTU code of ``size`` bytes (256: 1 ... 4096: 5)."""
    return size.bit_length() - 8


async def recv_cm(bench, kind, *, timeout_cycles=20_000):
    """The next frame from the core: a GSI packet to the peer's QP1 carrying a CM MAD of
    ``kind``; its MAD header and the fields of its message."""
    gsi = ib_cm.parse_gsi_frame(await bench.recv(timeout_cycles=timeout_cycles))
    assert gsi.icrc_ok, gsi
    assert (gsi.src_ip, gsi.dst_ip, gsi.dport, gsi.opcode, gsi.dest_qp, gsi.qkey,
            gsi.src_qp) == (OUR_IP, PEER_IP, ib_cm.ROCEV2_PORT, ib_cm.UD_SEND_ONLY, 1,
                            ib_cm.GSI_QKEY, 1), gsi
    header, message = ib_cm.parse_mad(gsi.datagram)
    assert (header.attribute_id, header.method) == (ib_cm.ATTRIBUTE_IDS[kind], 0x03), header
    return header, ib_cm.parse_cm_message(kind, message), gsi.datagram


async def rdma_connect(bench, host, *, comm_id, tid, rtu=True, **fields):
    """REQ, REP (checked), RTU: the REP's fields."""
    await bench.send(gsi_to_core("REQ", connect_request(host, comm_id, **fields),
                                 transaction_id=tid))
    header, rep, _ = await recv_cm(bench, "REP")
    assert header.transaction_id == tid, header
    qpn = rep["local_qpn"]
    assert rep["remote_comm_id"] == comm_id and rep["local_comm_id"] != 0, rep
    assert protocol.FIRST_QPN <= qpn < protocol.FIRST_QPN + 16, rep
    assert ib_cm.parse_accept_private(rep["private_data"]) == (1, qpn)
    if rtu:
        await send_rtu(bench, rep, comm_id=comm_id, tid=tid)
    return rep


async def send_rtu(bench, rep, *, comm_id, tid):
    rtu = ib_cm.cm_message("RTU", local_comm_id=comm_id, remote_comm_id=rep["local_comm_id"])
    await bench.send(gsi_to_core("RTU", rtu, transaction_id=tid))


def connected_qp(run, host, rep):
    """The endpoint's Qp of a connection, with a responder model as the host's QP."""
    index = rep["local_qpn"] - protocol.FIRST_QPN
    qp = Qp(index, remote_qpn=host.qpn, psn=host.psn, rkey=host.rkey, path_mtu=host.path_mtu,
            src_port=0xC000 + index, memory_base=host.base, timeout=14)
    run.attach_peer(qp, memory_size=1 << 16)
    return qp


def dreq_message(rep, comm_id):
    """The host's DREQ (rdma_disconnect) of the connection ``rep`` answered."""
    return ib_cm.cm_message("DREQ", local_comm_id=comm_id,
                            remote_comm_id=rep["local_comm_id"],
                            remote_qpn=rep["local_qpn"])


@cocotb.test()
async def rdma_connect_opens_a_qp_that_a_cm_start_writes_into(dut):
    """The host's rdma_connect: a REQ (RoCEv2 UD to QP1) is answered with a REP to the
    host's QP1 (the endpoint's QPN in Local QPN and private data, the host's comm ID
    and TID), the RTU establishes it; STATUS through the UDP CM shows the QP open, and a
    run of WRITEs started from the host with the UDP CM lands byte for byte in the
    responder model playing the host's QP (its QPN, PSN, rkey and buffer from the
    REQ)."""
    bench = await start(dut, seed=13)
    run = RoceRun(bench)
    host = Host(0x4D2, psn=0xABCDE, rkey=0x1122_3344, base=0x7F00_1234_0000, path_mtu=1024)
    rep = await rdma_connect(bench, host, comm_id=0x8765_4321, tid=0x0123_4567_89AB_CDEF)
    await bench.idle(300)
    counters = bench.counters()
    assert (counters["ib_cm"]["rep_sent"], counters["ib_cm"]["established"]) == (1, 1), \
        counters["ib_cm"]
    assert counters["cm"]["opened"] == 1, counters["cm"]
    qp = connected_qp(run, host, rep)
    got = await status(bench, qp)
    assert got.open and not got.running and not got.error, got
    await start_run(run, qp, host, length=3000, count=4, write=True, immediate=False)
    await run.finish()
    await check_status(bench, qp, messages=4)
    assert not bench.received
    bench.close()


def gsi_from_core(kind, frame, *, flow=None, **fields):
    """The model's frame of a CM message of ``kind`` (``fields``) from the core's QP1 to
    the peer's, with the TID and what the core generates per frame (BTH PSN, IPv4
    identification and traffic class) taken from ``frame``, the MAD the core sent. Its
    UDP flow: ``flow``, by default the host's comm ID (the message's Remote Comm ID)."""
    gsi = ib_cm.parse_gsi_frame(frame)
    header, _ = ib_cm.parse_mad(gsi.datagram)
    ip = Ether(frame)[IP]
    flow = fields["remote_comm_id"] if flow is None else flow
    return ib_cm.gsi_frame(
        ib_cm.mad(kind, ib_cm.cm_message(kind, **fields), transaction_id=header.transaction_id),
        src_ip=OUR_IP, dst_ip=PEER_IP, src_mac=OUR_MAC, dst_mac=PEER_MAC,
        sport=SOURCE_PORT_BASE | flow & 0x3FFF, psn=gsi.psn, ip_id=ip.id,
        tos=ip.tos, ttl=ip.ttl)


#: The REQs the passive CM rejects, one per cause, and the reason of each (IBTA table
#: 109): what the REQ of :func:`connect_request` has instead.
REJECTED = {
    "service ID": (8, {"service_id": ib_cm.service_id(protocol.CM_PORT + 1)}),
    "transport (UC)": (9, {"transport_service_type": 1}),
    "path MTU 8192": (26, {"path_mtu": 6}),
    "cma_hdr to another address": (28, {"private_data": ib_cm.cma_header(
        src_ip=PEER_IP, dst_ip="10.77.0.9", port=0xD431)}),
    "private data version 2": (28, {"version": 2}),
}


@cocotb.test()
async def every_cm_frame_sent_is_the_models_and_wireshark_dissects_it(dut):
    """Every kind of CM MAD the endpoint sends: the REP of a REQ (the second one's within
    1 µs of the core's clock from the REQ's last beat to the REP's first), the REJ of each cause
    (8, 9, 26, 28 for the cma_hdr and for the private data version) and, once all 16
    QPs are connected, REJ 3; the DREP to a host's DREQ, the DREQ of a QP closed with
    CLOSE_QP, the REJ 28 of a connection whose QP is closed before its RTU; the REQ of a
    CONNECT, the REJ 28 of a REP with private data version 2, the RTU of a good one.
    Each frame is byte for byte the IB CM model's (its generated fields read from it)
    and Wireshark dissects it as that message, with no malformed or error items."""
    bench = await start(dut, seed=37)
    bench.record_timing()
    sent = []               # (what, frame, Wireshark's message, fields it must show)

    async def exchange(kind, message, tid):
        await bench.send(gsi_to_core(kind, message, transaction_id=tid))
        frame = await bench.recv()
        return frame, ib_cm.parse_cm_message(*reply_message(frame))

    def reply_message(frame):
        header, message = ib_cm.parse_mad(ib_cm.parse_gsi_frame(frame).datagram)
        kind = {value: key for key, value in ib_cm.ATTRIBUTE_IDS.items()}[header.attribute_id]
        return kind, message

    hosts = [Host(0x600 + index, psn=0x1000 + index, rkey=0xAB00 + index,
                  base=0x10_0000 * (index + 1), path_mtu=1024) for index in range(17)]
    reps = []
    for index, host in enumerate(hosts[:16]):
        comm_id = 0x3000_0000 + index
        frame, rep = await exchange("REQ", connect_request(host, comm_id), 0x77_0000 + index)
        reps.append(rep)
        qpn = protocol.FIRST_QPN + index
        assert frame == gsi_from_core(
            "REP", frame, local_comm_id=rep["local_comm_id"], remote_comm_id=comm_id,
            local_qpn=qpn, starting_psn=rep["starting_psn"],
            target_ack_delay=TARGET_ACK_DELAY, rnr_retry_count=7,
            local_ca_guid=ib_cm.ca_guid(OUR_MAC),
            private_data=ib_cm.accept_private(qpn)), f"REP {index}: {rep}"
        if index == 1:                  # the peer's MAC known: no ARP in between
            cycles = bench.first_beat_cycle(frame) - bench.rx_last_cycles[-1]
            limit = CMAC_CLOCK_HZ // 1_000_000
            dut._log.info("REQ → REP: %d cycles (1 µs at %d Hz: %d)", cycles, CMAC_CLOCK_HZ,
                          limit)
            assert 0 < cycles <= limit, cycles
            sent.append(("REP", frame, "CM ConnectReply",
                         {"infiniband.cm.rep.localqpn": f"0x{qpn:06x}",
                          "infiniband.cm.rep.remotecommid": f"0x{comm_id:08x}"}))
        rtu = ib_cm.cm_message("RTU", local_comm_id=comm_id, remote_comm_id=rep["local_comm_id"])
        await bench.send(gsi_to_core("RTU", rtu, transaction_id=0x77_0000 + index))
        await bench.idle(100)               # the next REQ finds the CM idle

    causes = [(what, reason, fields) for what, (reason, fields) in REJECTED.items()]
    causes.append(("no QP free", 3, {}))
    for number, (what, reason, fields) in enumerate(causes):
        comm_id = 0x4000_0000 + number
        frame, rej = await exchange("REQ", connect_request(hosts[16], comm_id, **fields),
                                    0x88_0000 + number)
        assert frame == gsi_from_core("REJ", frame, remote_comm_id=comm_id, reason=reason), (
            what, rej)
        sent.append((f"REJ {reason} ({what})", frame, "CM ConnectReject",
                     {"infiniband.cm.rej.reason": f"0x{reason:04x}",
                      "infiniband.cm.rej.remotecommid": f"0x{comm_id:08x}"}))

    # The host of connection 0 disconnects; connection 1's QP is closed over UDP.
    comm_id, local = 0x3000_0000, reps[0]["local_comm_id"]
    frame, _ = await exchange("DREQ", dreq_message(reps[0], comm_id), 0x99_0000)
    assert frame == gsi_from_core("DREP", frame, local_comm_id=local, remote_comm_id=comm_id)
    sent.append(("DREP", frame, "CM DisconnectReply",
                 {"infiniband.cm.drsp.localcommid": f"0x{local:08x}",
                  "infiniband.cm.drsp.remotecommid": f"0x{comm_id:08x}"}))
    comm_id, local = 0x3000_0001, reps[1]["local_comm_id"]
    assert Datagram.decode(await cm(bench, protocol.close_qp(reps[1]["local_qpn"], PEER_IP))
                           ).ack == Ack.ACK
    frame = await bench.recv()
    assert frame == gsi_from_core("DREQ", frame, local_comm_id=local, remote_comm_id=comm_id,
                                  remote_qpn=hosts[1].qpn)
    sent.append(("DREQ", frame, "CM DisconnectRequest",
                 {"infiniband.cm.dreq.localcommid": f"0x{local:08x}",
                  "infiniband.cm.req.remoteqpneecn": f"0x{hosts[1].qpn:06x}"}))
    drep = ib_cm.cm_message("DREP", local_comm_id=comm_id, remote_comm_id=local)
    await bench.send(gsi_to_core("DREP", drep, transaction_id=0x15 << 32 | local))
    await bench.idle(300)

    # A connection whose QP is closed before its RTU: REJ 28 of the REP.
    comm_id = 0x5000_0000
    _, rep = await exchange("REQ", connect_request(hosts[16], comm_id), 0xAA_0000)
    local = rep["local_comm_id"]
    assert Datagram.decode(await cm(bench, protocol.close_qp(rep["local_qpn"], PEER_IP))
                           ).ack == Ack.ACK
    frame = await bench.recv()
    assert frame == gsi_from_core("REJ", frame, local_comm_id=local, remote_comm_id=comm_id,
                                  message_rejected=1, reason=28)
    sent.append(("REJ 28 (a pending connection's QP closed)", frame, "CM ConnectReject",
                 {"infiniband.cm.rej.reason": "0x001c",
                  "infiniband.cm.rej.localcommid": f"0x{local:08x}"}))

    # The endpoint connects (CONNECT): its REQ; a REP of private data version 2, REJ 28
    # of it; CONNECT again, its REQ, the REP, its RTU.
    for version in (2, 1):
        await bench.cm_request(connect_datagram(LISTEN_PORT), host_ip=PEER_IP, reply=False,
                               settle_cycles=10)
        frame = await bench.recv()
        _, req = reply_message(frame)
        req = ib_cm.parse_cm_message("REQ", req)
        local, qpn = req["local_comm_id"], req["local_qpn"]
        assert frame == gsi_from_core(
            "REQ", frame, flow=local, **expected_req_fields(req, LISTEN_PORT))
        if version == 2:
            sent.append(("REQ", frame, "CM ConnectRequest",
                         {"infiniband.cm.req.localqpn": f"0x{qpn:06x}",
                          "infiniband.cm.req.ip_cm.dip4": PEER_IP,
                          "infiniband.cm.req.ip_cm.sip4": OUR_IP}))
        rep = ib_cm.cm_message(
            "REP", local_comm_id=0x6000_0000 + version, remote_comm_id=local,
            local_qpn=0x777, starting_psn=0x4242, rnr_retry_count=7,
            private_data=ib_cm.connect_private(rkey=1, base=1 << 30, length=1 << 16,
                                               version=version))
        frame, _ = await exchange("REP", rep, 0x10 << 32 | local)
        kind = "REJ" if version == 2 else "RTU"
        fields = {"message_rejected": 1, "reason": 28} if version == 2 else {}
        assert frame == gsi_from_core(kind, frame, local_comm_id=local,
                                      remote_comm_id=0x6000_0000 + version, **fields)
        sent.append((f"{kind} of the host's REP", frame,
                     "CM ConnectReject" if version == 2 else "CM ReadyToUse",
                     {f"infiniband.cm.{kind.lower()}.remotecommid":
                      f"0x{0x6000_0000 + version:08x}"}))
        reply = Datagram.decode(await bench.cm_reply(host_ip=PEER_IP, timeout_cycles=2000))
        assert (reply.ack, reply.count) == ((Ack.NAK, 28) if version == 2 else (Ack.ACK, 0))

    counters = bench.counters()["ib_cm"]
    assert (counters["rep_sent"], counters["established"], counters["dreq_received"],
            counters["dreq_sent"], counters["drep_received"], counters["rej_freed"],
            counters["req_sent"], counters["rej_accept_version"], counters["connected"]) == \
        (17, 16, 1, 1, 1, 1, 2, 1, 1), counters
    assert not bench.received, [Ether(frame).summary() for frame in bench.received]

    packets = tshark.dissect([frame for _, frame, _, _ in sent],
                             Path(PARAMS["pcap"]).with_suffix(".sent.pcap"))
    assert len(packets) == len(sent)
    for (what, _, message, wanted), packet in zip(sent, packets, strict=True):
        dut._log.info("%s: %s", what, message)
        assert not packet.errors, (what, packet.errors)
        assert message in packet.shownames, (what, sorted(packet.shownames)[:20])
        for name, value in wanted.items():
            assert packet.shown.get(name) == value, (what, name, packet.shown.get(name))
#: The bench's clock cycles per ms tick of the IB CM's timers.
MS_CYCLES = CORE_PARAMS["ib_cm_ms"]


@cocotb.test()
async def rdma_disconnect_is_answered_with_drep_and_frees_the_qp(dut):
    """The host's DREQ of an established connection: a DREP (the model's for that DREQ,
    byte for byte), the QP closed (STATUS); the DREQ again (its DREP lost): another
    DREP; the host connects again at once and gets another QP."""
    bench = await start(dut, seed=41)
    run = RoceRun(bench)
    host = Host(0x5A1, psn=0x1234, rkey=0x600D, base=0x7F00_0000_0000, path_mtu=1024)
    rep = await rdma_connect(bench, host, comm_id=0x1111_0001, tid=0x51)
    qp = connected_qp(run, host, rep)
    await start_run(run, qp, host, length=2000, count=2, write=True, immediate=False)
    await run.finish()
    dreq = ib_cm.mad("DREQ", dreq_message(rep, 0x1111_0001), transaction_id=0xD1)
    drep = ib_cm.mad("DREP", ib_cm.cm_message("DREP", local_comm_id=rep["local_comm_id"],
                                              remote_comm_id=0x1111_0001),
                     transaction_id=0xD1)
    for _ in range(2):
        await bench.send(ib_cm.gsi_frame(dreq, src_ip=PEER_IP, dst_ip=OUR_IP,
                                         src_mac=PEER_MAC, dst_mac=OUR_MAC, sport=0xC0DE))
        assert (await recv_cm(bench, "DREP"))[2] == drep
    got = await status(bench, qp)
    assert not got.open, got
    again = await rdma_connect(bench, host, comm_id=0x1111_0002, tid=0x52)
    assert again["local_qpn"] != rep["local_qpn"], again
    assert again["local_comm_id"] != rep["local_comm_id"], again
    await bench.idle(300)
    counters = bench.counters()
    assert (counters["ib_cm"]["dreq_received"], counters["ib_cm"]["dreq_unknown"],
            counters["ib_cm"]["established"]) == (1, 1, 2), counters["ib_cm"]
    assert (counters["cm"]["opened"], counters["cm"]["closed"]) == (2, 1), counters["cm"]
    assert not bench.received
    bench.close()


@cocotb.test()
async def a_dreq_from_another_host_is_ignored(dut):
    """A DREQ with a connection's comm IDs and QPN from another address: no answer, the
    QP stays open and a run on it lands; counted as spoofed."""
    bench = await start(dut, seed=43)
    run = RoceRun(bench)
    host = Host(0x5A2, psn=0x4321, rkey=0x600E, base=0x7F00_0001_0000, path_mtu=1024)
    rep = await rdma_connect(bench, host, comm_id=0x2222_0001, tid=0x61)
    await bench.send(gsi_to_core("DREQ", dreq_message(rep, 0x2222_0001),
                                 transaction_id=0xD2, src_ip="10.77.0.7"))
    await bench.idle(2000)
    assert not bench.received
    assert bench.counters()["ib_cm"]["dreq_spoofed"] == 1, bench.counters()["ib_cm"]
    qp = connected_qp(run, host, rep)
    await start_run(run, qp, host, length=1500, count=3, write=True, immediate=False)
    await run.finish()
    await check_status(bench, qp, messages=3)
    bench.close()


@cocotb.test()
async def close_qp_of_an_rdma_cm_qp_sends_a_dreq(dut):
    """CLOSE_QP (UDP CM) of a QP that rdma_connect set up: the endpoint sends the host a
    DREQ (the model's, byte for byte: TID 0x15 << 32 | its comm ID, the host's QPN as
    Remote QPN) and, with the REQ's Local CM Response Timeout 8 (one IB CM millisecond),
    again at the next ms tick without DREP; the host's DREP ends it."""
    bench = await start(dut, seed=47)
    host = Host(0x5A3, psn=0x777, rkey=0x600F, base=0x7F00_0002_0000, path_mtu=1024)
    rep = await rdma_connect(bench, host, comm_id=0x3333_0001, tid=0x71,
                             local_cm_response_timeout=8, max_cm_retries=3)
    # The RTU taken first: a QP freed while its connection is still pending (REP sent,
    # no RTU) makes no DREQ.
    await bench.idle(300)
    assert bench.counters()["ib_cm"]["established"] == 1, bench.counters()["ib_cm"]
    request = protocol.close_qp(rep["local_qpn"], PEER_IP)
    raw = await cm(bench, request)
    assert Datagram.decode(raw).ack == Ack.ACK
    expected = ib_cm.mad("DREQ", ib_cm.cm_message(
        "DREQ", local_comm_id=rep["local_comm_id"], remote_comm_id=0x3333_0001,
        remote_qpn=host.qpn), transaction_id=0x15 << 32 | rep["local_comm_id"])
    assert (await recv_cm(bench, "DREQ"))[2] == expected
    assert (await recv_cm(bench, "DREQ", timeout_cycles=MS_CYCLES + 1000))[2] == expected
    drep = ib_cm.cm_message("DREP", local_comm_id=0x3333_0001,
                            remote_comm_id=rep["local_comm_id"])
    await bench.send(gsi_to_core("DREP", drep,
                                 transaction_id=0x15 << 32 | rep["local_comm_id"]))
    await bench.idle(20_000)
    assert not bench.received
    counters = bench.counters()["ib_cm"]
    assert (counters["dreq_sent"], counters["dreq_retransmitted"],
            counters["drep_received"]) == (1, 1, 1), counters
    bench.close()


@cocotb.test()
async def lost_rep_lost_rtu_and_a_duplicate_req(dut):
    """A REP lost and another connection's RTU lost: with the REQs' Local CM Response
    Timeout 8 (one IB CM millisecond) both REPs come again, the same bytes, at the next ms tick; the
    host takes the one and answers the other with another RTU, and both connections
    are established; a repeated REQ gets the same REP and no second QP."""
    bench = await start(dut, seed=53)
    hosts = [Host(0x5B0 + index, psn=0x100 * index + 1, rkey=0x7000 + index,
                  base=0x7F00_0100_0000 * (index + 1), path_mtu=1024) for index in range(3)]
    req = connect_request(hosts[0], 0x4444_0001, local_cm_response_timeout=8, max_cm_retries=3)
    await bench.send(gsi_to_core("REQ", req, transaction_id=0x81))
    first = await recv_cm(bench, "REP")                 # lost
    rep = await rdma_connect(bench, hosts[1], comm_id=0x4444_0002, tid=0x82, rtu=False,
                             local_cm_response_timeout=8, max_cm_retries=3)   # RTU lost
    again = {}
    for _ in range(2):
        _, fields, raw = await recv_cm(bench, "REP", timeout_cycles=MS_CYCLES + 1000)
        again[fields["remote_comm_id"]] = raw, fields
    assert again[0x4444_0001][0] == first[2]
    assert again[0x4444_0002][1] == rep
    await send_rtu(bench, first[1], comm_id=0x4444_0001, tid=0x81)
    await send_rtu(bench, rep, comm_id=0x4444_0002, tid=0x82)
    # duplicate REQ
    req = connect_request(hosts[2], 0x4444_0003)
    await bench.send(gsi_to_core("REQ", req, transaction_id=0x83))
    once = await recv_cm(bench, "REP")
    await bench.send(gsi_to_core("REQ", req, transaction_id=0x83))
    twice = await recv_cm(bench, "REP")
    assert once[2] == twice[2]
    await send_rtu(bench, once[1], comm_id=0x4444_0003, tid=0x83)
    await bench.idle(20_000)
    assert not bench.received
    counters = bench.counters()
    assert (counters["ib_cm"]["rep_sent"], counters["ib_cm"]["rep_retransmitted"],
            counters["ib_cm"]["rep_repeated"], counters["ib_cm"]["established"],
            counters["ib_cm"]["expired"]) == (3, 2, 1, 3, 0), counters["ib_cm"]
    assert counters["cm"]["opened"] == 3, counters["cm"]
    bench.close()


@cocotb.test()
async def sixteen_qps_connected_back_to_back_with_rdma_cm(dut):
    """Sixteen REQs back to back on the wire, then their sixteen RTUs back to back: none
    is lost (QP1's queue holds them while the passive CM serves one at a time), each REQ
    is answered with a REP of its own QP (all sixteen QPNs) and established; a
    seventeenth is rejected with reason 3 (no resources); every QP shows open in STATUS."""
    bench = await start(dut, seed=59)
    hosts = [Host(0x600 + index, psn=index + 1, rkey=0x8000 + index,
                  base=0x7F00_0000_0000 + (index << 24), path_mtu=1024) for index in range(16)]
    for index, host in enumerate(hosts):
        bench.queue(gsi_to_core("REQ", connect_request(host, 0x5555_0000 + index),
                                transaction_id=0x900 + index))
    reps = {}
    for _ in hosts:
        header, rep, _ = await recv_cm(bench, "REP")
        assert header.transaction_id == 0x900 + rep["remote_comm_id"] - 0x5555_0000, header
        reps[rep["remote_comm_id"]] = rep
    assert sorted(reps) == [0x5555_0000 + index for index in range(16)], sorted(reps)
    qpns = [rep["local_qpn"] for rep in reps.values()]
    assert sorted(qpns) == [protocol.FIRST_QPN + index for index in range(16)], qpns
    for comm_id, rep in reps.items():
        bench.queue(gsi_to_core("RTU", ib_cm.cm_message(
            "RTU", local_comm_id=comm_id, remote_comm_id=rep["local_comm_id"]),
            transaction_id=0x900 + comm_id - 0x5555_0000))
    host = Host(0x6FF, psn=1, rkey=1, base=0, path_mtu=1024)
    await bench.send(gsi_to_core("REQ", connect_request(host, 0x5555_00FF), transaction_id=0x9FF))
    header, rej, _ = await recv_cm(bench, "REJ")
    assert (header.transaction_id, rej["remote_comm_id"], rej["reason"]) == (
        0x9FF, 0x5555_00FF, 3), rej
    for qpn in qpns:
        raw = await cm(bench, protocol.status(qpn))
        assert Status.from_reply(raw).open, qpn
    counters = bench.counters()
    assert (counters["ib_cm"]["established"], counters["ib_cm"]["rej_no_qp"]) == (16, 1), \
        counters["ib_cm"]
    assert (counters["qp1"]["received"], counters["qp1"]["busy"]) == (33, 0), counters["qp1"]
    assert not bench.received
    bench.close()


LISTEN_PORT = 7471


def expected_req_fields(req, port, *, path_mtu=3):
    """The fields of the endpoint's REQ to the peer's listener on ``port`` (its comm
    ID, QPN and Starting PSN from ``req``, the REQ it sent), from the IBTA tables."""
    qpn = req["local_qpn"]
    mapped = 0xFFFF_0000_0000
    return dict(
        local_comm_id=req["local_comm_id"], service_id=ib_cm.service_id(port),
        local_ca_guid=ib_cm.ca_guid(OUR_MAC), local_qpn=qpn,
        remote_cm_response_timeout=18, starting_psn=req["starting_psn"],
        local_cm_response_timeout=18, retry_count=7, partition_key=0xFFFF,
        path_mtu=path_mtu, rnr_retry_count=7, max_cm_retries=4, primary_local_lid=0xFFFF,
        primary_remote_lid=0xFFFF, primary_local_gid=mapped | int(IPv4Address(OUR_IP)),
        primary_remote_gid=mapped | int(IPv4Address(PEER_IP)), primary_hop_limit=64,
        primary_local_ack_timeout=17,
        private_data=ib_cm.cma_header(src_ip=OUR_IP, dst_ip=PEER_IP,
                                      port=0xC000 | qpn - protocol.FIRST_QPN)
        + ib_cm.accept_private(qpn))


def connect_datagram(port, *, mtu=protocol.PathMtu.MTU_1024):
    """CONNECT: the peer asks the endpoint to open an rdma_cm connection to its
    listener on ``port``, from its own address, with path MTU ``mtu``."""
    return protocol.connect(PEER_IP, port, mtu).encode()


def connect_reply(port, ack, *, qpn=0, psn=0, count=0, mtu=protocol.PathMtu.MTU_1024):
    """The endpoint's answer to :func:`connect_datagram`."""
    return protocol.reply(protocol.connect(PEER_IP, port, mtu), ack,
                          QpInfo(qpn, psn, ip=OUR_IP),
                          mtu=mtu if ack == Ack.ACK else protocol.PathMtu.DEFAULT,
                          count=count).encode()


@cocotb.test()
async def the_endpoint_connects_to_a_listening_host(dut):
    """CONNECT on UDP 17185: the endpoint's REQ reaches the host's QP1 (byte for byte
    the model's, built from the IBTA fields), a repeated CONNECT meanwhile takes no
    second QP; the host's REP (its QPN, PSN and buffer) is answered with RTU, then
    CONNECT/ACK; a CONNECT again gets the same ACK; a WRITE run started over UDP lands
    byte for byte in the host's buffer. A CONNECT to a port the host rejects (REJ 8)
    is answered CONNECT/NAK 8 and the QP it held is free again."""
    bench = await start(dut, seed=41)
    run = RoceRun(bench)
    await bench.cm_request(connect_datagram(LISTEN_PORT), host_ip=PEER_IP, reply=False,
                           settle_cycles=10)
    header, req, mad = await recv_cm(bench, "REQ")
    index = req["local_qpn"] - protocol.FIRST_QPN
    comm_id = req["local_comm_id"]
    assert mad == ib_cm.mad("REQ", ib_cm.cm_message("REQ", **expected_req_fields(
        req, LISTEN_PORT)), transaction_id=0x10 << 32 | comm_id)
    assert header.transaction_id == 0x10 << 32 | comm_id
    await bench.cm_request(connect_datagram(LISTEN_PORT), host_ip=PEER_IP, reply=False,
                           settle_cycles=300)
    assert not bench.cm_replies and not bench.received

    host = Host(0x5A5, psn=0x31415, rkey=0xCAFE_F00D, base=0x7E00_0000_0000, path_mtu=1024)
    rep = ib_cm.cm_message(
        "REP", local_comm_id=0x600D_0001, remote_comm_id=comm_id, local_qpn=host.qpn,
        starting_psn=host.psn, target_ack_delay=15, rnr_retry_count=7,
        local_ca_guid=0x5254_00FF_FE12_3456,
        private_data=ib_cm.connect_private(rkey=host.rkey, base=host.base, length=1 << 16))
    await bench.send(gsi_to_core("REP", rep, transaction_id=header.transaction_id))
    rtu_header, rtu, _ = await recv_cm(bench, "RTU")
    assert (rtu_header.transaction_id, rtu["local_comm_id"], rtu["remote_comm_id"]) == \
        (header.transaction_id, comm_id, 0x600D_0001)
    reply = await bench.cm_reply(host_ip=PEER_IP, timeout_cycles=2000)
    psn = Datagram.decode(reply).loc.psn
    assert psn == host.psn
    assert reply == connect_reply(LISTEN_PORT, Ack.ACK, qpn=protocol.FIRST_QPN + index,
                                  psn=psn)
    again = await bench.cm_request(connect_datagram(LISTEN_PORT), host_ip=PEER_IP)
    assert again == reply

    qp = connected_qp(run, host, {"local_qpn": protocol.FIRST_QPN + index})
    await start_run(run, qp, host, length=2500, count=3, write=True, immediate=True)
    await run.finish()
    await check_status(bench, qp, messages=3)

    await bench.cm_request(connect_datagram(LISTEN_PORT + 1), host_ip=PEER_IP, reply=False,
                           settle_cycles=10)
    header, req, _ = await recv_cm(bench, "REQ")
    rejected = req["local_qpn"] - protocol.FIRST_QPN
    assert rejected != index
    rej = ib_cm.cm_message("REJ", local_comm_id=0x600D_0002,
                           remote_comm_id=req["local_comm_id"], message_rejected=0, reason=8)
    await bench.send(gsi_to_core("REJ", rej, transaction_id=header.transaction_id))
    reply = await bench.cm_reply(host_ip=PEER_IP, timeout_cycles=2000)
    assert reply == connect_reply(LISTEN_PORT + 1, Ack.NAK, count=8)
    got = await status(bench, SimpleNamespace(qpn=protocol.FIRST_QPN + rejected))
    assert not got.open, got
    counters = bench.counters()
    assert (counters["ib_cm"]["req_sent"], counters["ib_cm"]["connected"],
            counters["ib_cm"]["req_rejected"], counters["cm"]["connects"],
            counters["cm"]["connected"], counters["cm"]["connect_failed"]) == \
        (2, 1, 1, 2, 1, 1), counters
    assert not bench.received
    bench.close()
