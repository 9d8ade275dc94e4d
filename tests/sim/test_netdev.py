"""``python -m sim.netdev`` as a user runs it: a peer on the other UDP port (Scapy
frames, one per datagram) gets ARP, ping and connection-manager answers, through
faults too, and the device stops on SIGTERM with its summary."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from host import protocol
from sim.runner import BUILD, ROOT

HOST_MAC, HOST_IP = "52:54:00:12:34:56", "10.77.0.1"
CORE_MAC, CORE_IP = "02:00:00:00:00:02", "10.77.0.2"


def exchange(link, device, frame, want, *, seconds=60):
    """Send ``frame`` to ``device`` (again every 2 s: the device may still be starting);
    return the first frame from it for which ``want`` holds."""
    deadline = time.monotonic() + seconds
    resend = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() >= resend:
            link.sendto(bytes(frame), device)
            resend = time.monotonic() + 2
        try:
            packet = Ether(link.recv(65536))
        except TimeoutError:
            continue
        if want(packet):
            return packet
    raise AssertionError(f"no answer to {frame.summary()} in {seconds} s")


def test_netdev_answers_a_udp_peer_and_stops_with_a_summary(core_design):
    link = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    link.bind(("127.0.0.1", 0))
    link.settimeout(0.5)
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    device_port = probe.getsockname()[1]
    probe.close()
    to_device = ("127.0.0.1", device_port)
    summary = BUILD / "netdev-test-summary.json"
    pcap = BUILD / "pcap" / "netdev-test.pcap"
    device = subprocess.Popen(
        [sys.executable, "-m", "sim.netdev", "--local", f"127.0.0.1:{device_port}",
         "--remote", f"127.0.0.1:{link.getsockname()[1]}", "--summary", str(summary),
         "--pcap", str(pcap), "--faults-to-core", "duplicate=0.3", "--seconds", "600"],
        cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        arp = exchange(link, to_device, Ether(src=HOST_MAC, dst="ff:ff:ff:ff:ff:ff")
                       / ARP(op=1, hwsrc=HOST_MAC, psrc=HOST_IP, pdst=CORE_IP),
                       lambda p: ARP in p and p[ARP].op == 2, seconds=300)
        assert arp[ARP].hwsrc == CORE_MAC
        ping = exchange(link, to_device, Ether(src=HOST_MAC, dst=CORE_MAC)
                        / IP(src=HOST_IP, dst=CORE_IP)
                        / ICMP(id=7, seq=1) / Raw(b"netdev"),
                        lambda p: ICMP in p and p[ICMP].type == 0)
        assert ping[Raw].load == b"netdev"
        status = exchange(link, to_device, Ether(src=HOST_MAC, dst=CORE_MAC)
                          / IP(src=HOST_IP, dst=CORE_IP) / UDP(sport=5000, dport=protocol.CM_PORT)
                          / Raw(protocol.status(256).encode()),
                          lambda p: UDP in p and p[UDP].sport == protocol.CM_PORT)
        reply = bytes(status[UDP].payload)[:protocol.DATAGRAM_BYTES]
        assert reply == protocol.Status().reply(256)
    finally:
        device.send_signal(signal.SIGTERM)
        output, _ = device.communicate(timeout=120)
        link.close()
    assert device.returncode == 0, output
    result = json.loads(summary.read_text())
    assert result["frames"]["to_core"] >= 3 and result["frames"]["to_host"] >= 3, result
    assert result["faults_to_core"]["duplicated"] > 0 or result["frames"]["to_core"] == 3
    assert result["counters"].get("arp.replies", 0) >= 1, result
    assert pcap.stat().st_size > 24
