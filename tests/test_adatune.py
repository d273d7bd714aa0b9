"""AdaTune (Li et al. 2020): the CV stop rule, expected improvement, contextual eps, and the three
pieces together in the loop on the synthetic hardware; AutoTVM's rank loss (cost_model=xgb_rank) and
its diversity-aware selection, slow kernels under the run worker's rule, and the rows of
conf/experiment/adatune_row/."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm
from sklearn.ensemble import RandomForestRegressor

from test_chameleon import grid_space
from test_loop import finish, run_py
from tuning.core.measure import CVStop, MeasureSpec
from tuning.core.task import gemm_task
from tuning.cost_model.rf import RandomForestCostModel, expected_improvement
from tuning.cost_model.xgb import XGBoostCostModel, top_n_recall
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


# ---- cost_model=xgb_rank ---------------------------------------------------------------------------
def test_top_n_recall_by_hand():
    labels = [5.0, 4.0, 3.0, 2.0, 1.0]
    assert top_n_recall([9, 8, 7, 0, 0], labels, 3) == 1.0
    assert top_n_recall([0, 8, 7, 9, 0], labels, 3) == pytest.approx(2 / 3)  # config 3 is not a top-3 one
    assert top_n_recall([1, 2, 3], [3.0, 2.0, 1.0], 1) == 0.0  # reversed: the best is predicted worst
    assert top_n_recall([1, 2], [2.0, 1.0], 64) == 1.0  # n above the sample size: all of them


def test_xgb_rank_orders_a_hand_made_case():
    """Throughput falls with the first feature and rises a little with the second; the rank model
    must order unseen combinations as the formula does (its scores have no scale, only an order)."""
    rng = np.random.default_rng(0)
    X = rng.integers(0, 8, size=(120, 2)).astype(float)
    y = 100.0 / (1 + X[:, 0]) + 0.5 * X[:, 1]
    model = XGBoostCostModel(objective="rank:pairwise", early_stopping_rounds=20, recall_at=16).fit(X, y)
    probe = np.array([[0, 0], [1, 7], [3, 3], [7, 0]], dtype=float)  # true order: best first
    scores = model.predict(probe)
    assert list(np.argsort(-scores)) == [0, 1, 2, 3], scores
    assert model.booster.attr("best_iteration") is not None  # early stopping watched the recall


def test_xgb_rejects_an_unknown_objective():
    problems = XGBoostCostModel.check_params({"objective": "binary:logistic"}, "cost_model")
    assert problems and problems[0].startswith("cost_model.objective")

@pytest.mark.parametrize("objective", ["reg:squarederror", "rank:pairwise"])
def test_xgb_fits_the_trees_xgb_train_with_early_stopping_would(objective):
    import xgboost as xgb

    rng = np.random.default_rng(3)
    X = rng.integers(0, 8, size=(150, 4)).astype(float)
    y = 100.0 / (1 + X[:, 0]) + X[:, 1] * X[:, 2] + rng.normal(0, 1, 150)
    model = XGBoostCostModel(objective=objective, early_stopping_rounds=15, recall_at=16, seed=4).fit(X, y)
    train = xgb.DMatrix(X, label=y / y.max())
    stop = xgb.callback.EarlyStopping(rounds=15, save_best=True, maximize=model.ranks)
    reference = xgb.train(model._params(), train, num_boost_round=model.num_boost_round, evals=[(train, "train")],
                          verbose_eval=False, callbacks=[stop], custom_metric=model._recall if model.ranks else None)
    assert model.booster.num_boosted_rounds() == reference.num_boosted_rounds() < model.num_boost_round
    assert model.booster.attr("best_iteration") == reference.attr("best_iteration")
    probe = rng.integers(0, 8, size=(40, 4)).astype(float)
    assert np.array_equal(model.predict(probe), reference.inplace_predict(probe).astype(np.float64))


# ---- slow kernels: fewer runs, not a timeout (the run worker's rule) -------------------------------
def worker_spec(**fields) -> dict:
    from dataclasses import asdict

    rule = fields.pop("rule", None)
    return asdict(MeasureSpec(**{"number": 50, "repeat": 10, "min_repeat_ms": 0, "timeout_s": 10.0, **fields},
                              cv_stop=CVStop() if rule else None))


def test_a_kernel_that_fits_keeps_its_spec():
    from tuning.hardware.tvm_worker import fit_to_timeout

    assert fit_to_timeout(worker_spec(), 0.001) == (worker_spec(), "")


def test_a_slow_kernel_gets_fewer_runs_then_fewer_costs():
    from tuning.hardware.tvm_worker import fit_to_timeout

    fitted, note = fit_to_timeout(worker_spec(), 0.05)  # 500 runs x 50 ms = 25 s > 10 s
    assert (fitted["number"], fitted["repeat"]) == (19, 10) and note.startswith("fewer_runs")
    fitted, _ = fit_to_timeout(worker_spec(), 2.0)  # not even one run per cost fits ten times
    assert (fitted["number"], fitted["repeat"]) == (1, 4)
    assert fit_to_timeout(worker_spec(), 6.0)[0] is None  # one check run + one timed run exceed 10 s
    assert fit_to_timeout(worker_spec(slow_kernels="timeout"), 0.05)[0] is None


def test_a_slow_kernel_under_the_adaptive_rule_gets_shorter_micro_batches():
    from tuning.hardware.tvm_worker import fit_to_timeout

    fitted, _ = fit_to_timeout(worker_spec(rule=True), 0.05)
    assert fitted["cv_stop"]["micro_batch"] == 19 and fitted["cv_stop"]["max_batches"] == 10
    fitted, _ = fit_to_timeout(worker_spec(rule=True), 2.0)
    assert fitted["cv_stop"]["max_batches"] == 4 and fitted["cv_stop"]["min_batches"] == 3
    fitted, _ = fit_to_timeout(worker_spec(rule=True), 4.0)
    assert fitted["cv_stop"]["max_batches"] == fitted["cv_stop"]["min_batches"] == 1


# ---- the rows of conf/experiment/adatune_row/ compose, validate and run ------------------------------
ADATUNE_ROWS = ("xgbrank_sa_de", "rfei_csa_de150")


@pytest.mark.parametrize("row", ADATUNE_ROWS)
def test_each_adatune_row_composes_and_validates(compose_cfg, row):
    from tuning.engine.validate import validate

    cfg = compose_cfg(f"+experiment/adatune_row={row}")
    validate(cfg)
    if row == "xgbrank_sa_de":
        assert cfg.cost_model.objective == "rank:pairwise" and cfg.cost_model.recall_at == 32
    if row == "rfei_csa_de150":
        assert (cfg.evaluator.number, cfg.evaluator.repeat) == (50, 3)


def test_the_adatune_rows_run_on_synthetic_hardware(tmp_path):
    """Both rows, one run each, in one sweep on the synthetic hardware."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    finish(run_py("-m", "model=gemm_64", "hardware=synthetic", "hardware.noise=0.1", f"tracking.uri={uri}",
                  "budget.trials=40", "budget.plan_size=16", "search.n_iter=40",
                  f"+experiment/adatune_row={','.join(ADATUNE_ROWS)}", f"hydra.sweep.dir={tmp_path}/a",
                  tmp=tmp_path), timeout=600)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("tunelab").experiment_id],
                              "attributes.status = 'FINISHED'")
    assert {r.data.tags.get("choice.experiment/adatune_row") for r in runs
            if "mlflow.parentRunId" in r.data.tags} == set(ADATUNE_ROWS)


