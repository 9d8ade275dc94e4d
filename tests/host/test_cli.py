"""``qp-server`` end to end on loopback: a fake CM (from host.protocol) and a fake verbs backend."""

import dataclasses
import importlib.util
import io
import json
import socket

import pytest

from host import cli
from host.backend import Completion, CompletionKind, VerbsOptions
from host.cm import CmClient
from host.errors import HostError, StartNotTaken
from host.protocol import Ack, ErrorStatus, PathMtu, QpInfo, Request, Status
from host.run import DEFAULT_RING_LIMIT, RunConfig, default_ring, rate_divider

from .fakes import HOST_IP, FakeBackend, FakeEndpoint


def run(argv, backend=None):
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(argv, backend=backend, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def run_json(endpoint, backend, *argv):
    code, out, err = run([*endpoint.cm_args(), "--stall", "0.2", "--json", *argv], backend)
    return code, json.loads(out) if out else None, err


# Arguments


def test_parse_bytes():
    assert [cli.parse_bytes(text) for text in ("4096", "64K", "1M", "2G", "0x100", "3KiB")] == [
        4096, 65536, 1 << 20, 2 << 30, 256, 3072]
    for bad in ("", "ten", "-1", "4X"):
        with pytest.raises(cli.argparse.ArgumentTypeError):
            cli.parse_bytes(bad)


def test_parse_bind():
    assert cli.parse_bind("127.0.0.1:17186") == ("127.0.0.1", 17186)
    assert cli.parse_bind("10.0.0.1") == ("10.0.0.1", 0)
    assert cli.parse_bind(":5000") == ("0.0.0.0", 5000)
    for bad in ("host:1", "1.2.3.4:70000", "1.2.3.4:x"):
        with pytest.raises(cli.argparse.ArgumentTypeError):
            cli.parse_bind(bad)


def test_rate_to_divider():
    assert rate_divider(0, 4096, cli.DEFAULT_CLOCK_HZ) == 0
    assert rate_divider(1.0, 4096, cli.DEFAULT_CLOCK_HZ) == 1320
    assert rate_divider(2.0, 4096, cli.DEFAULT_CLOCK_HZ) == 660
    assert rate_divider(12.5, 1024, 322_265_625) == 26
    assert rate_divider(1000, 64, cli.DEFAULT_CLOCK_HZ) == 1
    with pytest.raises(ValueError, match="raise --rate or --size"):
        rate_divider(1e-9, 4096, cli.DEFAULT_CLOCK_HZ)
    with pytest.raises(ValueError):
        rate_divider(-1, 64, 1e6)


def test_rate_reaches_the_start_datagram():
    with FakeEndpoint() as endpoint:
        with CmClient("127.0.0.1", cm_port=endpoint.port, timeout=0.3) as cm:
            qpn = cm.open_qp(QpInfo(qpn=5, ip=HOST_IP))[0].qpn
        endpoint.capacity = 0
        code, _, err = run(["ctrl", "start", *endpoint.cm_args(retries=1), "--qpn", str(qpn),
                            "--size", "4K", "--count", "3", "--rate", "2", "--ring", "64K"])
        assert code == 1 and "did not take the start" in err
        start = next(r for r in endpoint.requests if r.txmeta.start)
        assert (start.length, start.count, start.divider, start.rem.base_addr) == (
            4096, 3, 660, 65536)
        assert start.txmeta.write and not start.txmeta.immediate


def test_default_ring():
    assert default_ring(100, 50) == 5000
    assert default_ring(4096, 1 << 20) == DEFAULT_RING_LIMIT
    assert default_ring(1 << 30, 4) == 1 << 30
    assert default_ring(64, 1, immediate=True) == 64
    assert default_ring(0, 10) == 0
    config = RunConfig(write=True, immediate=True, size=64, count=100, ring=640, receives=128)
    assert (config.slots, config.posted_receives, config.buffer_bytes) == (10, 9, 640)
    send = RunConfig(write=False, size=100, count=1000, receives=16)
    assert (send.ring_bytes, send.posted_receives, send.buffer_bytes) == (0, 16, 1600)


@pytest.mark.parametrize("argv, message", [
    (["--write", "--send"], "not allowed with argument"),
    (["--send", "--ring", "64K"], "--ring applies to --write only"),
    (["--size", "1K", "--ring", "512"], "must hold at least one message"),
    (["--imm", "--size", "1K", "--ring", "1K"], "at least two messages with --imm"),
    (["--mtu", "1500"], "invalid choice"),
    (["--count", "0"], "must be 1.."),
    (["--endpoint", "endpoint.local"], "not an endpoint IP[:PORT]"),
    (["--check", "sample=0"], "check must be all, sample=N"),
    (["--check", "some"], "check must be all, sample=N"),
    (["--rate", "1e-12"], "raise --rate or --size"),
    (["--poll", "sometimes"], "invalid choice"),
    (["ctrl", "status"], "--qpn"),
    (["ctrl", "close-qp", "--qpn", "256"], "--host-ip"),
    (["ctrl"], "required"),
])
def test_usage_errors_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv, backend=FakeBackend())
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_run_is_the_default_command_and_options_reach_the_backend():
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint:
        code, _, _ = run([*endpoint.cm_args(), "--device", "rxe0", "--ib-port", "2",
                          "--gid-index", "3", "--poll", "hybrid", "--size", "8",
                          "--count", "2"], backend)
        assert code == 0
        assert backend.options == VerbsOptions(device="rxe0", ib_port=2, gid_index=3,
                                               poll="hybrid")
        code, _, _ = run(["run", *endpoint.cm_args(), "--size", "8", "--count", "2"], backend)
        assert code == 0


