"""The Soft-RoCE guest boots with rxe0, pyverbs and the host program, and its eth0 carries frames.

One boot serves every test here (about 20 s under TCG, plus 1–2.5 minutes the
first time to build the image as root). A Scapy peer on the host end of the
``-netdev dgram`` link answers the guest's ARP and ICMP echo as 10.77.0.2, so a
passing ping proves frames flow both ways. The frames are written to
``build/softroce/test-network.pcap``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from scapy.layers.inet import ICMP, IP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Packet

from sim.pcap import PcapWriter
from sim.softroce.image import CACHE, build_image, cached_image
from sim.softroce.tools import HostToolsError, ensure_host_tools
from sim.softroce.vm import DEFAULT_MAC, GuestConfig, GuestResult, run_script

pytestmark = pytest.mark.softroce

GUEST_IP = "10.77.0.1"
PEER_MAC, PEER_IP = "02:00:00:00:00:02", "10.77.0.2"
GUEST_GID = "0000:0000:0000:0000:0000:ffff:0a4d:0001"  # ::ffff:10.77.0.1

SCRIPT = f"""\
echo "rdma_link: $(rdma link show rxe0/1)"
echo "sysfs_gid1: $(cat /sys/class/infiniband/rxe0/ports/1/gids/1)"
echo "sysfs_gid1_type: $(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/1)"
ibv_devinfo -v -d rxe0 | sed -n 's/^[[:space:]]*GID\\[ *1\\]:[[:space:]]*/devinfo_gid1: /p'
python3 -c '
import pyverbs
from pyverbs.device import Context
with Context(name="rxe0") as context:
    print("pyverbs_gid1:", context.query_gid(1, 1))
'
echo "pyverbs_exit: $?"
python3 -m host.cli ctrl --help > /tmp/ctrl-help.txt 2>&1
echo "cli_exit: $?"
sed 's/^/cli: /' /tmp/ctrl-help.txt
ping -c 3 -W 2 {PEER_IP}
echo "ping_exit: $?"
"""


@dataclass
class Peer:
    """Answers ARP and ICMP echo as ``PEER_IP`` on the host end of the dgram link."""
    pcap: PcapWriter
    socket: socket.socket = field(init=False)
    received: list[Packet] = field(default_factory=list)
    arp_replies: int = 0
    echo_replies: int = 0

    def __post_init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="softroce-peer")

    @property
    def port(self) -> int:
        return self.socket.getsockname()[1]

    def __enter__(self) -> Peer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.socket.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, qemu = self.socket.recvfrom(65535)
            except TimeoutError:
                continue
            self.pcap.write(data, time.time_ns())
            frame = Ether(data)
            self.received.append(frame)
            reply = self._answer(frame)
            if reply is not None:
                raw = bytes(reply)
                self.socket.sendto(raw, qemu)
                self.pcap.write(raw, time.time_ns())

    def _answer(self, frame: Packet) -> Packet | None:
        if ARP in frame and frame[ARP].op == 1 and frame[ARP].pdst == PEER_IP:
            self.arp_replies += 1
            return (Ether(src=PEER_MAC, dst=frame.src) /
                    ARP(op=2, hwsrc=PEER_MAC, psrc=PEER_IP, hwdst=frame[ARP].hwsrc,
                        pdst=frame[ARP].psrc))
        if (IP in frame and frame[IP].dst == PEER_IP and ICMP in frame
                and frame[ICMP].type == 8):
            self.echo_replies += 1
            request = frame[ICMP]
            return (Ether(src=PEER_MAC, dst=frame.src) / IP(src=PEER_IP, dst=frame[IP].src) /
                    ICMP(type=0, id=request.id, seq=request.seq) / bytes(request.payload))
        return None


@dataclass(frozen=True)
class Boot:
    result: GuestResult
    peer: Peer
    values: dict[str, list[str]]


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def boot() -> Iterator[Boot]:
    try:
        ensure_host_tools()
    except HostToolsError as error:
        pytest.skip(f"Soft-RoCE guest: {error}")
    if cached_image() is None and os.geteuid() != 0:
        pytest.skip("Soft-RoCE guest: no cached image and building one needs root: run "
                    "`python -m sim.softroce.guest build` as root once")
    image = build_image(log=print)
    started = time.monotonic()
    pcap = PcapWriter(CACHE / "test-network.pcap")
    try:
        with Peer(pcap) as peer:
            config = GuestConfig(local_port=_free_udp_port(), remote_port=peer.port,
                                 timeout=300.0)
            result = run_script(SCRIPT, config, image=image,
                                log_path=CACHE / "test-console.log")
    finally:
        pcap.close()
    print(f"\nSoft-RoCE guest: {result.timing_text()}; test fixture "
          f"{time.monotonic() - started:.1f} s; console log {result.log_path}")
    values: dict[str, list[str]] = {}
    for line in result.output.splitlines():
        key, separator, value = line.partition(": ")
        if separator:
            values.setdefault(key, []).append(value.strip())
    yield Boot(result, peer, values)


def test_script_exit_code(boot: Boot) -> None:
    assert boot.result.exit_code == 0, boot.result.output


def test_rxe0_has_ipv4_gid_at_index_1(boot: Boot) -> None:
    values = boot.values
    assert values["rdma_link"] == ["link rxe0/1 state ACTIVE physical_state LINK_UP netdev eth0"]
    assert values["sysfs_gid1"] == [GUEST_GID]
    assert values["sysfs_gid1_type"] == ["RoCE v2"]
    assert values["devinfo_gid1"] == [f"::ffff:{GUEST_IP}, RoCE v2"]


def test_pyverbs_queries_the_gid(boot: Boot) -> None:
    assert boot.values["pyverbs_exit"] == ["0"], boot.result.output
    assert boot.values["pyverbs_gid1"] == [GUEST_GID]


def test_host_cli_runs_from_the_share(boot: Boot) -> None:
    assert boot.values["cli_exit"] == ["0"], boot.result.output
    assert any("qp-server ctrl" in line for line in boot.values["cli"]), boot.values["cli"]


def test_frames_flow_both_ways(boot: Boot) -> None:
    peer = boot.peer
    assert boot.values["ping_exit"] == ["0"], boot.result.output
    assert "3 packets transmitted, 3 received, 0% packet loss" in boot.result.output
    assert peer.arp_replies >= 1 and peer.echo_replies == 3, (peer.arp_replies,
                                                               peer.echo_replies)
    assert all(frame.src == DEFAULT_MAC for frame in peer.received)
