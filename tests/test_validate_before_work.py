"""Bad input is refused before any work, naming the key: a tracking URI MLflow cannot keep runs in,
an experiment name it would refuse, a seed some consumer cannot take; quickly (no store retries),
with no records written and no traceback. A budget.plan_size larger than the space is cut to it,
and a small space's configs are measured in a seeded order, not lexicographically."""
from __future__ import annotations

import importlib.util
import logging
import sqlite3
import time

import pytest
from omegaconf import OmegaConf

from tuning.config import ConfigError
from tuning.engine.validate import validate
from tuning.tracking.mlflow_tracker import MlflowTracker

QUICK = 5.0  # seconds: a refusal never waits out tracking.retry_s (30)


def refused(cfg) -> str:
    started = time.monotonic()
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert time.monotonic() - started < QUICK
    return str(error.value)


def not_a_database(tmp_path):
    path = tmp_path / "hostname"
    path.write_text("buildhost\n")
    return f"sqlite:///{path}"


def a_folder(tmp_path):
    (tmp_path / "folder").mkdir()
    return f"sqlite:///{tmp_path / 'folder'}"


def under_a_file(tmp_path):
    (tmp_path / "plain").write_text("x")
    return f"sqlite:///{tmp_path / 'plain' / 'mlflow.db'}"


BAD_URIS = {  # tmp_path -> a tracking.uri
    "a text file": not_a_database,
    "a folder": a_folder,
    "a path under a file": under_a_file,
    "a bare path": lambda tmp_path: str(tmp_path / "mlruns"),
    "a file: URI": lambda tmp_path: (tmp_path / "mlruns").as_uri(),
    "a relative path": lambda tmp_path: "mlruns",
    "sqlite with two slashes": lambda tmp_path: "sqlite://mlflow.db",
    "sqlite in memory": lambda tmp_path: "sqlite://",
    "an unknown scheme": lambda tmp_path: "s3://bucket/mlflow",
}


@pytest.mark.parametrize("uri", BAD_URIS.values(), ids=BAD_URIS.keys())
def test_a_tracking_uri_mlflow_cannot_keep_runs_in_is_refused(compose_cfg, tmp_path, uri):
    message = refused(compose_cfg(f"tracking.uri='{uri(tmp_path)}'"))
    assert "\n  tracking.uri: " in message, message


@pytest.mark.skipif(importlib.util.find_spec("psycopg2") is not None, reason="psycopg2 is installed here")
def test_a_database_without_its_driver_is_refused(compose_cfg):
    message = refused(compose_cfg("tracking.uri='postgresql+pg8000://user@dbhost/mlflow'"))
    assert "tracking.uri: postgresql+pg8000 needs its Python driver" in message


def test_a_sqlite_database_an_empty_file_and_a_new_path_are_accepted(compose_cfg, tmp_path):
    sqlite3.connect(tmp_path / "real.db").execute("create table t (x)").connection.commit()
    (tmp_path / "empty.db").touch()  # sqlite's own empty database
    for path in ("real.db", "empty.db", "new/sub/mlflow.db"):
        validate(compose_cfg(f"tracking.uri=sqlite:///{tmp_path / path}"))
    validate(compose_cfg("tracking.uri=http://mlflow.example:5000"))


BAD_EXPERIMENTS = {"empty": "''", "blank": "'   '", "3000 characters": "x" * 3000}


@pytest.mark.parametrize("name", BAD_EXPERIMENTS.values(), ids=BAD_EXPERIMENTS.keys())
def test_an_experiment_name_mlflow_would_refuse_is_refused(compose_cfg, name):
    assert "\n  tracking.experiment: " in refused(compose_cfg(f"tracking.experiment={name}"))


def test_an_experiment_name_with_a_newline_is_refused(compose_cfg):
    cfg = compose_cfg()
    cfg.tracking.experiment = "grid\nsearch"
    assert "tracking.experiment: control characters" in refused(cfg)


@pytest.mark.parametrize("seed", [-1, 2**32, 2**63, 2**64])
def test_a_seed_some_consumer_cannot_take_is_refused(compose_cfg, seed):
    assert f"\n  seed: must be >= 0 and <= {2**32 - 1}, got {seed}" in refused(compose_cfg(f"seed={seed}"))


@pytest.mark.parametrize("cost_model", ["xgb", "xgb_ms", "rf"])
def test_a_cost_model_seed_its_library_cannot_take_is_refused(compose_cfg, cost_model):
    problems = refused(compose_cfg(f"cost_model={cost_model}", f"cost_model.seed={2**64}"))
    assert f"cost_model.seed: must be >= 0 and <= {2**32 - 1}, got {2**64}" in problems


