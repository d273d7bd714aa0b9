"""The seed papers' claims re-tested (experiments/claims.py): the controls and fidelity options on
hand-made data and on the synthetic hardware, and the claims' statistics (tuning/tools/compare/statistics.py)
on hand-made curves."""
from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from test_chameleon import grid_space
from test_loop import component, finish, run_py
from test_store import SYNTHETIC_BACKEND, filled
from tuning.core.records import MeasureResult, Record
from tuning.cost_model.xgb import XGBoostCostModel, top_n_recall
from tuning.sampler.kmeans import KMeansSampler
from tuning.tools.campaign import job_command
from tuning.tools.compare import (
    Claim,
    Curve,
    TaskTruth,
    claim_cell,
    claim_rows,
    claim_verdict,
    claims_markdown,
    compare,
    error_counts,
    final_quality,
    magnitude,
    time_ratio,
)
from tuning.tools.dataset import full_readings


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


# ---- sampler=kmeans_code ---------------------------------------------------------------------------
def kmeans_code(**overrides) -> KMeansSampler:
    return KMeansSampler(**{"k_min": 8, "k_max": 65, "k_step": 8, "cluster_dims": 2, "synthesis_pool": "cluster",
                            "keep_k_min": True, "random_share": 0.05, **overrides})


def few_distinct_candidates():
    """40 candidates whose two largest knobs take only 3 distinct pairs (the case where k fell to 3)."""
    space = grid_space(2, 3, 40, 50)
    pairs = [(5, 7), (20, 30), (39, 49)]
    rng = np.random.default_rng(1)
    candidates = [(0, int(rng.integers(2)), int(rng.integers(3)), *pairs[i % 3]) for i in range(40)]
    return space, candidates


def test_kmeans_code_keeps_k_at_least_8_and_adds_its_random_picks():
    space, candidates = few_distinct_candidates()
    sampler = kmeans_code()
    chosen = sampler.select(candidates, space, set(), 64, np.random.default_rng(0))
    assert sampler.last_k >= 8 and len(chosen) == sampler.last_k
    assert sampler.metrics()["random"] == int(0.05 * 64) == 3
    assert len(set(chosen)) == len(chosen)
    outside = [c for c in chosen[-3:] if (c[3], c[4]) not in {(5, 7), (20, 30), (39, 49)}]
    assert outside, "the last picks are random configs, not the candidates' clusters"
    assert sampler.metrics()["synthesised"] >= sampler.last_k - 3 - 3  # duplicate centres are synthesised


def test_the_papers_kmeans_still_shrinks_k_and_adds_no_random_picks():
    space, candidates = few_distinct_candidates()
    sampler = KMeansSampler(cluster_dims=2)
    sampler.select(candidates, space, set(), 64, np.random.default_rng(0))
    assert sampler.last_k == 3 and sampler.metrics()["random"] == 0


def test_random_share_is_a_share_of_the_plan_not_of_k():
    space = grid_space(6, 6, 6)
    rng = np.random.default_rng(2)
    candidates = [space.canonical(space.sample(rng)) for _ in range(100)]
    sampler = kmeans_code(random_share=0.25, keep_k_min=False)
    chosen = sampler.select(candidates, space, set(), 16, np.random.default_rng(0))
    assert sampler.metrics()["random"] == 4 and len(chosen) == min(sampler.last_k, 16)


# ---- slow kernels: fewer runs, not a timeout (the run worker's rule) -------------------------------
def spec(**fields) -> dict:
    from dataclasses import asdict

    from tuning.core.measure import CVStop, MeasureSpec

    rule = fields.pop("rule", None)
    return asdict(MeasureSpec(**{"number": 50, "repeat": 10, "min_repeat_ms": 0, "timeout_s": 10.0, **fields},
                              cv_stop=CVStop() if rule else None))


def test_a_kernel_that_fits_keeps_its_spec():
    from tuning.hardware.tvm_worker import fit_to_timeout

    assert fit_to_timeout(spec(), 0.001) == (spec(), "")