@pytest.mark.skipif(importlib.util.find_spec("pyverbs") is not None, reason="pyverbs present")
def test_without_pyverbs_the_run_names_the_package():
    with FakeEndpoint() as endpoint:
        code, _, err = run([*endpoint.cm_args(), "--count", "1"])
    assert code == 1
    assert "apt install python3-pyverbs" in err and "--system-site-packages" in err


# ctrl against a fake CM


def open_endpoint_qp(endpoint, host_qpn=5):
    with CmClient("127.0.0.1", cm_port=endpoint.port, timeout=0.3) as cm:
        qp, mtu = cm.open_qp(QpInfo(qpn=host_qpn, psn=1, ip=HOST_IP), PathMtu.MTU_1024)
    assert mtu == PathMtu.MTU_1024
    return qp.qpn


def test_ctrl_status_prints_every_field():
    status = Status(open=True, running=True, error=True, error_status=5, outstanding=3,
                    messages=4, packets=5, bytes=6, retransmitted=7, acks=8, naks_sequence=9,
                    naks_rnr=10, rnr_waits=11, timeouts=12, acks_dropped=13, icrc_errors=14,
                    naks_invalid=15, naks_access=16, naks_operational=17)
    with FakeEndpoint() as endpoint:
        endpoint.qps[1].status = status
        code, out, _ = run(["ctrl", "status", *endpoint.cm_args(), "--qpn", "257", "--json"])
        assert code == 0
        assert json.loads(out) == {"qpn": 257, **dataclasses.asdict(status),
                                   "error_status_name": "RNR_RETRY_EXCEEDED"}
        code, out, _ = run(["ctrl", "status", *endpoint.cm_args(), "--qpn", "257"])
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "qpn: 257"
    for field in dataclasses.fields(Status):
        assert f"{field.name}: {getattr(status, field.name)}" in lines
    assert "error_status_name: RNR_RETRY_EXCEEDED" in lines


def test_ctrl_status_of_a_qpn_out_of_range():
    with FakeEndpoint() as endpoint:
        code, _, err = run(["ctrl", "status", *endpoint.cm_args(), "--qpn", "9"])
    assert code == 1
    assert "qp-server: error: endpoint has no QP 9" in err and "start at 256" in err


def test_ctrl_start_is_confirmed_by_status():
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint:
        with CmClient("127.0.0.1", cm_port=endpoint.port, timeout=0.3) as cm:
            host = QpInfo(qpn=17, psn=1, rkey=0x500, base_addr=backend.base(0), ip=HOST_IP)
            backend.open(1, 64 * 10, 4)
            qpn = cm.open_qp(host)[0].qpn
        code, out, _ = run(["ctrl", "start", *endpoint.cm_args(), "--qpn", str(qpn),
                            "--size", "64", "--count", "10"])
        assert code == 0 and f"started endpoint QP {qpn}" in out
        assert len(endpoint.qp(qpn).starts) == 1
        code, _, err = run(["ctrl", "start", *endpoint.cm_args(), "--qpn", "258",
                            "--size", "64", "--count", "10"])
    assert code == 1 and "endpoint QP 258 is not open" in err


def test_ctrl_start_not_taken_is_resent_then_fails():
    with FakeEndpoint(ignore_starts=100) as endpoint:
        qpn = open_endpoint_qp(endpoint)
        code, _, err = run(["ctrl", "start", *endpoint.cm_args(timeout=0.1, retries=2),
                            "--qpn", str(qpn), "--size", "64", "--count", "10"])
        assert code == 1
        assert f"endpoint QP {qpn} did not take the start after 2 tries" in err
        assert "fewer --qps" in err
        assert sum(r.txmeta.start for r in endpoint.requests) == 2


