"""The study's pre-registered analysis (tuning/study/analysis.py): intervals and tests against scipy,
TOST, Holm, O'Brien-Fleming spending, withholding, stratification, plan checks and the false-positive rate."""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
from scipy import stats

from tuning.study.analysis import (
    WITHHELD,
    Claim,
    Plan,
    censored_row,
    described_ratio,
    family_table,
    holm,
    markdown,
    obrien_fleming_alpha,
    plan_problems,
    ratio_row,
)

DIFF = Claim("tuned", "default", "difference", None)


def plan(claims=(DIFF,), controls=(), alpha=0.05, min_blocks=3, planned_blocks=10, interim="none") -> Plan:
    return Plan(claims=tuple(claims), controls=tuple(controls), alpha=alpha, min_blocks=min_blocks,
                planned_blocks=planned_blocks, interim=interim)


def blocks_from(log_ratios, hosts=None, arm="tuned", baseline="default", rng=None):
    rng = rng if rng is not None else np.random.default_rng(0)
    hosts = hosts if hosts is not None else ["cpu"] * len(log_ratios)
    out = []
    for i, (r, h) in enumerate(zip(log_ratios, hosts)):
        base = float(rng.uniform(0.001, 0.01))
        out.append({"block": f"b{i}", "host_kind": h, "final": {baseline: base, arm: base * math.exp(r)}})
    return out


def test_the_t_interval_and_p_match_scipy_on_the_log_ratios():
    rng = np.random.default_rng(1)
    base = rng.uniform(0.001, 0.01, 12)
    arm = base * np.exp(rng.normal(-0.05, 0.08, 12))
    row = ratio_row(arm, base, ["cpu"] * 12, DIFF, 0.05)
    logs = np.log(arm / base)
    ref = stats.ttest_1samp(logs, 0.0)
    ci = ref.confidence_interval(0.95)
    assert row.headline == "plain" and row.stratified is None and row.n == 12
    assert row.plain.ratio == pytest.approx(math.exp(logs.mean()), rel=1e-12)
    assert (row.plain.low, row.plain.high) == pytest.approx((math.exp(ci.low), math.exp(ci.high)), rel=1e-10)
    assert row.plain.p == pytest.approx(ref.pvalue, rel=1e-10)
    assert row.plain.df == 11
    assert row.hosts[0].kind == "cpu" and row.hosts[0].n == 12
    # level 1 - alpha follows alpha
    ci90 = ref.confidence_interval(0.90)
    row90 = ratio_row(arm, base, ["cpu"] * 12, DIFF, 0.10)
    assert (row90.plain.low, row90.plain.high) == pytest.approx((math.exp(ci90.low), math.exp(ci90.high)), rel=1e-10)


def test_a_described_ratio_is_the_claims_interval_without_a_claim():
    rng = np.random.default_rng(3)
    base = rng.uniform(0.1, 1.0, 6)
    arm = base * np.exp(rng.normal(-0.2, 0.1, 6))
    row = ratio_row(arm, base, ["cpu"] * 6, DIFF, 0.05)
    assert described_ratio(arm, base, 0.05) == pytest.approx((row.plain.ratio, row.plain.low, row.plain.high))
    for bad in (([1.0], [1.0]), ([1.0, 2.0], [1.0]), ([1.0, 0.0], [1.0, 1.0]), ([1.0, math.nan], [1.0, 1.0])):
        with pytest.raises(ValueError):
            described_ratio(*bad, 0.05)