# ---- AdaTune's diversity-aware selection (sampler.diversity_ratio) ---------------------------------
def test_most_diverse_is_autotvms_submodular_pick_by_hand():
    from tuning.sampler.greedy import most_diverse

    configs = [(0, 1, 1), (0, 1, 2), (0, 2, 2), (1, 3, 3), (0, 1, 1)]
    # every config covers 3 new values at first: the earliest wins; then (1,3,3) adds 3 more, then
    # (0,2,2) adds 2 where (0,1,2) adds 1 and the repeat (0,1,1) none
    assert most_diverse(configs, 3) == [(0, 1, 1), (1, 3, 3), (0, 2, 2)]
    assert most_diverse(configs, 9) == [(0, 1, 1), (1, 3, 3), (0, 2, 2), (0, 1, 2), (0, 1, 1)]
    assert most_diverse([], 3) == []


def test_the_diversity_filter_asks_the_search_for_more_and_keeps_b():
    from tuning.sampler.greedy import GreedySampler

    space = grid_space(4, 4, 4)
    sampler = GreedySampler(eps=0.0, diversity_ratio=2.0)
    assert sampler.candidates_wanted(32) == 64 and GreedySampler().candidates_wanted(32) == 32
    rng = np.random.default_rng(0)
    candidates = list(dict.fromkeys(space.canonical(space.sample(rng)) for _ in range(64)))
    chosen = sampler.select(candidates, space, set(), 8, rng)
    plain = GreedySampler(eps=0.0).select(candidates, space, set(), 8, rng)
    assert len(chosen) == 8 and set(chosen) <= set(candidates)
    coverage = [sum(len({c[i] for c in picks}) for i in range(1, 4)) for picks in (chosen, plain)]
    assert coverage[0] >= coverage[1] and coverage[0] == 12  # every value of every knob, with 8 picks of 4-value knobs


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
