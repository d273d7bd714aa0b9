"""python -m tuning.tools.compare (tuning/tools/compare/): curves, censoring, the external target, the
methodology score by hand and against the autotuning-methodology package, and the whole tool on a
replayed grid run by run.py."""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest

from test_loop import finish, run_py
from test_store import SYNTHETIC_BACKEND, filled
from tuning.core.records import MeasureResult, Record
from tuning.tools.compare import (
    Curve,
    TaskTruth,
    compare,
    error_counts,
    incumbent_curve,
    main,
    markdown,
    stats,
    time_to_target,
    value_at_seconds,
    verdict_lines,
)


def curve(method: str, seed: int, values, task: str = "t") -> Curve:
    values = np.asarray(values, dtype=np.float64)
    return Curve(task, method, seed, f"{method}-{seed}", values, np.arange(1, len(values) + 1) * 0.5, "store")


def truth(best: float) -> dict:
    return {"t": TaskTruth({(i,): best + i for i in range(50)}, best, "store test")}


# ---- one run's curve -------------------------------------------------------------------------------
def record(config, cost, error=None) -> Record:
    result = MeasureResult.failed(error, "x") if error else MeasureResult(costs=[cost] * 3)
    return Record("t", "k", list(config), {}, result, 0, "m", 0, 0, 0.0)


def test_the_curve_scores_the_incumbent_by_the_store_not_by_its_reading():
    records = [record((0,), 5.0, "build"), record((1,), 3.0), record((2,), 4.0), record((3,), 2.0)]
    truths = {(1,): 3.5, (2,): 1.0, (3,): 2.5}  # config 2 is truly best, but its reading never made it incumbent
    assert incumbent_curve(records, truths).tolist() == [math.inf, 3.5, 3.5, 2.5]
    assert incumbent_curve(records, None).tolist() == [math.inf, 3.0, 3.0, 2.0]  # no store: its own readings


def test_time_to_target_censors_a_run_that_never_gets_there():
    run = curve("a", 0, [9, 7, 7, 5])
    assert time_to_target(run, 7.0, "measurements") == (2.0, True)
    assert time_to_target(run, 7.0, "seconds") == (1.0, True)
    assert time_to_target(run, 4.0, "measurements") == (4.0, False)  # censored at its length, kept


def test_the_incumbent_at_a_time_budget():
    run = curve("a", 0, [9, 7, 7, 5])  # measurements end at 0.5, 1.0, 1.5, 2.0 s
    assert value_at_seconds(run, 0.4) == math.inf  # nothing finished yet
    assert [value_at_seconds(run, t) for t in (0.5, 1.2, 2.0, 60.0)] == [9, 7, 5, 5]  # ended: keeps its last


def test_error_counts_name_failures_and_slow_kernels():
    records = [record((0,), 1.0), record((1,), 1.0, "timeout"), record((2,), 1.0, "invalid"),
               record((3,), 1.0, "invalid"),
               Record("t", "k", [4], {}, MeasureResult(costs=[1.0], message="fewer_runs: 3 run(s) x 10 cost(s)"),
                      0, "m", 0, 0, 0.0)]
    assert error_counts(records) == {"timeout": 1, "invalid": 2, "fewer_runs": 1}


def test_every_compare_table_counts_invalid_and_timeout_per_row():
    curves = [curve(method, seed, np.full(200, 1e-4)) for seed in range(3) for method in ("SA", "SA+AS")]
    result = compare(curves, {"t": TaskTruth({}, 1e-4, "store x")}, "SA", budgets=(64,))
    result.curves[0].errors = {"timeout": 3, "fewer_runs": 2}
    text = markdown(result, "test")
    assert "| method | measurements per run (median) | fewer_runs per run (mean) | invalid per run (mean) | " \
           "timeout per run (mean) |" in text
    assert "| SA | 200 | 0.7 | 0.0 | 1.0 |" in text


# ---- the comparison -------------------------------------------------------------------------------
def grid(better_by: float = 0.8, seeds: int = 10, length: int = 300) -> list[Curve]:
    rng = np.random.default_rng(0)
    curves = []
    for seed in range(seeds):
        base = np.minimum.accumulate(100 + 50 * rng.random(length))
        curves.append(curve("base", seed, base))
        curves.append(curve("fast", seed, base * better_by * (1 + 0.01 * rng.random(length))))
    return curves