def test_a_censored_measure_is_compared_by_signs_and_the_median():
    """Measurements to target: half the baseline's in every block is a sign test's 10 of 10 (p = 2 / 2^10)
    and an interval of the median from its 2nd smallest to 2nd largest log ratio (P(Bin(10, 1/2) <= 1)
    = 0.0107 <= 0.025 < P(<= 2)); a both-censored block is left out, a censored arm counted at its spend."""
    faster = Claim("tuned", "default", "difference", None, "to_target")
    arm = [(float(n), False) for n in range(10, 20)]
    base = [(2.0 * n, False) for n in range(10, 20)]
    row = censored_row(arm, base, ["cpu"] * 10, faster, 0.05)
    assert row.n == 10 and row.plain.ratio == pytest.approx(0.5) and (row.plain.low, row.plain.high) == pytest.approx((0.5, 0.5))
    assert row.plain.p == pytest.approx(2 / 2**10) == stats.binomtest(0, 10, 0.5).pvalue and row.verdict == "arm faster"
    mixed = censored_row([(64.0, True), (64.0, True), (10.0, False), (30.0, False)],
                         [(64.0, True), (20.0, False), (40.0, False), (20.0, False)], ["cpu"] * 4, faster, 0.05)
    assert mixed.n == 3  # the block both arms missed says nothing of the ratio
    assert mixed.plain.ratio == pytest.approx(1.5)  # log ratios log(64/20), log(10/40), log(30/20): the median
    assert mixed.plain.p == pytest.approx(stats.binomtest(2, 3, 0.5).pvalue) and mixed.verdict == "undecided"
    assert (mixed.plain.low, mixed.plain.high) == (0.0, math.inf)  # 3 blocks cannot bound a median at 95%
    same = Claim("tuned", "default", "equivalence", 1.05, "to_target")
    close = censored_row([(100.0 + i % 3, False) for i in range(12)], [(100.0, False)] * 12, ["cpu"] * 12, same, 0.05)
    assert close.plain.p == pytest.approx(2 ** -12) and close.verdict == "equivalent within margin 1.05"
    far = censored_row([(120.0, False)] * 12, [(100.0, False)] * 12, ["cpu"] * 12, same, 0.05)
    assert far.plain.p == 1.0 and far.verdict == "not shown equivalent"


def test_a_censored_claim_reads_its_measure_from_the_blocks_and_keeps_the_final_latency_s_look():
    claim = Claim("tuned", "default", "difference", None, "to_target")
    blocks = [{"block": f"b{i}", "host_kind": "cpu", "final": {"tuned": 1.0, "default": 1.0},
               "to_target": {"tuned": [10.0, False], "default": [30.0, False]}} for i in range(9)]
    blocks.append({"block": "old", "host_kind": "cpu", "final": {"tuned": 1.0, "default": 1.0}})  # says nothing of it
    blocks.append({"block": "cut", "host_kind": "cpu", "final": {"tuned": None, "default": 1.0},
                   "to_target": {"tuned": [1.0, False], "default": [99.0, False]}})  # incomplete: left out
    table = family_table(plan(claims=[claim], min_blocks=3, planned_blocks=11), blocks)
    [row] = table.claims
    assert table.n_blocks == 10 and row.n == 9 and row.plain.ratio == pytest.approx(1 / 3)
    assert row.verdict == "arm faster" and "(measurements to target)" in markdown(table)
    assert "tuned / default, difference" in markdown(family_table(plan(min_blocks=3, planned_blocks=11), blocks))


def test_the_interval_of_a_median_covers_it_at_least_95_percent():
    rng = np.random.default_rng(4)
    covered = 0
    for _ in range(400):
        logs = rng.normal(0.2, 0.3, 12)
        row = censored_row([(math.exp(x), False) for x in logs], [(1.0, False)] * 12, ["cpu"] * 12,
                           Claim("tuned", "default", "difference", None, "to_target"), 0.05)
        covered += row.plain.low <= math.exp(0.2) <= row.plain.high
    assert covered / 400 >= 0.95


def test_the_interval_covers_the_true_ratio_about_95_percent():
    rng = np.random.default_rng(2)
    true = 0.9
    covered = 0
    for _ in range(1000):
        base = rng.uniform(0.001, 0.01, 8)
        arm = base * true * np.exp(rng.normal(0, 0.1, 8))
        row = ratio_row(arm, base, ["cpu"] * 8, DIFF, 0.05)
        covered += row.plain.low <= true <= row.plain.high
    assert 0.93 <= covered / 1000 <= 0.97


