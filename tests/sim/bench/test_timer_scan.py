"""sim.bench.timer_scan on a small build: each timer is offered within two passes of the
scan's rows and 8 cycles of its time (its start taken within a pass and 3 cycles, its
expiry found within a pass and 5), and timers that run out together within three cycles
each; each CNP acted on within a pass of the rows and its visit."""

from sim.bench.timer_scan import measure, measure_cnps


def test_timers_of_16_qps_are_found_within_the_bounds():
    row = measure(16, seed=3)
    assert (row["lanes"], row["rows"], row["together"]) == (8, 2, 16)
    assert 0 <= row["single_mean"] <= row["single_worst"] <= 2 * row["rows"] + 8
    assert row["together_last"] <= row["rows"] + 3 * 16 + 5


def test_cnps_of_16_qps_are_acted_on_within_the_bound():
    row = measure_cnps(16, seed=3)
    assert (row["rows"], row["cnps"]) == (2, 16)
    assert 0 < row["mean"] <= row["worst"] <= row["bound"] < row["sweep_worst"]