def test_ctrl_close_qp():
    with FakeEndpoint() as endpoint:
        qpn = open_endpoint_qp(endpoint)
        argv = ["ctrl", "close-qp", *endpoint.cm_args(), "--qpn", str(qpn), "--host-ip", HOST_IP]
        assert run(argv)[:2] == (0, f"closed endpoint QP {qpn}\n")
        assert not endpoint.qp(qpn).status.open
        assert run(argv)[:2] == (0, f"endpoint QP {qpn} was not open (NO_QP)\n")


# The CM client


def test_cm_ignores_stray_datagrams_and_retries():
    with FakeEndpoint(stray=True, drop_first=2) as endpoint:
        with CmClient("127.0.0.1", cm_port=endpoint.port, timeout=0.1, retries=3) as cm:
            qp, mtu = cm.open_qp(QpInfo(qpn=5, ip=HOST_IP))
            assert (qp.qpn, mtu) == (256, PathMtu.MTU_4096)
            again, _ = cm.open_qp(QpInfo(qpn=5, ip=HOST_IP))
            assert again == qp
            assert cm.status(256).open
            assert cm.close_qp(256, HOST_IP) == Ack.ACK


def test_cm_errors_name_the_fix():
    with FakeEndpoint(qps=1) as endpoint:
        with CmClient("127.0.0.1", cm_port=endpoint.port, timeout=0.2) as cm:
            cm.open_qp(QpInfo(qpn=5, ip=HOST_IP))
            with pytest.raises(HostError, match=r"no free QP \(NO_QP\).*ctrl close-qp.*more QPs"):
                cm.open_qp(QpInfo(qpn=6, ip=HOST_IP))
            endpoint.qps[0].status = Status(open=True, running=True)
            with pytest.raises(StartNotTaken, match="still running"):
                cm.start(256, length=8, count=1)
            endpoint.qps[0].status = Status(open=True, error=True, error_status=7)
            with pytest.raises(HostError, match="REMOTE_ACCESS_ERROR.*--ring"):
                cm.start(256, length=8, count=1)


def test_cm_silent_endpoint():
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    with silent, CmClient("127.0.0.1", cm_port=port, timeout=0.05, retries=3) as cm:
        with pytest.raises(HostError) as error:
            cm.status(256)
    assert str(error.value) == (
        f"endpoint 127.0.0.1 did not answer STATUS on UDP {port} after 3 tries (0.05 s each): "
        "check the cable/IP with "
        "`ping 127.0.0.1`, or --endpoint")


def test_cm_bind_error_names_the_fix():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        with pytest.raises(HostError, match="cannot bind the CM socket.*--bind"):
            CmClient("127.0.0.1", bind=taken.getsockname())


# Runs with the fake verbs backend


@pytest.mark.parametrize("argv", [
    ["--write", "--size", "100", "--count", "50"],
    ["--write", "--size", "4", "--count", "5"],
    ["--write", "--size", "0", "--count", "5"],
    ["--write", "--imm", "--size", "64", "--count", "40", "--ring", "640"],
    ["--write", "--imm", "--size", "0", "--count", "6"],
    ["--send", "--size", "33", "--count", "30", "--receives", "4"],
    ["--send", "--imm", "--size", "4K", "--count", "12", "--receives", "3"],
])
def test_data_that_lands_correctly_passes(argv):
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint:
        code, summary, err = run_json(endpoint, backend, *argv)
        assert code == 0, err
        size = cli.parse_bytes(argv[argv.index("--size") + 1])
        count = int(argv[argv.index("--count") + 1])
        assert summary["ok"] is True
        assert (summary["messages"], summary["bytes"], summary["errors"]) == (
            count, count * size, 0)
        assert summary["qp"][0]["messages_ok"] == count
        assert summary["qp"][0]["status"]["messages"] == count
        assert "paired host QPN 17 (127.0.0.1) with endpoint QPN 256" in err
        assert not endpoint.qps[0].status.open, "the endpoint QP is closed at the end"
        assert backend.closed == 1


def test_write_lands_in_the_ring_slots():
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint:
        code, summary, _ = run_json(endpoint, backend, "--imm", "--size", "16", "--count",
                                    "7", "--ring", "48")
        assert code == 0
        start = endpoint.qps[0].starts[0]
        assert (start.rem.base_addr, start.length, start.count) == (48, 16, 7)
        assert backend.buffers[0][:48] == b"".join(
            cli.protocol.generator_payload(k, 16) for k in (6, 4, 5))
        assert summary["ring"] == 48 and summary["receives"] == 2