def test_a_clearly_faster_method_is_called_better_and_budgets_past_the_runs_are_dropped():
    result = compare(grid(), truth(10.0), "base", budgets=(64, 256, 1000))
    rows = [r for r in result.budget_table if r["method"] == "fast"]
    assert [r["budget"] for r in rows] == [64, 256]
    assert all(r["verdict"] == "better" and r["ratio_high"] < 1 for r in rows)
    assert rows[0]["ratio"] == pytest.approx(0.8, rel=0.02)
    assert rows[0]["p"] == pytest.approx(2 / 2 ** 10)  # all 10 seeds faster: the exact signed-rank p
    assert any("1000" in note for note in result.notes)


def test_a_seconds_budget_compares_the_incumbents_at_that_time():
    result = compare(grid(), truth(10.0), "base", budgets=(64,), seconds=(50.0, 1000.0))
    rows = [r for r in result.budget_table if r["method"] == "fast" and r["axis"] == "seconds"]
    assert [r["budget"] for r in rows] == [50.0, 1000.0] and all(r["verdict"] == "better" for r in rows)
    assert rows[0]["ratio"] == pytest.approx(0.8, rel=0.02)  # 50 s = the first 100 measurements here
    assert any("ended before 1000 s" in note for note in result.notes)
    assert any(line.startswith("t at 50 s: fast vs base") for line in verdict_lines(result))


def test_the_same_method_twice_is_undecided():
    bases = [c for c in grid() if c.method == "base"]
    # "fast" is the baseline's own curves, each paired with another seed's: the same method twice
    curves = bases + [curve("fast", c.seed, bases[(c.seed + 1) % len(bases)].true_s) for c in bases]
    result = compare(curves, truth(10.0), "base", budgets=(64,))
    [row] = [r for r in result.budget_table if r["method"] == "fast"]
    assert row["verdict"] == "undecided"


def test_the_same_within_a_margin_needs_the_margin_and_the_equivalence_test():
    bases = [c for c in grid() if c.method == "base"]
    rng = np.random.default_rng(1)
    twins = [curve("twin", c.seed, c.true_s * (1 + 0.004 * rng.standard_normal())) for c in bases]
    plain = compare(bases + twins, truth(10.0), "base", budgets=(64,))
    [row] = [r for r in plain.budget_table if r["method"] == "twin"]
    assert row["verdict"] == "undecided" and "p_same" not in row
    within = compare(bases + twins, truth(10.0), "base", budgets=(64,), margin=1.05)
    [row] = [r for r in within.budget_table if r["method"] == "twin"]
    assert row["verdict"] == "the same within 1.05x" and row["p_same_holm"] < 0.05
    narrow = compare(bases + twins, truth(10.0), "base", budgets=(64,), margin=1.001)
    assert [r["verdict"] for r in narrow.budget_table if r["method"] == "twin"] == ["undecided"]


def test_the_target_comes_from_the_store_not_from_the_baselines_runs():
    # the store knows a config at 10; every run's incumbent stays above 50: nobody reaches the target,
    # and every run is counted (censored at its length), none dropped
    result = compare(grid(), truth(10.0), "base", budgets=(64,))
    for row in (r for r in result.target_table if r["axis"] == "measurements"):
        assert row["runs"] == 10 and row["reached"] == 0 and row["median"] is None and row["at_least"] == 300
    # with the store's best at 90 /0.95 -> target ~94.7: the fast method (x0.8 of ~100-150) gets there
    reached = compare(grid(), truth(90.0), "base", budgets=(64,), fraction=0.95)
    fast = next(r for r in reached.target_table if r["axis"] == "measurements" and r["method"] == "fast")
    assert fast["reached"] == 10 and fast["median"] is not None


def test_a_censored_run_moves_the_median_instead_of_vanishing():
    curves = [curve("base", s, [9] * 10) for s in range(5)]
    # method "m": three seeds reach 1.0 at 3, 5 and 8 measurements; two never do (length 10)
    hits = {0: 3, 1: 5, 2: 8}
    curves += [curve("m", s, [9] * (hits[s] - 1) + [1] * (11 - hits[s]) if s in hits else [9] * 10) for s in range(5)]
    result = compare(curves, {"t": TaskTruth({(0,): 1.0, (1,): 9.0}, 1.0, "store test")}, "base", budgets=(10,))
    row = next(r for r in result.target_table if r["axis"] == "measurements" and r["method"] == "m")
    assert (row["runs"], row["reached"], row["median"]) == (5, 3, 8.0)  # without the censored two: 5