def test_a_slow_kernel_gets_fewer_runs_then_fewer_costs():
    from tuning.hardware.tvm_worker import fit_to_timeout

    fitted, note = fit_to_timeout(spec(), 0.05)  # 500 runs x 50 ms = 25 s > 10 s
    assert (fitted["number"], fitted["repeat"]) == (19, 10) and note.startswith("fewer_runs")
    fitted, _ = fit_to_timeout(spec(), 2.0)  # not even one run per cost fits ten times
    assert (fitted["number"], fitted["repeat"]) == (1, 4)
    assert fit_to_timeout(spec(), 6.0)[0] is None  # one check run + one timed run exceed 10 s
    assert fit_to_timeout(spec(slow_kernels="timeout"), 0.05)[0] is None


def test_a_slow_kernel_under_the_adaptive_rule_gets_shorter_micro_batches():
    from tuning.hardware.tvm_worker import fit_to_timeout

    fitted, _ = fit_to_timeout(spec(rule=True), 0.05)
    assert fitted["cv_stop"]["micro_batch"] == 19 and fitted["cv_stop"]["max_batches"] == 10
    fitted, _ = fit_to_timeout(spec(rule=True), 2.0)
    assert fitted["cv_stop"]["max_batches"] == 4 and fitted["cv_stop"]["min_batches"] == 3
    fitted, _ = fit_to_timeout(spec(rule=True), 4.0)
    assert fitted["cv_stop"]["max_batches"] == fitted["cv_stop"]["min_batches"] == 1


def test_error_counts_name_failures_and_slow_kernels():
    def record(error=None, message=""):
        result = MeasureResult.failed(error, "x") if error else MeasureResult(costs=[1.0], message=message)
        return Record("t", "k", [0], {}, result, 0, "m", 0, 0, 0.0)

    records = [record(), record("timeout"), record("invalid"), record("invalid"),
               record(message="fewer_runs: 3 run(s) x 10 cost(s)")]
    assert error_counts(records) == {"timeout": 1, "invalid": 2, "fewer_runs": 1}


# ---- the controls and fidelity options compose, validate and run -----------------------------------
CHAMELEON_ROWS = ("ae_cold", "ae_as_cold", "sa_plan_k", "sa_as_code", "ae_as_code")
ADATUNE_ROWS = ("xgbrank_sa_de", "rfei_csa_de150")


@pytest.mark.parametrize("row", CHAMELEON_ROWS + ADATUNE_ROWS)
def test_each_row_composes_and_validates(compose_cfg, row):
    from tuning.engine.validate import validate

    group = "chameleon_row" if row in CHAMELEON_ROWS else "adatune_row"
    cfg = compose_cfg(f"+experiment/{group}={row}")
    validate(cfg)
    if row.endswith("_cold"):
        assert cfg.search.best_starts == 0
    if row == "xgbrank_sa_de":
        assert cfg.cost_model.objective == "rank:pairwise" and cfg.cost_model.recall_at == 32
    if row == "rfei_csa_de150":
        assert (cfg.evaluator.number, cfg.evaluator.repeat) == (50, 3)
    if row.endswith("_code"):
        assert cfg.sampler.keep_k_min and cfg.sampler.random_share == 0.05


