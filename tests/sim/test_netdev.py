"""``python -m sim.netdev`` as a user runs it: a peer on the other UDP port (Scapy
frames, one per datagram) gets ARP, ping and connection-manager answers, through
faults too, and the device stops on SIGTERM with its summary."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from host import protocol
from host.cm import CmClient
from host.protocol import QpInfo
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


def start_device(link, name, *options):
    """``python -m sim.netdev`` with ``link`` (a bound UDP socket) as its peer, writing
    its summary and pcap under ``name``; returns the process and its UDP address."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    device_port = probe.getsockname()[1]
    probe.close()
    device = subprocess.Popen(
        [sys.executable, "-m", "sim.netdev", "--local", f"127.0.0.1:{device_port}",
         "--remote", f"127.0.0.1:{link.getsockname()[1]}",
         "--summary", str(BUILD / f"{name}-summary.json"),
         "--pcap", str(BUILD / "pcap" / f"{name}.pcap"), *options],
        cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return device, ("127.0.0.1", device_port)


def test_netdev_answers_a_udp_peer_and_stops_with_a_summary(core_design):
    link = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    link.bind(("127.0.0.1", 0))
    link.settimeout(0.5)
    summary = BUILD / "netdev-test-summary.json"
    pcap = BUILD / "pcap" / "netdev-test.pcap"
    device, to_device = start_device(link, "netdev-test", "--faults-to-core", "duplicate=0.3",
                                     "--seconds", "600")
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


class CmRelay:
    """The host's IP stack, reduced to what the CM needs: UDP datagrams to the relay's
    port on 127.0.0.1 go to the device as frames from HOST_IP to the CM; the CM's replies
    come back to the last sender; ARP requests for HOST_IP are answered."""

    def __init__(self, link, device):
        self.link, self.device = link, device
        self.cm_side = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.cm_side.bind(("127.0.0.1", 0))
        self.cm_side.settimeout(0.05)
        self.port = self.cm_side.getsockname()[1]
        self.client = None
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=target, daemon=True)
                         for target in (self._to_device, self._to_client)]

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        for thread in self._threads:
            thread.join(2)
        self.cm_side.close()

    def _to_device(self):
        while not self._stop.is_set():
            try:
                payload, self.client = self.cm_side.recvfrom(2048)
            except TimeoutError:
                continue
            self.link.sendto(bytes(Ether(src=HOST_MAC, dst=CORE_MAC) / IP(src=HOST_IP, dst=CORE_IP)
                                   / UDP(sport=self.client[1], dport=protocol.CM_PORT)
                                   / Raw(payload)), self.device)

    def _to_client(self):
        while not self._stop.is_set():
            try:
                frame = Ether(self.link.recv(65536))
            except TimeoutError:
                continue
            if ARP in frame and frame[ARP].op == 1 and frame[ARP].pdst == HOST_IP:
                self.link.sendto(bytes(Ether(src=HOST_MAC, dst=frame.src)
                                       / ARP(op=2, hwsrc=HOST_MAC, psrc=HOST_IP,
                                             hwdst=frame.src, pdst=frame[ARP].psrc)),
                                 self.device)
            elif UDP in frame and frame[UDP].sport == protocol.CM_PORT and self.client:
                self.cm_side.sendto(bytes(frame[UDP].payload)[:protocol.DATAGRAM_BYTES],
                                    self.client)


