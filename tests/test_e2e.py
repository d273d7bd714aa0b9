"""Whole models end to end on the real CPU backend: tune every task, apply the database,
compare with torch, time tuned / untuned / torch; `python -m tuning.tools.apply`; tuning.database
reuse; ONNX. Uses tiny_cnn (seconds per kernel) in `make test`; every named network with a
one-measurement-per-task budget in `make test-full`."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from tuning.core.networks import NETWORKS, build_network

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.tvm, pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")]
E2E = re.compile(r"end to end: tuned (?P<tuned>[\d.]+) ms\s+untuned (?P<untuned>[\d.]+) ms\s+"
                 r"(?:torch eager (?P<torch>[\d.]+) ms\s+speed-up vs torch [\d.]+x\s+)?"
                 r"(?:onnxruntime (?P<onnxruntime>[\d.]+) ms\s+speed-up vs onnxruntime [\d.]+x\s+)?vs untuned [\d.]+x\s+"
                 r"outputs (?P<verdict>match|DO NOT match) (?P<reference>\w+)")
QUICK_E2E = ("e2e.runs=5", "e2e.min_runs=1", "e2e.max_seconds=2")


def run(*args: str, tmp: Path, module=("run.py",), timeout=900) -> str:
    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp / "outputs")}
    proc = subprocess.run([sys.executable, *module, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return proc.stdout


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tiny")
    output = run("model=tiny_cnn", "budget.trials=40", "budget.min_trials_per_task=4", "budget.plan_size=8",
                 *QUICK_E2E, f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}", f"hydra.run.dir={tmp / 'run'}", tmp=tmp)
    return tmp, tmp / "run", output


@pytest.mark.slow  # whole models on real TVM take minutes: make test-full
def test_network_run_prints_table_and_e2e_line_and_matches_torch(tiny):
    tmp, run_dir, output = tiny
    assert re.search(r"^task\s+weight\s+MFLOP\s+best us", output, re.M), output
    assert re.search(r"^all tasks\s+7\s", output, re.M), output  # tiny_cnn: 7 distinct kernels, each once
    line = E2E.search(output)
    assert line, output
    assert line["verdict"] == "match" and line["reference"] == "torch"
    assert float(line["tuned"]) < float(line["untuned"])  # the untuned build runs serial loops
    e2e = json.loads((run_dir / "e2e.json").read_text())
    assert e2e["match"] and e2e["max_abs_diff"] <= e2e["tolerance"]
    assert set(e2e["latency_ms"]) == {"tuned", "untuned", "torch"} and e2e["num_threads"] == 2
    assert e2e["fresh_input"] is True  # each call's input written first, as a caller's new input is
    tasks = {t["name"] for t in json.loads((run_dir / "tasks.json").read_text())}
    # every tuned kernel the model calls read inside it (its reshape runs as the VM's view builtin)
    assert e2e["estimate_ms"] > 0 and {row["task"] for row in e2e["kernels"]} == tasks - {"reshape1"}
    assert "heaviest kernels in the model / predicted" in output
    # the heaviest kernels were re-chosen inside the model, and their predictions are those readings
    chosen = json.loads((run_dir / "in_model.json").read_text())
    assert "inside the model:" in output and chosen and "reshape1" not in chosen
    saved = {row["task"]: row for row in json.loads((run_dir / "best_configs.json").read_text())}
    predicted = {row["task"]: row["predicted_us"] for row in e2e["kernels"]}
    for task, row in chosen.items():
        assert saved[task]["in_model"] and saved[task]["config"] == row["configs"][row["chosen"]]
        assert predicted[task] == pytest.approx(row["predicted_s"][row["chosen"]] * 1e6)
    # every task was measured, and the budget was the model's, not per task
    rows = records(run_dir)
    assert len(rows) == 40 and len({r["task"] for r in rows}) == 7
    assert (run_dir / "database" / "database_tuning_record.json").exists()


@pytest.mark.slow  # whole models on real TVM take minutes: make test-full
def test_network_run_is_tracked_in_mlflow(tiny):
    tmp, run_dir, _ = tiny
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    logged = client.get_run(run_id)
    assert logged.info.status == "FINISHED"
    for key in ("e2e/tuned_ms", "e2e/untuned_ms", "e2e/torch_ms", "e2e/speedup_vs_torch", "e2e/match",
                "tuning/weighted_latency_ms"):
        assert key in logged.data.metrics, key
    assert logged.data.metrics["e2e/match"] == 1.0
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"e2e.json", "summary.txt", "records.jsonl", "database"} <= artifacts


@pytest.mark.slow  # whole models on real TVM take minutes: make test-full
def test_in_model_times_each_kernel_in_every_context(tiny):
    tmp, run_dir, _ = tiny
    done = subprocess.run([sys.executable, "experiments/in_model.py", str(run_dir), "--kernels", "2", "--passes", "2",
                           "--runs", "2", "--number", "2", "--settings", "default", "no_spin"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "### default (2 threads" in done.stdout and "### no_spin (2 threads" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("| fused_") or line.startswith("| mean")]
    assert len(rows) == 4 and all(" - " not in row and "nan" not in row for row in rows), done.stdout
    assert "in the model against alone (in_model / alone)" in done.stdout
    assert "The estimate re-read in this process" in done.stdout and "(each task's best re-measured at the run's end; in_model / predicted): geomean" in done.stdout


@pytest.mark.slow  # whole models on real TVM take minutes: make test-full
def test_apply_standalone(tiny):
    tmp, run_dir, _ = tiny
    (run_dir / "database").rename(run_dir / "database.moved")  # apply exports it again from the records
    output = run(str(run_dir), module=("-m", "tuning.tools.apply"), tmp=tmp)
    line = E2E.search(output)
    assert line and line["verdict"] == "match", output
    assert (run_dir / "database" / "database_tuning_record.json").exists()
    stale = run(str(run_dir), "--stale-input", module=("-m", "tuning.tools.apply"), tmp=tmp)
    assert "[2 threads; one input, untouched between calls]" in stale and E2E.search(stale)["verdict"] == "match"
    assert json.loads((run_dir / "e2e.json").read_text())["fresh_input"] is False
    (run_dir / "in_model.json").unlink()
    again = run(str(run_dir), "--in-model", module=("-m", "tuning.tools.apply"), tmp=tmp)
    assert "inside the model:" in again and E2E.search(again)["verdict"] == "match"
    chosen = json.loads((run_dir / "in_model.json").read_text())
    saved = {row["task"]: row for row in json.loads((run_dir / "best_configs.json").read_text())}
    assert all(saved[task]["in_model"] for task in chosen) and (run_dir / "best_schedules").is_dir()


@pytest.mark.slow  # whole models on real TVM take minutes: make test-full
def test_database_reuse_measures_nothing_already_done(tiny, tmp_path):
    tmp, first_dir, _ = tiny
    again = tmp_path / "again"
    output = run("model=tiny_cnn", "budget.trials=40", "budget.min_trials_per_task=4", "budget.plan_size=8",
                 "e2e.enabled=false", "tracking=none", f"tuning.database={first_dir}", f"hydra.run.dir={again}",
                 tmp=tmp_path)
    assert records(again) == []
    assert output.count(" reused") >= 7, output  # every task's row says it reused the first run's records
    # the same, naming the first run by its MLflow run id
    by_id = tmp_path / "by_id"
    run("model=tiny_cnn", "budget.trials=40", "budget.min_trials_per_task=4", "budget.plan_size=8",
        "e2e.enabled=false", f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}",
        f"tuning.database={(first_dir / 'mlflow_run_id').read_text().strip()}", f"hydra.run.dir={by_id}", tmp=tmp_path)
    assert records(by_id) == []
    longer = tmp_path / "longer"
    run("model=tiny_cnn", "budget.trials=56", "budget.min_trials_per_task=4", "budget.plan_size=8",
        "e2e.enabled=false", "tracking=none", f"tuning.database={first_dir}", f"hydra.run.dir={longer}", tmp=tmp_path)
    new, old = records(longer), records(first_dir)
    assert len(new) == 16
    assert not {(r["workload_key"], tuple(r["config"])) for r in new} & {(r["workload_key"], tuple(r["config"])) for r in old}


@pytest.mark.slow  # whole models on real TVM take minutes: make test-full
def test_onnx_file_tuned_applied_and_matches_torch(tmp_path):
    model, example = build_network("tiny_cnn", seed=5)
    path = tmp_path / "tiny.onnx"
    torch.onnx.export(model, (example,), str(path), dynamo=True, verbose=False)
    run_dir = tmp_path / "run"
    output = run("model=onnx", f"model.path={path}", "model.input_shape=[1,3,16,16]", "budget.trials=20",
                 "budget.min_trials_per_task=2", "budget.plan_size=4", *QUICK_E2E, "tracking=none",
                 f"hydra.run.dir={run_dir}", tmp=tmp_path)
    line = E2E.search(output)
    assert line and line["verdict"] == "match" and line["reference"] == "onnxruntime" and line["onnxruntime"], output
    x = np.load(run_dir / "e2e_input.npy")
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.load(run_dir / "e2e_output.npy"), expected, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("network", sorted(set(NETWORKS) - {"tiny_cnn"}))
def test_every_network_tunes_applies_and_matches_torch(network, tmp_path):
    """One measurement per task (the minimum budget) is enough to compile and check the whole model."""
    output = run(f"model={network}", "budget.trials=40", "budget.min_trials_per_task=1", "budget.plan_size=1",
                 "e2e.runs=1", "e2e.min_runs=1", "e2e.max_seconds=0", "tracking=none",
                 f"hydra.run.dir={tmp_path / 'run'}", tmp=tmp_path, timeout=3000)
    line = E2E.search(output)
    assert line and line["verdict"] == "match" and line["reference"] == "torch", output


def test_onnx_file_that_is_not_onnx_is_rejected_naming_the_key(tmp_path):
    bogus = tmp_path / "bogus.onnx"
    bogus.write_text("not a model")
    proc = subprocess.run([sys.executable, "run.py", "model=onnx", f"model.path={bogus}", "model.input_shape=[1,3]",
                           "tracking=none", f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TUNELAB_OUTPUTS": str(tmp_path)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "model.path:" in proc.stderr and not (tmp_path / "run" / "records.jsonl").exists()