def test_the_largest_seed_every_consumer_takes_is_accepted(compose_cfg):
    validate(compose_cfg(f"seed={2**32 - 1}", "cost_model=rf"))  # sklearn's random_state: 32 bits


# ---- a whole job, in process -------------------------------------------------------------------
def run_job(compose_cfg, monkeypatch, *overrides):
    """tuning.engine.run.main on the config run.py's @hydra.main would hand it, with its Hydra context."""
    from configs import as_job
    from tuning.engine import run

    return run.main(as_job(compose_cfg("model=gemm_64", "hardware=synthetic", "budget.trials=8", *overrides),
                           monkeypatch))


JOB_REFUSED = {
    "a bare path": (lambda tmp_path: f"tracking.uri={tmp_path / 'mlruns'}", "tracking.uri"),
    "an empty experiment": (lambda tmp_path: "tracking.experiment=''", "tracking.experiment"),
    "a 65-bit seed": (lambda tmp_path: "seed=18446744073709551616", "seed"),
}


@pytest.mark.parametrize("override,key", JOB_REFUSED.values(), ids=JOB_REFUSED.keys())
def test_a_job_with_bad_input_stops_before_any_work(compose_cfg, monkeypatch, tmp_path, capsys, override, key):
    started = time.monotonic()
    with pytest.raises(SystemExit) as stop:
        run_job(compose_cfg, monkeypatch, override(tmp_path))
    assert time.monotonic() - started < QUICK
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tunelab: invalid config:") and f"\n  {key}: " in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "records.jsonl").exists() and not (tmp_path / "run" / "config.yaml").exists()
    assert not (tmp_path / "outputs").exists()


def test_a_store_given_up_on_leaves_every_call_a_no_op(tmp_path):
    """Whatever makes start() fail (here MLflow 3's refusal of a folder store), the job goes on:
    tags, artifacts, texts and step reads after it are no-ops, never an AttributeError."""
    tracker = MlflowTracker(str(tmp_path / "mlruns"), "offline", retry_s=0)
    tracker.spool_to(str(tmp_path / "spool.jsonl"))
    assert tracker.start("run", {"a": 1}, {}) == ""
    assert tracker.offline
    tracker.set_tags({"k": "v"})
    tracker.log_artifact(__file__)
    tracker.log_text("text", "note.txt")
    assert tracker.logged_steps("tuning/best_gflops") == set()
    tracker.log_metrics({"tuning/best_gflops": 1.0}, step=1)
    tracker.end("FAILED")
    assert (tmp_path / "spool.jsonl").read_text().count("tuning/best_gflops") == 1


# ---- budget.plan_size larger than the space ----------------------------------------------------
def test_a_plan_size_larger_than_the_space_is_cut_to_it(compose_cfg, monkeypatch, tmp_path, caplog):
    from tuning.core.task import build_tasks
    from tuning.hardware.synthetic import SyntheticHardware

    [task] = build_tasks(compose_cfg("model=gemm_64", "model.space=tiling").model)
    space = SyntheticHardware().space(task)
    with caplog.at_level(logging.INFO, logger="tunelab"):
        run_job(compose_cfg, monkeypatch, "tracking=none", "model.space=tiling", "search=random", "cost_model=none",
                f"budget.plan_size={space.size + 1000}")
    assert f"budget.plan_size={space.size + 1000} is more than gemm_64's whole space ({space.size} configs)" \
           in caplog.text
    assert OmegaConf.load(tmp_path / "run" / "config.yaml").budget.plan_size == space.size
    lines = (tmp_path / "run" / "records.jsonl").read_text().splitlines()
    configs = [tuple(OmegaConf.create(line).config) for line in lines]
    first = list(space.enumerate())[:len(configs)]
    assert len(configs) == 8 and len(set(configs)) == 8
    assert configs != first  # a seeded sample of the space, not its lexicographic corner
    assert len({c[0] for c in configs}) > 1 or space.num_sketches == 1


def test_ctrl_c_before_the_first_measurement_says_nothing_was_measured(compose_cfg, monkeypatch, tmp_path, capsys):
    from tuning.engine import run

    def interrupted(cfg, hardware):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "job_tasks", interrupted)  # e.g. a whole model's import
    with pytest.raises(KeyboardInterrupt):
        run_job(compose_cfg, monkeypatch, "tracking=none")
    err = capsys.readouterr().err
    assert "interrupted (SIGINT) before the first measurement; nothing was measured; run the same command again" in err
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_a_refused_job_leaves_no_folder_behind(compose_cfg, monkeypatch, tmp_path):
    with pytest.raises(SystemExit):
        run_job(compose_cfg, monkeypatch, "seed=-1", "tracking=none")
    assert not (tmp_path / "run").exists()
