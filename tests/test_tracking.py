"""The tracking package against real embedded sqlite MLflow stores in tmp_path."""
from __future__ import annotations

import math
import multiprocessing
import time
from pathlib import Path

import mlflow
import pytest
from hydra.utils import instantiate
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from tuning.tracking.base import NoTracker, Tracker, flatten
from tuning.tracking.mlflow_tracker import MlflowTracker
from tuning.tracking.plot import convergence_png

# mlflow 3.17's own sqlalchemy store trips this on SQLAlchemy 2.x; nothing tunelab can change.
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

CONF = Path(__file__).resolve().parents[1] / "conf" / "tracking"


def sqlite_uri(folder: Path) -> str:
    return f"sqlite:///{folder / 'mlflow.db'}"


def runs(uri: str, experiment: str = "tunelab"):
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id], max_results=1000)


def test_run_lifecycle_metrics_params_artifacts(tmp_path):
    uri = sqlite_uri(tmp_path / "store")  # the folder does not exist yet
    tracker = MlflowTracker(uri, "tunelab", flush_every=200)
    params = flatten({"search": {"name": "sa", "temp": 1.0}, "seed": 3, "hardware": None,
                      "tiles": [1, 2, 4], "note": "x" * 7000, "k" * 300: 1})
    run_id = tracker.start("gemm-sa-greedy-3", params, tags={"git_commit": "abc", "n": 1})
    assert run_id and run_id in tracker.location
    assert f"tunelab ui --tracking-uri {uri}" in tracker.location

    for step in range(1000):
        tracker.log_metrics({"best/gflops_so_far": step * 0.5, "task/conv_l8/best_latency_us": 1e3 - step,
                             "tuning/invalid": math.nan if step % 2 else 0.0}, step=step)
    tracker.log_metrics({"best/gflops_so_far": math.inf}, step=1000)
    report = tmp_path / "records.jsonl"
    report.write_text('{"a": 1}\n')
    tracker.log_artifact(str(report))
    tracker.log_text("best schedule", "schedules/best.py")
    tracker.set_tags({"status_note": "ok"})
    tracker.end()

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "gemm-sa-greedy-3"
    assert run.data.params["search.name"] == "sa"
    assert run.data.params["tiles"] == "[1, 2, 4]"
    assert run.data.params["hardware"] == "null"
    assert len(run.data.params["note"]) == 6000
    assert any(len(k) == 250 for k in run.data.params)
    assert run.data.tags["git_commit"] == "abc" and run.data.tags["n"] == "1"
    assert run.data.tags["status_note"] == "ok"
    assert len(client.get_metric_history(run_id, "best/gflops_so_far")) == 1000  # inf dropped
    assert len(client.get_metric_history(run_id, "task/conv_l8/best_latency_us")) == 1000
    assert len(client.get_metric_history(run_id, "tuning/invalid")) == 500  # nan dropped
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"records.jsonl", "schedules"} <= artifacts
    assert client.download_artifacts(run_id, "schedules/best.py", str(tmp_path))
    # Artifacts land beside the db, whatever the CWD.
    assert (tmp_path / "store" / "mlartifacts").is_dir()
    tracker.end()  # a second end is harmless
    assert mlflow.active_run() is None  # the global fluent state stays untouched


def test_parent_and_children_in_one_process(tmp_path):
    uri = sqlite_uri(tmp_path)
    sweep = tmp_path / "multirun" / "2024-01-01" / "12-00-00"
    ids = []
    for job in range(3):
        tracker = MlflowTracker(uri, "tunelab")
        ids.append(tracker.start(f"job{job}", {"job": job}, {}, parent=str(sweep)))
        tracker.log_metrics({"best/gflops_so_far": job}, step=1)
        tracker.end()
    client, found = runs(uri)
    parents = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in found if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 3
    assert parents[0].info.run_name == "2024-01-01/12-00-00"
    assert parents[0].info.status == "FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert {r.info.run_id for r in children} == set(ids)


def _start_child(uri, sweep, job, barrier):
    tracker = MlflowTracker(uri, "tunelab")
    barrier.wait(timeout=60)  # all four hit the store at once
    tracker.start(f"job{job}", {"job": job}, {}, parent=sweep)
    tracker.log_metrics({"best/gflops_so_far": float(job)}, step=1)
    tracker.end()


def test_parent_shared_across_processes(tmp_path):
    uri = sqlite_uri(tmp_path)  # a fresh store: the processes also race to create it
    sweep = str(tmp_path / "multirun" / "sweep")
    ctx = multiprocessing.get_context("fork")  # mlflow stays imported: each child only opens the store
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_start_child, args=(uri, sweep, job, barrier)) for job in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=90)
    for p in procs:
        if p.is_alive():
            p.terminate()
    assert [p.exitcode for p in procs] == [0] * 4
    _, found = runs(uri)
    parents = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in found if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 4
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}


