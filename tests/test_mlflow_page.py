"""What MLflow shows of a run, without a browser: names that tell runs apart, the method in one word,
the headline metrics under names the UI shows first and logged once, figures that say which run they
are, the links the tools print, a sweep's closing line. The browser's view: tests/test_mlflow_ui.py."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from urllib.parse import unquote

import pytest
from omegaconf import OmegaConf

from tuning.config.cli import tunelab_command
from tuning.config.naming import (
    BEST_SO_FAR,
    FINAL_GFLOPS,
    FINAL_LATENCY_MS,
    FINAL_LATENCY_US,
    figure_title,
    method_label,
    run_name,
    with_current_names,
)
from tuning.core.outcome import TaskOutcome
from tuning.core.task import gemm_task
from tuning.engine.callbacks import curve_metrics
from tuning.engine.final import log_final_metrics
from tuning.sweep.multirun import best_line
from tuning.tools import sync
from tuning.tools.compare.report import compare_runs_page, mlflow_links
from tuning.tracking.mlflow_tracker import MlflowTracker
from tuning.tracking.plot import convergence_png

SA = {"search": "sa", "sampler": "greedy", "cost_model": "xgb", "evaluator": "fixed", "hardware": "synthetic"}


def config(trials=None, seed: int = 0):
    cfg = OmegaConf.create({"model": {"name": "gemm_64", "kind": "gemm"}, "seed": seed})
    if trials is not None:
        cfg.budget = {"trials": trials}
    return cfg


# ---- names ----------------------------------------------------------------------------------------
def test_runs_of_different_budgets_have_different_names():
    assert run_name(config(40), SA) == "gemm_64-sa-greedy-b40-synthetic-0"
    assert run_name(config(160), SA) != run_name(config(40), SA)
    assert run_name(config(40), {**SA, "hardware": "cpu"}) == "gemm_64-sa-greedy-b40-0"
    assert run_name(config(0), SA) == "gemm_64-sa-greedy-b0-synthetic-0"
    assert run_name(config(), SA) == "gemm_64-sa-greedy-synthetic-0"  # a config without a budget


def test_the_method_is_search_sampler_cost_model_and_a_non_default_evaluator():
    assert method_label(SA) == "sa+greedy+xgb"
    assert method_label({**SA, "sampler": "kmeans", "evaluator": "adaptive"}) == "sa+kmeans+xgb+adaptive"
    assert method_label({"search": "random"}) == "random+?+?"


def test_a_figure_names_method_workload_and_seed(tmp_path, monkeypatch):
    import matplotlib.axes

    titles = []
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda ax, text, *a, **k: titles.append(text))
    title = figure_title(config(40, seed=3), SA)
    assert title == "sa+greedy+xgb on gemm_64, seed 3"
    convergence_png({"gemm_64": [(1, 1.0), (4, 2.0)]}, str(tmp_path / "convergence.png"), final=2.0, title=title)
    assert titles == [f"Convergence: {title}"]


# ---- the headline metrics ------------------------------------------------------------------------
def test_the_headline_group_sorts_before_every_other_group():
    """MLflow's UI orders metric sections by the text before the last "/"."""
    others = ["e2e", "evaluator", "hardware", "model", "round", "run", "sampler", "search", "system", "task/conv1",
              "time", "tuning"]
    for key in (BEST_SO_FAR, FINAL_GFLOPS, FINAL_LATENCY_US, FINAL_LATENCY_MS):
        group = key.rsplit("/", 1)[0]
        assert group and sorted([group, *others])[0] == group, key


def test_older_runs_read_under_the_current_names():
    old = {"final_gflops": 50.0, "final_latency_us": 7.0, "tuning/best_gflops": 60.0, "run/run_s": 1.0}
    read = with_current_names(old)
    assert read[FINAL_GFLOPS] == 50.0 and read[FINAL_LATENCY_US] == 7.0 and read[BEST_SO_FAR] == 60.0
    assert read["run/run_s"] == 1.0
    assert with_current_names({"final_gflops": 1.0, FINAL_GFLOPS: 2.0})[FINAL_GFLOPS] == 2.0  # a resumed old run


class Collecting:
    def __init__(self):
        self.logged = {}

    def log_metrics(self, metrics, step):
        self.logged.update(metrics)