def test_a_corrupted_byte_fails_with_its_offset():
    backend = FakeBackend()
    with FakeEndpoint(backend, corrupt={(0, 7): 13}) as endpoint:
        code, summary, err = run_json(endpoint, backend, "--size", "64", "--count", "20")
    good = cli.protocol.generator_payload(7, 64)[13]
    assert code == 1
    assert summary["ok"] is False and summary["errors"] == 1
    assert summary["qp"][0]["messages_ok"] == 19
    expected = (f"message 7, byte offset 13: expected 0x{good:02x} got 0x{good ^ 0x40:02x} "
                f"(buffer offset {7 * 64 + 13:#x})")
    assert summary["first_error"] == f"QP 0 (host QPN 17, endpoint QPN 256): {expected}"
    assert f"qp-server: error: QP 0 (host QPN 17, endpoint QPN 256): {expected}" in err


@pytest.mark.parametrize("argv", [["--send"], ["--imm"]])
def test_a_corrupted_byte_in_send_and_immediate_runs(argv):
    backend = FakeBackend()
    with FakeEndpoint(backend, corrupt={(0, 2): 0}) as endpoint:
        code, summary, _ = run_json(endpoint, backend, *argv, "--size", "24", "--count", "5",
                                    "--receives", "2")
    assert code == 1
    assert "message 2, byte offset 0: expected 0x00 got 0x40" in summary["first_error"]


def test_an_overwritten_ring_slot_is_not_counted_as_checked():
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint:
        code, summary, err = run_json(endpoint, backend, "--size", "32", "--count", "50",
                                      "--ring", "320")
    assert code == 1
    assert summary["qp"][0]["messages_ok"] == 10 and summary["unchecked"] == 40
    assert "message 0 was overwritten by message 40 before it was checked" in err


def test_missing_messages_are_reported():
    backend = FakeBackend()
    with FakeEndpoint(backend, stop_after=3) as endpoint:
        code, summary, err = run_json(endpoint, backend, "--send", "--size", "8", "--count",
                                      "5")
    assert code == 1
    assert summary["missing"] == 2 and summary["qp"][0]["messages_ok"] == 3
    assert "message 3 never arrived: the endpoint ended the run after 3 messages" in err
    with FakeEndpoint(FakeBackend(), stop_after=3) as endpoint:
        code, summary, err = run_json(endpoint, endpoint.backend, "--size", "8", "--count", "5")
    assert code == 1 and summary["qp"][0]["messages_ok"] == 3
    assert summary["errors"] == 2, "the final ring check finds slots 3 and 4 unwritten"


def test_an_endpoint_qp_in_error_ends_the_run():
    backend = FakeBackend()
    with FakeEndpoint(backend, fail_with=ErrorStatus.RNR_RETRY_EXCEEDED) as endpoint:
        code, summary, err = run_json(endpoint, backend, "--send", "--size", "8", "--count", "5")
        assert code == 1
        assert summary["ok"] is False and "RNR_RETRY_EXCEEDED" in summary["error"]
        assert summary["qp"][0]["endpoint_qpn"] == 256
        assert "endpoint QP 256 went to ERROR (RNR_RETRY_EXCEEDED)" in err and "--receives" in err
        assert not endpoint.qps[0].status.open and backend.closed == 1


def test_a_failed_work_completion_names_its_status():
    backend = FakeBackend()
    backend.completions.put(Completion(0, 0, 12, CompletionKind.RECV_IMM))
    with FakeEndpoint(backend, ignore_starts=0) as endpoint:
        code, _, err = run_json(endpoint, backend, "--imm", "--size", "8", "--count", "5")
        assert code == 1
        assert "went to ERROR: work completion IBV_WC_RETRY_EXC_ERR at message 0" in err
        assert not endpoint.qps[0].status.open


def test_several_qps_wait_for_the_generator():
    backend = FakeBackend()
    with FakeEndpoint(backend, capacity=2, message_delay=0.01) as endpoint:
        code, summary, err = run([*endpoint.cm_args(timeout=0.1), "--json", "--qps", "3",
                                  "--send", "--imm", "--size", "40", "--count", "20"], backend)
        summary = json.loads(summary)
        assert code == 0, err
        starts = [r.rem.qpn for r in endpoint.requests if r.txmeta.start]
        assert starts.count(256) == starts.count(257) == 1
        assert starts.count(258) >= 2, "the third start waits for a free generator"
        assert summary["messages"] == 60 and summary["qps"] == 3
        assert [qp["endpoint_qpn"] for qp in summary["qp"]] == [256, 257, 258]
        assert all(not qp.status.open for qp in endpoint.qps)


