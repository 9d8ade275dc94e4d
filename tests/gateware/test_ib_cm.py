# amaranth: UnusedElaboratable=no
"""The passive IB CM (gateware.cm.ib_cm) against REQs, RTUs and REJs built with the
IB CM model (sim.models.ib_cm, struct from the IBTA tables): REP field by field, RTU,
REP retransmission timing and its exact bytes, duplicate REQs, every REJ reason,
retries exhausted, the host's REJ, QPs the owner frees, one QP, latencies, bad input
dropped and counted with the next good REQ served; disconnects both ways (the host's
DREQ answered with DREP and its QP freed, spoofed and unknown DREQs, the endpoint's
DREQ when the owner frees a QP, its retransmission and its DREP, a QP handed out again
meanwhile), DREQ and DREP compared byte for byte with the model's; MADs taken with
random gaps in ready and checked to be held until taken."""

import ipaddress
import random

import pytest
from amaranth.lib import data

from gateware.cm.ib_cm import IbCm, OpenRefusal
from gateware.headers import MAD
from gateware.roce.requests import FIRST_QPN, PathMtu
from sim.models import ib_cm

from .streams import put_item, run_testbenches, wait_for

HOST, OTHER_HOST, ENDPOINT = "10.77.0.1", "10.77.0.9", "10.77.0.2"
MAC = 0x02_12_34_56_78_9A
GUID = 0x00_12_34_FF_FE_56_78_9A        # EUI-64 of MAC: U/L bit flipped, FFFE inserted
PORT = 17185
MS = 40                                 # cycles per ms tick
QPS = 4
SEED = 0x5EED_0001
TID = 0x0123_4567_89AB_CDEF
HOST_COMM_ID = 0x8765_4321
REQ_TIMEOUT = 9                         # the endpoint's REQ: 2 ms between REQs


def req_mad(*, tid=TID, comm_id=HOST_COMM_ID, kind="REQ", host=HOST, endpoint=ENDPOINT,
            version=1, response_timeout=20, max_cm_retries=2, **fields):
    """A REQ as rdma_connect sends it to the endpoint (a 4 s REP timer by default)."""
    values = {
        "local_comm_id": comm_id, "service_id": ib_cm.service_id(PORT),
        "local_ca_guid": 0xA0B0_C0FF_FED0_E0F0, "local_qpn": 0x00_0123,
        "responder_resources": 0, "initiator_depth": 0, "remote_cm_response_timeout": 20,
        "starting_psn": 0xABCDE, "local_cm_response_timeout": response_timeout,
        "retry_count": 6, "partition_key": 0xFFFF, "path_mtu": 3, "rnr_retry_count": 5,
        "max_cm_retries": max_cm_retries, "primary_local_lid": 0xFFFF,
        "primary_remote_lid": 0xFFFF,
        "primary_local_gid": 0xFFFF_0000_0000 | int(ipaddress.IPv4Address(host)),
        "primary_remote_gid": 0xFFFF_0000_0000 | int(ipaddress.IPv4Address(endpoint)),
        "primary_hop_limit": 64, "primary_local_ack_timeout": 17,
        "private_data": ib_cm.cma_header(src_ip=host, dst_ip=endpoint, port=0xD431)
        + ib_cm.connect_private(rkey=0x1122_3344, base=0x7F00_1234_5000, length=1 << 20,
                                version=version),
    }
    values.update(fields)
    return ib_cm.mad(kind, ib_cm.cm_message(kind, **values), transaction_id=tid)


def message_mad(kind, *, tid=TID, **fields):
    return ib_cm.mad(kind, ib_cm.cm_message(kind, **fields), transaction_id=tid)


def record(mad, host=HOST):
    return {"src_ip": int(ipaddress.IPv4Address(host)), "src_port": 0xC123, "src_qp": 1,
            "mad": data.Const(MAD, int.from_bytes(mad, "big"))}


