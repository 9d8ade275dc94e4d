"""``qp-server --cm rdma`` and the receive API's ``cm="rdma"`` without a guest: the
option plumbing (a fake backend's ``rdma_connect`` pairs, the UDP CM starts and
watches the runs, ``rdma_disconnect`` ends them) and the error texts of rdma_cm."""

import os

import pytest

from host.errors import HostError
from host.protocol import CM_PORT, PathMtu, Request
from host.rdma_connect import CmEvent, EventChannel, NoEvent, Rejected, event_error
from host.receive import Receiver, RunConfig

from .fakes import HOST_IP, FakeBackend, FakeEndpoint
from .test_cli import run, run_json


@pytest.mark.parametrize("argv", [
    ["--write", "--size", "64", "--count", "6"],
    ["--write", "--imm", "--size", "64", "--count", "6"],
    ["--send", "--size", "64", "--count", "6", "--receives", "2"],
])
def test_cm_rdma_pairs_with_rdma_connect_starts_over_udp_and_disconnects(argv):
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint:
        code, summary, err = run_json(endpoint, backend, "--cm", "rdma", *argv)
        assert code == 0, err
        assert summary["ok"] is True and summary["cm"] == "rdma"
        assert summary["qp"][0]["messages_ok"] == 6
        assert backend.rdma_connects == [(0, "127.0.0.1", CM_PORT, 10.0)]
        requests = {request.request for request in endpoint.requests}
        assert Request.OPEN_QP not in requests and Request.CLOSE_QP not in requests
        assert any(request.txmeta.start for request in endpoint.requests)
        assert backend.rdma_disconnects == [0]
        assert summary["qp"][0]["disconnect"]["event"] == "DISCONNECTED"
        assert "with endpoint QPN 256 (127.0.0.1) through rdma_cm" in err
        assert not endpoint.qps[0].status.open


def test_rdma_port_and_timeout_reach_the_backend():
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint:
        code, _, err = run_json(endpoint, backend, "--cm", "rdma", "--rdma-port", "4791",
                                "--rdma-timeout", "2.5", "--qps", "2", "--size", "8",
                                "--count", "2")
        assert code == 0, err
        assert backend.rdma_connects == [(0, "127.0.0.1", 4791, 2.5),
                                         (1, "127.0.0.1", 4791, 2.5)]
        assert backend.rdma_disconnects == [0, 1]


def test_default_is_the_udp_cm():
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint:
        code, summary, _ = run_json(endpoint, backend, "--size", "8", "--count", "2")
        assert code == 0 and summary["cm"] == "udp"
        assert backend.rdma_connects == [] and backend.rdma_disconnects == []
        assert any(request.request == Request.OPEN_QP for request in endpoint.requests)


@pytest.mark.parametrize("argv, message", [
    (["--cm", "tcp"], "invalid choice"),
    (["--cm", "rdma", "--repeat", "2"], "--repeat needs --cm udp"),
    (["--cm", "rdma", "--mtu", "1024"], "--mtu needs --cm udp"),
    (["--cm", "rdma", "--rdma-port", "0"], "not a UDP port"),
    (["--cm", "rdma", "--rdma-timeout", "0"], "must be > 0 s"),
])
def test_usage_errors_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(argv, FakeBackend())
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("reason, words", [
    (28, ["reason 28 (consumer reject)", "private data", "version 1"]),
    (8, ["reason 8 (invalid service ID)", "rdma_cm port", f"default {CM_PORT}"]),
    (3, ["reason 3 (no QP available)", "--reclaim", "lease"]),
    (99, ["reason 99:", "check the port"]),
])
def test_a_rej_names_its_reason_and_the_fix(reason, words):
    backend = FakeBackend()
    backend.reject = reason
    with FakeEndpoint(backend) as endpoint:
        code, _, err = run([*endpoint.cm_args(), "--cm", "rdma", "--size", "8",
                            "--count", "2"], backend)
    assert code == 1
    assert "qp-server: error: 127.0.0.1 port 17185 REJECTED the connection with " in err
    for word in words:
        assert word in err
    assert backend.rdma_disconnects == [] and backend.closed


def test_no_qp_free_is_rej_3():
    backend = FakeBackend()
    with FakeEndpoint(backend, qps=1) as endpoint:
        code, _, err = run([*endpoint.cm_args(), "--cm", "rdma", "--qps", "2", "--size", "8",
                            "--count", "2"], backend)
    assert code == 1 and "reason 3 (no QP available)" in err
    assert backend.rdma_disconnects == [0], "the QP that was connected is disconnected"


