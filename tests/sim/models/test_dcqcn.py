"""The DCQCN reference model (sim.models.dcqcn) against hand-worked cases of the paper's
equations and ConnectX's settings."""

import math

import pytest

from sim.models.dcqcn import ALPHA_ONE, DcqcnSettings, ReactionPoint


def test_first_cnp_cuts_the_line_rate_by_the_initial_alpha():
    point = ReactionPoint()
    point.cnp(10.0)
    assert point.limited
    assert point.alpha == 1023
    assert point.target == 100_000                  # no timer stage yet: Rt not clamped
    assert point.rate == pytest.approx(100_000 * (1 - 1023 / 2048))


def test_alpha_decays_each_period_without_a_cnp_and_rises_with_one():
    point = ReactionPoint(DcqcnSettings(rpg_time_reset=10_000, rpg_byte_reset=0))
    point.cnp(0.0)
    point.advance(1.0)                              # the first CNP's period saw a CNP
    assert point.alpha == pytest.approx(1023 * 1019 / 1024 + 5)
    point.advance(11.0)                             # ten periods without
    assert point.alpha == pytest.approx((1023 * 1019 / 1024 + 5) * (1019 / 1024) ** 10)
    before = point.alpha
    point.cnp(11.5)                                 # a cut (the monitor period is over)
    point.advance(12.0)
    assert point.alpha == pytest.approx(before * 1019 / 1024 + 5)


def test_cnps_within_the_monitor_period_make_one_cut_at_its_end():
    point = ReactionPoint(DcqcnSettings(rpg_time_reset=10_000, rpg_byte_reset=0))
    point.cnp(0.0)
    first = point.rate
    point.cnp(1.0)
    point.cnp(2.0)
    assert point.rate == first and point.cuts == 1
    point.advance(3.9)
    assert point.cuts == 1
    point.advance(4.0)
    assert point.cuts == 2
    alpha = 1023                                    # periods 0..2 saw a CNP, period 3 none
    for period in range(4):
        alpha = alpha * 1019 / 1024 + (5 if period in (0, 1, 2) else 0)
    assert point.alpha == pytest.approx(alpha)
    assert point.rate == pytest.approx(first * (1 - alpha / 2048))


def test_timer_events_recover_fast_then_additively_then_hyper():
    settings = DcqcnSettings(rpg_threshold=5, rpg_byte_reset=0, rpg_time_reset=55)
    point = ReactionPoint(settings)
    point.cnp(0.0)
    cut = point.rate
    rates, targets = [cut], [point.target]
    for stage in range(1, 8):
        point.advance(55.0 * stage)
        rates.append(point.rate)
        targets.append(point.target)
    # Fast recovery for T = 1..4: Rt stays at the line rate, Rc halves the distance.
    for stage in range(1, 5):
        assert targets[stage] == 100_000
        assert rates[stage] == pytest.approx((rates[stage - 1] + 100_000) / 2)
    # T = 5: additive (Rt is held to the line rate), and so on.
    assert targets[5] == 100_000
    assert point.time_stage == 7


def test_additive_and_hyper_increase_move_the_target():
    settings = DcqcnSettings(rpg_threshold=1, rpg_byte_reset=1000, rpg_time_reset=55,
                             rpg_ai_rate=100, rpg_hai_rate=1000)
    point = ReactionPoint(settings)
    point.cnp(0.0)
    point.cnp(5.0)                                  # a second cut: Rt clamped? no timer stage
    assert point.target == 100_000
    point.advance(55.0 + 5.0)                       # T = 1: max(T, BC) = 1 = F: additive
    target = point.target
    assert target == 100_000                        # held to the line rate
    point.rate = point.target = 20_000.0            # from a low rate, the steps show
    point.sent(1000)                                # BC = 1: min(T, BC) = 1: additive
    assert point.target == 20_100
    point.sent(1000)                                # BC = 2, T = 1: additive
    assert point.target == 20_200
    point.advance(115.0)                            # T = 2, BC = 2: min 2 > F: hyper
    assert point.target == 21_200
    assert point.rate == pytest.approx((((20_000 + 20_100) / 2 + 20_200) / 2 + 21_200) / 2)


def test_target_clamped_after_a_timer_stage():
    point = ReactionPoint(DcqcnSettings(rpg_byte_reset=0, rpg_time_reset=10))
    point.cnp(0.0)
    point.advance(10.0)                             # T = 1
    rate = point.rate
    point.cnp(10.5)
    assert point.target == rate                     # clamp_tgt_rate_after_time_inc


def test_rate_never_falls_below_the_minimum():
    point = ReactionPoint(DcqcnSettings(rpg_min_rate=1000, rpg_byte_reset=0,
                                        rpg_time_reset=100_000))
    for step in range(40):
        point.cnp(4.0 * step)
    assert point.rate == 1000


def test_min_dec_fac_bounds_a_cut():
    point = ReactionPoint(DcqcnSettings(rpg_gd=10, rpg_min_dec_fac=80))
    point.cnp(0.0)                                  # α/2^10 ≈ 1 would cut to 0
    assert point.rate == pytest.approx(80_000)


def test_rate_to_set_on_first_cnp():
    point = ReactionPoint(DcqcnSettings(rate_to_set_on_first_cnp=30_000))
    point.cnp(0.0)
    assert point.rate == point.target == 30_000


def test_recovery_to_the_line_rate_ends_the_limit():
    point = ReactionPoint(DcqcnSettings(rpg_byte_reset=0, rpg_time_reset=50))
    point.cnp(0.0)
    steps = math.ceil(math.log2(50_000 * 256)) + 2
    point.advance(50.0 * steps)
    assert not point.limited and point.rate == 100_000
    point.cnp(50.0 * steps + 1)                     # a first CNP again
    assert point.alpha == 1023 and point.cuts == 1


@pytest.mark.parametrize("bad", [{"dce_tcp_rtt": 0}, {"dce_tcp_g": ALPHA_ONE},
                                 {"initial_alpha_value": -1}, {"rpg_min_dec_fac": 101}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        DcqcnSettings(**bad)