class Bench:
    """The block with a QP table owner model that hands out ``free`` QPs in order
    (refusing with ``refusal`` when none is left), and records of everything it sends,
    by cycle."""

    def __init__(self, *, free=(2, 0, 1, 3), refusal=OpenRefusal.NO_QP,
                 max_mtu=PathMtu.MTU_4096, qps=QPS, req_timeout=REQ_TIMEOUT):
        self.dut = IbCm(qps=qps, port=PORT)
        self.req_timeout = req_timeout
        self.results = []       # (cycle, CM_CONNECTED) of each connection the endpoint opened
        self.free = list(free)
        self.refusal = refusal
        self.max_mtu = max_mtu
        self.cycle = 0
        self.sent = []          # (cycle, dst_ip, dest_qp, flow, MAD bytes)
        self.opens = []
        self.closes = []        # (cycle, qp)
        self.taken = []         # cycles a MAD was taken
        self.answered = []      # cycles an allocation answer was taken
        self.open_cycles = []   # cycles an allocation request was taken

    async def monitor(self, ctx):
        """Counts cycles; takes MADs with ready low at random (30 % of cycles) and records
        each by the cycle it was first offered, checking it is held until taken; records
        when a MAD and an allocation answer are taken and each close."""
        rng, dut = random.Random(3), self.dut
        ctx.set(dut.o_close.ready, 1)
        offered = held = None
        async for _, _, *seen in ctx.tick().sample(
                dut.o.valid, dut.o.ready, dut.o.payload, dut.i.valid, dut.i.ready,
                dut.i_opened.valid, dut.i_opened.ready, dut.o_close.valid, dut.o_close.payload,
                dut.o_open.valid):
            valid, ready, item, *handshakes, close, qp, opening = seen
            if opening:                 # the owner is always ready
                self.open_cycles.append(self.cycle)
            if held is not None:
                assert valid and item == held, "a MAD changed or went before it was taken"
            if valid and offered is None:
                offered = self.cycle
            held = item if valid and not ready else None
            if valid and ready:
                self.sent.append((offered, str(ipaddress.IPv4Address(item.dst_ip)),
                                  int(item.dest_qp), int(item.flow),
                                  item.mad.as_bits().to_bytes(ib_cm.MAD_BYTES, "big")))
                offered = None
            if handshakes[0] and handshakes[1]:
                self.taken.append(self.cycle)
            if handshakes[2] and handshakes[3]:
                self.answered.append(self.cycle)
            if close:
                self.closes.append((self.cycle, int(qp)))
            ctx.set(dut.o.ready, rng.random() >= 0.3)
            self.cycle += 1

    async def owner(self, ctx):
        """Takes each allocation request and answers it 3 cycles later."""
        request, answer = self.dut.o_open, self.dut.i_opened
        ctx.set(request.ready, 1)
        wait = None
        async for _, _, valid, item, answered in ctx.tick().sample(
                request.valid, request.payload, answer.ready):
            if answered and ctx.get(answer.valid):
                ctx.set(answer.valid, 0)
            if valid:
                self.opens.append(item)
                wait = 3
            elif wait is not None:
                wait -= 1
                if wait == 0:
                    wait = None
                    ctx.set(answer.valid, 1)
                    if self.free:
                        ctx.set(answer.payload, {"accepted": 1, "qp": self.free.pop(0)})
                    else:
                        ctx.set(answer.payload, {"accepted": 0, "refusal": self.refusal})

    def run(self, main):
        async def testbench(ctx):
            ctx.set(self.dut.i_seed, SEED)
            ctx.set(self.dut.i_config, {"mac": MAC, "ip": int(ipaddress.IPv4Address(ENDPOINT)),
                                        "max_mtu": self.max_mtu, "ms_cycles": MS,
                                        "req_timeout": self.req_timeout})
            await main(ctx)
            for _ in range(20):
                await ctx.tick()
            assert not ctx.get(self.dut.o.valid), "a MAD left unread"
        run_testbenches(self.dut, testbench, self.monitor, self.owner, self.reporter)

    async def reporter(self, ctx):
        """Takes each result of a connection the endpoint opened, ready 2 cycles in 3."""
        async for _, _, valid, item in ctx.tick().sample(self.dut.o_connected.valid,
                                                             self.dut.o_connected.payload):
            if valid and ctx.get(self.dut.o_connected.ready):
                self.results.append((self.cycle, item))
            ctx.set(self.dut.o_connected.ready, self.cycle % 3 != 0)

    async def put(self, ctx, mad, host=HOST):
        await put_item(ctx, self.dut.i, record(mad, host))

    async def reply(self, ctx, count=1, cycles=200):
        """Wait for ``count`` more MADs sent; return the last one, parsed."""
        target = len(self.sent) + count
        await wait_for(ctx, lambda: len(self.sent) >= target, cycles)
        return self.sent[-1]

    def counters(self, ctx):
        counters = ctx.get(self.dut.o_counters)
        return {name: int(getattr(counters, name))
                for name in IbCm.counters_layout().members}


def parse(sent, kind):
    _, dst_ip, dest_qp, flow, mad = sent
    header, message = ib_cm.parse_mad(mad)
    assert (header.base_version, header.mgmt_class, header.class_version, header.method,
            header.status, header.class_specific, header.reserved,
            header.attribute_modifier) == (1, 0x07, 2, 0x03, 0, 0, 0, 0)
    assert header.attribute_id == ib_cm.ATTRIBUTE_IDS[kind]
    return header, ib_cm.parse_cm_message(kind, message)


def check_rep(sent, *, qp, tid=TID, comm_id=HOST_COMM_ID, host=HOST):
    header, rep = parse(sent, "REP")
    assert header.transaction_id == tid
    assert sent[1:4] == (host, 1, comm_id & 0x3FFF)
    assert rep["remote_comm_id"] == comm_id
    assert rep["local_comm_id"] != 0
    assert rep["local_qpn"] == FIRST_QPN + qp
    assert 0 < rep["starting_psn"] < 1 << 24
    assert rep["target_ack_delay"] <= 15
    assert rep["rnr_retry_count"] == 7
    assert rep["local_ca_guid"] == GUID
    assert (rep["local_qkey"], rep["local_eecn"], rep["responder_resources"],
            rep["initiator_depth"], rep["failover_accepted"], rep["end_to_end_flow_control"],
            rep["srq"], rep["vendor_id_high"], rep["vendor_id_mid"],
            rep["vendor_id_low"]) == (0,) * 10
    assert ib_cm.parse_accept_private(rep["private_data"]) == (1, FIRST_QPN + qp)
    assert rep["private_data"][8:] == bytes(196 - 8)
    return rep


def check_rej(sent, reason, *, tid=TID, comm_id=HOST_COMM_ID):
    header, rej = parse(sent, "REJ")
    assert header.transaction_id == tid
    assert sent[1:4] == (HOST, 1, comm_id & 0x3FFF)
    assert (rej["local_comm_id"], rej["remote_comm_id"], rej["message_rejected"],
            rej["reject_info_length"], rej["reason"]) == (0, comm_id, 0, 0, reason)
    return rej


def rtu(rep, comm_id=HOST_COMM_ID):
    return message_mad("RTU", local_comm_id=comm_id, remote_comm_id=rep["local_comm_id"])


def test_req_rep_rtu():
    bench = Bench()

    async def main(ctx):
        await bench.put(ctx, req_mad())
        rep = check_rep(await bench.reply(ctx), qp=2)
        assert len(bench.opens) == 1
        opened = bench.opens[0]
        assert ipaddress.IPv4Address(int(opened.remote_ip)) == ipaddress.IPv4Address(HOST)
        assert (opened.remote_qpn, opened.next_psn, opened.path_mtu, opened.timeout,
                opened.retry_count, opened.rnr_retry, opened.rkey, opened.base,
                opened.length) == (0x123, 0xABCDE, PathMtu.MTU_1024, 17, 6, 5, 0x1122_3344,
                                   0x7F00_1234_5000, 1 << 20)
        await bench.put(ctx, rtu(rep))
        for _ in range(5 * MS * 3):         # longer than every retransmission would take
            await ctx.tick()
        assert len(bench.sent) == 1 and bench.closes == []
        counters = bench.counters(ctx)
        assert counters["rep_sent"] == 1 and counters["established"] == 1
        assert counters["rep_retransmitted"] == 0 and counters["expired"] == 0
        # a second host: its own QP and comm ID
        await bench.put(ctx, req_mad(comm_id=0x1111, tid=7), host=OTHER_HOST)
        other = check_rep(await bench.reply(ctx), qp=0, comm_id=0x1111, tid=7, host=OTHER_HOST)
        assert other["local_comm_id"] != rep["local_comm_id"]
    bench.run(main)