def test_tost_within_and_outside_the_margin():
    eq = Claim("tuned", "default", "equivalence", 1.1)
    rng = np.random.default_rng(3)
    base = rng.uniform(0.001, 0.01, 20)
    inside = base * np.exp(rng.normal(0.0, 0.03, 20))
    row = ratio_row(inside, base, ["cpu"] * 20, eq, 0.05)
    logs = np.log(inside / base)
    p_low = stats.ttest_1samp(logs, -math.log(1.1), alternative="greater").pvalue
    p_high = stats.ttest_1samp(logs, math.log(1.1), alternative="less").pvalue
    assert row.plain.p == pytest.approx(max(p_low, p_high), rel=1e-10)
    assert row.plain.p < 0.05 and row.verdict == "equivalent within margin 1.1"
    outside = base * np.exp(rng.normal(0.2, 0.03, 20))  # about 22% slower: beyond the 10% margin
    row = ratio_row(outside, base, ["cpu"] * 20, eq, 0.05)
    assert row.plain.p > 0.5 and row.verdict == "not shown equivalent"


def test_holm_against_a_hand_computation():
    # sorted 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> raised to 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_the_table_adjusts_claims_and_controls_as_two_families():
    rng = np.random.default_rng(4)
    claims = (Claim("a", "base", "difference", None), Claim("b", "base", "difference", None))
    controls = (Claim("base2", "base", "equivalence", 1.05),)
    blocks = []
    for i in range(10):
        base = float(rng.uniform(0.001, 0.01))
        blocks.append({"block": i, "host_kind": "cpu",
                       "final": {"base": base, "a": base * math.exp(rng.normal(-0.1, 0.05)),
                                 "b": base * math.exp(rng.normal(0.0, 0.05)),
                                 "base2": base * math.exp(rng.normal(0.0, 0.01))}})
    blocks.append({"block": "lost", "host_kind": "cpu", "final": {"base": 0.002, "a": 0.001}})
    table = family_table(plan(claims, controls, planned_blocks=10), blocks)
    assert table.n_blocks == 10 and table.incomplete == ("lost",) and table.look == "final"
    raw = [row.estimate.p for row in table.claims]
    assert [row.p_adjusted for row in table.claims] == pytest.approx(holm(raw))
    assert table.controls[0].p_adjusted == pytest.approx(table.controls[0].estimate.p)  # a family of one
    assert table.claims[0].verdict == "arm faster"
    assert table.controls[0].verdict == "equivalent within margin 1.05"
    text = markdown(table)
    assert "2 claim(s), 1 control(s)" in text and "final look" in text and "lost" in text


def test_obrien_fleming_alpha():
    half = 2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - 0.025) / math.sqrt(0.5))
    assert obrien_fleming_alpha(0.05, 0.5) == pytest.approx(half, rel=1e-12)
    assert obrien_fleming_alpha(0.05, 0.5) == pytest.approx(0.00557, abs=1e-5)
    assert obrien_fleming_alpha(0.05, 1.0) == pytest.approx(0.05, rel=1e-12)
    assert 2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - 0.025)) == pytest.approx(0.05)  # the formula at t = 1 is alpha
    table = family_table(plan(planned_blocks=10, interim="obrien_fleming"), blocks_from([-0.1, -0.12, -0.08, -0.11, -0.09]))
    assert table.look == "interim" and table.information == 0.5
    assert table.look_alpha == pytest.approx(half) and table.claims[0].alpha == pytest.approx(half)
    assert "interim look" in markdown(table) and "O'Brien-Fleming alpha at this look 0.00557" in markdown(table)
    full = family_table(plan(planned_blocks=5, interim="obrien_fleming"), blocks_from([-0.1, -0.12, -0.08, -0.11, -0.09]))
    assert full.look == "final" and full.look_alpha == 0.05


def test_estimates_are_withheld_below_min_blocks():
    eq = Claim("other", "default", "equivalence", 1.2)
    blocks = blocks_from([-0.3, -0.31, -0.29, -0.3], hosts=["a100", "a100", "h100", "h100"])
    for b in blocks:
        b["final"]["other"] = b["final"]["default"] * 1.01
    table = family_table(plan((DIFF,), (eq,), min_blocks=5), blocks)
    assert table.withheld and table.n_blocks == 4
    for row in (*table.claims, *table.controls):
        assert row.withheld == WITHHELD and row.verdict == WITHHELD
        assert row.plain is None and row.stratified is None and row.p_adjusted is None
        assert all(h.ratio is None for h in row.hosts)
    text = markdown(table)
    body = [line for line in text.splitlines() if line.startswith("| ") and "family" not in line]
    assert len(body) == 2 and all(line.count("withheld") >= 3 for line in body)
    for line in body:
        stripped = line.replace("±1.2", "")  # the plan's margin, not a result
        assert not re.search(r"\d\.\d|\de-\d|nan|inf", stripped), line
    assert "every estimate withheld: 4 complete block(s) < min_blocks 5" in text


