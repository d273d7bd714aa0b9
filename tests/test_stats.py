"""The comparison's statistics (tuning/tools/compare/stats.py) against cases computed by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tuning.tools.compare import stats


# ---- bootstrap ----------------------------------------------------------------------------------
def test_bootstrap_interval_of_two_values_spans_them():
    # resampling [1, 3]: means 1 (p 1/4), 2 (p 1/2), 3 (p 1/4); the 2.5th and 97.5th percentiles are 1 and 3
    assert stats.bootstrap_ci([1.0, 3.0], np.mean, np.random.default_rng(0)) == (2.0, 1.0, 3.0)


def test_bootstrap_interval_of_equal_values_is_that_value():
    assert stats.bootstrap_ci([5.0] * 6, np.median, np.random.default_rng(0)) == (5.0, 5.0, 5.0)


def test_bootstrap_interval_needs_two_values():
    point, low, high = stats.bootstrap_ci([4.0], np.median)
    assert point == 4.0 and math.isnan(low) and math.isnan(high)


def test_bootstrap_interval_covers_the_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    covered = 0
    for _ in range(200):
        _, low, high = stats.bootstrap_ci(rng.normal(10.0, 2.0, size=30), np.mean, rng, resamples=1000)
        covered += low <= 10.0 <= high
    assert 0.88 <= covered / 200 <= 0.99  # the percentile bootstrap is a little narrow at n = 30


def test_the_same_seed_gives_the_same_interval():
    values = np.random.default_rng(2).lognormal(size=10)
    assert (stats.bootstrap_ci(values, np.median, np.random.default_rng(7))
            == stats.bootstrap_ci(values, np.median, np.random.default_rng(7)))


def test_curve_band_resamples_whole_curves():
    curves = np.array([[1.0, 1.0], [3.0, 3.0]])
    low, high = stats.curve_band(curves, np.mean, np.random.default_rng(0))
    assert low.tolist() == [1.0, 1.0] and high.tolist() == [3.0, 3.0]


# ---- paired ratios, Wilcoxon, Holm ----------------------------------------------------------------
def test_paired_ratio_of_a_method_twice_as_fast_on_every_seed():
    baseline = np.array([2.0, 4.0, 6.0, 8.0, 10.0, 12.0])
    result = stats.paired_ratio(baseline / 2, baseline, np.random.default_rng(0))
    assert result["ratio"] == pytest.approx(0.5)
    assert (result["low"], result["high"]) == (pytest.approx(0.5), pytest.approx(0.5))
    # six negative differences: the exact two-sided signed-rank p is 2 / 2**6
    assert result["p"] == pytest.approx(2 / 64)


def test_paired_ratio_is_the_geometric_mean_of_the_per_seed_ratios():
    result = stats.paired_ratio([1.0, 4.0], [2.0, 2.0], np.random.default_rng(0))  # ratios 0.5 and 2
    assert result["ratio"] == pytest.approx(1.0)
    assert (result["low"], result["high"]) == (pytest.approx(0.5), pytest.approx(2.0))


def test_wilcoxon_against_the_exact_distribution_by_hand():
    # differences 1, 2, 3, -4, 5: ranks 1..5, the negative rank sum is 4. Of the 2**5 sign patterns,
    # 7 have a rank sum <= 4 ({}, {1}, {2}, {3}, {4}, {1,2}, {1,3}): two-sided p = 2 * 7/32
    assert stats.wilcoxon_p([1, 2, 3, -4, 5]) == pytest.approx(14 / 32)


def test_wilcoxon_of_no_difference_is_one():
    assert stats.wilcoxon_p([0.0, 0.0, 0.0]) == 1.0
    assert math.isnan(stats.wilcoxon_p([]))


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 times 3, 2, 1 = 0.03, 0.06, 0.04 -> running max 0.03, 0.06, 0.06
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    adjusted = stats.holm([0.02, math.nan])
    assert adjusted[0] == pytest.approx(0.02) and math.isnan(adjusted[1])  # nan is not a test


@pytest.mark.parametrize("low, high, p, expected", [
    (0.8, 0.95, 0.01, "better"), (1.05, 1.2, 0.01, "worse"), (0.8, 1.1, 0.01, "undecided"),
    (0.8, 0.95, 0.2, "undecided"), (math.nan, math.nan, math.nan, "undecided")])
def test_verdict_needs_the_interval_and_the_test(low, high, p, expected):
    assert stats.verdict(low, high, p) == expected


def test_equivalence_needs_both_one_sided_tests_inside_the_margin():
    rng = np.random.default_rng(0)
    centred = np.log(1 + 0.005 * rng.standard_normal(10))  # within 1%: inside a 1.05 margin on both sides
    assert stats.tost_p(centred, 1.05) < 0.01
    noise = rng.standard_normal(10)
    near_upper = math.log(1.05) + 0.01 * (noise - noise.mean())  # mean on the upper bound: that side cannot pass
    assert stats.tost_p(near_upper, 1.05) > 0.05
    assert stats.tost_p(near_upper, 1.10) < 0.05  # the same data inside a wider stated margin
    assert stats.tost_p(-near_upper, 1.05) > 0.05  # and the lower side alone fails the same way
    assert math.isnan(stats.tost_p([0.0], 1.05))
    with pytest.raises(ValueError, match="margin"):
        stats.tost_p(centred, 0.95)


def test_only_an_equivalence_test_says_the_same():
    assert stats.verdict(0.98, 1.02, 0.9) == "undecided"  # not significant is not "the same"
    assert stats.verdict(0.98, 1.02, 0.9, equivalence_p=0.01, margin=1.05) == "the same within 1.05x"
    assert stats.verdict(0.98, 1.02, 0.9, equivalence_p=0.2, margin=1.05) == "undecided"
    assert stats.verdict(0.93, 1.02, 0.9, equivalence_p=0.01, margin=1.05) == "undecided"  # CI leaves the margin


def test_a_drift_that_slows_the_run_and_its_yardstick_alike_cancels():
    rng = np.random.default_rng(0)
    torch = [rng.normal(10, 0.1, 20) for _ in range(6)]
    drift = [1.0, 1.3, 0.8, 1.2, 1.1, 0.9]  # the host's speed when each baseline run was made
    baseline = [t * 0.5 * d for t, d in zip(torch, drift)]
    baseline_torch = [t * d for t, d in zip(torch, drift)]
    method = [t * 0.25 for t in torch]  # twice as fast as the baseline, timed at speed 1
    found = stats.paired_ratio_with_readings(baseline, method, rng, method_scale=baseline_torch, baseline_scale=torch)
    assert found["ratio"] == pytest.approx(2.0, rel=0.02) and found["low"] > 1.9 and found["high"] < 2.1
    raw = stats.paired_ratio_with_readings(baseline, method, np.random.default_rng(0))
    assert raw["high"] - raw["low"] > 5 * (found["high"] - found["low"])


# ---- censoring -------------------------------------------------------------------------------------
def test_kaplan_meier_median_counts_censored_runs():
    # reached at 3, 5 and 8 measurements; two runs stopped at 10 without reaching. Survival:
    # 4/5 = 0.8 after 3, 0.8 * 3/4 = 0.6 after 5, 0.6 * 2/3 = 0.4 after 8 -> the median is 8.
    # Dropping the censored runs would say 5.
    result = stats.kaplan_meier_median([3, 5, 8, 10, 10], [True, True, True, False, False])
    assert result["median"] == 8 and result["reached"] == 3 and result["n"] == 5
    assert result["low"] <= 8 and (result["high"] is None or result["high"] >= 8)


def test_kaplan_meier_median_not_reached_is_a_lower_bound():
    result = stats.kaplan_meier_median([10, 12, 12, 7], [True, False, False, False])
    # the run censored at 7 leaves 3 at risk at 10: survival 2/3 after it, never at or below 0.5
    assert result["median"] is None and result["at_least"] == 12
    none = stats.kaplan_meier_median([64, 64], [False, False])
    assert none["median"] is None and none["reached"] == 0 and none["at_least"] == 64


def test_the_bootstraps_fast_medians_equal_numpys_and_scipys_bit_for_bit():
    rng = np.random.default_rng(1)
    for trial in range(2000):
        n = int(rng.integers(1, 12))
        times = rng.integers(1, 6, size=n).astype(float) if trial % 2 else rng.exponential(size=n)  # ties, none
        reached = rng.random(n) < 0.6
        assert stats.kaplan_meier_point(times, reached) == stats.kaplan_meier_median(times, reached)["median"]
        values = rng.normal(size=int(rng.integers(1, 9)))
        assert stats.small_median(values) == float(np.median(values))
    assert stats.kaplan_meier_point([3, 5, 8, 10, 10], [True, True, True, False, False]) == 8
    assert stats.kaplan_meier_point([64, 64], [False, False]) is None
    assert np.isnan(stats.small_median(np.array([1.0, np.nan])))


def test_logrank_tells_a_faster_group_apart():
    fast = ([1, 2, 2, 3, 3, 4, 4, 5], [True] * 8)
    slow = ([20, 25, 30, 30, 30, 30, 30, 30], [True, True, True, False, False, False, False, False])
    assert stats.logrank_p(*fast, *slow) < 0.01
    assert stats.logrank_p(*fast, *fast) == pytest.approx(1.0)
    assert math.isnan(stats.logrank_p([5], [False], [5], [False]))