def test_lost_rtu_retransmits_then_closes():
    bench = Bench()
    interval = 2 * MS                       # Local CM Response Timeout 9: 2 ms

    async def main(ctx):
        await bench.put(ctx, req_mad(response_timeout=9, max_cm_retries=2))
        await bench.reply(ctx)
        await bench.reply(ctx, 2, cycles=3 * interval)
        await wait_for(ctx, lambda: bench.closes, 2 * interval)
        for _ in range(3 * interval):
            await ctx.tick()
    bench.run(main)

    assert len(bench.sent) == 3
    (first, *_), (second, *_), (third, *_) = bench.sent
    # ticks every MS cycles from cycle 0; the 2nd after the REP ends the wait, and the
    # sweep offers entry 2's REP 3 * 2 + 5 cycles after that tick
    assert second == (first // MS + 2) * MS + 3 * 2 + 5
    assert third - second == interval
    assert bench.closes == [(third + interval, 2)]
    assert len({sent[1:] for sent in bench.sent}) == 1, "a retransmitted REP differs"
    check_rep(bench.sent[0], qp=2)


def test_retry_counters_and_rtu_after_expiry():
    bench = Bench()

    async def main(ctx):
        await bench.put(ctx, req_mad(max_cm_retries=0, response_timeout=8))
        rep = check_rep(await bench.reply(ctx), qp=2)
        await wait_for(ctx, lambda: bench.closes, 3 * MS)
        await bench.put(ctx, rtu(rep))
        for _ in range(20):
            await ctx.tick()
        counters = bench.counters(ctx)
        assert (counters["expired"], counters["rep_retransmitted"], counters["unknown"],
                counters["established"]) == (1, 0, 1, 0)
    bench.run(main)
    assert len(bench.sent) == 1 and [qp for _, qp in bench.closes] == [2]


def test_duplicate_req_same_rep_one_qp():
    bench = Bench()

    async def main(ctx):
        await bench.put(ctx, req_mad())
        await bench.reply(ctx)
        await bench.put(ctx, req_mad())
        await bench.reply(ctx)
        rep = check_rep(bench.sent[0], qp=2)
        await bench.put(ctx, rtu(rep))
        await bench.put(ctx, req_mad())
        await bench.reply(ctx)
        await bench.put(ctx, rtu(rep))      # repeated RTU: no change
        for _ in range(20):
            await ctx.tick()
        counters = bench.counters(ctx)
        assert (counters["rep_sent"], counters["rep_repeated"], counters["established"],
                counters["unknown"]) == (1, 2, 1, 0)
    bench.run(main)
    assert len(bench.opens) == 1
    assert len({sent[1:] for sent in bench.sent}) == 1 and len(bench.sent) == 3


@pytest.mark.parametrize("case, reason, counter", [
    ({"service_id": ib_cm.service_id(PORT + 1)}, 8, "rej_service"),
    ({"service_id": ib_cm.service_id(PORT, ps=0x0111)}, 8, "rej_service"),
    ({"transport_service_type": 1}, 9, "rej_transport"),
    ({"version": 2}, 28, "rej_version"),
    ({"endpoint": "10.77.0.3"}, 28, "rej_address"),
    ({"path_mtu": 4}, 26, "rej_mtu"),
    ({"path_mtu": 0}, 26, "rej_mtu"),
    ({"path_mtu": 6}, 26, "rej_mtu"),
])
def test_rejects_then_serves(case, reason, counter):
    bench = Bench(max_mtu=PathMtu.MTU_1024)

    async def main(ctx):
        await bench.put(ctx, req_mad(tid=0x42, comm_id=0x77, **case))
        check_rej(await bench.reply(ctx), reason, tid=0x42, comm_id=0x77)
        assert bench.opens == []
        assert bench.counters(ctx)[counter] == 1
        await bench.put(ctx, req_mad())
        check_rep(await bench.reply(ctx), qp=2)
    bench.run(main)


@pytest.mark.parametrize("refusal, reason, counter", [
    (OpenRefusal.NO_QP, 3, "rej_no_qp"),
    (OpenRefusal.DENIED, 28, "rej_denied"),
])
def test_no_qp_rejects(refusal, reason, counter):
    bench = Bench(free=(), refusal=refusal)

    async def main(ctx):
        await bench.put(ctx, req_mad())
        check_rej(await bench.reply(ctx), reason)
        for _ in range(4 * MS):
            await ctx.tick()
        assert bench.counters(ctx)[counter] == 1
    bench.run(main)
    assert len(bench.opens) == 1 and len(bench.sent) == 1 and bench.closes == []


def test_bad_input_dropped_then_serves():
    bench = Bench()

    async def main(ctx):
        await bench.put(ctx, message_mad("MRA", local_comm_id=HOST_COMM_ID))
        await bench.put(ctx, ib_cm.mad(0x0019, bytes(ib_cm.CM_BYTES), transaction_id=TID))
        await bench.put(ctx, message_mad("RTU", local_comm_id=HOST_COMM_ID,
                                         remote_comm_id=SEED))
        await bench.put(ctx, req_mad())
        rep = check_rep(await bench.reply(ctx), qp=2)
        # comm IDs right, wrong source; swapped IDs; the host's REJ answered by nothing
        await bench.put(ctx, rtu(rep), host=OTHER_HOST)
        await bench.put(ctx, message_mad("RTU", local_comm_id=rep["local_comm_id"],
                                         remote_comm_id=HOST_COMM_ID))
        for _ in range(30):
            await ctx.tick()
        counters = bench.counters(ctx)
        # (the MRA, of no REQ of the endpoint's, is unknown; attribute 0x19 is no CM's)
        assert (counters["attribute"], counters["unknown"], counters["established"]) == (1, 4, 0)
        await bench.put(ctx, rtu(rep))
        for _ in range(30):
            await ctx.tick()
        assert bench.counters(ctx)["established"] == 1
    bench.run(main)
    assert len(bench.opens) == 1 and len(bench.sent) == 1


def test_host_rej_closes_pending():
    bench = Bench()

    async def main(ctx):
        await bench.put(ctx, req_mad())
        rep = check_rep(await bench.reply(ctx), qp=2)
        await bench.put(ctx, message_mad("REJ", local_comm_id=HOST_COMM_ID,
                                         remote_comm_id=rep["local_comm_id"],
                                         message_rejected=1, reason=28))
        await wait_for(ctx, lambda: bench.closes, 30)
        assert bench.counters(ctx)["rejected_by_host"] == 1
        # the same comm ID again is a new connection: a new QP
        await bench.put(ctx, req_mad(tid=9))
        again = check_rep(await bench.reply(ctx), qp=0, tid=9)
        assert again["local_comm_id"] != rep["local_comm_id"]
    bench.run(main)
    assert [qp for _, qp in bench.closes] == [2] and len(bench.opens) == 2


def test_qp_freed_by_the_owner_leaves_the_table():
    bench = Bench(free=(2, 2, 1))
    interval = 2 * MS

    async def main(ctx):
        await bench.put(ctx, req_mad(response_timeout=9, max_cm_retries=1))
        rep = check_rep(await bench.reply(ctx), qp=2)
        await put_item(ctx, bench.dut.i_closed, 2)      # e.g. the lease ran out
        for _ in range(4 * interval):
            await ctx.tick()
        # rejected (REJ 28 of the REP), not retransmitted, not closed again
        assert len(bench.sent) == 2 and bench.closes == []
        assert bench.sent[1][4] == expected_rej_of_rep(rep)
        await bench.put(ctx, rtu(rep))
        for _ in range(20):
            await ctx.tick()
        assert bench.counters(ctx)["unknown"] == 1
        # the same REQ again is a new connection; the owner hands out QP 2 again
        await bench.put(ctx, req_mad(tid=5))
        again = check_rep(await bench.reply(ctx), qp=2, tid=5)
        await bench.put(ctx, req_mad(tid=5))
        assert (await bench.reply(ctx))[1:] == bench.sent[-2][1:]
        # another connection; the owner frees QP 2: the other one stays
        await bench.put(ctx, req_mad(comm_id=0x99, tid=6))
        newer = check_rep(await bench.reply(ctx), qp=1, comm_id=0x99, tid=6)
        await put_item(ctx, bench.dut.i_closed, 2)     # ``again`` still pending: REJ
        assert (await bench.reply(ctx))[4] == expected_rej_of_rep(again, tid=5)
        await bench.put(ctx, req_mad(comm_id=0x99, tid=6))
        assert (await bench.reply(ctx))[1:] == bench.sent[-3][1:]
        await bench.put(ctx, rtu(again))
        await bench.put(ctx, rtu(newer, comm_id=0x99))
        for _ in range(20):
            await ctx.tick()
        counters = bench.counters(ctx)
        assert (counters["established"], counters["unknown"], counters["rep_repeated"]) == \
            (1, 2, 2)
    bench.run(main)
    assert len(bench.opens) == 3


def test_one_qp():
    bench = Bench(free=(0,), qps=1)

    async def main(ctx):
        await bench.put(ctx, req_mad())
        rep = check_rep(await bench.reply(ctx), qp=0)
        await bench.put(ctx, rtu(rep))
        await bench.put(ctx, req_mad(comm_id=0x55, tid=3))
        check_rej(await bench.reply(ctx), 3, comm_id=0x55, tid=3)
        await bench.put(ctx, req_mad())
        assert (await bench.reply(ctx))[1:] == bench.sent[0][1:]
        counters = bench.counters(ctx)
        assert (counters["established"], counters["rep_repeated"], counters["rej_no_qp"]) == \
            (1, 1, 1)
    bench.run(main)
    assert len(bench.opens) == 2


def test_latency():
    bench = Bench()

    async def main(ctx):
        await bench.put(ctx, req_mad(version=2))
        await bench.reply(ctx)
        await bench.put(ctx, req_mad())
        await bench.reply(ctx)
        await bench.put(ctx, req_mad())
        await bench.reply(ctx)
    bench.run(main)
    (rej, *_), (rep, *_), (repeated, *_) = bench.sent
    assert rej - bench.taken[0] == 3
    assert bench.open_cycles[0] - bench.taken[1] == 3 + 3 * QPS
    assert rep - bench.answered[0] == 2
    assert repeated - bench.taken[2] == 3 + 3 * (2 + 1)       # found in entry 2


def test_comm_ids_from_the_seed():
    bench = Bench()

    async def main(ctx):
        for number in range(3):
            await bench.put(ctx, req_mad(comm_id=number + 1, tid=number))
            await bench.reply(ctx)
    bench.run(main)
    ids = [parse(sent, "REP")[1]["local_comm_id"] for sent in bench.sent]
    assert ids == [SEED, SEED + 1, SEED + 2]


def test_parameters():
    with pytest.raises(ValueError, match="QP count"):
        IbCm(qps=0)
    with pytest.raises(ValueError, match="Port"):
        IbCm(qps=4, port=1 << 16)
    assert IbCm(qps=4, port=4791).service_id == 0x0106_12B7


ENDPOINT_QPN = FIRST_QPN + 2            # the QP the bench's owner hands out first
HOST_QPN = 0x00_0123                    # req_mad's Local QPN


def dreq_mad(rep, *, tid=0x0D0D, comm_id=HOST_COMM_ID, remote_qpn=ENDPOINT_QPN):
    """The host's DREQ of the connection ``rep`` answered (rdma_disconnect)."""
    return message_mad("DREQ", tid=tid, local_comm_id=comm_id,
                       remote_comm_id=rep["local_comm_id"], remote_qpn=remote_qpn)


def expected_drep(dreq):
    """The DREP the model answers a DREQ's MAD with: its TID, the comm IDs swapped."""
    header, message = ib_cm.parse_mad(dreq)
    fields = ib_cm.parse_cm_message("DREQ", message)
    return message_mad("DREP", tid=header.transaction_id,
                       local_comm_id=fields["remote_comm_id"],
                       remote_comm_id=fields["local_comm_id"])


def expected_dreq(rep, *, comm_id=HOST_COMM_ID, host_qpn=HOST_QPN):
    """The endpoint's DREQ of the connection ``rep`` opened: TID 0x15 << 32 | its comm ID."""
    return message_mad("DREQ", tid=0x15 << 32 | rep["local_comm_id"],
                       local_comm_id=rep["local_comm_id"], remote_comm_id=comm_id,
                       remote_qpn=host_qpn)


async def established(bench, ctx, **req):
    """REQ, REP, RTU: the REP's fields."""
    await bench.put(ctx, req_mad(**req))
    rep = parse(await bench.reply(ctx), "REP")[1]
    await bench.put(ctx, rtu(rep, comm_id=req.get("comm_id", HOST_COMM_ID)))
    await settle(ctx)
    return rep


async def settle(ctx, cycles=40):
    for _ in range(cycles):
        await ctx.tick()


def test_host_dreq_drep_and_qp_freed():
    bench = Bench()

    async def main(ctx):
        rep = await established(bench, ctx)
        dreq = dreq_mad(rep)
        await bench.put(ctx, dreq)
        sent = await bench.reply(ctx)
        assert sent[1:] == (HOST, 1, HOST_COMM_ID & 0x3FFF, expected_drep(dreq))
        assert [qp for _, qp in bench.closes] == [2]
        assert bench.closes[0][0] < sent[0], "the DREP went before the QP was freed"
        # the host's DREQ again (its DREP lost): DREP again, nothing else freed
        await bench.put(ctx, dreq)
        assert (await bench.reply(ctx))[1:] == sent[1:]
        # the connection is gone: its RTU and its REQ find nothing
        await bench.put(ctx, rtu(rep))
        await settle(ctx)
        counters = bench.counters(ctx)
        assert (counters["dreq_received"], counters["dreq_unknown"], counters["unknown"],
                counters["dreq_spoofed"]) == (1, 1, 1, 0)
        await bench.put(ctx, req_mad(tid=3))
        check_rep(await bench.reply(ctx), qp=0, tid=3)
        assert counters["rep_repeated"] == 0
    bench.run(main)
    assert len(bench.closes) == 1 and len(bench.opens) == 2


def test_host_dreq_of_a_pending_connection():
    bench = Bench()

    async def main(ctx):
        await bench.put(ctx, req_mad())
        rep = check_rep(await bench.reply(ctx), qp=2)
        dreq = dreq_mad(rep)
        await bench.put(ctx, dreq)
        assert (await bench.reply(ctx))[4] == expected_drep(dreq)
        await settle(ctx, 4 * 2 ** (20 - 8) // 2)
        assert bench.counters(ctx)["dreq_received"] == 1
    bench.run(main)
    assert [qp for _, qp in bench.closes] == [2] and len(bench.sent) == 2


@pytest.mark.parametrize("case", ["other host", "other qpn", "other comm id"])
def test_spoofed_dreq_ignored(case):
    bench = Bench()

    async def main(ctx):
        rep = await established(bench, ctx)
        host, dreq = HOST, dreq_mad(rep)
        if case == "other host":
            host = OTHER_HOST
        elif case == "other qpn":
            dreq = dreq_mad(rep, remote_qpn=ENDPOINT_QPN + 1)
        else:
            dreq = dreq_mad(rep, comm_id=HOST_COMM_ID + 1)
        await bench.put(ctx, dreq, host=host)
        await settle(ctx)
        counters = bench.counters(ctx)
        if case == "other comm id":     # no connection: answered as IBTA asks
            assert (counters["dreq_unknown"], counters["dreq_spoofed"]) == (1, 0)
            assert bench.sent[-1][1:] == (HOST, 1, (HOST_COMM_ID + 1) & 0x3FFF,
                                          expected_drep(dreq))
        else:
            assert (counters["dreq_spoofed"], counters["dreq_unknown"]) == (1, 0)
            assert len(bench.sent) == 1
        assert bench.closes == [] and counters["dreq_received"] == 0
        # the connection stands: a repeated REQ gets its REP, its host's DREQ ends it
        await bench.put(ctx, req_mad())
        assert (await bench.reply(ctx))[1:] == bench.sent[0][1:]
        await bench.put(ctx, dreq_mad(rep))
        await bench.reply(ctx)
        assert [qp for _, qp in bench.closes] == [2]
    bench.run(main)


def test_unknown_dreq_answered_unknown_drep_dropped():
    bench = Bench()

    async def main(ctx):
        dreq = message_mad("DREQ", tid=0x77, local_comm_id=0x4444, remote_comm_id=0x5555,
                           remote_qpn=ENDPOINT_QPN)
        await bench.put(ctx, dreq, host=OTHER_HOST)
        assert (await bench.reply(ctx))[1:] == (OTHER_HOST, 1, 0x4444 & 0x3FFF,
                                                expected_drep(dreq))
        await bench.put(ctx, message_mad("DREP", local_comm_id=0x4444, remote_comm_id=SEED))
        await settle(ctx)
        counters = bench.counters(ctx)
        assert (counters["dreq_unknown"], counters["drep_unknown"], counters["unknown"],
                counters["attribute"]) == (1, 1, 0, 0)
    bench.run(main)
    assert len(bench.sent) == 1 and bench.closes == [] and bench.opens == []


def test_owner_frees_qp_dreq_retransmitted_then_given_up():
    bench = Bench()
    interval = 2 * MS                       # Local CM Response Timeout 9: 2 ms

    async def main(ctx):
        # the RTU lost once: the REP's retries spent do not count for the DREQ's
        await bench.put(ctx, req_mad(response_timeout=9, max_cm_retries=2))
        rep = parse(await bench.reply(ctx), "REP")[1]
        await bench.reply(ctx, cycles=3 * interval)
        await bench.put(ctx, rtu(rep))
        await settle(ctx, 3 * MS)
        await put_item(ctx, bench.dut.i_closed, 2)      # e.g. CLOSE_QP
        await bench.reply(ctx, cycles=100)
        assert bench.sent[-1][1:] == (HOST, 1, HOST_COMM_ID & 0x3FFF, expected_dreq(rep))
        await settle(ctx, 10)
        await put_item(ctx, bench.dut.i_closed, 0)      # a free QP: its sweep counts nothing
        await bench.reply(ctx, 2, cycles=3 * interval)
        await settle(ctx, 4 * interval)
        counters = bench.counters(ctx)
        assert (counters["dreq_sent"], counters["dreq_retransmitted"],
                counters["dreq_expired"], counters["expired"]) == (1, 2, 1, 0)
        # gone: its DREP finds nothing
        await bench.put(ctx, message_mad("DREP", local_comm_id=HOST_COMM_ID,
                                         remote_comm_id=rep["local_comm_id"]))
        await settle(ctx)
        assert bench.counters(ctx)["drep_unknown"] == 1
    bench.run(main)
    assert bench.closes == [] and len(bench.sent) == 5
    (first, *_), (second, *_), (third, *_) = bench.sent[2:]
    assert second == (first // MS + 2) * MS + 3 * 2 + 5
    assert third - second == interval
    assert len({sent[1:] for sent in bench.sent[2:]}) == 1, "a retransmitted DREQ differs"


def test_drep_ends_the_endpoints_disconnect():
    bench = Bench()
    interval = 2 * MS

    async def main(ctx):
        rep = await established(bench, ctx, response_timeout=9, max_cm_retries=3)
        await put_item(ctx, bench.dut.i_closed, 2)
        await bench.reply(ctx, cycles=100)
        drep = message_mad("DREP", local_comm_id=HOST_COMM_ID,
                           remote_comm_id=rep["local_comm_id"])
        await bench.put(ctx, drep, host=OTHER_HOST)        # not from its host: dropped
        await settle(ctx)
        await bench.put(ctx, drep)
        await settle(ctx, 5 * interval)
        await bench.put(ctx, drep)                          # again: no disconnect left
        await settle(ctx)
        counters = bench.counters(ctx)
        assert (counters["dreq_sent"], counters["drep_received"], counters["drep_unknown"],
                counters["dreq_retransmitted"]) == (1, 1, 2, 0)
    bench.run(main)
    assert bench.closes == [] and len(bench.sent) == 2


def test_dreqs_cross():
    """The host's DREQ while the endpoint's waits for DREP: DREP, no second close."""
    bench = Bench()

    async def main(ctx):
        rep = await established(bench, ctx, response_timeout=9, max_cm_retries=3)
        await put_item(ctx, bench.dut.i_closed, 2)
        await bench.reply(ctx, cycles=100)
        dreq = dreq_mad(rep)
        await bench.put(ctx, dreq)
        assert (await bench.reply(ctx))[4] == expected_drep(dreq)
        await settle(ctx, 5 * 2 * MS)
        counters = bench.counters(ctx)
        assert (counters["dreq_sent"], counters["dreq_received"],
                counters["dreq_retransmitted"]) == (1, 1, 0)
    bench.run(main)
    assert bench.closes == [] and len(bench.sent) == 3


def expected_rej_of_rep(rep, *, comm_id=HOST_COMM_ID, tid=TID):
    """The endpoint's REJ of a connection whose REP the host has not answered: the REQ's
    TID, Message Rejected 1 (REP), reason 28 (as Linux's cm_destroy_id in REP_SENT)."""
    return message_mad("REJ", tid=tid, local_comm_id=rep["local_comm_id"],
                       remote_comm_id=comm_id, message_rejected=1, reason=28)


def test_pending_connection_freed_is_rejected():
    """A connection whose QP the owner frees before the RTU: REJ 28, once; no DREQ, no
    REP again, its RTU unknown after."""
    bench = Bench()

    async def main(ctx):
        await bench.put(ctx, req_mad(response_timeout=9, max_cm_retries=3))
        rep = parse(await bench.reply(ctx), "REP")[1]
        await put_item(ctx, bench.dut.i_closed, 2)
        assert (await bench.reply(ctx))[4] == expected_rej_of_rep(rep)
        await settle(ctx, 10 * MS)
        await bench.put(ctx, rtu(rep))
        await settle(ctx)
        counters = bench.counters(ctx)
        assert (counters["dreq_sent"], counters["rej_freed"], counters["unknown"],
                counters["rep_retransmitted"]) == (0, 1, 1, 0)
    bench.run(main)
    assert len(bench.sent) == 2 and bench.closes == []


def test_qp_handed_out_again_during_a_disconnect():
    """The owner hands the freed QP to a new connection while the old one's DREQ waits
    for DREP: the new connection's entry replaces it; no DREQ of the old goes out after,
    the old one's DREP finds nothing, the new connection is served and disconnected."""
    bench = Bench(free=(2, 2))
    interval = 2 * MS

    async def main(ctx):
        rep = await established(bench, ctx, response_timeout=9, max_cm_retries=3)
        await put_item(ctx, bench.dut.i_closed, 2)
        await bench.reply(ctx, cycles=100)
        assert bench.sent[-1][4] == expected_dreq(rep)
        new = await established(bench, ctx, comm_id=0x99, tid=6, response_timeout=9,
                                max_cm_retries=3)
        check_rep(bench.sent[-1], qp=2, comm_id=0x99, tid=6)
        await settle(ctx, 6 * interval)
        assert len(bench.sent) == 3, "the old connection's DREQ went out again"
        await bench.put(ctx, message_mad("DREP", local_comm_id=HOST_COMM_ID,
                                         remote_comm_id=rep["local_comm_id"]))
        await bench.put(ctx, dreq_mad(rep))             # the old one's DREQ: unknown
        assert (await bench.reply(ctx))[4] == expected_drep(dreq_mad(rep))
        await bench.put(ctx, dreq_mad(new, comm_id=0x99))
        assert (await bench.reply(ctx))[4] == expected_drep(dreq_mad(new, comm_id=0x99))
        counters = bench.counters(ctx)
        assert (counters["drep_unknown"], counters["drep_received"], counters["dreq_unknown"],
                counters["dreq_received"], counters["dreq_sent"],
                counters["established"]) == (1, 0, 1, 1, 1, 2)
    bench.run(main)
    assert [qp for _, qp in bench.closes] == [2]


def test_the_owner_frees_the_qp_before_the_dreqs_close():
    """A QP the owner freed before the host's DREQ finds it: DREP, and no o_close."""
    bench = Bench()

    async def main(ctx):
        rep = await established(bench, ctx)
        ctx.set(bench.dut.i_closed.valid, 1)
        ctx.set(bench.dut.i_closed.payload, 2)
        dreq = dreq_mad(rep)
        ctx.set(bench.dut.i.payload, record(dreq))
        ctx.set(bench.dut.i.valid, 1)
        await ctx.tick()
        ctx.set(bench.dut.i_closed.valid, 0)
        await ctx.tick().until(bench.dut.i.ready)
        ctx.set(bench.dut.i.valid, 0)
        await wait_for(ctx, lambda: any(sent[4] == expected_drep(dreq)
                                        for sent in bench.sent), 200)
        await settle(ctx, 4 * MS)
    bench.run(main)
    assert bench.closes == []


def test_disconnect_latency():
    bench = Bench()
    found = []

    async def main(ctx):
        rep = await established(bench, ctx)
        closed = bench.cycle
        await put_item(ctx, bench.dut.i_closed, 2)
        await bench.reply(ctx, cycles=100)
        found.append(bench.sent[-1][0] - closed)
        await bench.put(ctx, dreq_mad(rep, comm_id=0x5))                # unknown
        await bench.reply(ctx)
        found.append(bench.sent[-1][0] - bench.taken[-1])
        await bench.put(ctx, req_mad(comm_id=0x77, tid=1))
        new = parse(await bench.reply(ctx), "REP")[1]
        await bench.put(ctx, rtu(new, comm_id=0x77))
        await settle(ctx)
        await bench.put(ctx, dreq_mad(new, comm_id=0x77, remote_qpn=FIRST_QPN))
        await bench.reply(ctx)
        found.extend([bench.closes[-1][0] - bench.taken[-1], bench.sent[-1][0] - bench.taken[-1]])
    bench.run(main)
    # the DREQ of entry 2 after i_closed; an unknown DREQ's DREP after all entries; a
    # DREQ found in entry 0: its close, then its DREP a cycle after the close is taken
    assert found == [3 * 2 + 6, 2 + 3 * QPS, 2 + 3 * (0 + 1), 2 + 3 * (0 + 1) + 1]


# The active side: the endpoint's REQ to a listening host (its QP taken by the owner
# beforehand), the host's REP, MRA and REJ, the RTU, the result for the owner.

LISTEN_PORT = 7471
HOST_REP_COMM_ID = 0x0BAD_CAFE


def expected_req(qp, *, comm_id, psn, port=LISTEN_PORT, path_mtu=PathMtu.MTU_1024, host=HOST):
    """The endpoint's REQ, from the IBTA fields (the model's ``cm_message``): as rdma_cm
    sends one over RoCE, the cma_hdr from the QP's UDP port, then version 1 and the QPN."""
    mapped = 0xFFFF_0000_0000
    return message_mad(
        "REQ", tid=0x10 << 32 | comm_id, local_comm_id=comm_id,
        service_id=ib_cm.service_id(port), local_ca_guid=GUID, local_qpn=FIRST_QPN + qp,
        remote_cm_response_timeout=REQ_TIMEOUT, starting_psn=psn,
        local_cm_response_timeout=REQ_TIMEOUT, retry_count=7, partition_key=0xFFFF,
        path_mtu=path_mtu.value, rnr_retry_count=7, max_cm_retries=4,
        primary_local_lid=0xFFFF, primary_remote_lid=0xFFFF,
        primary_local_gid=mapped | int(ipaddress.IPv4Address(ENDPOINT)),
        primary_remote_gid=mapped | int(ipaddress.IPv4Address(host)),
        primary_hop_limit=64, primary_local_ack_timeout=17,
        private_data=ib_cm.cma_header(src_ip=ENDPOINT, dst_ip=host, port=0xC000 | qp)
        + ib_cm.accept_private(FIRST_QPN + qp))


def host_rep(req, *, version=1, comm_id=HOST_REP_COMM_ID, **fields):
    """The listening host's REP to the endpoint's REQ ``req`` (parsed), with the 24 bytes
    of its rdma_accept private data."""
    values = dict(local_comm_id=comm_id, remote_comm_id=req["local_comm_id"],
                  local_qpn=HOST_QPN, starting_psn=0x00_5150, target_ack_delay=15,
                  rnr_retry_count=6, local_ca_guid=0x5254_00FF_FE12_3456,
                  private_data=ib_cm.connect_private(rkey=0xAABB_CCDD, base=0x7F11_2233_4000,
                                                     length=1 << 16, version=version))
    values.update(fields)
    return message_mad("REP", tid=0x10 << 32 | req["local_comm_id"], **values)


async def connect(bench, ctx, qp=1, *, port=LISTEN_PORT, path_mtu=PathMtu.MTU_1024,
                  host=HOST):
    """Asks for a connection on ``qp``; checks the REQ against the model's, byte for byte
    (its comm ID and PSN read from it); returns it parsed."""
    await put_item(ctx, bench.dut.i_connect,
                   {"qp": qp, "remote_ip": int(ipaddress.IPv4Address(host)), "port": port,
                    "path_mtu": path_mtu})
    sent = await bench.reply(ctx)
    _, req = parse(sent, "REQ")
    assert sent[1:3] == (host, 1)
    assert sent[4] == expected_req(qp, comm_id=req["local_comm_id"], psn=req["starting_psn"],
                                   port=port, path_mtu=path_mtu, host=host)
    assert req["local_comm_id"] != 0 and 0 < req["starting_psn"] < 1 << 24
    return req


def expected_rtu(req, comm_id=HOST_REP_COMM_ID):
    return message_mad("RTU", tid=0x10 << 32 | req["local_comm_id"],
                       local_comm_id=req["local_comm_id"], remote_comm_id=comm_id)


def result(bench, index=-1):
    _, item = bench.results[index]
    return {name: int(getattr(item, name)) for name in
            ("qp", "accepted", "reason", "remote_qpn", "next_psn", "rnr_retry", "rkey",
             "base", "length")}


ACCEPTED = {"accepted": 1, "reason": 0, "remote_qpn": HOST_QPN, "next_psn": 0x5150,
            "rnr_retry": 6, "rkey": 0xAABB_CCDD, "base": 0x7F11_2233_4000, "length": 1 << 16}


def test_endpoint_connects_req_rep_rtu_and_a_repeated_rep():
    bench = Bench()

    async def main(ctx):
        req = await connect(bench, ctx, qp=1)
        assert req["local_comm_id"] == SEED         # the first comm ID after reset
        await bench.put(ctx, host_rep(req))
        assert (await bench.reply(ctx))[4] == expected_rtu(req)
        await wait_for(ctx, lambda: bench.results, 30)
        assert result(bench) == {"qp": 1, **ACCEPTED}
        await settle(ctx, 12 * 2 * MS)             # no REQ again once answered
        await bench.put(ctx, host_rep(req))        # the RTU lost: the host repeats its REP
        assert (await bench.reply(ctx))[4] == expected_rtu(req)
        counters = bench.counters(ctx)
        assert (counters["req_sent"], counters["connected"], counters["rtu_repeated"],
                counters["req_retransmitted"]) == (1, 1, 1, 0)
        # a second connection, to another host and port: its own comm ID
        other = await connect(bench, ctx, qp=3, port=9999, path_mtu=PathMtu.MTU_4096,
                              host=OTHER_HOST)
        assert other["local_comm_id"] == SEED + 1
    bench.run(main)
    assert len(bench.results) == 1 and bench.opens == [] and bench.closes == []


def test_endpoint_connection_disconnected_by_the_host():
    """Established by the endpoint, the connection ends as any: the host's DREQ frees
    the QP and is answered with DREP; freed by the owner, the endpoint sends DREQ."""
    bench = Bench()

    async def main(ctx):
        req = await connect(bench, ctx, qp=1)
        await bench.put(ctx, host_rep(req))
        await bench.reply(ctx)
        dreq = message_mad("DREQ", tid=0x0D0D, local_comm_id=HOST_REP_COMM_ID,
                           remote_comm_id=req["local_comm_id"], remote_qpn=FIRST_QPN + 1)
        await bench.put(ctx, dreq)
        assert (await bench.reply(ctx))[4] == message_mad(
            "DREP", tid=0x0D0D, local_comm_id=req["local_comm_id"],
            remote_comm_id=HOST_REP_COMM_ID)
        assert [qp for _, qp in bench.closes] == [1]
        again = await connect(bench, ctx, qp=2)
        await bench.put(ctx, host_rep(again, comm_id=0x77))
        await bench.reply(ctx)
        await put_item(ctx, bench.dut.i_closed, 2)
        assert (await bench.reply(ctx))[4] == message_mad(
            "DREQ", tid=0x15 << 32 | again["local_comm_id"],
            local_comm_id=again["local_comm_id"], remote_comm_id=0x77, remote_qpn=HOST_QPN)
    bench.run(main)


def test_endpoint_req_retransmitted_then_reported_unanswered():
    bench = Bench()
    interval = 2 * MS

    async def main(ctx):
        await connect(bench, ctx, qp=0)
        await wait_for(ctx, lambda: bench.results, 7 * interval + 60)
        assert result(bench)["accepted"] == 0 and result(bench)["reason"] == 4
        assert result(bench)["qp"] == 0
    bench.run(main)
    assert [sent[1:] for sent in bench.sent] == [bench.sent[0][1:]] * 5    # 4 more
    gaps = [b[0] - a[0] for a, b in zip(bench.sent, bench.sent[1:], strict=False)]
    # (the ms ticks run from reset: the first wait is 1 to 2 of them)
    assert interval - MS <= gaps[0] <= interval + 10, gaps
    assert all(interval - 10 <= gap <= interval + 10 for gap in gaps[1:]), gaps


def test_endpoint_req_rejected_by_the_host():
    bench = Bench()

    async def main(ctx):
        req = await connect(bench, ctx, qp=2)
        # another source's REJ, and a REJ of a REP: not this REQ's
        for rejection, host in ((dict(message_rejected=0), OTHER_HOST),
                                (dict(message_rejected=1), HOST)):
            await bench.put(ctx, message_mad("REJ", remote_comm_id=req["local_comm_id"],
                                             reason=8, **rejection), host=host)
        await settle(ctx)
        assert bench.results == [] and bench.counters(ctx)["unknown"] == 2
        await bench.put(ctx, message_mad("REJ", remote_comm_id=req["local_comm_id"],
                                         message_rejected=0, reason=8))
        await wait_for(ctx, lambda: bench.results, 30)
        assert result(bench)["accepted"] == 0 and result(bench)["reason"] == 8
        await settle(ctx, 6 * 2 * MS)           # no REQ again
        await bench.put(ctx, host_rep(req))     # too late: nothing
        await settle(ctx)
        assert bench.counters(ctx)["req_rejected"] == 1
    bench.run(main)
    assert len(bench.sent) == 1 and len(bench.results) == 1


def test_endpoint_req_waits_longer_after_an_mra():
    bench = Bench()
    interval = 2 * MS

    async def main(ctx):
        req = await connect(bench, ctx, qp=0)
        # service timeout 11: 8 ms more than the REQ's own 2 ms
        await bench.put(ctx, message_mad("MRA", local_comm_id=HOST_REP_COMM_ID,
                                         remote_comm_id=req["local_comm_id"],
                                         message_mraed=0, service_timeout=11))
        await settle(ctx, 4 * interval)
        assert bench.counters(ctx)["mra_received"] == 1
        assert len(bench.sent) == 1
        await bench.reply(ctx, cycles=2 * interval)
        await bench.put(ctx, host_rep(req))
        await wait_for(ctx, lambda: bench.results, 60)
        assert result(bench) == {"qp": 0, **ACCEPTED}
    bench.run(main)
    assert len(bench.sent) == 3         # the REQ, once more after the MRA's wait, the RTU


def test_endpoint_rejects_a_rep_of_another_version():
    bench = Bench()

    async def main(ctx):
        req = await connect(bench, ctx, qp=3)
        await bench.put(ctx, host_rep(req, version=2))
        assert (await bench.reply(ctx))[4] == message_mad(
            "REJ", tid=0x10 << 32 | req["local_comm_id"], local_comm_id=req["local_comm_id"],
            remote_comm_id=HOST_REP_COMM_ID, message_rejected=1, reason=28)
        await wait_for(ctx, lambda: bench.results, 30)
        assert result(bench)["accepted"] == 0 and result(bench)["reason"] == 28
        assert bench.counters(ctx)["rej_accept_version"] == 1
    bench.run(main)


def test_endpoint_req_of_a_qp_freed_meanwhile_is_dropped():
    bench = Bench()

    async def main(ctx):
        req = await connect(bench, ctx, qp=1)
        await put_item(ctx, bench.dut.i_closed, 1)
        await settle(ctx, 8 * 2 * MS)
        await bench.put(ctx, host_rep(req))
        await settle(ctx)
        assert bench.counters(ctx)["unknown"] == 1
    bench.run(main)
    assert len(bench.sent) == 1 and bench.results == [] and bench.closes == []