def test_the_endpoint_path_mtu_is_used_and_checked():
    backend = FakeBackend(active_mtu=PathMtu.MTU_1024)
    with FakeEndpoint(backend) as endpoint:
        code, _, _ = run_json(endpoint, backend, "--size", "8", "--count", "2")
        assert code == 0
        assert backend.connected[0][1] == PathMtu.MTU_1024
        code, _, err = run_json(endpoint, backend, "--mtu", "4096", "--size", "8", "--count", "2")
    assert code == 1 and "--mtu 4096 is above the active MTU 1024" in err


def test_no_free_endpoint_qp():
    backend = FakeBackend()
    with FakeEndpoint(backend, qps=1) as endpoint:
        code, _, err = run_json(endpoint, backend, "--qps", "2", "--size", "8", "--count", "2")
        assert code == 1
        assert "endpoint has no free QP (NO_QP): close QPs with `qp-server ctrl close-qp`" in err
        assert not endpoint.qps[0].status.open, "the QP that was paired is closed again"
        assert backend.closed == 1


def test_a_silent_endpoint_fails_after_the_retries():
    backend = FakeBackend()
    with FakeEndpoint(backend, silent=True) as endpoint:
        code, out, err = run([*endpoint.cm_args(timeout=0.05, retries=2), "--count", "3"],
                             backend)
        assert code == 1 and out == ""
        assert err.splitlines()[-1] == (
            f"qp-server: error: endpoint 127.0.0.1 did not answer OPEN_QP on UDP "
            f"{endpoint.port} after 2 tries (0.05 s each): check the cable/IP with "
            "`ping 127.0.0.1`, or --endpoint")
        assert len(endpoint.requests) == 2 and backend.closed == 1


def test_ctrl_and_run_share_one_endpoint_session():
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint:
        code, summary, _ = run_json(endpoint, backend, "--size", "8", "--count", "3")
        assert code == 0
        code, out, _ = run(["ctrl", "status", *endpoint.cm_args(), "--qpn", "256", "--json"])
    assert code == 0 and json.loads(out)["open"] is False


def test_no_start_checks_what_user_logic_sends():
    backend = FakeBackend()
    user_run = cli.protocol.start_run(0, length=48, count=9, write=False, immediate=True)
    with FakeEndpoint(backend, user_run=user_run) as endpoint:
        code, summary, err = run_json(endpoint, backend, "--no-start", "--send", "--imm",
                                      "--size", "48", "--count", "9", "--receives", "2")
        assert code == 0, err
        assert summary["messages"] == 9 and summary["started"] is False
        assert not any(r.txmeta.start for r in endpoint.requests)


class InterruptingBackend(FakeBackend):
    def poll(self, timeout):
        raise KeyboardInterrupt


def test_ctrl_c_closes_the_qps():
    backend = InterruptingBackend()
    with FakeEndpoint(backend) as endpoint:
        code, out, err = run([*endpoint.cm_args(), "--send", "--size", "8", "--count", "5"],
                             backend)
        assert code == 130
        assert "interrupted" in out and "interrupted; the QPs are closed" in err
        assert not endpoint.qps[0].status.open and backend.closed == 1


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_human_summary_and_live_progress():
    backend = FakeBackend()
    with FakeEndpoint(backend, message_delay=0.02) as endpoint:
        out, err = io.StringIO(), Terminal()
        code = cli.main([*endpoint.cm_args(), "--send", "--size", "1K", "--count", "20"],
                        backend=backend, stdout=out, stderr=err)
    assert code == 0
    assert out.getvalue().startswith("OK: SEND, 20 of 20 messages checked (1024 bytes each), "
                                     "20480 bytes in ")
    assert "QP 0 (host QPN 17, endpoint QPN 256): 20/20 ok" in out.getvalue()
    table = out.getvalue().splitlines()[-3:]
    assert table[0].split() == ["QP", "messages", "bytes", "seconds", "Gb/s", "GB/s", "Mmsg/s",
                                "retransmitted", "NAKs", "timeouts"]
    assert table[1].split()[:3] == ["0", "20", "20480"]
    assert table[2].split()[:3] == ["all", "20", "20480"]
    assert float(table[2].split()[3]) > 19 * 0.02, "first to last landing, 19 gaps of 20 ms"
    assert "\r\033[K" in err.getvalue() and "/20 messages, " in err.getvalue()
    assert " GB/s now, " in err.getvalue() and " GB/s average, 0 errors" in err.getvalue()