def test_no_disconnected_in_time_closes_with_close_qp():
    backend = FakeBackend()
    backend.disconnect_outcome = {"disconnect_call": "returned", "event": None,
                                  "error": "waiting for DISCONNECTED: no rdma_cm event"}
    with FakeEndpoint(backend) as endpoint:
        code, summary, err = run_json(endpoint, backend, "--cm", "rdma", "--rdma-timeout",
                                      "3", "--size", "8", "--count", "2")
    assert code == 0, err
    assert "endpoint QP 256: no DISCONNECTED within 3 s of rdma_disconnect" in err
    assert "closed it with CLOSE_QP" in err
    assert summary["qp"][0]["disconnect"]["event"] is None
    assert summary["qp"][0]["disconnect"]["close_qp"] == "ACK"
    assert not endpoint.qps[0].status.open


def test_the_receive_api_takes_the_same_choice():
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint, endpoint_cm(endpoint) as cm, Receiver(
            RunConfig(write=False, size=32, count=5, receives=2, cm="rdma"), backend,
            cm) as receiver:
        seen = [(message.k, bytes(message.data)) for message in receiver.messages()]
    assert [k for k, _ in seen] == list(range(5))
    assert backend.rdma_connects and backend.rdma_disconnects == [0]


def endpoint_cm(endpoint):
    from host.cm import CmClient

    return CmClient(HOST_IP, cm_port=endpoint.port, timeout=0.3)


@pytest.mark.parametrize("event, words", [
    (CmEvent(7, -110), ["10.77.0.2 port 17185 is UNREACHABLE", "answering ARP and MADs"]),
    (CmEvent(6, -22), ["CONNECT_ERROR (status -22)", "path MTU"]),
    (CmEvent(10), ["ended in DISCONNECTED (status 0), not ESTABLISHED"]),
])
def test_connect_event_errors_name_the_fix(event, words):
    error = event_error(event, "10.77.0.2 port 17185", "ESTABLISHED")
    assert isinstance(error, HostError) and not isinstance(error, Rejected)
    for word in words:
        assert word in str(error)


def test_rejected_event_carries_its_reason():
    error = event_error(CmEvent(8, 28, b"\0" * 148), "10.77.0.2 port 17185", "ESTABLISHED")
    assert isinstance(error, Rejected) and error.reason == 28
    assert event_error(CmEvent(9), "x", "ESTABLISHED") is None
    assert event_error(CmEvent(5), "x", "CONNECT_RESPONSE") is None


def test_no_event_in_time_names_the_timeout_options():
    read, write = os.pipe()
    try:
        channel = EventChannel.__new__(EventChannel)
        channel.fd = read
        with pytest.raises(NoEvent, match=r"connecting to x: no rdma_cm event within 0.05 s"
                                            r".*--rdma-timeout of qp-server"):
            channel.get("connecting to x", 0.05)
    finally:
        os.close(read)
        os.close(write)


def test_listen_connects_through_connect_and_disconnects():
    """--listen PORT: QP i is connected by the endpoint to port PORT + i (CONNECT with
    the MTU asked for), runs start over UDP, rdma_disconnect ends them."""
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint:
        code, summary, err = run_json(endpoint, backend, "--cm", "rdma", "--listen", "18515",
                                      "--mtu", "1024", "--qps", "2", "--write", "--imm",
                                      "--size", "64", "--count", "6", "--rdma-timeout", "7")
        assert code == 0, err
        assert summary["ok"] is True and (summary["cm"], summary["listen"]) == ("rdma", 18515)
        assert [qp["messages_ok"] for qp in summary["qp"]] == [6, 6]
        assert backend.rdma_listens == [(0, 18515, PathMtu.MTU_1024, 7.0),
                                        (1, 18516, PathMtu.MTU_1024, 7.0)]
        assert backend.rdma_connects == []
        connects = [request for request in endpoint.requests
                    if request.request == Request.CONNECT]
        assert [request.length for request in connects] == [18515, 18516]
        assert backend.rdma_disconnects == [0, 1]
        assert "(the endpoint connected to port 18516)" in err


def test_a_connect_nak_is_reported_with_its_reason():
    backend = FakeBackend()
    with FakeEndpoint(backend, qps=0) as endpoint:
        code, summary, err = run_json(endpoint, backend, "--cm", "rdma", "--listen", "18515",
                                      "--size", "8", "--count", "1")
        assert code == 1 and "reason 3" in err, err
        assert summary["ok"] is False


@pytest.mark.parametrize("argv, message", [
    (["--listen", "18515"], "--listen needs --cm rdma"),
    (["--cm", "rdma", "--listen", "65535", "--qps", "2"], "must be 1..65535"),
])
def test_listen_usage_errors_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(argv, FakeBackend())
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