def test_the_rows_run_on_synthetic_hardware(tmp_path):
    """Every new row of both papers, one run each, in two sweeps on the synthetic hardware."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    common = ("model=gemm_64", "hardware=synthetic", "hardware.noise=0.1", f"tracking.uri={uri}")
    finish(run_py("-m", *common, "budget.trials=16", "budget.plan_size=8",
                  f"+experiment/chameleon_row={','.join(CHAMELEON_ROWS)}", f"hydra.sweep.dir={tmp_path}/c",
                  tmp=tmp_path), timeout=600)
    finish(run_py("-m", *common, "budget.trials=40", "budget.plan_size=16", "search.n_iter=40",
                  f"+experiment/adatune_row={','.join(ADATUNE_ROWS)}", f"hydra.sweep.dir={tmp_path}/a",
                  tmp=tmp_path), timeout=600)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("tunelab").experiment_id],
                              "attributes.status = 'FINISHED'")
    rows = {r.data.tags.get("choice.experiment/chameleon_row") or r.data.tags.get("choice.experiment/adatune_row")
            for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert rows == set(CHAMELEON_ROWS + ADATUNE_ROWS)
    code_runs = [r for r in runs if r.data.tags.get("choice.experiment/chameleon_row", "").endswith("_code")]
    for run in code_runs:
        ks = [m.value for m in client.get_metric_history(run.info.run_id, "sampler/k")]
        assert ks and min(ks) >= 8, ks


# ---- the claims' statistics -------------------------------------------------------------------------
def claims_result(method_speed: float, seeds: int = 10, quality: float = 1.0):
    """SA reaches the best config after 100 measurements, SA+AS after 100 / method_speed, ending at
    `quality` x the best."""
    curves = []
    for seed in range(seeds):
        jitter = 1 + 0.02 * seed
        for method, at, final in (("SA", 100, 1.0), ("SA+AS", int(100 / method_speed), quality)):
            values = np.full(200, 2e-4)
            values[int(at * jitter):] = 1e-4 * final
            curves.append(Curve("t", method, seed, f"{method}{seed}", values, np.arange(1, 201) * 0.5, "store"))
    return compare(curves, {"t": TaskTruth({}, 1e-4, "store x")}, "SA", budgets=(64,), fraction=0.95)


SA_AS = Claim("adaptive sampling cuts measurements with SA (Fig. 7b)", "SA", "SA+AS", "measurements", "1.98x")


def sa_as_rows(result) -> list[dict]:
    """The claim rows of SA+AS against SA on measurements to the target."""
    return claim_rows([SA_AS], result)


def test_a_clear_reduction_holds_and_says_where_the_paper_lies():
    [row] = sa_as_rows(claims_result(2.0))
    assert row["speed_ratio"] == pytest.approx(2.0, rel=0.05) and row["speed_low"] > 1
    assert row["verdict"] == "holds" and row["magnitude"]


def test_a_header_names_the_seeds_it_has():
    from tuning.tools.compare.report import seed_label

    assert seed_label([0]) == "seed 0"
    assert seed_label([2, 0, 1]) == "seeds 0-2 (3)"
    assert seed_label([0, 1, 3]) == "seeds 0, 1, 3 (3)"  # not "0-3": seed 2 is missing


def test_where_the_papers_number_lies():
    assert magnitude("1.98x", {"low": 1.5, "high": 2.5}) == "paper's within our CI"
    assert magnitude("1.98x", {"low": 2.5, "high": 3.0}) == "paper's below our CI"
    assert magnitude("1.3-3.9x", {"low": 0.8, "high": 1.2}) == "paper's above our CI"
    assert magnitude("", {"low": 0.8, "high": 1.2}) == ""


def test_no_difference_is_undecided_and_a_loss_does_not_hold():
    [same] = sa_as_rows(claims_result(1.0))
    assert same["verdict"] == "undecided at this power"
    [slower] = sa_as_rows(claims_result(0.5))
    assert slower["verdict"] == "does not hold" and slower["speed_high"] < 1


def test_a_quality_bound_breaks_a_faster_method():
    claim = Claim("x", "SA", "SA+AS", "measurements", "2x", quality_bound=1.02)
    result = claims_result(2.0, quality=1.5)  # twice as fast to... a 50% slower kernel
    speed = time_ratio(result, "t", claim, np.random.default_rng(0))
    speed["p_holm"] = speed["p"]  # the only row of its table
    quality = final_quality(result, "t", claim, np.random.default_rng(0))
    assert quality["ratio"] == pytest.approx(1.5) and claim_verdict(speed, quality, 1.02) == "does not hold"
    assert math.isnan(time_ratio(claims_result(2.0, seeds=1), "t", claim, np.random.default_rng(0))["ratio"])
    faster, worse = {"low": 1.5, "high": 2.5, "p_holm": 0.001}, {"low": 1.1, "high": 1.3}
    assert claim_verdict(faster, worse, 1.0) == "does not hold: slower output"
    assert claim_verdict(faster, {"low": 0.9, "high": 1.0}, 1.0) == "holds"
    assert claim_verdict(faster, {"low": 0.9, "high": 1.1}, 1.0) == "undecided at this power"


def test_a_claims_table_is_one_family_adding_a_row_raises_the_others_adjusted_p():
    result = claims_result(1.25, seeds=6)
    [alone] = claim_rows([SA_AS], result)
    control = Claim("a control on the same runs", "SA", "SA+AS", "run/run_s", "")
    others = [Claim(f"control {i}", "SA+AS", "SA", "measurements", "") for i in range(3)]
    with_more = claim_rows([SA_AS, control, *others], result)
    row = next(r for r in with_more if r["claim"] == SA_AS.text)
    assert row["speed_p"] == alone["speed_p"] and alone["speed_p_holm"] == alone["speed_p"]
    assert row["speed_p_holm"] > alone["speed_p_holm"]  # Holm across the table, not per row
    assert alone["verdict"] == "holds" and alone["speed_p"] < 0.05


def test_a_verdict_needs_the_adjusted_test_as_well_as_the_interval():
    faster, same = {"low": 1.2, "high": 1.5}, {"low": 0.95, "high": 1.0}
    assert claim_verdict({**faster, "p_holm": 0.01}, same, 1.0) == "holds"
    assert claim_verdict({**faster, "p_holm": 0.2}, same, 1.0) == "undecided at this power"
    assert claim_verdict(faster, same, 1.0) == "undecided at this power"  # no test, no verdict


def test_a_claim_with_one_seed_is_undecided_and_its_row_prints():
    [row] = claim_rows([SA_AS], claims_result(2.0, seeds=1))
    assert math.isnan(row["speed_p"]) and row["verdict"] == "undecided at this power"


def test_a_count_the_budget_fixes_is_an_identity_not_a_finding():
    made = Claim("SA+AS makes fewer measurements", "SA", "SA+AS", "made", "2x")
    result = claims_result(2.0)
    [row] = claim_rows([made], result)  # every run made 200 measurements: the ratio is 1 on every seed
    assert row["speed_identity"] and row["verdict"] == "an accounting identity: not tested"
    assert math.isnan(row["speed_p_holm"])
    assert row["magnitude"] == ""  # a fixed count is no interval to place the paper's number against


def test_the_final_kernels_interval_counts_the_stores_noise():
    rng = np.random.default_rng(3)
    a, b = (1,), (2,)  # SA+AS always ends on a, SA on b; the store read each 6 times, 5% apart
    readings = {a: list(1.008e-4 * (1 + 0.05 * rng.standard_normal(6))), b: list(1e-4 * (1 + 0.05 * rng.standard_normal(6)))}
    by_config = {c: float(np.median(r)) for c, r in readings.items()}
    curves = []
    for seed in range(8):
        for method, config in (("SA", b), ("SA+AS", a)):
            values = np.full(50, by_config[config])
            curves.append(Curve("t", method, seed, f"{method}{seed}", values, np.arange(1, 51) * 0.5, "store",
                                final_config=config))
    claim = Claim("x", "SA", "SA+AS", "measurements", "", quality_bound=1.0)
    noisy = compare(curves, {"t": TaskTruth(by_config, min(by_config.values()), "store x", readings)}, "SA", budgets=(8,))
    quality = final_quality(noisy, "t", claim, np.random.default_rng(0))
    assert quality["readings_resampled"] and quality["low"] < 1 < quality["high"]  # the store cannot tell a from b
    medians_only = compare(curves, {"t": TaskTruth(by_config, min(by_config.values()), "store x")}, "SA", budgets=(8,))
    certain = final_quality(medians_only, "t", claim, np.random.default_rng(0))
    assert certain["low"] == pytest.approx(certain["high"])  # seeds alone: every seed the same ratio, no width
    assert certain["ratio"] == pytest.approx(quality["ratio"])


def test_a_final_claim_is_the_baselines_final_latency_over_the_methods_with_its_test():
    """quantity "final": "a faster kernel at the same budget", baseline / method of the final kernels."""
    faster = Claim("a faster kernel", "SA", "SA+AS", "final", "1.1-1.5x")
    [row] = claim_rows([faster], claims_result(1.0, quality=0.8))  # SA+AS ends on a kernel 0.8x SA's
    assert row["speed_ratio"] == pytest.approx(1.25) and row["quality_ratio"] == pytest.approx(0.8)
    assert row["speed_low"] == pytest.approx(1 / row["quality_high"]) and row["speed_p"] < 0.05
    assert row["verdict"] == "holds" and row["magnitude"] == "paper's within our CI"
    [slower] = claim_rows([faster], claims_result(1.0, quality=1.3))
    assert slower["speed_ratio"] == pytest.approx(1 / 1.3) and slower["verdict"] == "does not hold"
    [same] = claim_rows([faster], claims_result(1.0))
    assert same["verdict"] == "undecided at this power"


def test_a_median_the_method_never_reaches_reads_so_not_as_zero():
    [row] = sa_as_rows(claims_result(0.4))  # SA+AS would reach it at 250 measurements: after its 200
    assert row["speed_ratio"] == 0 and row["verdict"] == "does not hold"
    assert "the method's median not reached (method 0/10 runs, baseline 10/10)" in claims_markdown([row], [])
    [reached] = sa_as_rows(claims_result(2.0))
    assert "not reached" not in claims_markdown([reached], [])
    neither = {**row, "speed_ratio": math.nan, "speed_reached": (0, 4), "speed_n": 10}
    assert "neither median reached (method 0/10 runs, baseline 4/10)" in claims_markdown([neither], [])


def test_a_cell_keeps_an_open_ended_interval():
    assert claim_cell(0.895, 0.5, math.inf) == "0.895x [0.500, inf]"  # some resamples never reached
    assert claim_cell(1.2, 1.1, 1.3) == "1.200x [1.100, 1.300]"
    assert claim_cell(math.nan, math.nan, math.nan) == "n/a"


@pytest.mark.slow
def test_the_chameleon_command_replays_its_grid_and_prints_verdicts(tmp_path, experiment_script):
    """experiments/claims.py chameleon end to end on a synthetic store: the grid, the plan-size
    control at SA+AS's mean k, the table."""
    spec = component("evaluator", "adatune_de").spec  # chameleon_replay's evaluator: the readings' key
    store, _ = filled(tmp_path / "store.sqlite", count=200, spec=full_readings(spec))
    claims = experiment_script("claims")
    rows = claims.main(["chameleon", "--store", str(store.path), "--models", "gemm_64", "--seeds", "2",
                        "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--out", str(tmp_path / "out"),
                        *SYNTHETIC_BACKEND, "budget.trials_per_task=64",
                        f"hydra.sweep.dir={tmp_path}/multirun/${{now:%H-%M-%S-%f}}"])
    assert {r["method"] for r in rows} >= {"SA+AS", "AE+AS", "SA+AS code"}
    text = (tmp_path / "out" / "claims.md").read_text()
    assert "SA plan=k: greedy SA at plan size gemm_64" in text and "1.98x" in text


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