def test_the_comparison_is_reproducible():
    first, second = (compare(grid(), truth(90.0), "base", budgets=(64, 256), seed=4) for _ in range(2))
    assert first.budget_table == second.budget_table and first.scores == second.scores


def test_a_seed_without_an_incumbent_yet_is_left_out_of_the_pairs():
    curves = [curve("base", s, [5.0, 4.0]) for s in range(4)]
    curves += [curve("m", s, [math.inf if s == 0 else 2.5, 2.0]) for s in range(4)]  # seed 0: nothing valid yet
    result = compare(curves, truth(1.0), "base", budgets=(1, 2))
    at_one, at_two = [r for r in result.budget_table if r["method"] == "m"]
    assert (at_one["pairs"], at_one["ratio"]) == (3, pytest.approx(0.5))
    assert (at_two["pairs"], at_two["ratio"]) == (4, pytest.approx(0.5))


def test_an_unknown_baseline_is_named():
    with pytest.raises(ValueError, match="no method 'nope'"):
        compare(grid(), truth(10.0), "nope")


# ---- the methodology score -------------------------------------------------------------------------
SPACE = np.arange(1.0, 101.0)  # true latencies 1..100: optimum 1, median 50.5


def test_cutoffs_by_hand():
    # 95%: target 1 + 49.5 * 0.05 = 3.475; worst first 100..1, the first <= it is 3 at index 97:
    # ceil(97 / (101 - 97)) = 25 measurements. 1%: target 50.005, first <= it is 50 at index 50: ceil(50/51) = 1
    assert stats.cutoff_fevals(SPACE, 0.95) == 25
    assert stats.cutoff_fevals(SPACE, 0.01) == 1


def test_random_search_baseline_by_hand():
    # index round(M * 101 / (M + 1)) of 100..1: M=1 -> round(50.5) = 50 -> 50; M=3 -> round(75.75) = 76 -> 24
    assert stats.random_search_curve(SPACE, [1, 3]).tolist() == [50.0, 24.0]


def test_score_is_one_at_the_optimum_zero_at_random_search_and_half_between():
    fevals = np.arange(1, 31)
    baseline = stats.random_search_curve(SPACE, fevals)
    at_optimum = np.ones((4, 30))
    assert stats.methodology_score(at_optimum, SPACE)["score"] == pytest.approx(1.0)
    assert stats.methodology_score(np.tile(baseline, (4, 1)), SPACE)["score"] == pytest.approx(0.0)
    halfway = stats.methodology_score(np.tile((baseline + 1) / 2, (4, 1)), SPACE)
    assert halfway["score"] == pytest.approx(0.5) and halfway["fevals"] == (1, 25)
    nothing_valid = stats.methodology_score(np.full((4, 30), math.inf), SPACE)["score"]
    assert nothing_valid == stats.methodology_score(np.full((4, 30), 100.0), SPACE)["score"] < 0  # the worst config


def test_score_against_the_autotuning_methodology_package(tmp_path):
    """Our cutoffs, random-search baseline and standardisation equal the package's own, read from the
    T4 file `python -m tuning.tools.dataset export` writes."""
    pytest.importorskip("jsonschema")
    from autotuning_methodology.baseline import RandomSearchCalculatedBaseline
    from autotuning_methodology.searchspace_statistics import SearchspaceStatistics

    from tuning.tools import dataset

    store, _ = filled(tmp_path / "store.sqlite", count=150)
    dataset.main(["export", "--store", str(store.path), "--task", "gemm_64", "--out", str(tmp_path / "gemm.json")])
    t4 = json.loads((tmp_path / "gemm_T4.json").read_text())
    space = np.array([r["measurements"][0]["value"] for r in t4["results"] if r["invalidity"] == "correct"])
    package = SearchspaceStatistics("gemm", "synthetic", True, ["compilation", "runtimes", "framework",
                                                                "search_algorithm", "validation"],
                                    ["time"], Path(tmp_path / "gemm_T4.json"))
    assert package.total_performance_absolute_optimum() == pytest.approx(space.min())
    for percentile in (0.01, 0.5, 0.95):
        assert package.cutoff_point(percentile)[1] == stats.cutoff_fevals(space, percentile)
    fevals = np.arange(1, 40)
    baseline = RandomSearchCalculatedBaseline(package)
    assert baseline.get_curve(fevals, "fevals") == pytest.approx(stats.random_search_curve(space, fevals))
    method = np.minimum.accumulate(np.random.default_rng(0).choice(space, size=39))
    ours = (stats.random_search_curve(space, fevals) - method) / (stats.random_search_curve(space, fevals) - space.min())
    assert baseline.get_standardised_curve(fevals, method, "fevals") == pytest.approx(ours)