@pytest.mark.parametrize("argv", [
    ["--write", "--size", "100", "--count", "6"],
    ["--write", "--imm", "--size", "64", "--count", "5", "--qps", "2"],
    ["--send", "--imm", "--size", "33", "--count", "4", "--receives", "2"],
])
def test_repeat_closes_resets_and_pairs_again(argv):
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint:
        code, summary, err = run_json(endpoint, backend, "--repeat", "3", *argv)
        assert code == 0, err
        qps = int(argv[argv.index("--qps") + 1]) if "--qps" in argv else 1
        size = int(argv[argv.index("--size") + 1])
        count = int(argv[argv.index("--count") + 1])
        assert summary["ok"] is True and summary["repeat"] == 3
        assert [one["pass"] for one in summary["passes"]] == [1, 2, 3]
        for one in summary["passes"]:
            assert one["ok"] is True
            assert (one["messages"], one["bytes"]) == (count * qps, count * size * qps)
            for qp in one["qp"]:
                assert qp["status"]["messages"] == count
                assert qp["status"]["bytes"] == count * size
        assert backend.resets == [qp for _ in range(2) for qp in range(qps)]
        assert backend.closed == 1, "the device stays open across passes"
        opens = [request for request in endpoint.requests if request.request == Request.OPEN_QP]
        assert len(opens) == 3 * qps
        host_psns = [request.loc.psn for request in opens if request.loc.qpn == 17]
        assert len(set(host_psns)) == 3, "the host QP takes a new first PSN each pass"
        assert err.count("closed endpoint QPN 256 after pass") == 2
        endpoint_psns = {one["qp"][0]["endpoint_psn"] for one in summary["passes"]}
        assert len(endpoint_psns) == 3
        assert not any(qp.status.open for qp in endpoint.qps)


def test_repeat_fails_on_a_stale_endpoint_psn():
    backend = FakeBackend()
    with FakeEndpoint(backend, stale_psn=True) as endpoint:
        code, summary, err = run_json(endpoint, backend, "--repeat", "2", "--size", "64",
                                      "--count", "3")
    assert code == 1
    assert "announced first PSN 0x002100 again after the close of pass 1" in err
    assert summary["ok"] is False and summary["passes"][0]["ok"] is True
    assert not endpoint.qps[0].status.open


def test_repeat_stops_at_the_first_failed_pass():
    backend = FakeBackend()
    with FakeEndpoint(backend, corrupt={(0, 2): 5}) as endpoint:
        code, summary, err = run_json(endpoint, backend, "--repeat", "3", "--size", "64",
                                      "--count", "4")
    assert code == 1
    assert len(summary["passes"]) == 1 and summary["ok"] is False
    assert "pass 1: QP 0" in err and backend.resets == []


# --check, checker threads, figures


def test_a_lapped_ring_is_detected_with_check_none():
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint:
        code, summary, err = run_json(endpoint, backend, "--check", "none", "--size", "32",
                                      "--count", "50", "--ring", "320")
    assert code == 1
    assert summary["ok"] is False and summary["check"] == "none"
    assert summary["checked"] == 0
    assert summary["qp"][0]["messages_ok"] == 10 and summary["unchecked"] == 40
    assert "message 0 was overwritten by message 40 before it was checked" in err


@pytest.mark.parametrize("argv", [["--send"], ["--imm"], ["--write"]])
def test_check_none_still_checks_the_immediate_and_the_count(argv):
    backend = FakeBackend()
    with FakeEndpoint(backend, corrupt={(0, 2): 0}) as endpoint:
        code, summary, _ = run_json(endpoint, backend, *argv, "--check", "none", "--size",
                                    "24", "--count", "5", "--receives", "2")
    assert code == 0, "a corrupted byte is not looked at"
    assert (summary["messages"], summary["checked"]) == (5, 0)
    with FakeEndpoint(FakeBackend(), stop_after=3) as endpoint:
        code, summary, err = run_json(endpoint, endpoint.backend, *argv, "--check", "none",
                                      "--size", "24", "--count", "5", "--receives", "2")
    assert code == 1 and summary["qp"][0]["messages_ok"] == 3
    assert "message 3 never" in err


def test_check_none_catches_a_wrong_immediate():
    backend = FakeBackend()
    backend.completions.put(Completion(0, 0, 0, CompletionKind.RECV_IMM, 8, imm=7))
    with FakeEndpoint(backend, ignore_starts=100) as endpoint:
        code, summary, err = run_json(endpoint, backend, "--no-start", "--imm", "--check",
                                      "none", "--size", "8", "--count", "1")
    assert code == 1
    assert "message 0: immediate expected 0x00000000 got 0x00000007" in err