def test_every_compare_table_counts_invalid_and_timeout_per_row():
    from tuning.tools.compare import markdown

    result = claims_result(2.0, seeds=3)
    result.curves[0].errors = {"timeout": 3, "fewer_runs": 2}
    text = markdown(result, "test")
    assert "| method | measurements per run (median) | fewer_runs per run (mean) | invalid per run (mean) | " \
           "timeout per run (mean) |" in text
    assert "| SA | 200 | 0.7 | 0.0 | 1.0 |" in text


def test_a_replay_keeps_the_slow_kernel_note(tmp_path):
    """A store row timed with fewer runs answers a replay with its note, so the replayed runs'
    compare tables count it."""
    from test_store import SPEC, TASK, replay
    from tuning.store import TaskRows, connect_store

    backend = replay(tmp_path / "s.sqlite").backend
    table = TaskRows(connect_store(tmp_path / "s.sqlite"), backend, SPEC, TASK, backend.space(TASK))
    config = table.space.canonical(table.space.sample(np.random.default_rng(0)))
    table.add(config, MeasureResult(costs=[1e-3] * 5, message="fewer_runs: 2 run(s) x 5 cost(s)"), "dataset")
    [answer] = replay(tmp_path / "s.sqlite", backend, on_miss="error").measure(TASK, [config], SPEC)
    assert answer.ok and answer.reused and answer.message.startswith("fewer_runs")


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


