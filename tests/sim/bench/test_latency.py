"""The arithmetic and the table of ``python -m sim.bench.latency`` from given cycle stamps
(the whole-core simulation itself runs in ``make bench``)."""

import pytest

from sim.bench.connectx import CONNECTX_PARAMS
from sim.bench.latency import (
    BUILD_QPS,
    MANY_QPS,
    build_params,
    latency_row,
    latency_table,
    runs,
    same_latency,
)

CLOCK_HZ = 322_265_625
#: A 64-byte RDMA WRITE ONLY: Ethernet 14, IPv4 20, UDP 8, BTH 12, RETH 16, payload,
#: ICRC 4; on the line also 4 bytes of FCS, 8 of preamble and SFD and 12 of gap.
FRAME = 14 + 20 + 8 + 12 + 16 + 64 + 4
LINE_CYCLES = (FRAME + 24) * 8 / 100e9 * CLOCK_HZ
ROUND_TRIP = 322                                  # 1 µs of the clock


def measured(qps, to_mac, to_completion, ack_to_completion=20, start=1000):
    """A row's measurements: one WRITE per value of ``to_mac`` (zipped with
    ``to_completion``), each 1000 cycles after the one before."""
    stamps = [{"request": start + 1000 * i, "first_beat": start + 1000 * i + mac,
               "completion": start + 1000 * i + done,
               "ack": start + 1000 * i + done - ack_to_completion}
              for i, (mac, done) in enumerate(zip(to_mac, to_completion, strict=True))]
    return {"build_qps": 16, "qps": qps, "qp": qps - 1, "length": 64,
            "repetitions": len(stamps),
            "round_trip": ROUND_TRIP, "stamps": stamps}


def test_a_row_is_the_spans_of_its_stamps():
    row = latency_row(measured(16, [30, 31, 30], [400, 402, 401]))
    assert row["frame"] == FRAME
    assert row["line_cycles"] == pytest.approx(LINE_CYCLES) == pytest.approx(4.18, abs=0.01)
    assert (row["to_mac_min"], row["to_mac_max"]) == (30, 31)
    assert (row["to_completion_min"], row["to_completion_max"]) == (400, 402)
    assert (row["ack_to_completion_min"], row["ack_to_completion_max"]) == (20, 20)
    assert row["endpoint_min"] == pytest.approx(400 - ROUND_TRIP - LINE_CYCLES)
    assert row["endpoint_max"] == pytest.approx(402 - ROUND_TRIP - LINE_CYCLES)
    assert row["to_mac_ns_max"] == pytest.approx(31 / CLOCK_HZ * 1e9)
    assert row["to_completion_ns_min"] == pytest.approx(400 / CLOCK_HZ * 1e9)
    assert row["round_trip_us"] == pytest.approx(ROUND_TRIP / CLOCK_HZ * 1e6)
    assert "stamps" not in row and row["qps"] == 16 and row["repetitions"] == 3


def test_the_table_shows_one_figure_where_the_repetitions_agree():
    table = latency_table([measured(1, [30, 30], [400, 400]),
                           measured(16, [30, 32], [400, 400])])
    one, every = (table.line(row) for row in table.rows)
    assert one.startswith(
        "| 16 | 1 | 0 | 2 | 30 | 93.1 | 400 | 1241.2 | 322 | 4.18 | 73.82 | 20 |")
    assert every.startswith("| 16 | 16 | 15 | 2 | 30–32 | 93.1–99.3 | 400 |")
    assert "The rows differ" in table.note
    assert table.markdown().startswith(table.caption)


def test_rows_that_agree_say_so():
    rows = [latency_row(measured(qps, [30, 30], [400, 400])) for qps in (1, 16)]
    assert same_latency(rows)
    assert not same_latency([*rows, latency_row(measured(16, [30, 30], [400, 401]))])
    assert "Every row measured the same" in latency_table(
        [measured(qps, [30], [400]) for qps in (1, 16)]).note


def test_the_rows_are_one_qp_and_every_qp_of_the_build():
    assert BUILD_QPS == 16 and MANY_QPS == 4096
    one, every = runs()
    assert (one["qps"], one["qp"]) == (1, 0) and (every["qps"], every["qp"]) == (16, 15)
    assert one["round_trip"] == every["round_trip"] == ROUND_TRIP
    assert [(row["build_qps"], row["qps"]) for row in runs(MANY_QPS)] == [(4096, 1),
                                                                          (4096, 4096)]


def test_a_build_of_many_qps_has_message_slots_for_them():
    assert build_params(BUILD_QPS) == CONNECTX_PARAMS
    assert build_params(MANY_QPS) == {**CONNECTX_PARAMS, "qps": 4096, "message_slots": 8192}
