"""The kernel's rdma_cm (Soft-RoCE in the QEMU guest) against the core's passive CM.

One netdev and one guest boot run these programs one after the other:

* ``write``: ``host.rdma_connect`` connects an RC QP through the guest's rdma_cm
  (REQ, REP, RTU), starts a generator WRITE run on it through the UDP CM, checks the
  bytes in its registered buffer, then ``rdma_disconnect`` and waits for DISCONNECTED;
* ``again``: the same once more, on the same endpoint right after that disconnect;
* ``imm`` and ``send``: ``qp-server --cm rdma`` with a WRITE-with-immediate run and a
  SEND run (started over UDP, checked byte by byte, ``rdma_disconnect`` at the end);
* ``version``: a REQ whose private data has version 2, rejected with REJ reason 28;
* ``port``: a REQ for another rdma_cm port, rejected with REJ reason 8;
* ``accept``: the endpoint as the active side: ``host.rdma_listen`` listens in the
  guest, asks with CONNECT, accepts the endpoint's REQ (rdma_cm's own QP), takes
  CONNECT/ACK, then ``rdma_disconnect``;
* ``listen``: ``qp-server --cm rdma --listen`` the same way with its own QP, a
  WRITE-with-immediate run checked byte by byte, ``rdma_disconnect`` at the end;
* ``nolisten``: a CONNECT naming a port nobody listens on: the guest's kernel answers
  the endpoint's REQ with REJ 8, and the endpoint answers CONNECT/NAK with count 8.

The REJ reasons are read on the host (the REJECTED event's status, through librdmacm)
and in netdev's pcap (the REJ MADs the endpoint sent, parsed with
``sim.models.ib_cm``), and netdev's counters name their causes. The private data the
host packs is checked first against the gateware's layout.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.utils import rdpcap

from gateware.cm.ib_cm import REQ_PRIVATE
from host.protocol import FIRST_QPN
from host.rdma_connect import ACCEPT_PRIVATE, connect_private, parse_accept_private
from host.rdma_listen import LISTEN_PORT
from sim.models.ib_cm import (
    ATTRIBUTE_IDS,
    ROCEV2_PORT,
    parse_cm_message,
    parse_gsi_frame,
    parse_mad,
)
from sim.softroce.connect import (
    ConnectResult,
    connect_step,
    guest_script,
    listen_step,
    qp_server_step,
    run_connect,
)
from sim.softroce.demo import ENDPOINT_IP
from sim.softroce.image import cached_image
from sim.softroce.tools import HostToolsError, ensure_host_tools
from sim.softroce.vm import QEMU

SIZE, COUNT = 1024, 4
CMA_HEADER_BYTES = 36       # rdma_cm puts its cma_hdr before the user's private data
#: Seconds within which DISCONNECTED must follow rdma_disconnect (the endpoint's DREP).
DISCONNECT_WITHIN = 5
OTHER_PORT = 17186
_RUN = ("--size", str(SIZE), "--count", str(COUNT))
_CONNECT = ("--timeout", "30")
STEPS = (
    connect_step("write", *_RUN, *_CONNECT, "--disconnect-timeout", str(DISCONNECT_WITHIN)),
    connect_step("again", *_RUN, *_CONNECT, "--disconnect-timeout", str(DISCONNECT_WITHIN)),
    qp_server_step("imm", "--write", "--imm", *_RUN, "--rdma-timeout", "10"),
    qp_server_step("send", "--send", *_RUN, "--rdma-timeout", "10"),
    connect_step("version", *_CONNECT, "--private-version", "2"),
    connect_step("port", *_CONNECT, "--port", str(OTHER_PORT)),
    listen_step("accept", "--port", str(LISTEN_PORT), *_CONNECT,
                "--disconnect-timeout", str(DISCONNECT_WITHIN)),
    qp_server_step("listen", "--listen", str(LISTEN_PORT + 1), "--write", "--imm", *_RUN,
                   "--rdma-timeout", "30"),
    listen_step("nolisten", "--port", str(LISTEN_PORT + 2), "--connect-port",
                str(LISTEN_PORT + 3), *_CONNECT),
)


def _field(private: bytes, name: str) -> int:
    """Field ``name`` of REQ_PRIVATE read out of the REQ's 92 bytes of private data."""
    first, end = REQ_PRIVATE.bit_span(name)
    value = int.from_bytes(private.ljust(REQ_PRIVATE.length, b"\0"), "big")
    return value >> (REQ_PRIVATE.size - end) & ((1 << (end - first)) - 1)