# ---- the tool, on a replayed grid ------------------------------------------------------------------
def test_compare_a_replayed_grid_from_mlflow(tmp_path, capsys):
    store, _ = filled(tmp_path / "store.sqlite", count=200)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    output = finish(run_py("-m", "model=gemm_64", "hardware=replay", *SYNTHETIC_BACKEND, f"hardware.store={store.path}",
                           "hardware.on_miss=error", "model.space=store", "search=random,sa", "seed=0,1",
                           "budget.trials=48", "budget.plan_size=16", "budget.init_random=8", f"tracking.uri={uri}",
                           "tracking.experiment=grid",
                           f"hydra.sweep.dir={tmp_path}/multirun", tmp=tmp_path), timeout=300)
    check_the_grid_summary(output, uri, tmp_path)
    firsts = {}
    for path in sorted((tmp_path / "multirun").glob("*/records.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        firsts.setdefault(lines[0]["seed"], []).append([r["config"] for r in lines[:8]])
    assert all(a == b for a, b in firsts.values()) and len(firsts) == 2  # common random numbers

    main(["--experiment", "grid", "--baseline", "random", "--tracking-uri", uri, "--out", str(tmp_path / "cmp"),
          "--budgets", "16", "48", "64"])
    printed = capsys.readouterr().out
    assert "sa vs random" in printed and "first 8 measurements shared" in printed
    assert "budgets 64 left out" in printed
    assert "single round" not in printed  # three rounds of 16: each search saw measurements
    table = (tmp_path / "cmp" / "compare.csv").read_text().splitlines()
    assert sum(line.startswith("budget,") for line in table) == 4  # 2 budgets x 2 methods
    assert (tmp_path / "cmp" / "curves_gemm_64.png").stat().st_size > 10_000

    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("tunelab-compare").experiment_id])
    assert run.data.params["baseline"] == "random" and "score/sa" in run.data.metrics
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"compare.md", "compare.csv",
                                                                         "curves_gemm_64.png"}
    assert (tmp_path / "mlartifacts").is_dir()  # beside the store, never ./mlruns of the working directory

    from tuning.tools.compare.load import gather, job_runs

    runs = job_runs(client, "grid")
    plain = {(c.method, c.seed): c.elapsed_s for c in gather(client, runs, tmp_path / "s1", ["search"]).curves}
    loaded = gather(client, runs, tmp_path / "s2", ["search"], with_overhead=True)
    assert any("search and model-fitting seconds" in note for note in loaded.notes)
    assert not any("no per-round" in note for note in loaded.notes)  # live runs log them every round
    for curve in loaded.curves:  # every method's own compute on its seconds axis, the same rule for all
        added = curve.elapsed_s - plain[(curve.method, curve.seed)]
        assert np.all(np.diff(added) >= -1e-12) and added[-1] > 0  # (float sums: differences of 1e-18)


def check_the_grid_summary(output: str, uri: str, tmp_path: Path) -> None:
    """A grid's parent run summarises its jobs (best per method, the compare command) and the grid's last
    printed line is that command, which works as printed."""
    import shlex
    import subprocess

    from mlflow.tracking import MlflowClient

    from tuning.config.cli import tunelab_command

    client = MlflowClient(uri)
    [parent] = [r for r in client.search_runs([client.get_experiment_by_name("grid").experiment_id])
                if "mlflow.parentRunId" not in r.data.tags]
    command = output.strip().splitlines()[-1]
    assert command == parent.data.tags["tunelab.compare_command"]
    assert command.startswith(f"{tunelab_command('compare')} --experiment grid --parent {parent.info.run_id} "
                              "--baseline random ")
    for method in ("random", "sa"):  # best per method
        assert parent.data.metrics[f"best/final_latency_us/{method}/gemm_64"] > 0
    assert "| sa | gemm_64 | 2 | best/final_latency_us |" in parent.data.tags["mlflow.note.content"]
    assert "grid_summary.md" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    done = subprocess.run(f"{command} --no-mlflow-run --out {shlex.quote(str(tmp_path / 'as-printed'))}", shell=True,
                          cwd="/", capture_output=True, text=True, timeout=300)  # pasted into a shell elsewhere
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| sa | 2 |" in (tmp_path / "as-printed" / "compare.md").read_text()  # both methods, both seeds


