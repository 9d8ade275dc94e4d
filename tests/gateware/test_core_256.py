# amaranth: UnusedElaboratable=no
"""The whole core built for 256 QPs (small retransmit rings and message slots), in
Amaranth's simulator: a host opens a QP through the CM and runs the generator on it,
user logic sends on QP 255, a responder model acknowledges, and STATUS reports both;
with DCQCN on by default, RoCEv2 packets carry ECT(0) whatever ECN the traffic class
set asks for."""

from collections import deque

from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from gateware.config import parse_ipv4
from gateware.core import NetworkCore
from gateware.roce.requests import PathMtu, Verb
from host import protocol
from host.protocol import Ack, Datagram, QpInfo, Status
from sim.models.responder import Responder

from .streams import run_testbenches, to_beats, wait_for

CORE_MAC, CORE_IP = "02:00:00:00:00:02", "10.77.0.2"
HOST_MAC, HOST_IP = "52:54:00:12:34:56", "10.77.0.1"
WIDTH = 64


class Bench:
    """The MAC's two streams: frames in (a beat a cycle), frames out (always ready),
    ARP answered for the host, RoCEv2 packets to responder models by QPN, CM replies
    kept."""

    def __init__(self):
        self.dut = NetworkCore(qps=256, retransmit_beats=128, messages=8, clock_hz=10_000_000)
        self.inbox = deque()
        self.cm_replies = []
        self.completions = []
        self.responders = {}
        self.roce_tos = set()           # the IPv4 traffic classes of RoCEv2 packets
        self.cycle = 0

    def host_frame(self, payload, *, dport):
        return bytes(Ether(src=HOST_MAC, dst=CORE_MAC) / IP(src=HOST_IP, dst=CORE_IP)
                     / UDP(sport=40000, dport=dport) / payload)

    async def mac_rx(self, ctx):
        rx = self.dut.rx
        while True:
            if not self.inbox:
                await ctx.tick()
                continue
            frame = self.inbox.popleft()
            frame += bytes(max(0, 60 - len(frame)))
            for data, keep, last in to_beats(frame, WIDTH):
                ctx.set(rx.tvalid, 1)
                ctx.set(rx.tdata, data)
                ctx.set(rx.tkeep, keep)
                ctx.set(rx.tlast, last)
                await ctx.tick()
            ctx.set(rx.tvalid, 0)

    async def mac_tx(self, ctx):
        tx = self.dut.tx
        ctx.set(tx.tready, 1)
        frame = b""
        async for _, _, valid, data, keep, last in ctx.tick().sample(
                tx.tvalid, tx.tdata, tx.tkeep, tx.tlast):
            self.cycle += 1
            for responder in self.responders.values():
                self.inbox.extend(responder.poll(self.cycle))
            if not valid:
                continue
            frame += int(data).to_bytes(WIDTH, "little")[:bin(keep).count("1")]
            if last:
                self.deliver(frame)
                frame = b""

    def deliver(self, frame):
        packet = Ether(frame)
        if ARP in packet and packet[ARP].op == 1 and packet[ARP].pdst == HOST_IP:
            self.inbox.append(bytes(Ether(src=HOST_MAC, dst=packet.src) / ARP(
                op=2, hwsrc=HOST_MAC, psrc=HOST_IP, hwdst=packet.src, pdst=packet[ARP].psrc)))
        elif UDP in packet and packet[UDP].sport == protocol.CM_PORT:
            self.cm_replies.append(bytes(packet[UDP].payload)[:protocol.DATAGRAM_BYTES])
        elif BTH in packet:
            self.roce_tos.add(packet[IP].tos)
            self.responders[packet[BTH].dqpn].receive(frame, self.cycle)

    async def completions_sink(self, ctx):
        ctx.set(self.dut.completion.ready, 1)
        async for _, _, valid, payload in ctx.tick().sample(self.dut.completion.valid,
                                                            self.dut.completion.payload):
            if valid:
                self.completions.append((int(payload.qp), payload.status.name))

    async def cm(self, ctx, datagram, *, reply=True):
        before = len(self.cm_replies)
        self.inbox.append(self.host_frame(datagram.encode(), dport=protocol.CM_PORT))
        if reply:
            await wait_for(ctx, lambda: len(self.cm_replies) > before, 3000)
            return self.cm_replies[-1]
        await ctx.tick().repeat(400)
        return None

    def responder(self, qpn, *, peer_qpn, psn, base, size):
        responder = Responder(mac=HOST_MAC, ip=HOST_IP, peer_mac=CORE_MAC, peer_ip=CORE_IP,
                              qpn=qpn, peer_qpn=peer_qpn, expected_psn=psn, rkey=0x77,
                              memory_base=base, memory_size=size, path_mtu=1024)
        self.responders[qpn] = responder
        return responder


