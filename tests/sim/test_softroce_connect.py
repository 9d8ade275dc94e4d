"""The kernel's ``rdma_connect`` (Soft-RoCE in the QEMU guest) against the core's passive CM.

``host.rdma_connect`` in the guest connects an RC QP to netdev's endpoint through the
guest's rdma_cm (REQ, REP, RTU), starts a generator WRITE run on it through the UDP CM
and checks the bytes in its registered buffer, then disconnects. One netdev and one
guest boot (about a minute and a half with the Verilator build and the image cached).
The private data the host packs is checked first against the gateware's layout.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from gateware.cm.passive import REQ_PRIVATE
from host.protocol import FIRST_QPN
from host.rdma_connect import ACCEPT_PRIVATE, connect_private, parse_accept_private
from sim.softroce.connect import ConnectResult, guest_script, run_connect
from sim.softroce.image import cached_image
from sim.softroce.tools import HostToolsError, ensure_host_tools
from sim.softroce.vm import QEMU

SIZE, COUNT = 1024, 4
CMA_HEADER_BYTES = 36       # rdma_cm puts its cma_hdr before the user's private data


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


def test_guest_script_loads_rdma_ucm_and_runs_the_program() -> None:
    script = guest_script(["--size", "64"])
    assert "modprobe rdma_ucm" in script
    assert "python3 -m host.rdma_connect --endpoint 10.77.0.2 --size 64" in script


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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
    result = run_connect(["--size", str(SIZE), "--count", str(COUNT), "--timeout", "30",
                          "--disconnect-timeout", "10"],
                         name="test-connect", local_port=_free_udp_port(),
                         remote_port=_free_udp_port())
    print(f"\nrdma_connect against netdev: {time.monotonic() - started:.1f} s; {result}")
    return result


@pytest.mark.softroce
def test_rdma_connect_is_established_with_an_endpoint_qp(connected: ConnectResult) -> None:
    assert {"rdma_ucm", "rdma_cm", "ib_cm"} <= set(connected.modules), connected.modules
    summary = connected.summary
    assert summary is not None, connected.log
    assert summary.get("established") is True, summary.get("error")
    assert summary["rep_version"] == 1
    assert FIRST_QPN <= summary["endpoint_qpn"] < 1 << 24
    assert summary["dest_qp_num"] == summary["endpoint_qpn"]
    counters = (connected.netdev or {}).get("counters", {})
    assert not any(name.startswith("ib_cm.rej") for name in counters), counters


@pytest.mark.softroce
def test_generator_write_run_on_the_connected_qp_is_byte_exact(
        connected: ConnectResult) -> None:
    summary = connected.summary or {}
    run = summary.get("run")
    assert run is not None, summary.get("error")
    assert run["messages_ok"] == COUNT, run
    assert run["status_messages"] == COUNT and run["status_bytes"] == COUNT * SIZE, run
    assert connected.exit_code == 0, connected.log


@pytest.mark.softroce
def test_rdma_disconnect_returns(connected: ConnectResult) -> None:
    """The endpoint does not answer DREQ: the host's rdma_disconnect returns at once and
    DISCONNECTED comes only when its CM gives the DREQ up (not within 10 s)."""
    disconnect = (connected.summary or {}).get("disconnect")
    assert disconnect is not None and disconnect["disconnect_call"] == "returned", disconnect
