"""Transfer: the store as a corpus (tuning/hardware/corpus.py) and corpora cut to one size (at_most), the
model registry (tuning/tracking/registry.py), cost_model.pretrained, `python -m tuning.tools.pretrain` on
real TVM spaces, and schedules chosen with no measurement (search=random with budget.trials=0, a
pre-trained model's pick of random schedules)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import xgboost as xgb

from configs import QUICK_TIMING
from tuning.core.measure import MeasureSpec
from tuning.core.records import MeasureResult
from tuning.core.task import gemm_task
from tuning.cost_model.xgb_ms import PER_STORE_WIDTH, MetaScheduleXGBoost, pack
from tuning.hardware.corpus import at_most, load_corpus
from tuning.hardware.synthetic import SyntheticHardware
from tuning.search.random import RandomSearch
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


# ---- corpora of one size -------------------------------------------------------------------------
def test_a_corpus_cut_to_one_size_is_a_seeded_draw_wherever_the_store_lies(tmp_path):
    path = tmp_path / "a.sqlite"
    fill_store(path, SyntheticHardware(), [(gemm_task("a", 64, 64, 64), 40), (gemm_task("b", 32, 32, 32), 6)],
               made_up_seconds)
    whole = {t.task.name: t for t in load_corpus([path], min_configs=2).tasks}
    cut = {t.task.name: t for t in at_most(load_corpus([path], min_configs=2), 10, seed=1).tasks}
    assert len(cut["a"].configs) == 10 and len(cut["b"].configs) == len(whole["b"].configs) == 6
    assert set(cut["a"].configs) < set(whole["a"].configs)
    seconds = dict(zip(whole["a"].configs, whole["a"].seconds))
    assert all(seconds[c] == s for c, s in zip(cut["a"].configs, cut["a"].seconds))
    shutil.copy(path, tmp_path / "elsewhere.sqlite")
    moved = at_most(load_corpus([tmp_path / "elsewhere.sqlite"], min_configs=2), 10, seed=1).tasks
    assert {t.task.name: t.configs for t in moved}["a"] == cut["a"].configs
    reseeded = at_most(load_corpus([path], min_configs=2), 10, seed=2).tasks
    assert {t.task.name: t.configs for t in reseeded}["a"] != cut["a"].configs
    assert at_most(load_corpus([path], min_configs=2), None, seed=1).configs == 46


def test_the_cut_and_the_skipped_correlations_are_checked_options(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    fill_store(store, SyntheticHardware(), [(gemm_task("a", 64, 64, 64), 4)], made_up_seconds)
    from tuning.tools import pretrain
    from tuning.tools.pretrain import parse_args
    from tuning.tools.value import main as value_main

    for main, command in ((pretrain.main, []), (value_main, ["train"])):  # each command's main, in this process
        with pytest.raises(SystemExit) as done:
            main([*command, "--store", str(store), "--configs-per-kernel", "1"])
        assert done.value.code == 2 and "--configs-per-kernel" in capsys.readouterr().err

    args = parse_args(["--store", str(store), "--configs-per-kernel", "24", "--no-heldout"])
    assert args.configs_per_kernel == 24 and args.no_heldout


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


# ---- search=random with no measurement ------------------------------------------------------------
class PrefersLargeUnroll:
    """A cost model that ranks: the higher the last knob's index, the better."""
    features = "knobs"
    can_rank = True

    def predict(self, X):
        return np.asarray(X, dtype=np.float64)[:, -1]


def test_a_random_schedule_is_legitimate_and_drawn_from_the_seed():
    hardware = SyntheticHardware(invalid_register_tile=2)
    space = hardware.space(gemm_task("g", 64, 64, 64))
    search = RandomSearch()
    first = search.best(space, None, np.random.default_rng([3, 1]))
    again = search.best(space, None, np.random.default_rng([3, 1]))
    other = {search.best(space, None, np.random.default_rng([s, 1]))[0] for s in range(8)}
    assert first == again and first[1] is None and space.is_legitimate(first[0])
    assert len(other) > 1  # another seed, another schedule


def test_best_of_many_is_the_cost_models_first_legitimate_pick():
    space = SyntheticHardware().space(gemm_task("g", 64, 64, 64))
    search = RandomSearch(best_of=64)
    chosen, predicted = search.best(space, PrefersLargeUnroll(), np.random.default_rng(0))
    drawn = RandomSearch().propose(space, None, 64, set(), np.random.default_rng(0))  # the same 64 draws
    assert predicted is None and chosen in drawn
    assert chosen[-1] == max(c[-1] for c in drawn)


def test_a_run_with_no_measurement_applies_a_random_legitimate_schedule(tmp_path, capsys):
    import tunelab

    tunelab.tune(["hardware=synthetic", "tracking=none", "model=gemm_64", "search=random", "budget.trials=0",
                  f"output_dir={tmp_path / 'run'}"])
    done = capsys.readouterr().out
    assert "(timed once; chosen without measuring)" in done and "measurements 0" in done
    assert (tmp_path / "run" / "records.jsonl").read_text() == ""