def test_256_qps_cm_generator_user_logic_and_status():
    bench = Bench()
    dut = bench.dut

    async def main(ctx):
        ctx.set(dut.roce_config.valid, 1)
        ctx.set(dut.roce_config.payload, {"tos": 0xB8, "tick": 16})   # ECN Not-ECT asked
        await ctx.tick()
        ctx.set(dut.roce_config.valid, 0)

        # A host opens QP 256 and runs 3 WRITEs of 1500 bytes at path MTU 1024.
        host = QpInfo(qpn=0x123, psn=0x10, rkey=0x77, base_addr=0x4000, ip=HOST_IP)
        request = protocol.open_qp(host, mtu=protocol.PathMtu.MTU_1024)
        raw = await bench.cm(ctx, request)
        psn = Datagram.decode(raw).loc.psn
        assert raw == protocol.reply(request, Ack.ACK, QpInfo(256, psn, ip=CORE_IP),
                                     mtu=protocol.PathMtu.MTU_1024).encode()
        generated = bench.responder(0x123, peer_qpn=256, psn=psn, base=0x4000, size=4500)
        await bench.cm(ctx, protocol.start_run(256, length=1500, count=3), reply=False)

        # User logic sets QP 255 (QPN 511) itself and sends 2000 bytes.
        ctx.set(dut.qp_write.valid, 1)
        ctx.set(dut.qp_write.payload, {"qp": 255, "state": {
            "remote_qpn": 0x456, "next_psn": 0x800, "rkey": 0x77,
            "remote_ip": parse_ipv4(HOST_IP), "path_mtu": PathMtu.MTU_1024,
            "src_port": 0xC0FF, "timeout": 10, "retry_count": 7, "rnr_retry": 7}})
        await ctx.tick().until(dut.qp_write.ready)
        ctx.set(dut.qp_write.valid, 0)
        user = bench.responder(0x456, peer_qpn=511, psn=0x800, base=0x9000, size=2000)
        payload = bytes(range(250)) * 8
        ctx.set(dut.work_request.valid, 1)
        ctx.set(dut.work_request.payload, {"verb": Verb.RDMA_WRITE, "qp": 255, "tag": 9,
                                           "remote_address": 0x9000, "length": 2000,
                                           "immediate": 0})
        await ctx.tick().until(dut.work_request.ready)
        ctx.set(dut.work_request.valid, 0)
        for data, keep, last in to_beats(payload, WIDTH):
            ctx.set(dut.payload.tvalid, 1)
            ctx.set(dut.payload.tdata, data)
            ctx.set(dut.payload.tkeep, keep)
            ctx.set(dut.payload.tlast, last)
            await ctx.tick().until(dut.payload.tready)
        ctx.set(dut.payload.tvalid, 0)

        await wait_for(ctx, lambda: len(bench.completions) == 4, 20_000)
        assert generated.memory == b"".join(protocol.generator_payload(k, 1500)
                                            for k in range(3))
        assert user.memory == payload
        assert bench.roce_tos == {0xBA}     # DCQCN on (the default): ECT(0) all the same
        assert sorted(bench.completions) == [(0, "SUCCESS")] * 3 + [(255, "SUCCESS")]
        status = Status.from_reply(await bench.cm(ctx, protocol.status(256)))
        assert (status.open, status.messages, status.packets, status.bytes,
                status.outstanding) == (True, 3, 6, 4500, 0), status
        status = Status.from_reply(await bench.cm(ctx, protocol.status(511)))
        assert (status.open, status.packets, status.bytes) == (False, 2, 2000), status
        request = protocol.status(512)
        assert await bench.cm(ctx, request) == protocol.reply(
            request, Ack.NO_QP, QpInfo(ip=CORE_IP)).encode()

    run_testbenches(dut, main, bench.mac_rx, bench.mac_tx, bench.completions_sink)