def test_resume_appends_to_the_same_run(tmp_path):
    uri = sqlite_uri(tmp_path)
    params = {"search": "sa", "seed": 0}
    first = MlflowTracker(uri, "tunelab", flush_every=10)
    run_id = first.start("job", params, {})
    for step in range(5):
        first.log_metrics({"best/gflops_so_far": step}, step=step)
    first.end("KILLED")
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(run_id).info.status == "KILLED"

    second = MlflowTracker(uri, "tunelab", flush_every=10)
    assert second.start("job", {**params, "resumed_from": 5}, {"resumed": True}, resume_run_id=run_id) == run_id
    assert client.get_run(run_id).info.status == "RUNNING"
    for step in range(5, 12):
        second.log_metrics({"best/gflops_so_far": step}, step=step)
    second.end()

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"search": "sa", "seed": "0", "resumed_from": "5"}
    assert run.data.tags["resumed"] == "True"
    history = client.get_metric_history(run_id, "best/gflops_so_far")
    assert sorted(m.step for m in history) == list(range(12))
    _, found = runs(uri)
    assert len(found) == 1


def test_flatten():
    flat = flatten({"a": {"b": {"c": 1}, "d": [1, "x"]}, "e": None, "f": True, "g": 2.5, "h": {}})
    assert flat == {"a.b.c": 1, "a.d": '[1, "x"]', "e": "null", "f": True, "g": 2.5, "h": "{}"}
    assert flatten({"x": 1}, prefix="cfg.") == {"cfg.x": 1}


def test_convergence_png(tmp_path):
    path = convergence_png({"sa": [(1, 1.0), (5, 3.0), (9, 4.0)], "random": [(1, 0.5), (9, 2.0)]},
                           str(tmp_path / "convergence.png"))
    data = Path(path).read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 1000


def test_the_lab_s_figures_leave_the_caller_s_backend_as_it_was(tmp_path):
    """A notebook's inline backend (here pyplot's pdf backend stands for it) survives a run's and a
    comparison's figures: they draw on Figure objects with their own canvas (matplotlib.use("Agg") did not)."""
    import subprocess
    import sys

    code = ("import matplotlib, sys; matplotlib.use('pdf'); import matplotlib.pyplot as plt\n"
            "from tuning.tracking.plot import convergence_png\n"
            f"convergence_png({{'sa': [(1, 1.0), (4, 2.0)]}}, {str(tmp_path / 'c.png')!r})\n"
            "print(matplotlib.get_backend(), len(plt.get_fignums()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["pdf", "0"], done.stderr[-2000:]  # the backend kept, no pyplot figure left open


def test_no_tracker_does_nothing(tmp_path):
    tracker = NoTracker()
    assert tracker.start("x", {"a": object()}, {"b": None}, parent=str(tmp_path / "p"),
                         resume_run_id="nope") == ""
    tracker.log_metrics({"m": math.nan}, step=0)
    tracker.log_artifact(str(tmp_path / "missing"))
    tracker.log_text("t", "t.txt")
    tracker.set_tags({"x": 1})
    tracker.flush()
    tracker.end("FAILED")
    assert tracker.location == "tracking disabled"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["mlflow", "none"])
def test_yamls_instantiate_without_io(tmp_path, name):
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    if name == "mlflow":  # the default uri needs Hydra's runtime
        cfg.uri = sqlite_uri(tmp_path / "out")
    tracker = instantiate(cfg)
    assert isinstance(tracker, Tracker)
    assert not (tmp_path / "out").exists()
    assert tracker.location


def test_system_metrics_are_sampled_while_the_run_is_open(tmp_path):
    """MLflow's own monitor (CPU, memory) runs beside the job, and stops with the run."""
    uri = sqlite_uri(tmp_path)
    tracker = MlflowTracker(uri, "system", system_metrics_s=0.2)
    run_id = tracker.start("job", {}, {})
    tracker.monitor_system()
    time.sleep(1.5)
    tracker.end()
    client, found = runs(uri, "system")
    metrics = client.get_run(run_id).data.metrics
    assert "system/cpu_utilization_percentage" in metrics and "system/system_memory_usage_megabytes" in metrics
    off = MlflowTracker(uri, "system", system_metrics_s=0)
    quiet_id = off.start("quiet", {}, {})
    off.monitor_system()
    off.end()
    reopened = MlflowTracker(uri, "system", system_metrics_s=0.2)  # tuning.tools.apply / export / sync reopen runs
    reopened.start("job", {}, {}, resume_run_id=quiet_id)
    time.sleep(1.0)
    reopened.end()
    assert not [k for k in client.get_run(quiet_id).data.metrics if k.startswith("system/")]
