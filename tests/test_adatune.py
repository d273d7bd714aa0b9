"""AdaTune (Li et al. 2020): the CV stop rule, expected improvement, contextual eps, and the three
pieces together in the loop on the synthetic hardware."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm
from sklearn.ensemble import RandomForestRegressor

from tuning.core.measure import CVStop, MeasureSpec
from tuning.core.task import gemm_task
from tuning.cost_model.rf import RandomForestCostModel, expected_improvement
from tuning.engine.loop import Components, RunInfo, tune_task
from tuning.evaluator.adaptive import AdaptiveEvaluator
from tuning.evaluator.fixed import FixedEvaluator
from tuning.hardware.synthetic import SyntheticHardware
from tuning.sampler.base import random_unvisited
from tuning.sampler.greedy import GreedySampler
from tuning.search.csa import ContextualSimulatedAnnealing
from tuning.tracking.base import NoTracker

TASK = gemm_task("g", 128, 128, 128)
PAPER = CVStop(micro_batch=50, max_batches=10, min_batches=3, cv_threshold=0.1)
CODE = CVStop(micro_batch=50, max_batches=10, min_batches=3, cv_threshold=0.1, statistic="per_batch",
              drop_extremes=True)


def batches_taken(rule: CVStop, stream) -> int:
    """Feed micro-batch costs one by one, as the run worker does; how many were timed."""
    costs = []
    for cost in stream:
        if rule.finished(costs):
            break
        costs.append(cost)
    return len(costs)


# ---- the stop rule on hand-made timing streams ---------------------------------------------
def test_a_steady_kernel_stops_after_min_batches():
    assert batches_taken(PAPER, [1e-3] * 20) == 3
    assert not PAPER.finished([1e-3, 1e-3])  # never before min_batches, although the CV is 0


def test_cv_of_the_running_throughput_by_hand():
    # Perf_i = i / Time(i): 1/1, 2/3, 3/4 -> mean 0.80556, population std 0.14164, CV 0.17583
    assert PAPER.coefficient_of_variation([1.0, 2.0, 1.0]) == pytest.approx(0.17583, abs=1e-5)
    assert not PAPER.finished([1.0, 2.0, 1.0])
    # 1/1, 2/2.3, 3/3.1 -> CV 0.0587: the running throughput smooths one slow batch away...
    assert PAPER.coefficient_of_variation([1.0, 1.3, 0.8]) == pytest.approx(0.05866, abs=1e-5)
    assert PAPER.finished([1.0, 1.3, 0.8])
    # ...the code's per-batch throughput does not: 1, 1/1.3, 1/0.8 -> CV 0.19508
    assert CODE.coefficient_of_variation([1.0, 1.3, 0.8]) == pytest.approx(0.19508, abs=1e-5)
    assert not CODE.finished([1.0, 1.3, 0.8])


def test_the_code_drops_the_extremes_only_beyond_four_batches():
    spike = [1.0, 1.0, 1.0, 1.0, 10.0]
    assert CODE.finished(spike)  # 10.0 dropped (with the fastest 1.0): CV 0
    no_drop = CVStop(statistic="per_batch", drop_extremes=False)
    assert not no_drop.finished(spike)
    assert not CODE.finished([1.0, 1.0, 10.0, 1.0])  # four batches: nothing dropped yet


def test_a_kernel_that_never_settles_gets_every_run():
    alternating = [1.0, 3.0] * 10
    assert batches_taken(CVStop(statistic="per_batch"), alternating) == 10
    assert batches_taken(CVStop(max_batches=4, statistic="per_batch"), alternating) == 4


def test_a_lower_threshold_measures_longer():
    rng = np.random.default_rng(0)
    stream = list(1e-3 * (1 + 0.3 * rng.standard_normal(10)).clip(0.2))
    taken = [batches_taken(CVStop(cv_threshold=t, statistic="per_batch"), stream) for t in (0.5, 0.2, 0.05)]
    assert taken == sorted(taken) and taken[0] < taken[-1], taken


# ---- the evaluator on the synthetic hardware -------------------------------------------------
def configs(hardware, count=20):
    space = hardware.space(TASK)
    rng = np.random.default_rng(0)
    return list(dict.fromkeys(space.canonical(space.sample(rng)) for _ in range(count)))


def test_adaptive_spends_fewer_run_seconds_than_the_deterministic_evaluator():
    for noise, max_mean_batches in ((0.0, 3.0), (0.3, 10.0)):
        hardware = SyntheticHardware(noise=noise)
        batch = configs(hardware)
        adaptive = AdaptiveEvaluator().measure(hardware, TASK, batch)
        fixed = FixedEvaluator(number=50, repeat=10, min_repeat_ms=0).measure(hardware, TASK, batch)
        ok = [(a, f) for a, f in zip(adaptive, fixed) if a.ok]
        assert all(3 <= len(a.costs) <= 10 and len(f.costs) == 10 for a, f in ok)
        assert all(a.costs == f.costs[:len(a.costs)] for a, f in ok)  # the same stream, cut short
        assert np.mean([len(a.costs) for a, _ in ok]) <= max_mean_batches
        assert sum(a.run_s for a, _ in ok) < sum(f.run_s for _, f in ok)
        assert sum(f.run_s for _, f in ok) == pytest.approx(sum(50 * sum(f.costs) for _, f in ok))


def test_remeasure_has_no_early_stop():
    hardware = SyntheticHardware()
    batch = [c for c, r in zip(configs(hardware), AdaptiveEvaluator().measure(hardware, TASK, configs(hardware)))
             if r.ok][:2]
    assert [len(r.costs) for r in AdaptiveEvaluator(final_repeat=7).remeasure(hardware, TASK, batch)] == [7, 7]


def test_spec_without_the_rule_is_the_deterministic_evaluator():
    spec = AdaptiveEvaluator(runs=500, micro_batch=50).spec
    assert (spec.number, spec.repeat, spec.min_repeat_ms) == (50, 10, 0) and spec.cv_stop.max_batches == 10
    assert AdaptiveEvaluator(runs=120, micro_batch=50).rule.max_batches == 2  # never more than `runs`


# ---- expected improvement (eq. 1-2) ----------------------------------------------------------
def test_expected_improvement_by_hand():
    mean = np.array([1.2, 1.0, 0.7, 1.3, 0.7, 0.5])
    std = np.array([0.1, 0.2, 0.1, 0.0, 0.0, 1e-12])
    ei = expected_improvement(mean, std, best=1.0)
    assert ei[0] == pytest.approx(0.2 * norm.cdf(2.0) + 0.1 * norm.pdf(2.0))  # 0.200849
    assert ei[0] == pytest.approx(0.200849, abs=1e-6)
    assert ei[1] == pytest.approx(0.2 / math.sqrt(2 * math.pi))  # Z = 0: sigma phi(0)
    assert ei[2] == pytest.approx(-0.3 * norm.cdf(-3.0) + 0.1 * norm.pdf(-3.0))
    assert ei[3] == pytest.approx(0.3)  # sigma = 0: the certain improvement...
    assert ei[4] == 0.0  # ...or none, never negative
    assert ei[5] == 0.0 and np.all(ei >= 0)


def test_rf_predicts_ei_from_the_trees_spread():
    hardware = SyntheticHardware()
    space = hardware.space(TASK)
    rng = np.random.default_rng(1)
    batch = [space.sample(rng) for _ in range(80)]
    y = np.array([r.gflops(TASK.flops) for r in hardware.measure(TASK, batch, MeasureSpec())])
    model = RandomForestCostModel(seed=3).fit(space.features(batch), y)
    X = space.features([space.sample(rng) for _ in range(30)])
    per_tree = np.stack([t.predict(X) for t in model.forest.estimators_])
    mean, std = model.predict_dist(X)
    assert np.allclose(mean, per_tree.mean(axis=0)) and np.allclose(std, per_tree.std(axis=0))
    assert np.allclose(model.predict(X), expected_improvement(mean, std, 1.0))
    model.acquisition = "mean"
    assert np.allclose(model.predict(X), mean)


# ---- contextual eps (eq. 3) ------------------------------------------------------------------
def test_eps_t_is_the_mean_std_of_k_unmeasured_configs_over_the_best_measured():
    hardware = SyntheticHardware()
    space = hardware.space(TASK)
    rng = np.random.default_rng(2)
    measured = list(dict.fromkeys(space.canonical(space.sample(rng)) for _ in range(60)))
    y = np.array([r.gflops(TASK.flops) for r in hardware.measure(TASK, measured, MeasureSpec())])
    model = RandomForestCostModel(seed=5).fit(space.features(measured), y)
    search = ContextualSimulatedAnnealing(uncertainty_samples=20)
    visited = set(measured)
    eps, _ = search._contextual_eps(space, model, visited, np.random.default_rng(9))

    # by hand: the same 20 draws; the trees' std in GFLOP/s; eq. 3 with Perf(p*) = max y. (The forest
    # is fit on y / max y, as the model does: split ties on a rescaled target can break differently.)
    draw_rng, unmeasured = np.random.default_rng(9), []
    for _ in range(20):
        unmeasured.append(random_unvisited(space, visited, unmeasured, draw_rng))
    forest = RandomForestRegressor(n_estimators=10, max_features=10, random_state=5)
    forest.fit(space.features(measured), y / y.max())
    gflops = np.stack([t.predict(space.features(unmeasured)) * y.max() for t in forest.estimators_])
    assert eps == pytest.approx(gflops.std(axis=0).mean() / y.max(), rel=1e-6)
    assert 0 < eps < 1


def test_eps_t_starts_at_initial_eps_and_replaces_greedy_eps():
    hardware = SyntheticHardware()
    space = hardware.space(TASK)
    search = ContextualSimulatedAnnealing(n_iter=20, initial_eps=0.05)
    search.propose(space, RandomForestCostModel(), 32, set(), np.random.default_rng(0))
    assert search.exploration() == 0.05  # an unfitted forest has no spread
    candidates = configs(hardware, 40)[:16]
    greedy = GreedySampler(eps=0.05)
    assert greedy.select(candidates, space, set(), 16, np.random.default_rng(0), exploration=0.0) == candidates
    explored = greedy.select(candidates, space, set(), 16, np.random.default_rng(0), exploration=1.0)
    assert len(explored) == 16 and len(set(explored) & set(candidates)) <= 1


# ---- the three together in the loop ----------------------------------------------------------
class Metrics(NoTracker):
    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, dict(metrics)))


def test_adatune_in_the_loop_logs_eps_and_batches(tmp_path):
    tracker = Metrics()
    parts = Components(ContextualSimulatedAnnealing(n_iter=50), GreedySampler(), AdaptiveEvaluator(),
                       RandomForestCostModel(), SyntheticHardware(noise=0.1), tracker)
    run = RunInfo(seed=0, out_dir=tmp_path, method="csa+greedy", trials=96, plan_size=32)
    outcome = tune_task(TASK, parts, run)
    assert len(outcome.records) == 96 and outcome.best_cost < math.inf
    assert all(3 <= len(r.result.costs) <= 10 for r in outcome.records if r.result.ok)
    rounds = [m for _, m in tracker.logged if "search/eps" in m]
    assert len(rounds) == 3 and rounds[0]["search/eps"] != rounds[-1]["search/eps"]
    assert all(0 < m["search/eps"] <= 1 and 3 <= m["evaluator/batches"] <= 10 for m in rounds)


# ---- the ablation table (a preset of tuning.tools.compare) ----------------------------------------
def test_table_compares_each_adaptive_row_with_its_deterministic_twin(experiment_script):
    from tuning.tools.compare import Curve, TaskTruth, compare

    table = experiment_script("adatune_table")
    curves, metrics = [], {}
    for method, run_s in (("XGB+SA+DE", 40.0), ("RFEI+CSA+DE", 50.0), ("RFEI+CSA+AE", 15.0)):
        for seed in range(8):  # 8 seeds: the exact p 2/2**8, Holm-doubled over the two metrics, is < 0.05
            curves.append(Curve("conv_l8", method, seed, f"{method}{seed}", np.array([200e-6, 100e-6]),
                                np.array([1.0, 2.0]), "readings"))
            metrics[(method, seed)] = {"run/run_s": run_s * (1 + 0.01 * seed), "run/tuning_wall_s": 100.0}
    result = compare(curves, {"conv_l8": TaskTruth({}, 100e-6, "readings")}, table.BASELINE, budgets=(2,),
                     run_metrics=metrics, metric_keys=table.METRICS)
    lines = table.against_deterministic(result)
    assert lines[0] == "RFEI+CSA+AE vs RFEI+CSA+DE:"
    run_s = next(line for line in lines if "run/run_s" in line)
    assert "0.300x" in run_s and run_s.endswith("-> better")  # 15 / 50 s on every seed
    assert table.ROWS["rf+csa+adaptive"] == "RFEI+CSA+AE" and table.BASELINE == table.ROWS["xgb+sa+adatune_de"]