def test_a_full_space_campaign_stops_at_its_hours_and_the_same_command_continues_it(tmp_path, experiment_script, capsys,
                                                                                    monkeypatch):
    """claims.py --full-space on a synthetic backend: a stop at --hours leaves no run finished; the same
    command then runs every job; a third call measures nothing and starts no run, and packs the
    archive. Read as a file on a machine that has neither the store nor the MLflow runs, the archive
    prints the same table from a view of its own."""
    from mlflow.tracking import MlflowClient

    claims = experiment_script("claims")
    store, uri = tmp_path / "stores" / "full.sqlite", f"sqlite:///{tmp_path}/mlflow.db"
    command = ["adatune", "--full-space", "--store", str(store), "--models", "gemm_64", "--seeds", "2",
               "--campaign", str(tmp_path / "campaign"), "--tracking-uri", uri, "--out", str(tmp_path / "out"),
               *SYNTHETIC_BACKEND, "budget.trials_per_task=48"]
    with pytest.raises(SystemExit):  # no run finished: nothing to compare yet
        claims.main([*command, "--hours", str(1 / 3600)])  # SIGTERM a second in: run.py is still starting
    assert "campaign stopped at --hours with 0 of 4 runs finished" in capsys.readouterr().out
    rows = claims.main(command)
    assert {r["method"] for r in rows} == {"RFEI+CSA+AE"} and all(r["baseline"] == "XGB+SA+DE" for r in rows)
    text = (tmp_path / "out" / "claims.md").read_text()
    assert "full space, seeds 0-1 (2)" in text and "Full space (model.space=full)" in text
    folders = sorted(p.parent.relative_to(tmp_path / "campaign") for p in (tmp_path / "campaign").rglob("status"))
    assert [str(f) for f in folders] == [f"gemm_64/{row}/seed{s}" for row in ("rfei_csa_ae", "xgb_sa_de") for s in (0, 1)]
    client = MlflowClient(uri)
    [experiment] = [e for e in client.search_experiments() if e.name == "claims-adatune-full"]
    runs = len(client.search_runs([experiment.experiment_id]))
    rows_in_store = sqlite3.connect(store).execute("SELECT count(*) FROM readings").fetchone()[0]
    claims.main([*command, "--archive", str(tmp_path / "campaigns" / "full")])
    assert len(client.search_runs([experiment.experiment_id])) == runs
    assert sqlite3.connect(store).execute("SELECT count(*) FROM readings").fetchone()[0] == rows_in_store

    [packed] = (tmp_path / "campaigns" / "full").glob("*.tar.xz")
    with pytest.raises(SystemExit, match="read for its tables only"):
        claims.main([*command, "--archive", str(packed)])
    store.rename(tmp_path / "elsewhere.sqlite")  # what a clone on another machine lacks: the store and the runs
    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "outputs"))
    viewed = [*command[:command.index("--tracking-uri")], "--out", str(tmp_path / "view-out"), *SYNTHETIC_BACKEND,
              "budget.trials_per_task=48", "--table-only", "--archive", str(packed)]

    def table(found):
        return [(r["claim"], r["task"], str(r["speed_ratio"]), str(r["speed_low"]), r["verdict"]) for r in found]

    assert table(claims.main(viewed)) == table(rows)
    view = tmp_path / "outputs" / "archive-views" / "full" / packed.name.split(".")[0]
    assert (view / "stores" / "full.sqlite").is_file() and not store.exists()
    assert len(client.search_runs([experiment.experiment_id])) == runs  # this machine's MLflow store: untouched
    assert table(claims.main(viewed)) == table(rows)  # again: nothing re-logged twice
    in_view = MlflowClient(f"sqlite:///{view / 'mlflow.db'}")
    [copied] = [e for e in in_view.search_experiments() if e.name == "claims-adatune-full"]
    assert len(in_view.search_runs([copied.experiment_id])) == 4