class SpyChecker:
    """Records the messages a run's checker compares."""

    def __init__(self, monkeypatch):
        from host import checker

        self.checked = []
        original = checker.Checker.check_messages

        def check_messages(checker_self, buffer, offset, first_k, count):
            self.checked += range(first_k, first_k + count)
            return original(checker_self, buffer, offset, first_k, count)

        monkeypatch.setattr(checker.Checker, "check_messages", check_messages)


@pytest.mark.parametrize("argv", [["--send", "--receives", "3"], ["--imm"], ["--write"]])
def test_sampling_checks_every_nth_message(argv, monkeypatch):
    spy = SpyChecker(monkeypatch)
    backend = FakeBackend()
    with FakeEndpoint(backend, corrupt={(0, 4): 1, (0, 6): 2}) as endpoint:
        code, summary, err = run_json(endpoint, backend, *argv, "--check", "sample=3",
                                      "--size", "64", "--count", "11")
    assert sorted(spy.checked) == [0, 3, 6, 9]
    assert code == 1 and summary["checked"] == 4 and summary["errors"] == 1
    assert summary["qp"][0]["messages_ok"] == 10, "message 4 is not looked at"
    assert "message 6, byte offset 2" in summary["first_error"]


def test_check_all_checks_every_message_once(monkeypatch):
    spy = SpyChecker(monkeypatch)
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint:
        code, summary, _ = run_json(endpoint, backend, "--send", "--size", "64", "--count",
                                    "30", "--qps", "2", "--receives", "4")
    assert code == 0 and summary["checked"] == 60
    assert sorted(spy.checked) == sorted(list(range(30)) * 2)


def test_a_corrupted_byte_is_located_with_checker_threads(monkeypatch):
    import host.checker

    monkeypatch.setattr(host.checker, "_MIN_THREAD_BYTES", 256)
    backend = FakeBackend()
    with FakeEndpoint(backend, corrupt={(0, 37): 1001}) as endpoint:
        code, summary, _ = run_json(endpoint, backend, "--check-threads", "2", "--size", "2K",
                                    "--count", "60")
    good = cli.protocol.generator_payload(37, 2048)[1001]
    expected = (f"message 37, byte offset 1001: expected 0x{good:02x} got 0x{good ^ 0x40:02x} "
                f"(buffer offset {37 * 2048 + 1001:#x})")
    assert code == 1 and summary["check_threads"] == 2
    assert summary["first_error"] == f"QP 0 (host QPN 17, endpoint QPN 256): {expected}"


def test_figures_per_qp_and_in_total():
    backend = FakeBackend()
    status = dict(retransmitted=3, naks_sequence=1, naks_rnr=2, timeouts=4)
    with FakeEndpoint(backend, message_delay=0.01) as endpoint:
        original = endpoint._answer

        def answer(request):
            if request.request == Request.STATUS:
                qp = endpoint.qp(request.rem.qpn)
                if qp is not None and qp.status.open:
                    qp.status = dataclasses.replace(qp.status, **status)
            return original(request)

        endpoint._answer = answer
        code, summary, _ = run_json(endpoint, backend, "--send", "--size", "1000", "--count",
                                    "10", "--qps", "2")
    assert code == 0
    for qp in summary["qp"]:
        figures = qp["figures"]
        assert (figures["messages"], figures["bytes"]) == (10, 10_000)
        assert (figures["retransmitted"], figures["naks"], figures["timeouts"]) == (3, 3, 4)
        # The endpoint lands a message every 10 ms; the host notices each at its next
        # poll, so the first-to-last time is 90 ms give or take a poll's delay.
        assert 0.5 * 9 * 0.01 <= figures["seconds"] < 10.0
        assert figures["gbytes_per_s"] == pytest.approx(10_000 / figures["seconds"] / 1e9,
                                                        rel=1e-2)
        assert figures["gbits_per_s"] == pytest.approx(8 * figures["gbytes_per_s"], rel=1e-2)
        assert figures["mmsgs_per_s"] == pytest.approx(10 / figures["seconds"] / 1e6,
                                                       rel=1e-2)
    total = summary["figures"]
    assert (total["messages"], total["bytes"], total["retransmitted"], total["naks"]) == (
        20, 20_000, 6, 6)
    assert total["seconds"] >= max(qp["figures"]["seconds"] for qp in summary["qp"])


# Several endpoints


