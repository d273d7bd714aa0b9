"""Continuing and reusing runs: a killed run's folder, an earlier run's records, a task's saved state.

    resolve_resume(cfg, hydra)   the run's config and folder, claimed (tuning/run_folder.py); with
                                 `resume=DIR` the saved config (budget.*, tracking.uri may change)
    prior_records(cfg, tasks, ...)  `tuning.database`: an earlier run's records for these tasks
    restore_state / save_state   one task's search, rng and round counter, written after every
                                 round (atomically), so a killed run continues where it stopped

Everything read back from disk is untrusted input: a folder that is not a tunelab run is a
ConfigError naming the key that pointed at it.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from tuning.config import ConfigError
from tuning.records import RecordError, RecordLog
from tuning.run_folder import claim, load_config, saved_choices
from tuning.tracking.mlflow_tracker import sqlite_path


def resolve_resume(cfg, hydra: dict):
    """The run's config and folder, the folder claimed for this process (tuning/run_folder.py).

    A new run needs a folder that holds no run. A resumed run continues in its old folder with
    its saved config, read as untrusted input; budget.* and tracking.uri overrides apply."""
    if not cfg.resume:
        out_dir = Path(cfg.output_dir).resolve()
        claim(out_dir, resuming=False)
        return cfg, out_dir
    out_dir = Path(cfg.resume).expanduser().resolve()
    saved = out_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"resume: {out_dir} holds no config.yaml (not a tunelab run folder)")
    old = load_config(saved, "resume")
    claim(out_dir, resuming=True, key="resume")
    hydra["choices"] = _saved_choices(out_dir, hydra)
    overrides = hydra.get("overrides", [])
    kept = [o for o in overrides if o.startswith(RESUME_OVERRIDES)]
    ignored = [o for o in overrides if not o.startswith((*RESUME_OVERRIDES, "resume=", "hydra."))]
    if ignored:
        print(f"tunelab: resuming {out_dir} with its saved config; ignoring {' '.join(ignored)} "
              "(only budget.* and tracking.uri may change on resume)", file=sys.stderr)
    old.merge_with(OmegaConf.from_dotlist(kept))
    old.resume = str(out_dir)
    old.output_dir = str(out_dir)
    _check_tracking_store(old)
    return old, out_dir


RESUME_OVERRIDES = ("budget.", "tracking.uri=")


def _saved_choices(out_dir: Path, hydra: dict) -> dict:
    """Names (method, run name) come from the saved run's group choices, not from this
    composition's defaults: `resume=DIR` alone would otherwise call a random run "sa"."""
    choices = saved_choices(out_dir)
    saved_hydra = out_dir / ".hydra" / "hydra.yaml"
    # a folder from before run.yaml: Hydra's copy, unless this very job has just rewritten it
    if not choices and saved_hydra.exists() and Path(hydra.get("output_dir", "")).resolve() != out_dir:
        choices = dict(OmegaConf.load(saved_hydra).hydra.runtime.choices)
    return {k: v for k, v in choices.items() if not k.startswith("hydra/")}


def _check_tracking_store(cfg) -> None:
    """A moved run folder names a sqlite store that is not there: say so, rather than create an
    empty one that holds none of the run's history."""
    uri = str(cfg.get("tracking", {}).get("uri", ""))
    db = sqlite_path(uri)
    if db is not None and not db.exists():
        raise ConfigError(f"tracking.uri: the run's MLflow store {uri} does not exist (was the folder moved?); "
                          "point at it with tracking.uri=sqlite:////path/to/mlflow.db")


def prior_records(cfg, tasks, out_dir: Path, tracker) -> dict:
    """tuning.database: records of an earlier run (its folder, its records.jsonl, or its MLflow
    run id in this run's tracking store) for these tasks, by workload key."""
    if not cfg.tuning.database:
        return {}
    records_file = _records_file(str(cfg.tuning.database), out_dir, tracker)
    try:
        records = RecordLog(records_file).load()
    except RecordError as error:
        raise ConfigError(f"tuning.database: {error}") from error
    keys = {t.key for t in tasks}
    prior: dict = {}
    for record in records:
        if record.workload_key in keys:
            prior.setdefault(record.workload_key, []).append(record)
    return prior


def _records_file(database: str, out_dir: Path, tracker) -> Path:
    path = Path(database).expanduser().resolve()
    if path.exists():
        records_file = path / "records.jsonl" if path.is_dir() else path
        if not records_file.is_file():
            raise ConfigError(f"tuning.database: {path} holds no records.jsonl (not a tunelab run folder)")
        if records_file.parent == out_dir:
            raise ConfigError("tuning.database: points at this run's own folder (use resume= to continue a run)")
        return records_file
    if re.fullmatch(r"[0-9a-f]{32}", database):
        (out_dir / "database_source").mkdir(parents=True, exist_ok=True)
        try:
            return Path(tracker.download(database, "records.jsonl", str(out_dir / "database_source")))
        except FileNotFoundError as error:
            raise ConfigError(f"tuning.database: {error}") from error
    raise ConfigError(f"tuning.database: {database!r} is neither a run folder, a records file, nor an MLflow run id")


# ---- one task's search state ----------------------------------------------------------------------
def _state_path(out_dir: Path, task) -> Path:
    return Path(out_dir) / "state" / f"{task.key}.json"


def restore_state(out_dir: Path, task, search, seed: int, task_index: int, cost_model=None):
    """(rng, next round index) of a task: fresh from (seed, task index), or as saved by save_state
    (the search's own state is loaded into `search`, the cost model's into `cost_model`)."""
    rng = np.random.default_rng([seed, task_index])
    path = _state_path(out_dir, task)
    if not path.exists():
        return rng, 0
    state = json.loads(path.read_text())
    rng.bit_generator.state = state["rng"]
    search.load_state_dict(state["search"])
    if cost_model is not None:
        cost_model.load_state_dict(state.get("cost_model") or {})  # absent in states saved before it existed
    return rng, state["round"]


def save_state(out_dir: Path, task, search, rng, round_index: int, cost_model=None) -> None:
    path = _state_path(out_dir, task)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    state = {"round": round_index, "rng": rng.bit_generator.state, "search": search.state_dict(),
             "cost_model": cost_model.state_dict() if cost_model is not None else {}}
    temporary.write_text(json.dumps(state))
    os.replace(temporary, path)  # atomic: a kill leaves the old or the new state, never half