def test_campaign_options_belong_to_a_campaign(experiment_script, capsys):
    claims = experiment_script("claims")
    with pytest.raises(SystemExit):
        claims.parse_args(["chameleon", "--hours", "2"])
    assert "--hours, --campaign and --archive belong to a campaign (--full-space or --build)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["chameleon", "--archive", "campaigns/chameleon-full"])
    assert "--archive belong to a campaign" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["chameleon", "--full-space", "--hours", "0"])
    assert "--hours: must be > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["chameleon", "--full-space", "--jobs", "2"])
    assert "--jobs: a --full-space campaign times kernels" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["chameleon", "--full-space", "--build"])
    assert "--build: a --full-space campaign fills its own store" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["chameleon", "--build", "--table-only", "--archive", "campaigns/c/host-2c-0123abcd.tar.xz"])
    assert "a --build campaign's replays are not in its archive" in capsys.readouterr().err


def test_a_build_campaign_builds_each_task_once_then_replays_as_one_step(tmp_path, experiment_script):
    claims = experiment_script("claims")
    command = ["chameleon", "--build", "--store", str(tmp_path / "s.sqlite"), "--campaign", str(tmp_path / "c"),
               "--seeds", "3", "budget.trials=64"]
    args, paper = claims.parse_args(command)
    builds = {task: job_command(claims.build_job(args, task)) for task in claims.STORE_TASKS}
    assert builds["conv_l8"][builds["conv_l8"].index("--configs") + 1] == "2000"
    assert all(builds[t][builds[t].index("--configs") + 1] == "500" for t in ("conv_l7", "conv_l6", "gemm_512"))
    assert all(c[1:4] == ["-m", "tuning.tools.dataset", "build"] and c[-2:] == ["evaluator=adatune_de",
               "hardware.build_workers=2"] and c[c.index("--store") + 1] == args.store for c in builds.values())
    other, _ = claims.parse_args([*command, "--build-override", "hardware=synthetic", "--build-override",
                                  "hardware.noise=0.2"])
    assert job_command(claims.build_job(other, "conv_l8"))[-3:] == ["evaluator=adatune_de", "hardware=synthetic",
                                                                     "hardware.noise=0.2"]
    assert claims.build_job(other, "conv_l8").folder != claims.build_job(args, "conv_l8").folder
    replays = claims.replay_job(paper, args)
    assert not replays.archived and replays.folder.parent == tmp_path / "c" / "chameleon"
    step = job_command(replays)
    assert step[1].endswith("experiments/claims.py") and "--replays-only" in step and step[-1] == "budget.trials=64"
    (tmp_path / "s.sqlite").touch()  # built by then
    inner, _ = claims.parse_args(step[2:])  # the step's own command parses, and replays what the campaign asked
    assert (inner.replays_only, inner.seeds, inner.models, inner.store, inner.overrides) == \
        (True, 3, list(paper.models), args.store, ["budget.trials=64"])
    assert claims.replay_job(paper, claims.parse_args(command)[0]).folder == replays.folder
    assert claims.replay_job(paper, claims.parse_args([*command, "--seeds", "4"])[0]).folder != replays.folder