def test_the_overhead_axis_counts_a_rounds_search_before_it_and_its_fit_after_it():
    from tuning.tools.compare.load import overhead_at_each

    search = {16: 1.0, 32: 3.0, 48: 6.0}  # cumulative seconds after each round of 16
    assert overhead_at_each(search, 50).tolist() == [1.0] * 16 + [3.0] * 16 + [6.0] * 18
    fits = {16: 0.5, 32: 1.5, 48: 2.0}  # a round's fit comes after its measurements: the next round pays it
    assert overhead_at_each(fits, 48, from_round_before=True).tolist() == [0.0] * 16 + [0.5] * 16 + [1.5] * 16
    assert overhead_at_each({}, 3).tolist() == [0.0, 0.0, 0.0]
    resumed = {16: 1.0, 32: 3.0, 48: 0.5}  # a resume counts its seconds from 0 again: 3.0 + 0.5
    assert overhead_at_each(resumed, 48).tolist()[-1] == 3.5
    reused = {24: 1.0, 40: 2.0}  # 8 records from tuning.database counted in the steps
    assert overhead_at_each(reused, 32, reused=8).tolist() == [1.0] * 16 + [2.0] * 16


def test_a_run_measured_in_a_single_round_is_counted_as_such():
    """compare warns about runs whose search never saw a measurement: each task's rounds are counted."""
    from types import SimpleNamespace

    from tuning.tools.compare.load import measured_rounds

    def records(*task_rounds):
        return [SimpleNamespace(task=task, round=r) for task, r in task_rounds]

    assert measured_rounds(records(("a", 0), ("a", 0), ("b", 0))) == 1
    assert measured_rounds(records(("a", 0), ("b", 0), ("b", 1))) == 2
    assert measured_rounds([]) == 0


