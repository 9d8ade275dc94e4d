"""``python -m host.dump``, the receive API's example: every message to a file, in order."""

import hashlib
import io
import json

import pytest

from host import dump
from host.protocol import generator_payload

from .fakes import FakeBackend, FakeEndpoint


@pytest.mark.parametrize("argv", [
    ["--send", "--size", "100", "--count", "30", "--receives", "4"],
    ["--write", "--imm", "--size", "64", "--count", "25", "--ring", "256"],
    ["--write", "--size", "48", "--count", "40"],
])
def test_every_message_lands_in_its_qps_file_in_order(argv, tmp_path):
    backend = FakeBackend()
    with FakeEndpoint(backend) as endpoint:
        out, err = io.StringIO(), io.StringIO()
        code = dump.main([*argv, "--endpoint", f"127.0.0.1:{endpoint.port}", "--timeout",
                          "0.3", "--stall", "0.2", "--qps", "2", "--out",
                          str(tmp_path / "run")], backend=backend, stdout=out, stderr=err)
        assert not any(qp.status.open for qp in endpoint.qps)
    assert code == 0, err.getvalue()
    size = int(argv[argv.index("--size") + 1])
    count = int(argv[argv.index("--count") + 1])
    expected = b"".join(generator_payload(k, size) for k in range(count))
    summary = json.loads(out.getvalue())
    assert summary["ok"] is True and summary["figures"]["messages"] == 2 * count
    for index, qp in enumerate(summary["qp"]):
        path = tmp_path / f"run.qp{index}"
        assert qp["file"] == str(path) and path.read_bytes() == expected
        assert qp["sha256"] == hashlib.sha256(expected).hexdigest()
        assert qp["figures"]["bytes"] == count * size and qp["status"]["messages"] == count


def test_a_failure_is_reported_like_qp_server(tmp_path):
    backend = FakeBackend()
    with FakeEndpoint(backend, qps=1) as endpoint:
        err = io.StringIO()
        code = dump.main(["--endpoint", f"127.0.0.1:{endpoint.port}", "--timeout", "0.3",
                          "--qps", "2", "--out", str(tmp_path / "run")], backend=backend,
                         stdout=io.StringIO(), stderr=err)
    assert code == 1
    assert "host.dump: error: endpoint has no free QP (NO_QP)" in err.getvalue()
