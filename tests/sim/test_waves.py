"""The timing diagrams in docs/generated/waves are what the core does now: the scenario
of sim/waves.py, run again, gives the same WaveDrom JSON. A change of a handshake (a
ready a cycle later, a payload field moved) changes its diagram: rerun
``python -m sim.waves`` and commit the JSON with the change."""

import json

import pytest

from sim import waves


@pytest.fixture(scope="module")
def trace():
    return waves.record()


def test_each_diagram_is_wavedrom_with_a_clock_valid_and_ready(trace):
    for diagram in waves.DIAGRAMS:
        document = json.loads(waves.dumps(waves.wavedrom(trace, diagram,
                                                         waves.window(trace, diagram))))
        clock, *rest = document["signal"]
        length = len(clock["wave"])
        assert clock == {"name": "clk", "wave": "p" + "." * (length - 1)}
        assert 16 <= length <= 24, (diagram.name, length)
        waves_shown = [entry for entry in rest if isinstance(entry, dict) and entry] + \
            [entry for group in rest if isinstance(group, list) for entry in group[1:]]
        for entry in waves_shown:
            assert len(entry["wave"]) == length, (diagram.name, entry)
            assert entry["wave"].count("=") == len(entry.get("data", [])), entry
        if diagram.valid:
            names = [entry["name"] for entry in waves_shown]
            assert names[:2] in (["valid", "ready"], ["tvalid", "tready"]), names
            assert "1" in waves_shown[0]["wave"]


def test_a_payload_field_shows_only_while_valid(trace):
    completion = next(d for d in waves.DIAGRAMS if d.name == "completion")
    document = waves.wavedrom(trace, completion, waves.window(trace, completion))
    valid = document["signal"][1]["wave"]
    tag = document["signal"][4][2]
    assert tag["name"] == "tag" and tag["data"] == ["1", "2"]
    level = None
    for v, t in zip(valid, tag["wave"], strict=True):
        level = v if v != "." else level
        assert (t == "x") == (level == "0") or t == ".", (valid, tag["wave"])


def test_the_committed_diagrams_are_current(trace, tmp_path):
    written = waves.generate(tmp_path, trace)
    for path in written:
        committed = waves.WAVES_DIR / path.name
        assert committed.exists(), f"{committed} is missing: run `python -m sim.waves`"
        assert path.read_text() == committed.read_text(), (
            f"{committed.name} differs from the simulation: the handshake or payload of "
            f"its stream changed; rerun `python -m sim.waves` and commit docs/generated/waves")
