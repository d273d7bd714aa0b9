"""Transfer: the store as a corpus (tuning/hardware/corpus.py), the model registry (tuning/tracking/registry.py),
cost_model.pretrained, and `python -m tuning.tools.pretrain` on real TVM spaces."""
from __future__ import annotations

import numpy as np
import pytest
import xgboost as xgb

from configs import QUICK_TIMING
from tuning.core.measure import MeasureSpec
from tuning.core.records import MeasureResult
from tuning.core.task import gemm_task
from tuning.cost_model.xgb_ms import MetaScheduleXGBoost, pack
from tuning.hardware.corpus import load_corpus
from tuning.hardware.synthetic import SyntheticHardware
from tuning.store import TaskRows, connect_store
from tuning.tracking.registry import RegistryError, load_booster, parse_reference, register_booster, resolve


def fill_store(path, hardware, tasks_and_counts, seconds_of):
    """Rows for `count` random configs of each task, with made-up seconds (no measuring)."""
    store = connect_store(path)
    spec = MeasureSpec()
    for task, count in tasks_and_counts:
        space = hardware.space(task)
        rows = TaskRows(store, hardware, spec, task, space)
        rng = np.random.default_rng(0)
        configs = list(dict.fromkeys(space.canonical(space.sample(rng)) for _ in range(count)))
        for config in configs:
            rows.add(config, MeasureResult(costs=[seconds_of(task, config)] * 3), source="import")
    store.close()


def made_up_seconds(task, config):
    return 1e-3 * (1 + sum(config) % 7)


# ---- the corpus ------------------------------------------------------------------------------------
def test_corpus_reads_every_kernel_with_enough_configs(tmp_path):
    path = tmp_path / "store.sqlite"
    fill_store(path, SyntheticHardware(), [(gemm_task("a", 64, 64, 64), 30), (gemm_task("b", 32, 32, 32), 3)],
               made_up_seconds)
    corpus = load_corpus([path], min_configs=5)
    assert [t.task.name for t in corpus.tasks] == ["a"]
    assert any("b" in reason and "3 configs" in reason for reason in corpus.skipped)
    [task] = corpus.tasks
    assert task.task.workload["M"] == 64 and len(task.configs) == len(task.seconds) > 5
    assert task.ratio.max() == 1.0 and task.ratio.min() > 0
    assert np.allclose(task.ratio, task.seconds.min() / task.seconds)


def test_corpus_skips_a_kernel_without_a_workload(tmp_path):
    path = tmp_path / "store.sqlite"
    fill_store(path, SyntheticHardware(), [(gemm_task("a", 64, 64, 64), 10)], made_up_seconds)
    store = connect_store(path)
    with store.conn:
        store.conn.execute("UPDATE tasks SET workload = 'not json'")
    store.close()
    corpus = load_corpus([path])
    assert not corpus.tasks and "no workload" in corpus.skipped[0]


# ---- the registry ------------------------------------------------------------------------------------
def tiny_booster(seed=0, width=4):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(50, width)).astype(np.float32)
    return xgb.train({"max_depth": 2, "verbosity": 0, "base_score": 0.0}, xgb.DMatrix(X, label=X[:, 0]), 5)


def test_registry_round_trip(tmp_path):
    registry = f"sqlite:///{tmp_path / 'mlflow.db'}"
    booster = tiny_booster()
    first = register_booster(booster, "m", registry, "pretrain", {"kernels": 2}, {"heldout_spearman_mean": 0.5},
                             {"tunelab.features": "per_store", "tunelab.tasks": '[{"name": "a"}]'})
    second = register_booster(tiny_booster(1), "m", registry, "pretrain", {}, {}, {"tunelab.features": "per_store"})
    assert (first, second) == ("models:/m/1", "models:/m/2")
    loaded, tags = load_booster("models:/m/1", registry)
    X = np.random.default_rng(3).uniform(size=(7, 4)).astype(np.float32)
    assert np.allclose(loaded.inplace_predict(X), booster.inplace_predict(X))
    assert tags["tunelab.features"] == "per_store" and tags["tunelab.tasks"] == '[{"name": "a"}]'
    assert str(resolve("m", registry).version) == "2"  # no version: the latest
    with pytest.raises(RegistryError, match="no registered model"):
        resolve("models:/absent/1", registry)
    with pytest.raises(RegistryError, match="expected models:/<name>/<version>"):
        parse_reference("models:/bad name/x")


