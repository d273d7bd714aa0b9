"""The storage group: one place says where MLflow runs, Optuna studies and measurement stores live
(tuning/config/storage.py), and a sweep's MLflow parent run is opened by the launching process, no file
in the sweep folder."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tuning.config import ConfigError, storage
from tuning.engine.validate import validate
from tuning.tracking import mlflow_tracker
from tuning.tracking.mlflow_tracker import MlflowTracker

REPO = Path(__file__).resolve().parents[1]


def runs_of(uri: str):
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tunelab").experiment_id
    found = client.search_runs([experiment], max_results=100)
    parents = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    return parents, [r for r in found if "mlflow.parentRunId" in r.data.tags]


# ---- where things live -------------------------------------------------------------------------
def test_the_mlflow_uri_is_explicit_then_the_environment_then_the_group_then_outputs(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    group = {"storage": {"mlflow_uri": "postgresql://db/runs"}}
    assert storage.mlflow_uri() == f"sqlite:///{tmp_path / 'out'}/mlflow.db"
    assert storage.mlflow_uri(cfg=group) == "postgresql://db/runs"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")
    assert storage.mlflow_uri(cfg=group) == "http://tracking:5000"
    assert storage.mlflow_uri("sqlite:////abs/given.db", cfg=group) == "sqlite:////abs/given.db"
    assert storage.optuna_uri() == f"sqlite:///{tmp_path / 'out'}/optuna.db"
    assert storage.stores_dir() == tmp_path / "out" / "stores"


def test_the_group_composes_into_the_tracking_uri_and_the_sweep_storage(compose_cfg, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = compose_cfg("hparams_search=kmeans_threshold")
    outputs = tmp_path / "outputs"
    assert cfg.tracking.uri == cfg.storage.mlflow_uri == f"sqlite:///{outputs}/mlflow.db"
    assert cfg.hydra.sweeper.storage == cfg.storage.optuna_uri == f"sqlite:///{outputs}/optuna.db"
    assert cfg.storage.stores_dir == str(outputs / "stores")
    assert storage.mlflow_uri(cfg=cfg) == cfg.tracking.uri and storage.optuna_uri(cfg) == cfg.hydra.sweeper.storage

    cfg = compose_cfg("hparams_search=ppo", "storage.mlflow_uri=sqlite:////shared/m.db",
                      "storage.optuna_uri=postgresql://db/studies")
    assert (cfg.tracking.uri, cfg.hydra.sweeper.storage) == ("sqlite:////shared/m.db", "postgresql://db/studies")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")
    assert compose_cfg().tracking.uri == "http://tracking:5000"  # the environment beats the group
    assert compose_cfg("tracking.uri=sqlite:////x/y.db").tracking.uri == "sqlite:////x/y.db"  # explicit beats both


@pytest.mark.parametrize("override,key", [
    ("+storage.mlflow_url=sqlite:////x.db", "storage.mlflow_url"),
    ("storage.optuna_uri=http://host:5000", "storage.optuna_uri"),
    ("storage.mlflow_uri=ftp://host/runs", "storage.mlflow_uri"),
])
def test_a_bad_storage_key_is_refused_naming_it(compose_cfg, override, key):
    with pytest.raises(ConfigError, match=f"\n  {key}: "):
        validate(compose_cfg(override))


def test_a_job_with_a_bad_storage_stops_before_any_work(compose_cfg, monkeypatch, tmp_path, capsys):
    from configs import as_job
    from tuning.engine import run

    (tmp_path / "file").write_text("not a folder")
    cfg = compose_cfg("model=gemm_64", "hardware=synthetic", "budget.trials=8",
                      f"storage.stores_dir={tmp_path / 'file' / 'stores'}")
    with pytest.raises(SystemExit) as stop:
        run.main(as_job(cfg, monkeypatch))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("tunelab: invalid config:")
    assert "\n  storage.stores_dir: " in err and "Traceback" not in err
    assert not (tmp_path / "run" / "records.jsonl").exists() and not (tmp_path / "outputs").exists()


# ---- a sweep's parent run ----------------------------------------------------------------------
def test_the_launching_process_opens_the_parent_and_hands_its_id_to_the_jobs(compose_cfg, tmp_path, monkeypatch):
    from tuning.sweep.multirun import SweepParent

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.delenv(mlflow_tracker.PARENT_RUN_ENV, raising=False)
    sweep = tmp_path / "multirun" / "2026-01-01" / "12-00-00"
    cfg = compose_cfg(f"tracking.uri={uri}", f"hydra.sweep.dir={sweep}")
    callback = SweepParent()
    callback.on_multirun_start(cfg)
    parent_id = os.environ[mlflow_tracker.PARENT_RUN_ENV]
    parent = MlflowClient(tracking_uri=uri).get_run(parent_id)
    assert parent.info.status == "SCHEDULED" and parent.data.tags[mlflow_tracker.MULTIRUN_TAG] == str(sweep)
    tracker = MlflowTracker(uri, "tunelab")
    tracker.start("job0", {}, {}, parent=str(sweep))
    tracker.end()
    monkeypatch.delenv(mlflow_tracker.PARENT_RUN_ENV)  # a launcher without the environment: found by the tag
    tracker = MlflowTracker(uri, "tunelab")
    tracker.start("job1", {}, {}, parent=str(sweep))
    tracker.end()
    monkeypatch.setenv(mlflow_tracker.PARENT_RUN_ENV, parent_id)
    callback.on_multirun_end(cfg)
    assert mlflow_tracker.PARENT_RUN_ENV not in os.environ  # as before the multirun
    parents, children = runs_of(uri)
    assert [p.info.run_id for p in parents] == [parent_id] and parents[0].info.status == "FINISHED"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent_id} and len(children) == 2
    assert sorted(p.name for p in sweep.iterdir()) == ["multirun.yaml"]


@pytest.mark.slow
def test_a_sweep_has_one_parent_made_before_its_jobs_and_no_file_in_its_folder(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = tmp_path / "sweep"
    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp_path / "outputs")}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "run.py", "-m", "hardware=synthetic", "model=gemm_64", "budget.trials=8",
                           "seed=0,1", f"tracking.uri={uri}", f"hydra.sweep.dir={sweep}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    parents, children = runs_of(uri)
    assert len(parents) == 1 and len(children) == 2
    [parent] = parents
    assert parent.info.run_name.startswith("sweep seed ") and parent.info.status == "FINISHED"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert parent.info.start_time <= min(c.info.start_time for c in children)
    assert not [p.name for p in sweep.iterdir() if p.name.startswith(".")]  # no id file, no lock file
