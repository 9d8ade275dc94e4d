"""``qp-server --reclaim`` and the STATUS requests that keep QPs' leases, against the
fake CM (tests/host/fakes.py) on loopback."""

import io
import json
import time

from host import cli
from host.cm import CmClient
from host.errors import HostError
from host.protocol import PathMtu, QpInfo, Request
from host.run import RunConfig, Runner

from .fakes import HOST_IP, FakeBackend, FakeEndpoint


def leave_open(endpoint, *host_qpns):
    """QPs a crashed qp-server left open on the endpoint."""
    with CmClient("127.0.0.1", cm_port=endpoint.port, timeout=0.3) as cm:
        for qpn in host_qpns:
            cm.open_qp(QpInfo(qpn=qpn, psn=1, ip=HOST_IP), PathMtu.MTU_1024)


def run(endpoint, backend, *argv):
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*endpoint.cm_args(), "--stall", "0.2", "--json", *argv], backend=backend,
                    stdout=out, stderr=err)
    return code, json.loads(out.getvalue()) if out.getvalue() else None, err.getvalue()


def test_reclaim_frees_what_a_crashed_run_left_open():
    backend = FakeBackend()
    with FakeEndpoint(backend, qps=2) as endpoint:
        leave_open(endpoint, 901, 902)
        code, _, err = run(endpoint, backend, "--size", "64", "--count", "5")
        assert code == 1 and "no free QP (NO_QP)" in err and "--reclaim" in err
        code, summary, err = run(endpoint, backend, "--reclaim", "--size", "64", "--count", "5")
        assert code == 0, err
        assert summary["ok"] is True
        assert "closed 2 endpoint QPs left open by 127.0.0.1 (--reclaim)" in err
        assert "with endpoint QPN 256" in err
        closes = [request for request in endpoint.requests if request.request == Request.CLOSE_QP]
        assert closes[0].rem.qpn == 0xFFFFFF and closes[0].loc.ip == HOST_IP
        assert not any(qp.status.open for qp in endpoint.qps)


def test_close_all_of_an_endpoint_without_the_extension_names_the_fix():
    with FakeEndpoint() as endpoint:
        endpoint.close_all_supported = False
        with CmClient("127.0.0.1", cm_port=endpoint.port, timeout=0.3) as cm:
            try:
                cm.close_all(HOST_IP)
            except HostError as error:
                assert "predates close-all" in str(error) and "ctrl close-qp" in str(error)
            else:
                raise AssertionError("NO_QP to a close-all was taken for done")


def test_keep_alive_asks_status_of_held_qps_only():
    with FakeEndpoint(qps=3) as endpoint:
        leave_open(endpoint, 7)                     # not this client's
        with CmClient("127.0.0.1", cm_port=endpoint.port, timeout=0.3,
                      keepalive=0.05) as cm:
            held = [cm.open_qp(QpInfo(qpn=qpn, psn=1, ip=HOST_IP))[0].qpn for qpn in (8, 9)]

            def statuses():
                return [request.rem.qpn for request in endpoint.requests
                        if request.request == Request.STATUS]
            cm.keep_alive()
            assert statuses() == [], "asked before the interval passed"
            time.sleep(0.06)
            cm.keep_alive()
            assert sorted(statuses()) == held
            cm.keep_alive()
            assert len(statuses()) == 2
            cm.close_qp(held[0], HOST_IP)
            time.sleep(0.06)
            cm.keep_alive()
            assert sorted(statuses()) == sorted([*held, held[1]])


def test_a_run_keeps_its_qps_leases():
    """30 messages of 20 ms: a run of at least 0.6 s asks STATUS every 50 ms."""
    backend = FakeBackend()
    with FakeEndpoint(backend, message_delay=0.02) as endpoint:
        with CmClient("127.0.0.1", cm_port=endpoint.port, timeout=0.3, keepalive=0.05) as cm:
            runner = Runner(RunConfig(size=64, count=30, stall=5.0), backend(None), cm)
            assert runner.run().ok
        statuses = [request for request in endpoint.requests
                    if request.request == Request.STATUS]
        assert len(statuses) >= 10, len(statuses)