def final_metrics(outcomes, tmp_path: Path) -> dict:
    tracker = Collecting()
    parts = SimpleNamespace(tracker=tracker, hardware=SimpleNamespace(simulated_clock=False))
    log_final_metrics(outcomes, parts, SimpleNamespace(measured=40, simulated_s=0.0), 1.0, tmp_path)
    return tracker.logged


def test_one_task_logs_its_result_once(tmp_path):
    logged = final_metrics([TaskOutcome(gemm_task("gemm_64", 64, 64, 64), records=[], best_cost=1e-5)], tmp_path)
    assert {FINAL_GFLOPS, FINAL_LATENCY_US} <= set(logged)
    assert not [k for k in logged if k.startswith("task/") or k.endswith("final_gflops") and k != FINAL_GFLOPS]
    assert not [k for k in curve_metrics(gemm_task("gemm_64", 64, 64, 64), 10.0, 0) if k.startswith("task/")]


def test_several_tasks_log_each_tasks_result_too(tmp_path):
    outcomes = [TaskOutcome(gemm_task(name, 64, 64, 64), records=[], best_cost=1e-5) for name in ("a", "b")]
    logged = final_metrics(outcomes, tmp_path)
    assert {FINAL_GFLOPS, FINAL_LATENCY_MS, "task/a/final_gflops", "task/b/final_latency_us"} <= set(logged)
    assert sync.final_metrics(tmp_path) == (40, logged)  # the folder keeps each task's prediction too
    assert "task/a/best_gflops" in curve_metrics(outcomes[0].task, 10.0, 0, per_task=True)


# ---- links and lines -------------------------------------------------------------------------------
def run(run_id: str, experiment_id: str = "3"):
    return SimpleNamespace(info=SimpleNamespace(run_id=run_id, experiment_id=experiment_id))


def test_the_compare_links_open_the_model_training_view():
    result = SimpleNamespace(curves=[SimpleNamespace(run_id="r1"), SimpleNamespace(run_id="r2")])
    lines = mlflow_links("sqlite:////x/mlflow.db", [run("r1"), run("r2"), run("left-out")], result, run("c", "7"))
    assert lines[0] == f"MLflow UI (serve it: {tunelab_command('ui', '--tracking-uri', 'sqlite:////x/mlflow.db')}):"
    assert lines[1].endswith("http://127.0.0.1:5000/#/experiments/7/runs/c?workflowType=machine_learning")
    page = unquote(lines[2].split("http://127.0.0.1:5000", 1)[1])
    assert page == '/#/compare-runs?runs=["r1", "r2"]&experiments=["3"]&workflowType=machine_learning'
    served = mlflow_links("http://mlflow:5000/", [run("r1")], result)
    assert served == ["MLflow UI:", "  the compared runs' charts: http://mlflow:5000" + compare_runs_page([run("r1")])]


def test_the_trackers_links_open_the_model_training_view(tmp_path):
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "tunelab")
    tracker._experiment_id = "1"
    assert tracker.location.endswith("then open http://127.0.0.1:5000/#/experiments/1?workflowType=machine_learning")
    assert tracker.run_page("abc").endswith("/#/experiments/1/runs/abc?workflowType=machine_learning")


@pytest.mark.parametrize("results, said", [
    ({"best_params": {"sampler.threshold": 2.5}, "best_value": 81.234567, "best_trial": 3},
     "sweep s (4 COMPLETE, 1 PRUNED): best trial 3, final_gflops=81.2346 (maximize) with sampler.threshold=2.5"),
    ({"pareto_front": [{"trial": 1}, {"trial": 4}]},
     "sweep s (4 COMPLETE, 1 PRUNED): Pareto front of final_gflops and tuning_s: trials 1, 4 (pareto_front.csv)"),
    ({}, "sweep s (4 COMPLETE, 1 PRUNED): no trial completed"),
])
def test_a_sweeps_closing_line(results, said):
    objectives = ["final_gflops", "tuning_s"] if "pareto_front" in results else ["final_gflops"]
    line = best_line({"study_name": "s", "objectives": objectives, "directions": ["maximize"],
                      "trials": {"PRUNED": 1, "COMPLETE": 4}, **results})
    assert line == said
