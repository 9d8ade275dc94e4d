"""The cocotb side of ``make sim``: a Scapy host talks to the simulated core."""

import json
import os

import cocotb
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from gateware.core import TOS_ECT0
from gateware.roce.requests import Verb
from host import protocol
from sim.models.responder import Completion, Responder
from sim.models.rocev2 import (
    Message,
    RetransmitPages,
    generator_payload,
    message_packets,
    roce_frame,
)
from sim.testbench import MIN_FRAME, NetworkBench

PARAMS = json.loads(os.environ["BENCH_PARAMS"])
HOST_MAC, HOST_IP = "52:54:00:12:34:56", "10.77.0.1"
CORE_MAC, CORE_IP = "02:00:00:00:00:02", "10.77.0.2"


def show(direction, frame):
    print(f"  {direction} {len(frame):5d} B  {Ether(frame).summary()}", flush=True)


@cocotb.test()
async def demo(dut):
    bench = NetworkBench(dut, pcap=PARAMS["pcap"], peers={HOST_IP: HOST_MAC})
    await bench.reset()
    print("\nA Scapy host (10.77.0.1) and the simulated endpoint (10.77.0.2):", flush=True)
    exchanges = [
        ("ARP who-has", Ether(src=HOST_MAC, dst="ff:ff:ff:ff:ff:ff") /
         ARP(op=1, hwsrc=HOST_MAC, psrc=HOST_IP, pdst=CORE_IP)),
        ("ping", Ether(src=HOST_MAC, dst=CORE_MAC) / IP(src=HOST_IP, dst=CORE_IP) /
         ICMP(id=1, seq=1) / Raw(b"hello from the host")),
        ("UDP echo", Ether(src=HOST_MAC, dst=CORE_MAC) / IP(src=HOST_IP, dst=CORE_IP) /
         UDP(sport=40000, dport=7) / Raw(b"echo me, endpoint")),
    ]
    failures = 0
    for name, request in exchanges:
        print(f"{name}:", flush=True)
        show("->", bytes(request))
        requests_before = len(bench.arp_requests)
        await bench.send(bytes(request))
        reply = await bench.recv()
        for arp in bench.arp_requests[requests_before:]:
            show("<-", bytes(arp))
            print("     (the host answers the endpoint's ARP request)", flush=True)
        show("<-", reply)
        answer = Ether(reply)
        if Raw in request and (Raw not in answer or answer[Raw].load != request[Raw].load):
            failures += 1
            print("     MISMATCH: the reply does not carry the request's data", flush=True)
    failures += await roce_demo(bench)
    bench.close()
    counters = bench.counters()
    drops = {f"{group}.{name}": value for group, fields in counters.items()
             if isinstance(fields, dict) for name, value in fields.items() if value}
    print(f"\nCounters that moved: {drops or 'none'}", flush=True)
    print(f"Frames in both directions: {bench.pcap.frames}, written to {PARAMS['pcap']}",
          flush=True)
    print("Open it with: wireshark " + PARAMS["pcap"], flush=True)
    assert failures == 0


async def roce_demo(bench):
    """The host opens a QP through the connection manager; its RDMA side is a
    responder model (Soft-RoCE's rules). One RDMA WRITE with immediate posted by user
    logic, then a generator run of SENDs started through the CM. Every frame is
    checked against Scapy's, ICRC included; the host acknowledges them, and the data
    must be in its memory and receive queue."""
    write = Message("RDMA_WRITE_WITH_IMMEDIATE", bytes(index & 0xFF for index in range(2500)),
                    remote_address=0x7F00_0000_1000, immediate=0xCAFE)
    mine = protocol.QpInfo(qpn=0x11, psn=0x100, rkey=0x1234, base_addr=write.remote_address,
                           ip=HOST_IP)
    request = protocol.open_qp(mine, mtu=protocol.PathMtu.MTU_1024)
    print("Connection manager, UDP 17185:", flush=True)
    print(f"  -> OPEN_QP  host QPN {mine.qpn:#x}, PSN {mine.psn:#x}, path MTU 1024", flush=True)
    reply = protocol.Datagram.decode(await bench.cm_request(request.encode(), host_ip=HOST_IP))
    ours = reply.loc
    print(f"  <- {reply.request.name}/{reply.ack.name}  endpoint QPN {ours.qpn:#x}, "
          f"PSN {ours.psn:#x}, path MTU {reply.txmeta.mtu.bytes}", flush=True)
    if reply.ack != protocol.Ack.ACK or reply.rem != mine:
        print("     MISMATCH: not the reply the protocol asks for", flush=True)
        return 1
    index = ours.qpn - protocol.FIRST_QPN
    qp = {"remote_qpn": mine.qpn, "next_psn": ours.psn, "rkey": mine.rkey,
          "src_port": 0xC000 + index}
    host = Responder(mac=HOST_MAC, ip=HOST_IP, peer_mac=CORE_MAC, peer_ip=CORE_IP,
                     qpn=mine.qpn, peer_qpn=ours.qpn, expected_psn=ours.psn,
                     rkey=mine.rkey, memory_base=write.remote_address,
                     memory_size=len(write.payload), path_mtu=1024)
    host.post_receive(4)
    bench.attach(host)
    ring = RetransmitPages()
    runs = [("RDMA WRITE with immediate, 2500 bytes, path MTU 1024, from user logic", write)]
    runs += [(f"generator: SEND {k}, 100 bytes", Message("SEND", generator_payload(k, 100)))
             for k in range(3)]
    bench.post({"verb": Verb.RDMA_WRITE_WITH_IMMEDIATE, "qp": index, "tag": 1,
                "remote_address": write.remote_address, "length": len(write.payload),
                "immediate": write.immediate}, write.payload)
    await bench.cm_request(protocol.start_run(ours.qpn, length=100, count=3, write=False
                                              ).encode(), host_ip=HOST_IP, reply=False)
    failures, psn = 0, qp["next_psn"]
    for title, message in runs:
        print(f"{title}:", flush=True)
        for fields in message_packets(message, psn=psn, path_mtu=1024, rkey=qp["rkey"],
                                      ring=ring):
            frame = await bench.recv()
            show("<-", frame)
            expected = roce_frame(fields, src_mac=CORE_MAC, dst_mac=HOST_MAC, src_ip=CORE_IP,
                                  dst_ip=HOST_IP, dest_qp=qp["remote_qpn"],
                                  src_port=qp["src_port"], tos=TOS_ECT0, ip_id=Ether(frame)[IP].id)
            expected += bytes(max(0, MIN_FRAME - len(expected)))
            if frame != expected:
                failures += 1
                print("     MISMATCH: differs from the frame Scapy builds", flush=True)
            psn += 1
    await bench.wait_completions(len(runs))
    await bench.idle(50)
    print(f"The host acknowledged with {host.stats['frames_sent']} ACKs.", flush=True)
    print(f"Completions: {[(c['tag'], c['packets']) for c in bench.completions]} "
          "(tag, packets); every frame equals Scapy's, ICRC included"
          if not failures else "", flush=True)
    landed = [Completion(0x09, write.payload, write.immediate)]
    landed += [Completion(0x04, message.payload, None) for _, message in runs[1:]]
    if host.memory != write.payload or host.receive_queue != landed:
        failures += 1
        print("MISMATCH: the data in the host's memory or receive queue differs", flush=True)
    else:
        print("The host's memory and receive queue hold the data, byte for byte.", flush=True)
    return failures