def test_random_schedules_without_measuring_and_best_of_needs_a_ranking_model(compose_cfg):
    from tuning.config import ConfigError
    from tuning.engine.validate import validate

    validate(compose_cfg("search=random", "budget.trials=0"))
    with pytest.raises(ConfigError, match="search.best_of: 8 random configs ranked by a cost model that ranks nothing"):
        validate(compose_cfg("search=random", "search.best_of=8", "cost_model=none", "budget.trials=0"))
    with pytest.raises(ConfigError, match="search.best_of"):
        validate(compose_cfg("search=random", "search.best_of=0", "budget.trials=0"))


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


# ---- real TVM: a pre-trained cost model's pick with no measurement ---------------------------------
@pytest.mark.tvm
def test_a_pretrained_cost_models_pick_of_random_schedules_is_applied_with_no_measurement(tmp_path, capsys):
    """`tunelab pretrain --configs-per-kernel --no-heldout` on a store of real TVM spaces, then
    run.py model=conv_tiny search=random search.best_of=16 cost_model=xgb_ms budget.trials=0: a kernel the
    model never saw (a network's kernels go the same way: tests/test_value.py's scheduled_network)."""
    import tunelab
    from tuning.hardware.cpu import CPUHardware
    from tuning.tools import pretrain

    hardware, store = CPUHardware(num_threads=2), tmp_path / "store.sqlite"
    fill_store(store, hardware, [(gemm_task(f"gemm_{n}", n, n, n), 30) for n in (32, 64)], made_up_seconds)
    registry = f"sqlite:///{tmp_path / 'mlflow.db'}"
    pretrain.main(["--store", str(store), "--no-heldout", "--configs-per-kernel", "24", "--name", "x",
                   "--tracking-uri", registry])  # in this process: its command line is tests/test_tool_flags.py's
    trained = capsys.readouterr().out
    assert "trained on 2 kernels, 48 measured configs" in trained and "held out" not in trained
    tunelab.tune(["model=conv_tiny", "search=random", "search.best_of=16", "cost_model=xgb_ms",  # run.py's job
                  "cost_model.pretrained=x", f"cost_model.registry={registry}", "budget.trials=0", "tracking=none",
                  "e2e.enabled=false", *QUICK_TIMING, f"output_dir={tmp_path / 'run'}"])
    run = capsys.readouterr()
    assert "scheduled 1 kernel without measuring" in run.err + run.out
    assert (tmp_path / "run" / "records.jsonl").read_text() == ""
    assert (tmp_path / "run" / "database" / "database_tuning_record.json").read_text().count("\n") == 1


@pytest.mark.tvm
def test_pretrain_learns_from_several_hosts_holds_one_out_and_saves_a_prior(tmp_path, capsys):
    """Two hosts' rows in one store: each kernel's space rebuilt for its own host, both learned from;
    --exclude-hardware leaves one host out; --save writes the booster and what it saw, which
    tuning.prior reads back as a shipped prior."""
    from tuning.cost_model import priors
    from tuning.hardware.cpu import CPUHardware
    from tuning.store import connect_store
    from tuning.tools import pretrain

    store = tmp_path / "store.sqlite"
    hosts = [CPUHardware(mcpu="znver3", num_threads=2), CPUHardware(mcpu="skylake-avx512", num_threads=2)]
    for hardware in hosts:
        fill_store(store, hardware, [(gemm_task(f"gemm_{n}", n, n, n), 25) for n in (32, 48)], made_up_seconds)
    opened = connect_store(store, read_only=True)
    fingerprints = sorted({hardware for hardware, _, _ in opened.keys()})
    opened.close()
    assert len(fingerprints) == 2
    registry = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = ["--store", str(store), "--tracking-uri", registry, "--name", "pre", "--min-configs", "10",
               "--no-heldout", "--rounds", "20", "--max-depth", "4"]
    pretrain.main([*command, "--save", str(tmp_path / "both")])
    assert "trained on 4 kernels" in capsys.readouterr().out
    booster, about = priors.load("package:both", folder=tmp_path)
    assert booster.num_features() == PER_STORE_WIDTH and about["hardware"] == fingerprints
    assert booster.num_boosted_rounds() <= 20 and {t["hardware"] for t in about["tasks"]} == set(fingerprints)
    pretrain.main([*command, "--exclude-hardware", fingerprints[0][:12], "--save", str(tmp_path / "one")])
    done = capsys.readouterr()
    assert "trained on 2 kernels" in done.out and "--exclude-hardware" in done.err
    assert priors.load("package:one", folder=tmp_path)[1]["hardware"] == fingerprints[1:]
    with pytest.raises(priors.PriorError, match="no prior 'package:absent' ships with tunelab.*package:both"):
        priors.load("package:absent", folder=tmp_path)
    (tmp_path / "broken.ubj").write_bytes(b"not a booster")
    with pytest.raises(priors.PriorError, match="broken.ubj is not a readable xgboost booster"):
        priors.load("package:broken", folder=tmp_path)
    with pytest.raises(priors.PriorError, match="no prior"):
        priors.load("package:../both", folder=tmp_path)  # a name, never a path
