"""Continuing and reusing runs: a killed run's folder, an earlier run's records, a task's saved state.

    resolve_resume(cfg, hydra)   the run's config and folder, claimed (tuning/engine/run_folder.py); with
                                 `resume=DIR` the saved config (budget.*, tracking.uri, hardware.store may change)
    check_records / check_resume (check_budget, check_task_states)
                                 before any work on a resumed run: its records are readable and
                                 each measurement is there once, the budget is not below them, and
                                 every task's saved state is readable and not older than its records
    reused_records(database, tasks, ...)  `tuning.database`: an earlier run's records for these tasks
                                 (prior_records: the same from a config, for tuning/tools)
    restore_state / save_state   one task's search, rng and round counter, written after every
                                 round (atomically), so a killed run continues where it stopped

Everything read back from disk is untrusted input: a folder that is not a tunelab run is a
ConfigError naming the key that pointed at it.

A task's state is saved after each of its rounds, so a run killed in a task's first round has
records of that task (round 0) and no state for it: that is resumed as if never stopped. A state
that is missing past round 0, unreadable, or older than the records cannot be: the resume is
refused, naming the file, unless `reset_state=true` is given; then those tasks continue from their
records with a fresh search state and random stream (their records are kept and the cost model
refits from them; what the search had learnt beyond the records, e.g. SA's walkers or PPO's
agent, is lost, and the rest of the run differs from one never stopped).
"""
from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from tuning.config import ConfigError
from tuning.config.tracking_uri import sqlite_path
from tuning.core.plausible import bounds_of
from tuning.core.records import RecordError, RecordLog
from tuning.engine.budget import BudgetPlan
from tuning.engine.run_folder import claim, load_config, saved_choices
from tuning.engine.spec import JobSpec


def resolve_resume(cfg, hydra: dict):
    """The run's config and folder, the folder claimed for this process (tuning/engine/run_folder.py).

    A new run needs a folder that holds no run. A resumed run continues in its old folder with
    its saved config, read as untrusted input; budget.* and tracking.uri overrides apply, and
    this command's reset_state."""
    if not cfg.resume:
        if cfg.get("reset_state"):
            raise ConfigError("reset_state: only a resumed run (resume=DIR) has a saved state to reset")
        out_dir = Path(cfg.output_dir).resolve()
        claim(out_dir, resuming=False)
        return cfg, out_dir
    out_dir = Path(cfg.resume).expanduser().resolve()
    saved = out_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"resume: {out_dir} holds no config.yaml (not a tunelab run folder)")
    overrides = hydra.get("overrides", [])
    kept = [o for o in overrides if o.startswith(RESUME_OVERRIDES)]
    replaced = tuple(o.split("=", 1)[0] for o in kept if o.startswith(SERVER_OVERRIDES))
    old = load_config(saved, "resume", named=[cfg], replaced=replaced,
                      how="name it on the command line (the same key=URL; only hardware.store and tracking.uri "
                          "can be given on resume)")
    claim(out_dir, resuming=True, key="resume")
    hydra["choices"] = _saved_choices(out_dir, hydra)
    ignored = [o for o in overrides if not o.startswith((*RESUME_OVERRIDES, *RESUME_SWITCHES, "resume=", "hydra."))]
    if ignored:
        print(f"tunelab: resuming {out_dir} with its saved config; ignoring {' '.join(ignored)} "
              "(only budget.*, tracking.uri, hardware.store and reset_state may change on resume)", file=sys.stderr)
    old.merge_with(_override_values(kept))
    old.reset_state = bool(cfg.get("reset_state", False))  # this command's switch, never the saved run's
    old.resume = str(out_dir)
    old.output_dir = str(out_dir)
    _check_tracking_store(str(old.get("tracking", {}).get("uri", "")))
    return old, out_dir


# tracking.uri and hardware.store: where the run's MLflow store and measurement store are now, or a
# server's URL with the password a saved config leaves out
SERVER_OVERRIDES = ("tracking.uri=", "hardware.store=")
RESUME_OVERRIDES = ("budget.", *SERVER_OVERRIDES)
RESUME_SWITCHES = ("reset_state=",)  # read from this command's config, not merged into the saved one


def _override_values(overrides: list[str]):
    """The overrides as a config, their values parsed as Hydra parses them: a multirun's job gets its
    overrides escaped (tracking.uri=http\\://host\\:5000), which a plain dotlist would keep."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    values = OmegaConf.create()
    for override in OverridesParser.create().parse_overrides(overrides):
        OmegaConf.update(values, override.key_or_group, override.value(), force_add=True)
    return values


def _saved_choices(out_dir: Path, hydra: dict) -> dict:
    """Names (method, run name) come from the saved run's group choices, not from this
    composition's defaults: `resume=DIR` alone would otherwise call a random run "sa"."""
    choices = saved_choices(out_dir)
    saved_hydra = out_dir / ".hydra" / "hydra.yaml"
    # a folder from before run.yaml: Hydra's copy, unless this very job has just rewritten it
    if not choices and saved_hydra.exists() and Path(hydra.get("output_dir", "")).resolve() != out_dir:
        choices = dict(OmegaConf.load(saved_hydra).hydra.runtime.choices)
    return {k: v for k, v in choices.items() if not k.startswith("hydra/")}