def test_qp_server_reclaim_frees_the_qps_a_crashed_run_left(core_design):
    """A qp-server on HOST_IP died with two endpoint QPs open; the next one, started with
    --reclaim, closes them (CLOSE_QP of all QPs, count 2) and pairs with QPN 256 again.
    The verbs side is the fake backend (no RoCE traffic: --no-start); it ends on SIGTERM
    and closes its QP."""
    link = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    link.bind(("127.0.0.1", 0))
    link.settimeout(0.05)
    device, to_device = start_device(link, "netdev-reclaim", "--seconds", "900")
    server = None
    try:
        with CmRelay(link, to_device) as relay:
            with CmClient("127.0.0.1", cm_port=relay.port, timeout=5, retries=60) as crashed:
                left = [crashed.open_qp(QpInfo(qpn=qpn, psn=1, ip=HOST_IP))[0].qpn
                        for qpn in (0x31, 0x32)]
            assert left == [256, 257]
            server = subprocess.Popen(
                [sys.executable, "-c", "import sys; from host.cli import main; "
                 "from tests.host.fakes import FakeBackend; "
                 f"sys.exit(main(backend=FakeBackend(ip={HOST_IP!r})))",
                 "--endpoint", "127.0.0.1", "--cm-port", str(relay.port), "--timeout", "5",
                 "--reclaim", "--no-start", "--size", "64", "--count", "1", "--stall", "600"],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            lines = []
            while not any("paired host QPN" in line for line in lines):
                line = server.stderr.readline()
                assert line, f"qp-server ended: {''.join(lines)}"
                lines.append(line)
            server.send_signal(signal.SIGTERM)
            _, rest = server.communicate(timeout=120)
            err = "".join(lines) + rest
    finally:
        if server is not None and server.poll() is None:
            server.kill()
        device.send_signal(signal.SIGTERM)
        output, _ = device.communicate(timeout=120)
        link.close()
    assert server.returncode == 130, err
    assert "closed 2 endpoint QPs left open by 10.77.0.1 (--reclaim)" in err
    assert f"paired host QPN 17 ({HOST_IP}) with endpoint QPN 256" in err
    assert "interrupted; the QPs are closed" in err
    assert device.returncode == 0, output
    counters = json.loads((BUILD / "netdev-reclaim-summary.json").read_text())["counters"]
    assert (counters.get("cm.opened"), counters.get("cm.closed")) == (3, 3), counters


def test_two_ports_each_with_its_own_channel_addresses_and_files():
    """``--ports 2``: two simulations, the second with port 2's channel, addresses, pcap
    and summary, both with every other option given (no simulation runs here)."""
    from sim.netdev import build_parser, port_arguments

    argv = ["--ports", "2", "--seconds", "30", "--faults", "drop=0.01", "--ip2", "10.77.1.7",
            "--local2", "127.0.0.1:47104", "--remote2", "127.0.0.1:47103"]
    ports = [build_parser().parse_args(arguments)
             for arguments in port_arguments(argv, build_parser().parse_args(argv))]
    assert [port.ports for port in ports] == [1, 1]
    assert [(port.local, port.remote, port.ip, port.mac) for port in ports] == [
        ("127.0.0.1:47002", "127.0.0.1:47001", CORE_IP, CORE_MAC),
        ("127.0.0.1:47104", "127.0.0.1:47103", "10.77.1.7", "02:00:00:00:01:02")]
    assert ports[1].pcap.name == "netdev-port2.pcap" != ports[0].pcap.name
    assert ports[1].summary.name == "netdev-summary-port2.json" != ports[0].summary.name
    assert all(port.seconds == 30 and port.faults["drop"] == 0.01 for port in ports)


def test_the_default_build_is_the_benches_core():
    """Without build options, or with them at their defaults, and with either source, the
    build and its cache key are the benches' (CORE_PARAMS and SOURCE_PARAMS: the build
    tests/sim/conftest.py makes, which tests/sim/test_event_source.py runs too)."""
    from sim.netdev import build_parser, design_params
    from sim.testbench import CORE_PARAMS, SOURCE_PARAMS

    for argv in ([], ["--qps", "16", "--retransmit-beats", "512", "--messages", "1024",
                      "--message-slots", "4096"], ["--source", "example"],
                 ["--source", "example", "--fragment-bytes", "1000"]):
        params, source = design_params(build_parser().parse_args(argv))
        assert (repr(params), repr(source)) == (repr(CORE_PARAMS), repr(SOURCE_PARAMS))
    params, source = design_params(build_parser().parse_args(["--fragment-bytes", "2000"]))
    assert source == {**SOURCE_PARAMS, "fragment_bytes": 2000}


@pytest.mark.parametrize("source", ["generator", "example"])
def test_build_options_reach_the_core_and_its_cache_key(monkeypatch, capsys, source):
    """``--qps``, ``--retransmit-beats``, ``--messages`` and ``--message-slots`` go into
    the parameters the core (beside the example source, which takes ``--fragment-bytes``)
    is built with, into the build's key, onto the startup line and into what the summary
    records."""
    import sim.bench.core_runs
    import sim.netdev
    import sim.testbench

    built = {}

    def build(name, elaboratable, *, key):
        built.update(name=name, params=elaboratable(), key=key)
        return "the build"
    monkeypatch.setattr(sim.bench.core_runs, "build", build)
    monkeypatch.setattr(sim.bench.core_runs, "EventCore", lambda **params: params)
    args = sim.netdev.build_parser().parse_args(
        ["--source", source, "--qps", "8", "--retransmit-beats", "128", "--messages", "32",
         "--message-slots", "256", "--retransmit-pages", "16", "--fragment-bytes", "500"])
    design_build, summary = sim.netdev._design(args)
    expected = {**sim.testbench.CORE_PARAMS, "retransmit_beats": 128, "qps": 8,
                "retransmit_pages": 16, "messages": 32, "message_slots": 256}
    source_params = {**sim.testbench.SOURCE_PARAMS, "fragment_bytes": 500}
    assert design_build == "the build"
    assert built == {"name": "core",
                     "params": {"user_ports": True, **source_params, **expected},
                     "key": repr({**expected, "source": source_params})}
    assert summary == {"source": source, **expected}
    assert ("(qps=8, retransmit_beats=128, retransmit_pages=16, messages=32, "
            "message_slots=256)"
            in capsys.readouterr().out)


@pytest.mark.parametrize("argv, message", [
    (["--qps", "0"], "argument --qps: QP count must be 1..4096, not 0"),
    (["--qps", "5000"], "argument --qps: QP count must be 1..4096, not 5000"),
    (["--qps", "many"], "argument --qps: not an integer: 'many'"),
    (["--retransmit-beats", "32"], "argument --retransmit-beats: Ring beats must be a power "
     "of 2, 128..1048576 (a ring of 64-byte beats holds 2 pages of 4096 bytes), not 32"),
    (["--retransmit-beats", "1000"], "power of 2, 128..1048576"),
    (["--retransmit-pages", "3"], "argument --retransmit-pages: Retransmit pages must be a "
     "power of 2, 2..65536, not 3"),
    (["--messages", "1"], "argument --messages: Messages per QP must be a power "
     "of 2, 2..32768, not 1"),
    (["--messages", "48", "--source", "example"], "power of 2, 2..32768, not 48"),
    (["--message-slots", "8"], "argument --message-slots: Message slots must be a power "
     "of 2, 16..65536, not 8"),
])
def test_a_build_the_core_refuses_is_a_usage_error(capsys, argv, message):
    from sim.netdev import build_parser

    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(argv)
    assert refused.value.code == 2
    error = capsys.readouterr().err
    assert message in error and error.count("error:") == 1, error


def test_two_ports_are_built_alike():
    """``--ports 2``: both ports' simulations get the build options (and so one build)."""
    from sim.netdev import build_parser, design_params, port_arguments

    argv = ["--ports", "2", "--qps", "4", "--retransmit-beats", "256", "--messages", "16",
            "--message-slots", "64"]
    ports = [design_params(build_parser().parse_args(arguments))
             for arguments in port_arguments(argv, build_parser().parse_args(argv))]
    assert [(params["qps"], params["retransmit_beats"], params["messages"],
             params["message_slots"]) for params, _ in ports] == [(4, 256, 16, 64)] * 2
    assert ports[0] == ports[1] == design_params(build_parser().parse_args(argv))


def test_relative_files_are_the_callers(monkeypatch, tmp_path):
    """``--pcap`` and ``--summary`` relative to the caller's directory, not to the one the
    simulation runs in."""
    from sim.netdev import build_parser

    tmp_path = tmp_path.resolve()
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["--pcap", "run.pcap", "--summary", "out/run.json"])
    assert (args.pcap, args.summary) == (tmp_path / "run.pcap", tmp_path / "out" / "run.json")
