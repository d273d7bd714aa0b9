"""Smoke tests of the CLI (`python run.py`) on the synthetic hardware with a temporary MLflow store (a run
that only sets the stage for the command under test goes through tunelab.tune, in this process)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from helpers import run_py_completed, tune_job

REPO = Path(__file__).resolve().parents[1]

# mlflow 3.17's own sqlalchemy store trips this on SQLAlchemy 2.x; nothing tunelab can change.
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

SUMMARY = re.compile(r"\[(?P<task>\w+)\] best [\d.]+ us (?:\([^)]*\))?\s*(?P<gflops>[\d.]+) GFLOP/s\s+"
                     r"measurements (?P<n>\d+)\s+invalid (?P<invalid>\d+)")


def smoke_run(store: Path, experiment: str, *args: str) -> str:
    """run.py on the synthetic hardware into the module's MLflow store, to a clean exit: its stdout."""
    proc = run_py_completed(*args, "hardware=synthetic", f"tracking.uri={uri(store)}",
                            f"tracking.experiment={experiment}", tmp=store, timeout=180)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


def uri(tmp: Path) -> str:
    return f"sqlite:///{tmp / 'mlflow.db'}"


def all_runs(store: Path, experiment: str):
    client = MlflowClient(tracking_uri=uri(store))
    found = client.get_experiment_by_name(experiment)
    return client, client.search_runs([found.experiment_id], max_results=100)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One sqlite store for the module (creating one costs seconds); one experiment per test."""
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def single_run(store, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("single")
    output = smoke_run(store, "single", "model=gemm_64", "budget.trials=100", "search.n_iter=100",
                       f"hydra.run.dir={tmp / 'run'}")
    return tmp, store, output


def test_single_run_prints_summary(single_run):
    tmp, store, output = single_run
    summary = SUMMARY.search(output)
    assert summary, output
    assert summary["task"] == "gemm_64" and int(summary["n"]) == 100 and float(summary["gflops"]) > 0
    assert "MLflow:" in output and uri(store) in output
    assert len((tmp / "run" / "records.jsonl").read_text().splitlines()) == 100
    assert not (store / "outputs").exists()


def test_single_run_mlflow_contents(single_run):
    tmp, store, _ = single_run
    client, runs = all_runs(store, "single")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "gemm_64-sa-greedy-b100-synthetic-0"
    assert (tmp / "run" / "mlflow_run_id").read_text().strip() == run.info.run_id

    history = client.get_metric_history(run.info.run_id, "best/gflops_so_far")
    assert len(history) == 100  # one point per measurement, written a round at a time
    steps = [m.step for m in history]
    assert steps == sorted(steps) and max(steps) == 100
    values = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert values == sorted(values), "best-so-far never falls"
    for name in ("time/search_s", "time/model_s", "tuning/best_latency_us", "tuning/invalid", "model/rank_corr"):
        assert name in run.data.metrics, name
    assert not any(name.startswith("task/") for name in run.data.metrics)  # one task: the run's metrics say it

    params = run.data.params
    assert params["budget.trials"] == "100" and params["seed"] == "0"
    assert params["search._target_"] == "tuning.search.sa.SimulatedAnnealing"
    assert params["hardware._target_"] == "tuning.hardware.synthetic.SyntheticHardware"
    assert params["model.M"] == "64"
    tags = run.data.tags
    assert "budget.trials=100" in tags["overrides"] and tags["hardware"] == "synthetic"
    assert tags["mlflow.source.git.commit"] and tags["mlflow.user"] and tags["mlflow.source.type"] == "LOCAL"
    assert "gemm_64" in tags["mlflow.note.content"] and "best/final_gflops" in tags["mlflow.note.content"]
    assert "output_dir" not in params and tags["tunelab.output_dir"] == str(tmp / "run")
    assert run.data.metrics["best/final_gflops"] > 0 and run.data.metrics["best/final_latency_us"] > 0
    assert params["method"] == tags["method"] == "sa+greedy+xgb"
    kind = client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"]
    assert kind == "custom_model_development"  # MLflow's UI opens the runs table, not the GenAI view

    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"records.jsonl", "config.yaml", "convergence.png"} <= artifacts
    local = Path(client.download_artifacts(run.info.run_id, "records.jsonl", str(tmp / "download")))
    assert local.read_text() == (tmp / "run" / "records.jsonl").read_text()


def test_multirun_grid_one_parent_two_children(store, tmp_path):
    output = smoke_run(store, "multi", "-m", "search=random,sa", "model=gemm_64", "budget.trials=32",
                       f"hydra.sweep.dir={tmp_path / 'multi'}")
    assert len(SUMMARY.findall(output)) == 2
    client, runs = all_runs(store, "multi")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert sorted(c.info.run_name for c in children) == ["gemm_64-random-greedy-b32-synthetic-0", "gemm_64-sa-greedy-b32-synthetic-0"]
    assert all(c.info.status == "FINISHED" for c in children)
    assert parent.info.status == "FINISHED"
    [line] = [line for line in output.splitlines() if "MLflow parent run" in line]
    assert line.endswith(f"/#/experiments/{parent.info.experiment_id}/runs/{parent.info.run_id}"
                         "?workflowType=machine_learning")
    for job in ("0", "1"):
        assert len((tmp_path / "multi" / job / "records.jsonl").read_text().splitlines()) == 32
    assert not (store / "outputs").exists()


def test_resume_continues_the_same_mlflow_run(store, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    tune_job(store, monkeypatch, "model=gemm_64", "search=random", "budget.trials=64", f"output_dir={run_dir}",
             "hardware=synthetic", f"tracking.uri={uri(store)}", "tracking.experiment=resume")
    output = smoke_run(store, "resume", f"resume={run_dir}", "budget.trials=96", f"hydra.run.dir={tmp_path / 'resumed'}")
    assert SUMMARY.search(output)["n"] == "96"
    client, runs = all_runs(store, "resume")
    assert len(runs) == 1, "a resume must reopen the run, not start another"
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "gemm_64-random-greedy-b96-synthetic-0"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "best/gflops_so_far")]
    assert 64 in steps and 96 in steps
    assert len((run_dir / "records.jsonl").read_text().splitlines()) == 96
    assert not (tmp_path / "resumed").exists()  # the folder Hydra made for the resuming job held nothing
    assert (run_dir / "run.log").read_text().count("budget: ") == 2  # both jobs logged into the run's own log


def test_adatune_ablation_sweeps_its_four_rows_and_the_table_prints(store, tmp_path, experiment_script, capsys,
                                                                    monkeypatch):
    """+experiment=adatune_ablation_reduced on one model and seed: one run per row of AdaTune §5.3,
    read back by experiments/adatune_table.py from the same store."""
    output = smoke_run(store, "adatune", "-m", "+experiment=adatune_ablation_reduced", "model=gemm_64", "seed=0",
                       "budget.trials=40", "search.n_iter=40", "hardware.noise=0.2",
                       f"hydra.sweep.dir={tmp_path / 'multi'}")
    assert len(SUMMARY.findall(output)) == 4
    client, runs = all_runs(store, "adatune")
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    schemes = {(r.data.tags["choice.cost_model"], r.data.tags["choice.search"], r.data.tags["choice.evaluator"])
               for r in children}
    assert schemes == {("xgb", "sa", "adatune_de"), ("rf", "sa", "adatune_de"), ("rf", "csa", "adatune_de"),
                       ("rf", "csa", "adaptive")}
    assert all(r.data.params["budget.plan_size"] == "32" for r in children)
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # the script sets it for its own process
    capsys.readouterr()
    experiment_script("adatune_table").main(["--uri", uri(store), "--mlflow-experiment", "adatune"])
    table = capsys.readouterr().out
    assert list((store / "compare").glob("*/compare.md"))  # beside the MLflow store, not in the repository
    assert "+experiment=adatune_ablation_reduced" in table and "Baseline **XGB+SA+DE**; 1 seeds" in table
    for scheme in ("RFEI+SA+DE", "RFEI+CSA+DE", "RFEI+CSA+AE"):
        assert f"| {scheme} | 1 |" in table, table
    assert "RFEI+CSA+AE vs RFEI+CSA+DE:\n  " in table and "run/run_s: RFEI+CSA+AE vs RFEI+CSA+DE" in table