def _check_tracking_store(uri: str) -> None:
    """A moved run folder names a sqlite store (tracking.uri) that is not there: say so, rather than
    create an empty one that holds none of the run's history."""
    db = sqlite_path(uri)
    if db is not None and not db.exists():
        raise ConfigError(f"tracking.uri: the run's MLflow store {uri} does not exist (was the folder moved?); "
                          "point at it with tracking.uri=sqlite:////path/to/mlflow.db")


# ---- a resumed folder, checked before any work ----------------------------------------------------
def check_records(out_dir: Path) -> list:
    """The folder's records. A line that is not a record, or two lines that are one measurement
    (the same task and index, or the same task and config: a run measures a config once), is a
    ConfigError naming the file and lines."""
    log = RecordLog(out_dir / "records.jsonl")
    try:
        records = log.load()
    except RecordError as error:
        raise ConfigError(f"resume: {error}; repair or remove that line, then resume again") from None
    _check_once(log.path, records)
    return records


def _check_once(path: Path, records) -> None:
    first_line: dict = {}
    for line, record in enumerate(records, start=1):  # load() skips only a torn last line
        for identity, what in (((record.workload_key, "index", record.index), f"measurement #{record.index}"),
                               ((record.workload_key, "config", tuple(record.config)), f"config {record.config}")):
            first = first_line.setdefault(identity, line)
            if first != line:
                raise ConfigError(f"resume: {path}:{first} and {path}:{line} are the same measurement ({what} of "
                                  f"{record.task}), which would count twice toward the budget; remove line "
                                  f"{line}, then resume again")


def check_resume(job: JobSpec, plan: BudgetPlan, out_dir: Path, records, tasks, hardware, fresh_state) -> None:
    """Everything a resumed run checks in its folder before measuring again (`plan`: its budget
    resolved); `fresh_state(task)` gives the (search, cost model) a task whose saved state is lost
    restarts with."""
    check_plausible(out_dir / "records.jsonl", records, tasks, hardware)
    check_budget(plan.trials, job.budget.trials_per_task, out_dir, records)
    check_task_states(job.seed, job.reset_state, out_dir, tasks, records, fresh_state)


def check_plausible(path: Path, records, tasks, hardware, key: str = "resume") -> None:
    """A records file carries no FLOPs and no device, so RecordLog holds it to the bounds that need
    neither; once the tasks and the hardware are known, each reading is held to its task's bounds
    (tuning/core/plausible.py): one the device could not have produced is refused naming file and line."""
    limits = {task.key: bounds_of(task, hardware) for task in tasks}
    for line, record in enumerate(records, start=1):  # load() skips only a torn last line
        bounds = limits.get(record.workload_key)
        problem = bounds.first_problem(record.result.costs) if bounds else None
        if problem:
            raise ConfigError(f"{key}: {path}:{line}: not a plausible reading of {record.task} on this hardware "
                              f"({problem}); repair or remove that line")


def check_budget(trials: int | None, per_task: int | None, out_dir: Path, records) -> None:
    """A resumed run only adds measurements: a budget (`trials`, resolved; `per_task`: budget.trials_per_task)
    below what the records hold would leave config.yaml disagreeing with them."""
    if trials is None or trials >= len(records):
        return
    given = (f"budget.trials_per_task: {per_task} per task gives budget.trials={trials}" if per_task is not None
             else f"budget.trials: {trials}")
    raise ConfigError(f"{given}, but {out_dir / 'records.jsonl'} already holds {len(records)} measurements; a "
                      f"resumed run only adds to them (budget.trials={len(records)} or more)")


def check_states(cfg, out_dir: Path, tasks, records, fresh_parts) -> None:
    """check_task_states with a config's seed and reset_state (what tests of a saved run folder call)."""
    check_task_states(cfg.seed, bool(cfg.get("reset_state")), out_dir, tasks, records, fresh_parts)