def test_a_build_campaigns_options_are_checked(tmp_path, experiment_script, capsys):
    claims = experiment_script("claims")
    with pytest.raises(SystemExit):
        claims.parse_args(["adatune", "--build-override", "hardware=synthetic"])
    assert "--build-override belongs to --build" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a step is run by the campaign, never a campaign itself
        claims.parse_args(["adatune", "--build", "--replays-only", "--store", str(tmp_path / "s.sqlite")])
    assert "--replays-only: a --build campaign's own step, alone" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["adatune", "--build", "--store", "postgresql://lab@db:5432/tunelab"])
    assert "--store: a campaign's store is a sqlite file" in capsys.readouterr().err
    assert not (Path.cwd() / "postgresql:").exists()


@pytest.mark.slow
def test_a_build_campaign_builds_replays_and_carries_its_store_to_a_new_machine(tmp_path, experiment_script, capsys):
    """claims.py adatune --build on a synthetic backend: a stop at --hours prints no table; the same
    command builds the store, replays and prints it; a third call builds and replays nothing; on a
    new machine (a fresh campaign folder, store folder and MLflow) the archive brings the store and
    the finished build back, and only the replays run again."""
    from mlflow.tracking import MlflowClient

    claims = experiment_script("claims")

    def command(machine: str) -> list[str]:
        return ["adatune", "--build", "--store", str(tmp_path / machine / "stores" / "lab.sqlite"), "--models",
                "gemm_64", "--seeds", "2", "--campaign", str(tmp_path / machine / "c"), "--archive",
                str(tmp_path / "archive"), "--tracking-uri", f"sqlite:///{tmp_path}/{machine}/mlflow.db",
                "--out", str(tmp_path / machine / "out"), "--build-override", "hardware=synthetic",
                "--build-override", "hardware.noise=0.2", *SYNTHETIC_BACKEND, "budget.trials_per_task=48",
                f"hydra.sweep.dir={tmp_path}/{machine}/multirun/${{now:%H-%M-%S-%f}}"]

    assert claims.main([*command("a"), "--hours", str(1 / 3600)]) == []
    assert "no table yet" in capsys.readouterr().out
    rows = claims.main(command("a"))
    assert {r["method"] for r in rows} >= {"RFEI+CSA+AE"}
    assert "restricted to the store's configs" in (tmp_path / "a" / "out" / "claims.md").read_text()
    store = tmp_path / "a" / "stores" / "lab.sqlite"
    readings = sqlite3.connect(store).execute("SELECT count(*) FROM readings").fetchone()[0]
    client = MlflowClient(f"sqlite:///{tmp_path}/a/mlflow.db")
    runs = len(client.search_runs([client.get_experiment_by_name("claims-adatune").experiment_id]))
    claims.main(command("a"))
    assert len(client.search_runs([client.get_experiment_by_name("claims-adatune").experiment_id])) == runs
    assert sqlite3.connect(store).execute("SELECT count(*) FROM readings").fetchone()[0] == readings
    capsys.readouterr()
    rows_b = claims.main(command("b"))
    out = capsys.readouterr().out
    assert f"{readings:,} store readings" in out and "tuning.tools.dataset" not in out  # nothing built again
    assert sqlite3.connect(tmp_path / "b" / "stores" / "lab.sqlite").execute(
        "SELECT count(*) FROM readings").fetchone()[0] == readings

    def table(found):  # str: an interval that is nan on both machines reads alike
        return [(r["claim"], r["task"], str(r["speed_ratio"]), str(r["speed_low"]), r["verdict"]) for r in found]

    assert table(rows_b) == table(rows)  # the same readings and seeds: the same replays


def test_a_job_whose_folder_holds_a_run_resumes_it(tmp_path, experiment_script):
    claims = experiment_script("claims")
    args, paper = claims.parse_args(["chameleon", "--full-space", "--store", str(tmp_path / "s.sqlite"),
                                     "--campaign", str(tmp_path / "c"), "budget.trials_per_task=8"])
    folder = tmp_path / "c" / "conv_l8" / "sa" / "seed0"
    jobs = claims.campaign_jobs(paper, args)
    assert jobs[0].folder == folder
    new = job_command(jobs[0])
    assert "+experiment/chameleon_row=sa" in new and "model.space=full" in new and "hardware.on_miss=measure" in new
    assert new.index("budget.trials_per_task=500") < new.index("budget.trials_per_task=8")  # the user's wins
    assert new[-1] == f"hydra.run.dir={folder}"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("{}")
    assert job_command(jobs[0])[2:] == [f"resume={folder}"]
    assert [job.folder.parent.name for job in jobs[:4]] == ["sa", "sa_as", "ae", "ae_as"]
