"""MetaSchedule as a method row: search=evolutionary, cost_model=xgb_ms, cost_model.features.

Pure Python here (synthetic spaces, hand-made per-store rows); real TVM schedules and features in
test_tvm_cpu.py."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import spearmanr

from tuning.config import ConfigError
from tuning.core.features import model_features, store_rows
from tuning.core.measure import MeasureSpec
from tuning.core.records import MeasureResult
from tuning.core.space import Space
from tuning.core.task import gemm_task
from tuning.cost_model.xgb import XGBoostCostModel
from tuning.cost_model.xgb_ms import MetaScheduleXGBoost, pack, warmup_scores
from tuning.engine.validate import validate
from tuning.hardware.synthetic import SyntheticHardware
from tuning.search.evolutionary import EvolutionarySearch, _move_tile_factor

HARDWARE = SyntheticHardware()
TASK = gemm_task("g", 256, 256, 256)


def space_with_rows(rows_of):
    """The synthetic gemm space with `store_features` = rows_of(config) -> (k, w) array."""
    base = HARDWARE.space(TASK)
    calls = []

    def store_features(configs):
        calls.append(len(configs))
        return [np.asarray(rows_of(c), dtype=np.float32) for c in configs]

    space = Space(base.knobs, base.active, store_features=store_features)
    return space, calls


# ---- model_features (tuning/core/features.py) ----------------------------------------------------
def test_per_store_rows_are_padded_to_one_count_and_cached():
    space, calls = space_with_rows(lambda c: np.full((1 + c[0] % 2, 3), c[0] + 1.0))
    configs = [space.sample(np.random.default_rng(s)) for s in range(20)]
    X = model_features(space, configs, "per_store")
    assert X.shape == (20, 2, 3)
    for config, rows in zip(configs, X):
        assert np.all(rows[0] == config[0] + 1)
        assert np.all(rows[1] == (config[0] + 1 if config[0] % 2 else 0))  # zero row pads
    before = sum(calls)
    assert np.array_equal(model_features(space, configs, "per_store"), X) and sum(calls) == before


def test_more_stores_than_the_count_are_summed_into_the_last_row():
    big: set = set()
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    space, _ = space_with_rows(lambda c: rows if c in big else rows[:1])
    first, second = (space.sample(np.random.default_rng(s)) for s in (10, 11))
    assert store_rows(space, [first]).shape == (1, 1, 2)  # the count is fixed by the first call
    big.add(second)
    assert np.array_equal(store_rows(space, [second])[0], [rows.sum(axis=0)])


def test_both_appends_the_knob_features_to_every_real_row():
    space, _ = space_with_rows(lambda c: np.ones((1 + c[0] % 2, 4)))
    configs = [space.sample(np.random.default_rng(s)) for s in range(12)]
    X = model_features(space, configs, "both")
    knobs = space.features(configs)
    assert X.shape == (12, 2, 4 + knobs.shape[1])
    assert np.array_equal(X[:, 0, 4:], knobs) and np.all(X[:, 0, :4] == 1)
    for config, rows in zip(configs, X):  # a padding row stays zero, so xgb_ms drops it
        assert rows[1].any() == bool(config[0] % 2)


def test_knob_space_without_tvm_refuses_per_store_features():
    with pytest.raises(ValueError, match="per-store features need a space scheduled by TVM"):
        model_features(HARDWARE.space(TASK), [HARDWARE.space(TASK).sample(np.random.default_rng(0))], "per_store")


# ---- cost_model=xgb_ms -----------------------------------------------------------------------------
def rows_and_throughput(count, seed):
    """Programs of 1-3 stores; throughput is a sum of a per-row function (what pack-sum can learn)."""
    rng = np.random.default_rng(seed)
    X = np.zeros((count, 3, 4), dtype=np.float32)
    y = np.zeros(count)
    for i in range(count):
        stores = int(rng.integers(1, 4))
        X[i, :stores] = rng.uniform(0.1, 1.0, size=(stores, 4))
        y[i] = sum(np.sin(3 * r[0]) + r[1] ** 2 for r in X[i, :stores])
    return X, y


def test_pack_drops_padding_rows_and_keeps_program_ids():
    X = np.zeros((3, 2, 2), dtype=np.float32)
    X[0, 0] = 1
    X[2] = 2
    rows, ids = pack(X)
    assert ids.tolist() == [0, 2, 2] and rows.shape == (3, 2)


def test_pack_sum_learns_a_per_store_sum_and_predicts_zero_for_no_stores():
    X, y = rows_and_throughput(400, seed=0)
    X_test, y_test = rows_and_throughput(300, seed=1)
    model = MetaScheduleXGBoost(num_warmup_samples=100).fit(X, y)
    assert spearmanr(model.predict(X_test), y_test).correlation > 0.8
    assert model.predict(np.zeros((2, 3, 4)))[0] == 0.0


def test_random_scores_until_the_warmup_then_adaptive_refits():
    X, y = rows_and_throughput(120, seed=0)
    model = MetaScheduleXGBoost(num_warmup_samples=100, seed=4)
    model.fit(X[:99], y[:99])
    assert model.booster is None
    warm = model.predict(X[:10])
    assert np.array_equal(warm, warmup_scores(X[:10], 4)) and np.all((warm >= 0) & (warm < 1))
    assert not np.array_equal(warm, warmup_scores(X[:10], 5))
    model.fit(X[:100], y[:100])
    first = model.booster
    model.fit(X[:115], y[:115])  # 15 more < 100 / 5: MetaSchedule keeps the last model
    assert model.booster is first
    model.fit(X[:120], y[:120])
    assert model.booster is not first and model.trained_on == 120


def test_failed_programs_teach_nothing():
    """Label weights: a failed program (throughput 0) has weight 0, as in MetaSchedule (a fixed number
    of rounds: the early-stopping metric does see them)."""
    X, y = rows_and_throughput(200, seed=2)
    fixed = {"num_warmup_samples": 0, "num_boost_round": 30, "early_stopping_rounds": 1000}
    a = MetaScheduleXGBoost(**fixed).fit(X, y).predict(X)
    failed = np.concatenate([y, np.zeros(50)])
    b = MetaScheduleXGBoost(**fixed).fit(np.concatenate([X, X[:50] * 0.5]), failed).predict(X)
    assert np.allclose(a, b)


def test_a_resumed_model_refits_where_the_run_last_did():
    """Adaptive training keeps a model until the data grows by a fifth; a resume that refit on all
    records would score differently. The saved state says where the last refit was."""
    X, y = rows_and_throughput(130, seed=0)
    running = MetaScheduleXGBoost(num_warmup_samples=100)
    running.fit(X[:100], y[:100])
    running.fit(X[:119], y[:119])  # kept: 19 < 100 / 5
    resumed = MetaScheduleXGBoost(num_warmup_samples=100)
    resumed.load_state_dict(json.loads(json.dumps(running.state_dict())))
    resumed.fit(X[:119], y[:119])
    assert np.array_equal(resumed.predict(X), running.predict(X))
    assert not np.array_equal(MetaScheduleXGBoost(num_warmup_samples=100).fit(X[:119], y[:119]).predict(X),
                              running.predict(X))
    with pytest.raises(ValueError, match="trained_records"):
        resumed.load_state_dict({"trained_records": -1})


def test_flat_models_read_per_store_rows():
    X, y = rows_and_throughput(300, seed=0)
    X_test, y_test = rows_and_throughput(200, seed=1)
    model = XGBoostCostModel(features="per_store").fit(X, y)
    assert spearmanr(model.predict(X_test), y_test).correlation > 0.5


# ---- search=evolutionary -----------------------------------------------------------------------
def test_tile_mutation_moves_a_divisor_between_levels():
    space = HARDWARE.space(TASK)
    rng = np.random.default_rng(0)
    slot = next(s for s in space.active[0] if space.knobs[s].kind == "tile")
    for _ in range(200):
        config = space.sample(rng)
        config = (0,) + config[1:] if config[0] == 0 else space.switch_sketch(config, 0)
        value = _move_tile_factor(space, config, slot, rng)
        if value is None:
            continue
        before, after = space.knobs[slot].choices[config[slot]], space.knobs[slot].choices[value]
        assert np.prod(before) == np.prod(after)
        changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
        assert len(changed) == 2
        i, j = changed
        assert before[i] * after[j] == after[i] * before[j] or before[i] * before[j] == after[i] * after[j]


def true_gflops(configs):
    return np.array([r.gflops(TASK.flops) for r in HARDWARE.measure(TASK, configs, MeasureSpec())])


def test_guided_by_a_perfect_model_it_proposes_far_better_than_random(monkeypatch):
    import tuning.search.evolutionary as evolutionary

    monkeypatch.setattr(evolutionary, "predict", lambda space, model, configs: true_gflops(configs))
    space = HARDWARE.space(TASK)
    search = EvolutionarySearch(population_size=128)
    proposals = search.propose(space, None, 32, set(), np.random.default_rng(0))
    random = [space.sample(np.random.default_rng(1000 + i)) for i in range(32)]
    assert len(proposals) == 32 and len(set(proposals)) == 32
    assert np.median(true_gflops(proposals)) > 1.3 * np.median(true_gflops(random))
    assert search.metrics()["mutated"] > 0


def test_best_measured_configs_seed_the_population_and_survive_a_resume():
    search = EvolutionarySearch(population_size=10, init_measured_ratio=0.2)
    space = HARDWARE.space(TASK)
    configs = [space.sample(np.random.default_rng(s)) for s in range(6)]
    results = [MeasureResult(costs=[float(c)]) for c in (5, 1, 3, 2, 4, 6)]
    results[2] = MeasureResult.failed("invalid", "x")
    search.observe(configs, results)
    assert search._measured_seeds() == [configs[1], configs[3]]
    again = EvolutionarySearch(population_size=10, init_measured_ratio=0.2)
    again.load_state_dict(json.loads(json.dumps(search.state_dict())))
    assert again.measured == search.measured


def test_measured_configs_are_never_proposed():
    space = HARDWARE.space(TASK)
    rng = np.random.default_rng(0)
    visited = {space.canonical(space.sample(rng)) for _ in range(300)}
    model = XGBoostCostModel()
    proposals = EvolutionarySearch(population_size=64).propose(space, model, 16, visited, rng)
    assert proposals and not set(proposals) & visited


def test_eps_greedy_is_handed_to_the_sampler():
    assert EvolutionarySearch(eps_greedy=0.2).exploration() == 0.2


def test_unmutated_copies_take_each_parent_once_per_generation():
    space = HARDWARE.space(TASK)
    search = EvolutionarySearch(population_size=64, genetic_mutate_prob=0.0, genetic_max_fail_count=200)
    population = [space.sample(np.random.default_rng(s)) for s in range(64)]
    scores = np.zeros(64)
    scores[0] = 1.0  # all the weight on one parent
    scores[1:] = 1e-3
    counts = {"mutated": 0, "copied": 0, "mutation_failed": 0}
    children = search._next_generation(space, population, scores, np.random.default_rng(0), counts)
    assert children.count(population[0]) < 10 and counts["copied"] > 32


def test_selection_clamps_negative_scores_and_shifts_rank_scores():
    from tuning.search.evolutionary import _selection

    assert _selection([-1.0, 1.0, 3.0]).tolist() == [0.0, 0.25, 0.75]
    assert np.allclose(_selection([-3.0, -1.0]), [0.0, 1.0])
    assert np.allclose(_selection([0.0, 0.0]), [0.5, 0.5])


def test_nothing_legitimate_proposes_nothing():
    space = HARDWARE.space(TASK)
    never = Space(space.knobs, space.active, legitimacy=lambda config: False)
    assert EvolutionarySearch(population_size=16).propose(never, XGBoostCostModel(), 8, set(),
                                                          np.random.default_rng(0)) == []


# ---- validation --------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (["search=sa", "cost_model=xgb_ms", "hardware=cpu"], "search=sa scores too many"),
    (["search=evolutionary", "cost_model=xgb_ms", "hardware=synthetic"], "does not schedule with TVM"),
    (["search=evolutionary", "cost_model=xgb", "cost_model.features=loops"], "cost_model.features: expected one of"),
    (["search=evolutionary", "search.p_tile_size=0", "search.p_compute_location=0", "search.p_unroll=0"],
     "search.p_tile_size"),
])
def test_bad_feature_choices_are_rejected_naming_the_key(compose_cfg, overrides, message):
    cfg = compose_cfg(*overrides)
    with pytest.raises(ConfigError, match=message):
        validate(cfg, choices(cfg))


def test_evolutionary_with_per_store_features_is_accepted(compose_cfg):
    for overrides in (["search=evolutionary", "cost_model=xgb_ms", "hardware=cpu"],
                      ["search=random", "cost_model=xgb", "cost_model.features=both"]):
        cfg = compose_cfg(*overrides)
        validate(cfg, choices(cfg))


def choices(cfg) -> dict:
    return {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra/")}


# ---- the peer benchmark's arithmetic (experiments/bench_vs_peers.py) -------------------------------
def test_peer_benchmark_pairs_by_seed_and_pass(experiment_script, tmp_path):
    bench = experiment_script("bench_vs_peers")
    torch_s = {-1: [1.0, 2.0]}
    kernel = {0: [2.0, 2.0], 1: [0.5, 1.0]}
    ratios = bench.paired_ratios(torch_s, kernel)
    assert ratios[0].tolist() == [0.5, 1.0] and ratios[1].tolist() == [2.0, 2.0]
    centre, low, high = bench.geomean_ci(ratios, np.random.default_rng(0))
    assert np.isclose(centre, (0.5 * 1.0 * 2.0 * 2.0) ** 0.25) and low <= centre <= high
    args = bench.parse_args(["--workloads", "conv_l8", "--seeds", "0", "--methods",
                             "evolutionary+greedy+xgb_ms:cost_model.features=knobs", "--out", str(tmp_path)])
    [(_, method, _, folder), (_, peer, _, _)] = bench.jobs(args)
    assert peer == bench.PEER and "=" not in folder.name and "=" not in folder.parent.name
    seconds = {"conv_l8": {"torch": {-1: [1e-4, 1e-4]}, method: {0: [2e-4, 2e-4]}, bench.PEER: {0: [1e-4, 1e-4]}}}
    table = bench.report(args, seconds)
    assert "0.50x" in table and "speed relative to metaschedule" in table


def test_peer_benchmark_says_where_the_tuning_seconds_went(experiment_script, tmp_path):
    bench = experiment_script("bench_vs_peers")
    args = bench.parse_args(["--workloads", "conv_l8", "--seeds", "0", "1", "--methods", "sa+greedy+xgb",
                             "--out", str(tmp_path)])
    lab = {"run/wall_s": 100.0, "run/search_s": 3.0, "run/model_s": 1.0, "run/measure_s": 90.0,
           "run/tracking_s": 2.0, "run/state_s": 0.5, "run/run_s": 40.0}
    for seed in (0, 1):
        folder = tmp_path / "conv_l8" / "sa+greedy+xgb" / f"seed{seed}"
        (folder / "run").mkdir(parents=True)
        (folder / "run" / "final_metrics.json").write_text(json.dumps({"step": 256, "metrics": lab}))
        (folder.parent.parent / bench.PEER / f"seed{seed}" / "work").mkdir(parents=True)
        (folder.parent.parent / bench.PEER / f"seed{seed}" / "work" / "profile.json").write_text(
            json.dumps({"Total": 200.0, "EvoSearch": 20.0, "JoinRunnerFutures": 150.0}))
    lines = "\n".join(bench.overhead_report(args))
    assert "search 3.0%" in lines and "python 3.5%" in lines and "outside measure 10.0%" in lines
    assert "JoinRunnerFutures 75.0%" in lines and "EvoSearch 10.0%" in lines
    old = dict(lab)
    del old["run/measure_s"]  # a run from before the loop kept measure_s: no row, no guess
    (tmp_path / "conv_l8" / "sa+greedy+xgb" / "seed0" / "run" / "final_metrics.json").write_text(
        json.dumps({"step": 256, "metrics": old}))
    assert bench.lab_shares(tmp_path / "conv_l8" / "sa+greedy+xgb" / "seed0") is None


def test_peer_benchmark_retimes_the_task_a_row_tuned(experiment_script, tmp_path):
    """A row with model.* overrides (model.space=wide) tuned another task than conf/model's: its
    best is found among its own run's records, not dropped from the table."""
    from omegaconf import OmegaConf

    from tuning.core.records import Record

    bench = experiment_script("bench_vs_peers")
    run = tmp_path / "gemm_64" / "sa+greedy+xgb__model.space-wide" / "seed0" / "run"
    run.mkdir(parents=True)
    model = {"name": "gemm_64", "kind": "gemm", "M": 64, "N": 64, "K": 64, "dtype": "float32", "space": "wide"}
    OmegaConf.save(OmegaConf.create({"model": model}), run / "config.yaml")
    wide = gemm_task("gemm_64", 64, 64, 64, space="wide")
    assert wide.key != bench.task_of("gemm_64").key
    record = Record("gemm_64", wide.key, [5, 1, 2, 0], {}, MeasureResult(costs=[1e-5, 1e-5]), 0, "sa", 0, 0, 0.0)
    (run / "records.jsonl").write_text(record.to_json() + "\n")
    asked = []

    class Schedules:
        def schedule(self, config):
            return type("Scheduled", (), {"mod": ("module of", config)})(), config

    class Hardware:
        def schedules(self, task):
            asked.append(task.key)
            return Schedules()

    assert bench.best_module("gemm_64", "sa+greedy+xgb:model.space=wide", run.parent, Hardware()) == (
        "module of", (5, 1, 2, 0))
    assert asked == [wide.key]


def test_a_peer_benchmark_row_may_have_its_own_budget(experiment_script):
    bench = experiment_script("bench_vs_peers")
    args = bench.parse_args(["--trials", "256", "--methods", "sa+greedy+xgb:budget.trials=1000", "sa+greedy+xgb"])
    assert [bench.trials_of(m, args) for m in args.methods] == [1000, 256]


@pytest.mark.parametrize("method", ["sa+greedy", "sa+greedy+xgb:features", "sa+greedy+xgb:budget.trials=0",
                                    "sa+greedy+xgb:budget.trials=1e3"])
def test_peer_benchmark_rejects_a_malformed_method(experiment_script, method):
    bench = experiment_script("bench_vs_peers")
    with pytest.raises(SystemExit):
        bench.parse_args(["--methods", method])
