"""The cocotb side of ``make sim``: a Scapy host talks to the simulated core."""

import json
import os

import cocotb
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from sim.bench import NetworkBench

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
    bench.close()
    counters = bench.counters()
    drops = {f"{group}.{name}": value for group, fields in counters.items()
             if isinstance(fields, dict) for name, value in fields.items() if value}
    print(f"\nCounters that moved: {drops or 'none'}", flush=True)
    print(f"Frames in both directions: {bench.pcap.frames}, written to {PARAMS['pcap']}",
          flush=True)
    print("Open it with: wireshark " + PARAMS["pcap"], flush=True)
    assert failures == 0