def test_stratified_interval_is_narrower_when_host_kinds_differ_by_a_constant_factor():
    rng = np.random.default_rng(5)
    n = 16
    hosts = ["a100"] * (n // 2) + ["h100"] * (n // 2)
    shift = np.where(np.array(hosts) == "a100", math.log(0.8), math.log(0.95))  # the arm gains more on a100
    logs = shift + rng.normal(0, 0.02, n)
    base = rng.uniform(0.001, 0.01, n)
    row = ratio_row(base * np.exp(logs), base, hosts, DIFF, 0.05)
    assert row.headline == "stratified" and row.estimate is row.stratified
    strat, plain = row.stratified, row.plain
    assert strat.ratio == pytest.approx(plain.ratio)  # weighted by stratum size: the same point
    assert strat.df == n - 2
    assert strat.high - strat.low < 0.5 * (plain.high - plain.low)
    assert {h.kind: h.n for h in row.hosts} == {"a100": 8, "h100": 8}
    assert row.hosts[0].ratio == pytest.approx(0.8, rel=0.03) and row.hosts[1].ratio == pytest.approx(0.95, rel=0.03)
    within = sum(((logs[i:i + 8] - logs[i:i + 8].mean()) ** 2).sum() for i in (0, 8)) / (n - 2)
    assert strat.se == pytest.approx(math.sqrt(within / n))
    assert row.heterogeneity_p == pytest.approx(stats.f_oneway(logs[:8], logs[8:]).pvalue, rel=1e-8)
    assert row.heterogeneity_p < 1e-6
    text = markdown(family_table(plan(), blocks_from(logs, hosts)))
    assert "stratified" in text and "a100 ×8" in text


def test_plan_problems_name_their_keys():
    assert plan_problems(plan()) == []
    bad = Plan(claims=(Claim("a", "a", "difference", None), Claim("b", "base", "equivalence", 1.0)),
               controls=(Claim("c", "base", "difference", 1.1), Claim("d", "base", "superiority", None)),
               alpha=0.5, min_blocks=1, planned_blocks=0, interim="pocock")
    problems = plan_problems(bad)
    for key in ("analysis.alpha", "analysis.min_blocks", "analysis.planned_blocks", "analysis.interim",
                "analysis.claims[0].arm", "analysis.claims[1].margin", "analysis.controls[0].margin",
                "analysis.controls[1].kind"):
        assert any(p.startswith(key + ":") for p in problems), (key, problems)
    assert any(p.startswith("analysis.claims:") for p in plan_problems(plan(claims=())))
    assert any("planned_blocks" in p for p in plan_problems(plan(min_blocks=5, planned_blocks=4)))
    with pytest.raises(ValueError, match="analysis.alpha"):
        family_table(plan(alpha=0.0), blocks_from([0.0, 0.1, 0.2]))


def test_bad_blocks_are_refused():
    with pytest.raises(ValueError, match="twice"):
        family_table(plan(), [*blocks_from([0.0, 0.1]), *blocks_from([0.0])])
    with pytest.raises(ValueError, match="not > 0"):
        family_table(plan(), [{"block": 1, "host_kind": "cpu", "final": {"tuned": 0.0, "default": 1.0}}])
    with pytest.raises(ValueError, match="host_kind"):
        family_table(plan(), [{"block": 1, "final": {"tuned": 1.0, "default": 1.0}}])
    with pytest.raises(ValueError, match="at least 2"):
        ratio_row([1.0], [1.0], ["cpu"], DIFF, 0.05)


@pytest.mark.parametrize("hosts", [["cpu"] * 10, ["a100", "h100"] * 5], ids=["plain", "stratified"])
def test_false_positive_rate_at_a_true_ratio_of_one(hosts):
    rng = np.random.default_rng(6)
    host_factor = np.where(np.array(hosts) == "h100", 0.5, 1.0)  # the host scales both arms alike
    study = plan(min_blocks=2, planned_blocks=10)
    positives = 0
    for _ in range(2000):
        base = rng.uniform(0.001, 0.01, 10) * host_factor
        arm = base * np.exp(rng.normal(0.0, 0.1, 10))
        blocks = [{"block": i, "host_kind": h, "final": {"default": b, "tuned": a}}
                  for i, (h, b, a) in enumerate(zip(hosts, base, arm))]
        positives += family_table(study, blocks).claims[0].verdict != "undecided"
    assert 0.03 <= positives / 2000 <= 0.07


def test_group_sequential_levels_spend_alpha_over_the_looks_together():
    from tuning.study.analysis import group_sequential_levels

    assert group_sequential_levels(0.05, [1.0]) == pytest.approx([0.05])
    levels = group_sequential_levels(0.05, [0.5, 1.0])
    assert levels[0] == pytest.approx(obrien_fleming_alpha(0.05, 0.5), rel=1e-9)  # the first look: what it spends
    assert 0.046 < levels[1] < 0.05  # the last look gives back what the first one spent, not all of alpha
    for fractions in ([0.5, 1.0], [1 / 3, 2 / 3, 1.0], [0.2, 0.4, 0.6, 0.8, 1.0]):
        bounds = stats.norm.isf(np.asarray(group_sequential_levels(0.05, fractions)) / 2)
        rng = np.random.default_rng(7)
        steps = rng.standard_normal((200_000, len(fractions))) * np.sqrt(np.diff([0.0, *fractions]))
        z = steps.cumsum(axis=1) / np.sqrt(fractions)  # the score process's Z at each look, under no difference
        crossed = np.abs(z) >= bounds
        first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), -1)
        assert crossed.any(axis=1).mean() == pytest.approx(0.05, abs=0.0025), fractions  # 5 SE of 200,000 draws
        spent = [obrien_fleming_alpha(0.05, t) for t in fractions]
        for k, increment in enumerate(np.diff([0.0, *spent])):
            assert (first == k).mean() == pytest.approx(increment, abs=0.0025), (fractions, k)