def test_two_endpoints_run_in_parallel(tmp_path):
    backends = [FakeBackend(), FakeBackend()]
    made = iter(backends)

    def factory(options):
        return next(made)

    with FakeEndpoint(backends[0], message_delay=0.002) as first, \
            FakeEndpoint(backends[1], message_delay=0.002, corrupt={(1, 5): 9}) as second:
        listing = tmp_path / "endpoints"
        listing.write_text(f"# the crate\n127.0.0.1:{second.port}  # board 2\n")
        code, out, err = run(["--endpoint", f"127.0.0.1:{first.port}", "--endpoints-file",
                              str(listing), "--bind", "127.0.0.1:0", "--timeout", "0.3",
                              "--stall", "0.2", "--json", "--send", "--size", "64", "--count",
                              "20", "--qps", "2", "--receives", "4"], factory)
        summary = json.loads(out)
        assert code == 1
        assert [one["endpoint"] for one in summary["endpoints"]] == [
            f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}"]
        good, bad = summary["endpoints"]
        assert good["ok"] is True and good["messages"] == 40
        assert bad["ok"] is False and bad["errors"] == 1
        assert "QP 1 (host QPN 18, endpoint QPN 257): message 5, byte offset 9" in (
            bad["first_error"])
        assert summary["ok"] is False
        assert (summary["figures"]["messages"], summary["figures"]["bytes"]) == (80, 80 * 64)
        assert f"qp-server: error: endpoint 127.0.0.1:{second.port}: QP 1" in err
        assert f"qp-server: 127.0.0.1:{first.port}: paired host QPN 17" in err
        for endpoint in (first, second):
            assert sum(r.txmeta.start for r in endpoint.requests) == 2
            assert not any(qp.status.open for qp in endpoint.qps)
        assert [backend.closed for backend in backends] == [1, 1]

        made = iter([FakeBackend(), FakeBackend()])
        backends = list(made)
        made = iter(backends)
        first.backend, second.backend = backends
        second.corrupt = {}
        first.message_delay = second.message_delay = 0.03
        terminal, stdout = Terminal(), io.StringIO()
        code = cli.main(["--endpoint", f"127.0.0.1:{first.port}", "--endpoint",
                         f"127.0.0.1:{second.port}", "--bind", "127.0.0.1:0", "--stall", "0.2",
                         "--send", "--size", "64", "--count", "20"], backend=factory,
                        stdout=stdout, stderr=terminal)
    out, err = stdout.getvalue(), terminal.getvalue()
    assert code == 0, err
    progress = [line for line in err.split("\r\033[K") if line.startswith("127.0.0.1")]
    assert progress, "a live line for both endpoints"
    assert all(line.count(" msgs ") == 3 and " | total " in line for line in progress)
    assert progress[-1].startswith(f"127.0.0.1:{first.port} ")
    assert f" | 127.0.0.1:{second.port} " in progress[-1]
    lines = out.splitlines()
    assert lines[0] == f"endpoint 127.0.0.1:{first.port}:"
    assert f"endpoint 127.0.0.1:{second.port}:" in lines
    table = lines[-5:]
    assert table[0].split()[:3] == ["endpoint", "messages", "bytes"]
    assert table[1].split()[:3] == [f"127.0.0.1:{first.port}", "20", "1280"]
    assert table[2].split()[:3] == [f"127.0.0.1:{second.port}", "20", "1280"]
    assert table[3].split()[:3] == ["all", "40", "2560"]
    assert table[4] == "OK: 2 of 2 endpoints ok"


def test_endpoint_arguments():
    assert cli.parse_endpoint("10.77.0.2") == "10.77.0.2"
    assert cli.parse_endpoint("10.77.0.2:4000") == "10.77.0.2:4000"
    for bad in ("10.77.0.2:0", "board:17185", "10.77.0.2:x"):
        with pytest.raises(cli.argparse.ArgumentTypeError):
            cli.parse_endpoint(bad)


def test_a_device_per_endpoint():
    backends = [FakeBackend(), FakeBackend()]
    made = iter(backends)

    def factory(options):
        return next(made)(options)

    with FakeEndpoint(backends[0]) as first, FakeEndpoint(backends[1]) as second:
        code, out, err = run(["--endpoint", f"127.0.0.1:{first.port}", "--endpoint",
                              f"127.0.0.1:{second.port}", "--device", "rxe0", "--device",
                              "rxe1", "--bind", "127.0.0.1:0", "--stall", "0.2", "--json",
                              "--write", "--size", "64", "--count", "2"], factory)
    assert code == 0, err
    assert [backend.options.device for backend in backends] == ["rxe0", "rxe1"]
    three = ["--endpoint", "10.0.0.1", "--endpoint", "10.0.0.2", "--endpoint", "10.0.0.3"]
    for argv in ([*three, "--device", "rxe0", "--device", "rxe1"],
                 [*three[:2], "--device", "rxe0", "--device", "rxe1"]):
        with pytest.raises(SystemExit) as exit_info:
            run(argv, FakeBackend())
        assert exit_info.value.code == 2
