"""Continuing and reusing runs: a killed run's folder, an earlier run's records, a task's saved state.

    resolve_resume(cfg, hydra)   `resume=DIR`: the run's saved config and folder (budget.* may change)
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
from tuning.records import RecordLog


def resolve_resume(cfg, hydra: dict):
    """A resumed run continues in its old folder with its saved config; budget.* overrides apply.
    Returns (config, run folder)."""
    if not cfg.resume:
        return cfg, Path(cfg.output_dir).resolve()
    out_dir = Path(cfg.resume).resolve()
    saved = out_dir / "config.yaml"
    if not saved.exists():
        raise ConfigError(f"resume: {out_dir} holds no config.yaml (not a tunelab run folder)")
    old = OmegaConf.load(saved)
    # Names (method, run name) come from the saved run's group choices, not from this
    # composition's defaults: `resume=DIR` alone would otherwise call a random run "sa".
    saved_hydra = out_dir / ".hydra" / "hydra.yaml"
    choices = OmegaConf.load(saved_hydra).hydra.runtime.choices if saved_hydra.exists() else {}
    hydra["choices"] = {k: v for k, v in dict(choices).items() if not k.startswith("hydra/")}
    overrides = hydra.get("overrides", [])
    budget_overrides = [o for o in overrides if o.startswith("budget.")]
    ignored = [o for o in overrides if not o.startswith(("budget.", "resume=", "hydra."))]
    if ignored:
        print(f"tunelab: resuming {out_dir} with its saved config; ignoring {' '.join(ignored)} "
              "(only budget.* may change on resume)", file=sys.stderr)
    old.merge_with(OmegaConf.from_dotlist(budget_overrides))
    old.resume = str(out_dir)
    old.output_dir = str(out_dir)
    return old, out_dir


def prior_records(cfg, tasks, out_dir: Path, tracker) -> dict:
    """tuning.database: records of an earlier run (its folder, its records.jsonl, or its MLflow
    run id in this run's tracking store) for these tasks, by workload key."""
    if not cfg.tuning.database:
        return {}
    records_file = _records_file(str(cfg.tuning.database), out_dir, tracker)
    keys = {t.key for t in tasks}
    prior: dict = {}
    for record in RecordLog(records_file).load():
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


def restore_state(out_dir: Path, task, search, seed: int, task_index: int):
    """(rng, next round index) of a task: fresh from (seed, task index), or as saved by save_state
    (the search's own state is loaded into `search`)."""
    rng = np.random.default_rng([seed, task_index])
    path = _state_path(out_dir, task)
    if not path.exists():
        return rng, 0
    state = json.loads(path.read_text())
    rng.bit_generator.state = state["rng"]
    search.load_state_dict(state["search"])
    return rng, state["round"]


def save_state(out_dir: Path, task, search, rng, round_index: int) -> None:
    path = _state_path(out_dir, task)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    state = {"round": round_index, "rng": rng.bit_generator.state, "search": search.state_dict()}
    temporary.write_text(json.dumps(state))
    os.replace(temporary, path)  # atomic: a kill leaves the old or the new state, never half