def test_pretrained_scores_before_the_warmup_and_is_fine_tuned_after(tmp_path):
    registry = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rng = np.random.default_rng(0)
    X = rng.uniform(0.1, 1, size=(200, 2, 4)).astype(np.float32)
    y = X[:, :, 0].sum(axis=1)
    base = MetaScheduleXGBoost(num_warmup_samples=0).fit(X, y).booster
    register_booster(base, "pre", registry, "pretrain", {}, {}, {"tunelab.features": "per_store"})
    model = MetaScheduleXGBoost(num_warmup_samples=100, pretrained="pre/1", registry=registry)
    rows, ids = pack(X[:5])
    expected = np.bincount(ids, weights=base.inplace_predict(rows), minlength=5)
    assert np.allclose(model.predict(X[:5]), expected)  # zero-shot before the warm-up
    model.fit(X[:50], y[:50])
    assert np.allclose(model.predict(X[:5]), expected)
    model.fit(X[:150], y[:150])
    rounds = base.num_boosted_rounds()
    assert model.booster.num_boosted_rounds() > rounds  # boosting continued from it: its first trees are base's
    assert np.allclose(model.booster[:rounds].inplace_predict(rows), base.inplace_predict(rows))


def test_a_missing_or_mismatched_pretrained_model_is_rejected(tmp_path):
    registry = f"sqlite:///{tmp_path / 'mlflow.db'}"
    register_booster(tiny_booster(width=164), "pre", registry, "pretrain", {}, {}, {"tunelab.features": "per_store"})
    params = {"features": "per_store", "registry": registry}
    [problem] = MetaScheduleXGBoost.check({**params, "pretrained": "models:/nothing/1"}, "cost_model")
    assert problem.startswith("cost_model.pretrained: no registered model") and "tunelab pretrain" in problem
    [problem] = MetaScheduleXGBoost.check({**params, "features": "both", "pretrained": "pre/1"}, "cost_model")
    assert "reads features per_store, not cost_model.features=both" in problem
    assert MetaScheduleXGBoost.check({**params, "pretrained": "pre/1"}, "cost_model") == []
    [problem] = MetaScheduleXGBoost.check({**params, "pretrained": None}, "cost_model")
    assert problem.startswith("cost_model.registry: set, but there is no cost_model.pretrained")
    [problem] = MetaScheduleXGBoost.check({**params, "pretrained": "pre/1", "registry": "nosuch://x"}, "cost_model")
    assert problem.startswith("cost_model.pretrained:")


# ---- real TVM spaces ---------------------------------------------------------------------------------
@pytest.mark.tvm
def test_pretrain_registers_a_model_a_run_starts_from(tmp_path, capsys):
    import tunelab
    from tuning.hardware.cpu import CPUHardware
    from tuning.tools import pretrain

    store = tmp_path / "store.sqlite"
    hardware = CPUHardware(num_threads=2)
    kernels = [(gemm_task("gemm_64", 64, 64, 64), 40), (gemm_task("gemm_32", 32, 32, 32), 40),
               (gemm_task("gemm_48", 48, 48, 48), 40)]

    def seconds(task, config):  # a made-up landscape the features can see: the inner tile of i
        decisions = hardware.space(task).decisions(config)
        return 1e-4 * (1 + abs(list(decisions.values())[1][-1] - 4))

    fill_store(store, hardware, kernels, seconds)
    registry = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = ["--store", str(store), "--tracking-uri", registry, "--name", "pre", "--min-configs", "10"]
    pretrain.main(command)  # in this process: its command line is tests/test_tool_flags.py's
    done = capsys.readouterr()
    assert "trained on 3 kernels" in done.out and "registered models:/pre/1" in done.out
    assert "held out gemm_64" in done.out
    pretrain.main([*command, "--exclude", "gemm_64"])
    without = capsys.readouterr()
    assert "trained on 2 kernels" in without.out and "registered models:/pre/2" in without.out
    assert "skipped" in without.err
    _, tags = load_booster("pre/1", registry)
    assert tags["tunelab.features"] == "per_store" and "gemm_48" in tags["tunelab.tasks"]
    tunelab.tune(["model=gemm_64", "search=evolutionary", "cost_model=xgb_ms", *QUICK_TIMING,  # run.py's job
                  "cost_model.pretrained=models:/pre/1", f"cost_model.registry={registry}", "search.population_size=32",
                  "budget.trials=8", "budget.plan_size=4", "tracking=none", f"output_dir={tmp_path / 'run'}"])
    assert "GFLOP/s" in capsys.readouterr().out  # an absent model is refused by validation: tests/test_value.py