def test_a_declared_look_schedule_analyses_the_latest_look_s_blocks_at_its_exact_level():
    from tuning.study.analysis import group_sequential_levels

    scheduled = dataclasses.replace(plan(min_blocks=4, planned_blocks=10, interim="obrien_fleming"), looks=(5, 10))
    ratios = [-0.1, -0.12, -0.08, -0.11, -0.09, -0.1, -0.13]
    early = family_table(scheduled, blocks_from(ratios[:4]))
    assert early.withheld and early.look == "none yet" and "until the first planned look (5" in markdown(early)
    first = family_table(scheduled, blocks_from(ratios))  # 7 blocks: the look at 5 uses the first 5
    assert first.n_blocks == 5 and first.look == "interim"
    assert first.look_alpha == pytest.approx(group_sequential_levels(0.05, [0.5, 1.0])[0])
    assert "look 1 of the 2 planned" in markdown(first)
    last = family_table(scheduled, blocks_from(ratios + [-0.1, -0.1, -0.1]))
    assert last.look == "final" and last.look_alpha == pytest.approx(group_sequential_levels(0.05, [0.5, 1.0])[1])
    assert last.look_alpha < 0.05


@pytest.mark.parametrize("looks, says", [((5, 4, 10), "increasing"), ((2, 10), "before min_blocks"),
                                         ((5, 8), "the last look is at the planned 10")])
def test_a_bad_look_schedule_is_named(looks, says):
    bad = dataclasses.replace(plan(min_blocks=3, planned_blocks=10, interim="obrien_fleming"), looks=looks)
    assert any(p.startswith("analysis.looks") and says in p for p in plan_problems(bad)), plan_problems(bad)
    assert any("interim obrien_fleming" in p for p in plan_problems(dataclasses.replace(bad, interim="none",
                                                                                      looks=(5, 10))))