def test_connect_private_lands_in_the_gateware_fields() -> None:
    user = connect_private(rkey=0x1234_5678, base=0x7F00_DEAD_BEEF_0000, length=65536)
    assert len(user) == 24
    private = bytes(CMA_HEADER_BYTES) + user
    assert _field(private, "version") == 1
    assert _field(private, "rkey") == 0x1234_5678
    assert _field(private, "base") == 0x7F00_DEAD_BEEF_0000
    assert _field(private, "length") == 65536


def test_accept_private_reads_version_and_qpn() -> None:
    rep = ACCEPT_PRIVATE.pack(1, 0x101).ljust(196, b"\0")
    assert parse_accept_private(rep) == (1, 0x101)


def test_guest_script_loads_rdma_ucm_and_runs_each_step() -> None:
    script = guest_script(STEPS)
    assert "modprobe rdma_ucm" in script
    assert "python3 -m host.rdma_connect --endpoint 10.77.0.2 --size 1024" in script
    assert "python3 -m host.cli --endpoint 10.77.0.2 --cm rdma" in script
    assert f"python3 -m host.rdma_listen --endpoint 10.77.0.2 --port {LISTEN_PORT}" in script
    assert script.index("/tmp/write.json") < script.index("/tmp/again.json")


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rej_reasons(pcap: Path) -> list[int]:
    """The reasons of the REJ MADs the endpoint sent, in order, from netdev's pcap."""
    reasons = []
    for packet in rdpcap(str(pcap)):
        if not (packet.haslayer(IP) and packet.haslayer(UDP) and packet[IP].src == ENDPOINT_IP
                and packet[UDP].dport == ROCEV2_PORT and packet.haslayer(BTH)
                and packet[BTH].dqpn == 1):
            continue
        header, message = parse_mad(parse_gsi_frame(bytes(packet)).datagram[:256])
        if header.attribute_id == ATTRIBUTE_IDS["REJ"]:
            reasons.append(parse_cm_message("REJ", message)["reason"])
    return reasons


@pytest.fixture(scope="module")
def connected() -> ConnectResult:
    try:
        ensure_host_tools(needed=(QEMU,))
    except HostToolsError as error:
        pytest.skip(f"Soft-RoCE: {error}")
    if cached_image() is None and os.geteuid() != 0:
        pytest.skip("Soft-RoCE: no cached image and building one needs root: run "
                    "`python -m sim.softroce.guest build` as root once")
    started = time.monotonic()
    result = run_connect(STEPS, name="test-connect", local_port=_free_udp_port(),
                         remote_port=_free_udp_port())
    print(f"\nrdma_cm against netdev: {time.monotonic() - started:.1f} s; " + "; ".join(
        f"{name} exit {step.exit_code} in {step.seconds} s"
        for name, step in result.steps.items()))
    return result


def _counters(connected: ConnectResult) -> dict[str, int]:
    return (connected.netdev or {}).get("counters", {})


@pytest.mark.softroce
def test_rdma_connect_is_established_with_an_endpoint_qp(connected: ConnectResult) -> None:
    assert {"rdma_ucm", "rdma_cm", "ib_cm"} <= set(connected.modules), connected.modules
    summary = connected["write"].summary
    assert summary is not None, connected["write"].log
    assert summary.get("established") is True, summary.get("error")
    assert summary["rep_version"] == 1
    assert FIRST_QPN <= summary["endpoint_qpn"] < 1 << 24
    assert summary["dest_qp_num"] == summary["endpoint_qpn"]


@pytest.mark.softroce
def test_generator_write_run_on_the_connected_qp_is_byte_exact(
        connected: ConnectResult) -> None:
    summary = connected["write"].summary or {}
    run = summary.get("run")
    assert run is not None, summary.get("error")
    assert run["messages_ok"] == COUNT, run
    assert run["status_messages"] == COUNT and run["status_bytes"] == COUNT * SIZE, run
    assert connected["write"].exit_code == 0, connected["write"].log


@pytest.mark.softroce
@pytest.mark.parametrize("name, immediate, operation", [
    ("imm", True, "write"), ("send", False, "send")])
def test_qp_server_cm_rdma_runs_are_byte_exact(connected: ConnectResult, name: str,
                                               immediate: bool, operation: str) -> None:
    step = connected[name]
    summary = step.summary
    assert summary is not None, step.log
    assert step.exit_code == 0 and summary["ok"] is True, step.log[-5:]
    assert (summary["cm"], summary["operation"], summary["immediate"]) == (
        "rdma", operation, immediate)
    assert (summary["messages"], summary["bytes"], summary["errors"]) == (
        COUNT, COUNT * SIZE, 0)
    qp = summary["qp"][0]
    assert qp["messages_ok"] == COUNT and qp["status"]["messages"] == COUNT
    assert FIRST_QPN <= qp["endpoint_qpn"] < 1 << 24
    assert qp["disconnect"]["disconnect_call"] == "returned", qp["disconnect"]
    assert any("through rdma_cm" in line for line in step.log), step.log