def test_compare_rejects_bad_arguments(tmp_path, capsys):
    for argv, message in ((["--baseline", "x", "--fraction", "nan"], "--fraction"),
                          (["--baseline", "x", "--fraction", "1.5"], "--fraction"),
                          (["--baseline", "x", "--budgets", "0"], "--budgets"),
                          (["--baseline", "x", "--seconds", "inf"], "--seconds"),
                          (["--baseline", "x", "--tag", "novalue"], "--tag")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err



# ---- a grid over several models ----------------------------------------------------------------------
class FakeClient:
    """What gather() asks of MLflow: each run's records.jsonl and tasks.json."""

    def __init__(self, files: dict):
        self.files = files  # run id -> {artifact name: text}

    def download_artifacts(self, run_id, path, folder):
        target = Path(folder) / path
        target.write_text(self.files[run_id][path])
        return str(target)


def fake_run(run_id: str, method: str, seed: int, model: str, cost: float):
    from types import SimpleNamespace

    rows = [Record(model, f"key-{model}", [i], {}, MeasureResult(costs=[cost + i * 1e-6] * 3), 0, method, seed, i, float(i))
            for i in range(4)]
    files = {"records.jsonl": "".join(r.to_json() + "\n" for r in rows),
             "tasks.json": json.dumps([{"name": model, "key": f"key-{model}"}])}
    run = SimpleNamespace(info=SimpleNamespace(run_id=run_id, run_name=run_id, start_time=0),
                          data=SimpleNamespace(params={"seed": str(seed), "model.name": model},
                                               tags={"choice.search": method}, metrics={"run/run_s": cost * 1e4}))
    return run, files


def test_a_grid_over_models_keeps_one_run_per_model_at_each_seed(tmp_path):
    """Two models share methods and seeds: neither model's runs may hide the other's (they did, when
    the newest run per method and seed was kept whatever its model)."""
    from tuning.tools.compare import gather

    made = [fake_run(f"{model}-{method}-{seed}", method, seed, model, cost)
            for model, cost in (("conv_l7", 2e-4), ("conv_l8", 1e-4)) for method in ("sa", "ppo") for seed in (0, 1)]
    client = FakeClient({run.info.run_id: files for run, files in made})
    found = gather(client, [run for run, _ in made], tmp_path, ["search"])
    assert sorted({(c.task, c.method, c.seed) for c in found.curves}) == sorted(
        (model, method, seed) for model in ("conv_l7", "conv_l8") for method in ("ppo", "sa") for seed in (0, 1))
    assert set(found.metrics) == {(m, s, model) for model in ("conv_l7", "conv_l8") for m in ("sa", "ppo") for s in (0, 1)}
    result = compare(found.curves, found.truths, "sa", budgets=(4,), run_metrics=found.metrics,
                     metric_keys=("run/run_s",))
    assert {(r["model"], r["method"]) for r in result.metric_table} == {
        (model, method) for model in ("conv_l7", "conv_l8") for method in ("sa", "ppo")}


def test_runs_from_different_hardware_are_flagged(tmp_path):
    """Readings of two machines do not compare: the comparison says which hardware measured what."""
    from tuning.tools.compare import gather

    made = [fake_run(f"{method}-{seed}", method, seed, "conv_l8", 1e-4) for method in ("sa", "ppo") for seed in (0, 1)]
    for run, _ in made:
        run.data.tags.update(hardware="cpu", cpu_model="Xeon" if run.info.run_id != "ppo-1" else "EPYC")
    client = FakeClient({run.info.run_id: files for run, files in made})
    notes = gather(client, [run for run, _ in made], tmp_path, ["search"]).notes
    assert any(note.startswith("the runs were measured on different hardware") and "EPYC" in note for note in notes)
    same = [run for run, _ in made if run.info.run_id != "ppo-1"]
    assert "hardware: cpu / Xeon" in gather(client, same, tmp_path, ["search"]).notes


def test_a_store_key_sqlite_cannot_take_falls_back_to_the_runs_readings():
    """tasks.json is an untrusted artifact: JSON can carry a lone surrogate, which sqlite cannot bind."""
    from tuning.tools.compare.load import _store_entry

    assert _store_entry({"store": "s.sqlite", "store_key": ["hw", "task", "\udc80"]}) == (None, ())
    assert _store_entry({"store": "s.sqlite", "store_key": ["hw", "task", "space"]}) == ("s.sqlite", ("hw", "task", "space"))


# ---- which runs are one method: everything but the seed --------------------------------------------
def tracked(client, experiment_id: str, search: str, seed: int, trials: int = 32, parallel_size: int = 128,
            hardware: str = "synthetic", parent: str | None = None, tags: dict | None = None, cost: float = 1e-4) -> str:
    """A finished job run as tunelab logs one (params, choice tags, records.jsonl, tasks.json), without tuning."""
    import tempfile

    from mlflow.entities import Param

    run = client.create_run(experiment_id, run_name=f"gemm_64-{search}-b{trials}-{seed}", tags={
        "choice.search": search, "choice.sampler": "greedy", "choice.cost_model": "xgb", "choice.evaluator": "fixed",
        "choice.hardware": hardware, "seed": str(seed), **({"mlflow.parentRunId": parent} if parent else {}),
        **(tags or {})})
    params = {"seed": seed, "cost_model.seed": seed, "model.name": "gemm_64", "model.M": 64, "model.space": "full",
              "budget.trials": trials, "budget.plan_size": 16, "search._target_": f"tuning.search.{search}.S",
              "search.parallel_size": parallel_size, "hardware._target_": f"tuning.hardware.{hardware}.H",
              "output_dir": f"/runs/{search}-{seed}-{trials}", "tracking.experiment": "x"}
    client.log_batch(run.info.run_id, params=[Param(k, str(v)) for k, v in params.items()])
    rows = [Record("gemm_64", "key-gemm_64", [i], {}, MeasureResult(costs=[cost * (1 + 0.1 * ((i * 7 + seed) % 5))] * 3),
                   i // 16, search, seed, i, time.time() + i) for i in range(trials)]
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "records.jsonl").write_text("".join(r.to_json() + "\n" for r in rows))
        (Path(folder) / "tasks.json").write_text(json.dumps([{"name": "gemm_64", "key": "key-gemm_64"}]))
        client.log_artifact(run.info.run_id, f"{folder}/records.jsonl")
        client.log_artifact(run.info.run_id, f"{folder}/tasks.json")
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


@pytest.fixture
def tracking(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    return uri, client, client.create_experiment("lab", artifact_location=(tmp_path / "artifacts").as_uri())


def compare_cli(uri: str, *argv: str, tmp: Path) -> tuple[object, str]:
    out = tmp / f"cmp{len(list(tmp.glob('cmp*')))}"
    result = main(["--experiment", "lab", "--tracking-uri", uri, "--no-mlflow-run", "--out", str(out),
                   "--budgets", "16", "32", *argv])
    return result, (out / "compare.md").read_text()


def test_runs_of_one_method_with_different_budgets_are_rows_of_their_own_and_an_unlike_baseline_is_refused(
        tmp_path, tracking, capsys):
    """sa at 32 and at 64 measurements is two rows, never one method with four runs; --baseline sa is refused
    naming the key they differ in (on the old behaviour both pooled under "sa", the newer run of a seed kept)."""
    from tuning.tools.compare.selection import Refused

    uri, client, experiment = tracking
    for seed in (0, 1):
        tracked(client, experiment, "random", seed)
        tracked(client, experiment, "sa", seed, trials=32)
        tracked(client, experiment, "sa", seed, trials=64)
    with pytest.raises(Refused, match=r"--baseline sa: .*differ in budget.trials.*sa\[budget.trials=32\]; "
                                      r"sa\[budget.trials=64\]") as refused:
        compare_cli(uri, "--baseline", "sa", tmp=tmp_path)
    assert refused.value.code == 2 and "--baseline sa" in capsys.readouterr().err
    result, report = compare_cli(uri, "--baseline", "random", tmp=tmp_path)
    assert {c.method for c in result.curves} == {"random", "sa[budget.trials=32]", "sa[budget.trials=64]"}
    assert len([c for c in result.curves if c.method.startswith("sa")]) == 4  # no run left out as "a newer run"
    assert "sa: its runs did not all run alike, so they are rows of their own, told apart by budget.trials" in report
    assert report.index("told apart by budget.trials") < report.index("## gemm_64")  # at the top, not in the notes
    assert "warning: the compared rows did not run alike: budget.trials 32 (random, sa[budget.trials=32]), " \
           "64 (sa[budget.trials=64])" in report
    compare_cli(uri, "--baseline", "sa[budget.trials=32]", tmp=tmp_path)  # a row named as printed is a baseline
    pooled, report = compare_cli(uri, "--baseline", "sa", "--group-by", "name", tmp=tmp_path)
    assert {c.method for c in pooled.curves} == {"random", "sa"}
    assert "warning: sa pools runs that did not run alike: budget.trials 32 / 64" in report


def test_runs_of_one_method_with_different_hyperparameters_or_hardware_are_rows_of_their_own(tmp_path, tracking):
    uri, client, experiment = tracking
    for seed in (0, 1):
        tracked(client, experiment, "sa", seed, parallel_size=128)
        tracked(client, experiment, "sa", seed, parallel_size=256)
        tracked(client, experiment, "random", seed)
        tracked(client, experiment, "random", seed, hardware="cpu")
    result, report = compare_cli(uri, "--baseline", "sa[search.parallel_size=128]", tmp=tmp_path)
    assert {c.method for c in result.curves} == {
        "sa[search.parallel_size=128]", "sa[search.parallel_size=256]",
        "random[hardware._target_=tuning.hardware.cpu.H]", "random[hardware._target_=tuning.hardware.synthetic.H]"}
    assert "told apart by search.parallel_size" in report and "told apart by hardware._target_" in report


def test_compare_reads_the_latest_grid_by_default_and_says_what_it_picked(tmp_path, tracking):
    """A grid, then an Optuna sweep in the same experiment: the sweep's trials (other hyperparameters, other
    budgets) are not taken for the grid's seeds; the report's first line says which runs it compared."""
    uri, client, experiment = tracking
    grid = client.create_run(experiment, run_name="sweep search x seed", tags={"tunelab.multirun": "/m/1"}).info.run_id
    for search in ("random", "sa"):
        for seed in (0, 1):
            tracked(client, experiment, search, seed, parent=grid)
    sweep = client.create_run(experiment, run_name="sa_temperature", tags={"tunelab.multirun": "/m/2"}).info.run_id
    for trial, size in enumerate((256, 32)):
        tracked(client, experiment, "sa", 0, trials=64, parallel_size=size, parent=sweep,
                tags={"optuna.trial": str(trial), "optuna.study": "sa_temperature-gemm_64"})
    tracked(client, experiment, "sa", 0, trials=256, hardware="cpu")  # a single run, the newest
    result, report = compare_cli(uri, "--baseline", "sa", tmp=tmp_path)
    assert {r.info.run_id for r in client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{grid}'")} == {
        c.run_id for c in result.curves}
    assert report.splitlines()[2].startswith(f"Selected: the latest grid of experiment 'lab', parent run "
                                             f"'sweep search x seed' ({grid}): its 4 finished runs; 3 other")
    everything, report = compare_cli(uri, "--baseline", "random", "--all-runs", tmp=tmp_path)
    assert len(everything.curves) == 7 and "Selected: every finished run of experiment 'lab' (--all-runs): 7 runs" \
        in report
    with pytest.raises(SystemExit, match="--baseline sa: its runs did not all run alike"):
        compare_cli(uri, "--baseline", "sa", "--all-runs", tmp=tmp_path)


def test_compare_where_there_are_no_runs_creates_nothing_and_names_where_it_looked(tmp_path, monkeypatch, capsys):
    from tuning.tools.compare.selection import Refused

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "outputs"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(Refused) as refused:
        main(["--baseline", "sa"])
    assert refused.value.code == 2
    assert f"no runs in sqlite:///{tmp_path}/outputs/mlflow.db (it does not exist)" in capsys.readouterr().err
    import tunelab
    from tunelab import ui

    with pytest.raises(ValueError, match="no runs in sqlite:///.*/outputs/mlflow.db \\(it does not exist\\)"):
        tunelab.compare("sa")
    monkeypatch.setattr(os, "execvp", lambda *command: pytest.fail(f"tunelab ui served a store it made: {command}"))
    with pytest.raises(SystemExit) as stopped:
        ui.main([])
    assert stopped.value.code == 2 and "tunelab ui: no runs in sqlite:///" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no outputs/mlflow.db, no folder
    uri = f"sqlite:///{tmp_path}/m.db"
    from mlflow.tracking import MlflowClient

    MlflowClient(uri).create_experiment("other")
    with pytest.raises(SystemExit, match=f"no MLflow experiment 'none' in {uri} \\(it holds 'Default', 'other'\\)"):
        main(["--baseline", "x", "--experiment", "none", "--tracking-uri", uri])


def test_what_a_setting_is():
    """The seed (and a component's `${seed}`), paths, tracking, storage and the workload are no settings; a store
    a run did not set reads null; a key only one run holds is no difference; lists go by element in a config."""
    from tuning.config.identity import config_settings, differing, method_rows, run_settings

    params = {"seed": "3", "cost_model.seed": "3", "budget.trials": "32", "model.name": "gemm_64", "model.space": "store",
              "tracking.experiment": "x", "storage.mlflow_uri": "sqlite:///m.db", "output_dir": "/o", "e2e.runs": "50",
              "objective.report_every": "16", "search.parallel_size": "128", "method": "sa+greedy+xgb"}
    assert run_settings(params, {"tunelab.tuning.database": "/earlier"}) == {
        "budget.trials": "32", "model.space": "store", "search.parallel_size": "128", "hardware.store": "null",
        "tuning.database": "/earlier"}
    config = {"seed": 0, "hydra": {"x": 1}, "search": {"temp": [1.0, 0.0]}, "hardware": {"store": "postgresql://u:pw@h/s"},
              "objective": {"metrics": ["final_gflops"]}}
    assert config_settings(config, ["search.temp.0"]) == {"search.temp.1": "0.0", "hardware.store": "postgresql://u@h/s",
                                                          "objective.metrics.0": "final_gflops"}
    assert differing({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == ["b"]
    rows, unlike = method_rows([{"search": "sa"}, {"search": "sa"}, {"search": "random"}],
                               [{"budget.trials": "32"}, {"budget.trials": "256", "new.key": "1"}, {"budget.trials": "32"}])
    assert rows == ["sa[budget.trials=32]", "sa[budget.trials=256]", "random"]
    assert unlike == {"sa": {"budget.trials": ["32", "256"]}, "random": {}}