def check_task_states(seed: int, reset_state: bool, out_dir: Path, tasks, records,
                      fresh_parts: Callable[[int], tuple[Any, Any]]) -> None:
    """Every task's saved state is readable (it is loaded into a fresh search and cost model,
    `fresh_parts(task index)`) and not older than the task's records; a state is missing only where
    the task never finished a round. Otherwise a ConfigError naming the files, or with
    `reset_state=true`, those tasks' states are replaced by fresh ones (module docstring)."""
    last_round: dict = {}
    for record in records:
        last_round[record.workload_key] = max(last_round.get(record.workload_key, 0), record.round)
    damaged = []
    for index, task in enumerate(tasks):
        problem = _state_problem(_state_path(out_dir, task), task, last_round.get(task.key),
                                 lambda state: _load_state(state, *fresh_parts(index), seed, index))
        if problem:
            damaged.append((index, task, problem))
    if not damaged:
        return
    if not reset_state:
        raise ConfigError("resume: " + "\n  ".join(problem for _, _, problem in damaged) + "\n  without it the run "
                          "cannot continue as if never stopped: restore it, or resume with reset_state=true (the "
                          "task restarts its search from its records with a fresh state; no record is lost)")
    for index, task, problem in damaged:
        search, cost_model = fresh_parts(index)
        next_round = last_round.get(task.key, -1) + 1
        save_state(out_dir, task, search, _fresh_rng(seed, index), next_round, cost_model)
        print(f"tunelab: reset_state: {problem}; {task.name} continues at round {next_round} with a fresh search "
              "state and random stream (its records are kept; the rest of the run differs from one never stopped)",
              file=sys.stderr)


def _state_problem(path: Path, task, last_round: int | None, load) -> str | None:
    records = path.parent.parent / "records.jsonl"
    if not path.exists():
        if last_round:
            return f"{path} is missing, though {records} holds round {last_round} of {task.name}"
        return None  # never saved: the task has no record, or was stopped in its first round
    try:
        state = _read_state(path)
        load(state)
    except Exception as error:  # noqa: BLE001 - a search's load_state_dict may fail in any way on a damaged file
        return f"{path} is not a tunelab search state ({type(error).__name__}: {error})"
    if last_round is not None and state["round"] < last_round:
        return (f"{path} is older than the records: it continues at round {state['round']}, {records} holds "
                f"round {last_round} of {task.name}")
    return None


def prior_records(cfg, tasks, out_dir: Path, tracker, hardware=None) -> dict:
    """reused_records of a config's tuning.database: what the folder commands (tuning/tools: apply,
    export, sync) call with a run's saved config."""
    return reused_records(cfg.tuning.database, tasks, out_dir, tracker, hardware)


def reused_records(database: str | None, tasks, out_dir: Path, tracker, hardware=None) -> dict:
    """tuning.database (JobSpec.database): records of an earlier run (its folder, its records.jsonl, or
    its MLflow run id in this run's tracking store) for these tasks, by workload key; with `hardware`,
    their readings are held to its physical bounds (check_plausible)."""
    if not database:
        return {}
    records_file = _records_file(str(database), out_dir, tracker)
    try:
        records = RecordLog(records_file).load()
    except RecordError as error:
        raise ConfigError(f"tuning.database: {error}") from error
    if hardware is not None:
        check_plausible(records_file, records, tasks, hardware, "tuning.database")
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
    (the search's own state is loaded into `search`, the cost model's into `cost_model`). A resumed
    run's states were checked before any work (check_states)."""
    path = _state_path(out_dir, task)
    if not path.exists():
        return _fresh_rng(seed, task_index), 0
    state = _read_state(path)
    return _load_state(state, search, cost_model, seed, task_index), state["round"]


def _fresh_rng(seed: int, task_index: int):
    return np.random.default_rng([seed, task_index])


def _read_state(path: Path) -> dict:
    """The saved state, its shape checked (ValueError saying why not)."""
    state = json.loads(path.read_text())
    if not isinstance(state, dict):
        raise ValueError(f"expected a JSON object, got {type(state).__name__}")
    round_index = state.get("round")
    if not isinstance(round_index, int) or isinstance(round_index, bool) or round_index < 0:
        raise ValueError(f"round: expected an int >= 0, got {json.dumps(round_index)[:40]}")
    for key in ("rng", "search"):
        if not isinstance(state.get(key), dict):
            raise ValueError(f"{key}: expected an object, got {json.dumps(state.get(key))[:40]}")
    if not isinstance(state.get("cost_model") or {}, dict):  # absent in states saved before it existed
        raise ValueError(f"cost_model: expected an object, got {json.dumps(state['cost_model'])[:40]}")
    return state


def _load_state(state: dict, search, cost_model, seed: int, task_index: int):
    """The saved rng; the search's and cost model's states loaded into them."""
    rng = _fresh_rng(seed, task_index)
    rng.bit_generator.state = state["rng"]
    search.load_state_dict(state["search"])
    if cost_model is not None:
        cost_model.load_state_dict(state.get("cost_model") or {})
    return rng


def save_state(out_dir: Path, task, search, rng, round_index: int, cost_model=None) -> None:
    path = _state_path(out_dir, task)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    state = {"round": round_index, "rng": rng.bit_generator.state, "search": search.state_dict(),
             "cost_model": cost_model.state_dict() if cost_model is not None else {}}
    temporary.write_text(json.dumps(state))
    os.replace(temporary, path)  # atomic: a kill leaves the old or the new state, never half