@pytest.mark.softroce
@pytest.mark.parametrize("name, reason, counter", [
    ("version", 28, "ib_cm.rej_version"), ("port", 8, "ib_cm.rej_service")])
def test_a_bad_req_is_rejected_with_its_reason(connected: ConnectResult, name: str,
                                               reason: int, counter: str) -> None:
    """The REJECTED event's status on the host is the reason the REJ on the wire
    carries; netdev counts the cause."""
    step = connected[name]
    summary = step.summary or {}
    assert step.exit_code == 1 and summary.get("established") is False, step.log
    assert summary.get("rej_reason") == reason, summary
    assert f"with reason {reason}" in summary["error"]
    assert _counters(connected).get(counter) == 1, _counters(connected)
    assert rej_reasons(Path(connected.pcap)) == [28, 8]


@pytest.mark.softroce
def test_rdma_disconnect_is_answered_and_a_new_connect_works(
        connected: ConnectResult) -> None:
    """DISCONNECTED follows rdma_disconnect within seconds (the endpoint answers the
    DREQ with DREP), and the next connect to the same endpoint runs byte-exact."""
    first = (connected["write"].summary or {}).get("disconnect")
    assert first is not None and first["disconnect_call"] == "returned", first
    assert first.get("event") == "DISCONNECTED", first
    assert first["seconds"] < DISCONNECT_WITHIN, first
    again = connected["again"].summary or {}
    assert again.get("established") is True, again.get("error")
    assert (again.get("run") or {}).get("messages_ok") == COUNT, again
    assert (again.get("disconnect") or {}).get("event") == "DISCONNECTED", again


@pytest.mark.softroce
def test_the_endpoint_connects_to_a_listening_host(connected: ConnectResult) -> None:
    """CONNECT, the endpoint's REQ (version 1, its QPN), the host's accept, RTU:
    ESTABLISHED, and CONNECT/ACK names the QP of the REQ; rdma_disconnect is
    answered with DREP within DISCONNECT_WITHIN."""
    step = connected["accept"]
    summary = step.summary or {}
    assert summary.get("established") is True, (summary.get("error"), step.log[-5:])
    assert summary["req_version"] == 1
    assert FIRST_QPN <= summary["endpoint_qpn"] < 1 << 24
    assert summary["ack_qpn"] == summary["endpoint_qpn"] == summary["dest_qp_num"]
    assert summary["ack_ip"] == ENDPOINT_IP
    assert summary["ack_psn"] == summary["rq_psn"]
    assert summary["ack_mtu"] == summary["path_mtu"] == 1024
    disconnect = summary["disconnect"]
    assert disconnect.get("event") == "DISCONNECTED", disconnect
    assert disconnect["seconds"] < DISCONNECT_WITHIN, disconnect
    assert step.exit_code == 0, step.log


@pytest.mark.softroce
def test_qp_server_listen_run_is_byte_exact_and_disconnects(connected: ConnectResult) -> None:
    step = connected["listen"]
    summary = step.summary
    assert summary is not None, step.log
    assert step.exit_code == 0 and summary["ok"] is True, step.log[-5:]
    assert (summary["cm"], summary["listen"], summary["operation"], summary["immediate"]) == (
        "rdma", LISTEN_PORT + 1, "write", True)
    assert (summary["messages"], summary["bytes"], summary["errors"]) == (
        COUNT, COUNT * SIZE, 0)
    qp = summary["qp"][0]
    assert qp["messages_ok"] == COUNT and qp["status"]["messages"] == COUNT
    assert FIRST_QPN <= qp["endpoint_qpn"] < 1 << 24
    assert qp["disconnect"].get("event") == "DISCONNECTED", qp["disconnect"]
    assert qp["disconnect"]["seconds"] < DISCONNECT_WITHIN, qp["disconnect"]
    assert any(f"the endpoint connected to port {LISTEN_PORT + 1}" in line
               for line in step.log), step.log


@pytest.mark.softroce
def test_connect_to_a_port_nobody_listens_on_is_nak_8(connected: ConnectResult) -> None:
    """The guest's kernel answers the endpoint's REQ with REJ 8 (invalid service ID);
    the endpoint passes the reason on in CONNECT/NAK's count."""
    step = connected["nolisten"]
    summary = step.summary or {}
    assert step.exit_code == 1 and summary.get("established") is False, step.log
    assert summary.get("rej_reason") == 8, summary
    assert "NAK, REJ reason 8" in summary["error"]
