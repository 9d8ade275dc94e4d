"""``python -m sim.bench.elaboration`` without building anything: the builds it measures,
and its verdict on the largest one, from given figures (the builds themselves run in
``make bench``)."""

import json
import subprocess

import pytest

from sim.bench import elaboration


def test_a_build_of_many_qps_has_message_slots_for_them():
    assert elaboration.build_parameters(16) == {"qps": 16, "message_slots": 4096}
    assert elaboration.build_parameters(4096) == {"qps": 4096, "message_slots": 8192}


@pytest.mark.parametrize("seconds, peak_gb, verdict", [
    (110, 2.6, 0), (601, 2.6, 1), (110, 8.1, 1)])
def test_the_verdict_is_on_the_largest_build(monkeypatch, seconds, peak_gb, verdict):
    """Each build's figures come from its own process; the largest must stay within 10
    minutes and 8 GB, whatever the smaller ones took."""
    real_run = subprocess.run

    def run(command, **kwargs):
        if "--one" not in command:          # (git, for the provenance)
            return real_run(command, **kwargs)
        qps = int(command[command.index("--one") + 1])
        figures = {"qps": qps, "seconds": seconds if qps == 4096 else 900,
                   "peak_gb": peak_gb if qps == 4096 else 9.0, "rtlil_mb": 40.0,
                   "largest": [["roce_tx.buffer", 16.8]]}
        return subprocess.CompletedProcess(command, 0, json.dumps(figures) + "\n", "")
    written = []
    monkeypatch.setattr(elaboration.subprocess, "run", run)
    monkeypatch.setattr(elaboration.report, "write",
                        lambda name, tables, **kwargs: written.append(tables[0]))
    assert elaboration.main(["256", "4096"]) == verdict
    table, = written
    assert [row["qps"] for row in table.rows] == [256, 4096]
    assert table.line(table.rows[1]).endswith("| `roce_tx.buffer` 16.8 |")
