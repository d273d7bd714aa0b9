"""One tuning job: validate -> instantiate -> tune each task -> export -> report.

Called by run.py (the thin @hydra.main). Returns the sweep objective
(`cfg.objective`, tuning/sweep.py) so Optuna sweeps can use it; a job that is an
Optuna trial reports its best-so-far each round and raises optuna.TrialPruned
when pruned (its MLflow run ends KILLED, tagged optuna.state=PRUNED).
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from hydra_plugins.tunelab_optuna_sweeper.trial import current_trial
from omegaconf import DictConfig, OmegaConf

from tuning.config import ConfigError, validate
from tuning.apply import (e2e_line, evaluate_end_to_end, is_whole_model, model_curve, task_table,
                          weighted_latency_ms)
from tuning.loop import Components, RunInfo, tune_tasks
from tuning.records import RecordLog
from tuning.sweep import Pruning, objective_values, trial_tags
from tuning.task import build_tasks
from tuning.tracking.base import flatten
from tuning.tracking.plot import convergence_png


def main(cfg: DictConfig) -> float:
    hydra = _hydra_info()
    try:
        cfg, out_dir = _resolve_resume(cfg, hydra)
        validate(cfg, hydra.get("choices"))
    except ConfigError as error:
        print(f"tunelab: {error}", file=sys.stderr)
        sys.exit(2)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))

    parts = Components(*(instantiate(cfg[g]) for g in ("search", "sampler", "evaluator", "cost_model",
                                                         "hardware", "tracking")))
    try:
        tasks = _tasks(cfg, parts.hardware)
        prior = prior_records(cfg, tasks, out_dir, parts.tracker)
    except ConfigError as error:
        parts.hardware.close()
        print(f"tunelab: {error}", file=sys.stderr)
        sys.exit(2)
    (out_dir / "records.jsonl").touch()  # exists even when reused records leave nothing to measure
    method = f"{_choice(hydra, cfg, 'search')}+{_choice(hydra, cfg, 'sampler')}"
    run_name = f"{cfg.model.name}-{_choice(hydra, cfg, 'search')}-{_choice(hydra, cfg, 'sampler')}-{cfg.seed}"
    trial = current_trial()  # the Optuna trial this job is, in a sweep; else None
    pruning = Pruning(trial, cfg.objective, cfg.budget.trials) if trial is not None else None
    if trial is not None:
        run_name += f"-trial{trial.number}"
    run_id_file = out_dir / "mlflow_run_id"
    run_id = parts.tracker.start(
        run_name, flatten(OmegaConf.to_container(cfg, resolve=True)),
        {**_tags(hydra, cfg), **(trial_tags(trial) if trial is not None else {})},
        parent=hydra.get("sweep_dir"),
        resume_run_id=run_id_file.read_text().strip() if run_id_file.exists() else None,
    )
    if run_id:
        run_id_file.write_text(run_id)

    status, e2e, pruned = "FAILED", None, False
    try:
        with parts.hardware:
            parts.tracker.set_tags(parts.hardware.describe())
            outcomes, tuning_s, started_at = _tune_all(cfg, tasks, parts, out_dir, method, prior, pruning)
            pruned = pruning is not None and pruning.pruned_at is not None
            _export(parts, outcomes, out_dir)
            if is_whole_model(cfg.model) and cfg.e2e.enabled and not pruned:
                e2e = evaluate_end_to_end(cfg, parts.hardware, parts.tracker, out_dir)
            parts.tracker.log_text(_summary(outcomes) + (e2e_line(e2e) + "\n" if e2e else ""), "summary.txt")
        status = "KILLED" if pruned else "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if trial is not None:
            parts.tracker.set_tags({"optuna.state": {"FINISHED": "COMPLETE", "KILLED": "PRUNED"}.get(status, "FAIL")})
        parts.tracker.end(status)
    _report(outcomes, e2e, parts.tracker, out_dir)
    if pruned:
        import optuna

        raise optuna.TrialPruned(f"pruned after {pruning.pruned_at} measurements")
    return objective_values(cfg.objective, outcomes, tuning_s, started_at)


def _tasks(cfg, hardware) -> list:
    """The model's tasks; a whole model's come from the backend (import + extraction).
    With budget.trials_per_task, budget.trials becomes that times the number of tasks."""
    if not is_whole_model(cfg.model):
        return _with_budget(cfg, build_tasks(cfg.model))
    try:
        tasks = hardware.model_tasks(cfg.model, cfg.seed)
    except Exception as error:  # noqa: BLE001 - a file the frontend cannot read is bad input, not a crash
        if cfg.model.kind != "onnx":
            raise
        raise ConfigError(f"model.path: Relax's ONNX frontend cannot import {cfg.model.path}: "
                          f"{type(error).__name__}: {error}") from error
    return _with_budget(cfg, tasks)


def _with_budget(cfg, tasks) -> list:
    if cfg.budget.trials_per_task is not None:
        cfg.budget.trials = cfg.budget.trials_per_task * len(tasks)
    if cfg.budget.trials < len(tasks):
        raise ConfigError(f"budget.trials: {cfg.model.name} has {len(tasks)} tasks and every one needs at "
                          f"least one measurement; got {cfg.budget.trials}")
    return tasks


def prior_records(cfg, tasks, out_dir: Path, tracker) -> dict:
    """tuning.database: records of an earlier run (its folder, its records.jsonl, or its MLflow
    run id in this run's tracking store) for these tasks."""
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


def _tune_all(cfg, tasks, parts, out_dir, method, prior, after_round=None):
    """Tune, log the totals; returns (outcomes, tuning seconds, time.time() at the start)."""
    deadline = time.monotonic() + cfg.budget.time_limit_s if cfg.budget.time_limit_s else None
    plan_size = int(cfg.search.get("plan_size", 64))
    run = RunInfo(cfg.seed, out_dir, method, cfg.budget.trials, plan_size, deadline, cfg.budget.early_stop,
                  cfg.budget.min_trials_per_task, cfg.budget.rounds_per_task, after_round)

    def components_for(index: int) -> Components:  # each task learns its own model and search state
        if len(tasks) == 1:
            return parts
        return replace(parts, **{g: instantiate(cfg[g]) for g in ("search", "sampler", "cost_model")})

    started, started_at = time.perf_counter(), time.time()
    outcomes = tune_tasks(tasks, components_for, run, instantiate(cfg.scheduler), prior)
    totals = {f"run/{key}": sum(o.times.get(key, 0.0) for o in outcomes)
              for key in ("search_s", "model_s", "build_s", "run_s")}
    totals["run/tuning_wall_s"] = time.perf_counter() - started  # tuning and the final re-measurements
    for outcome in outcomes:
        if math.isfinite(outcome.best_cost):
            parts.tracker.log_metrics({
                f"task/{outcome.task.name}/final_latency_us": outcome.best_cost * 1e6,
                f"task/{outcome.task.name}/final_gflops": outcome.best_gflops,
            }, step=run.measured)
    total = sum(o.best_gflops for o in outcomes)
    parts.tracker.log_metrics({"tuning/final_gflops": total, "tuning/measurements": run.measured,
                               "tuning/new_measurements": run.measured - sum(o.reused for o in outcomes),
                               "tuning/weighted_latency_ms": weighted_latency_ms(outcomes), **totals},
                              step=run.measured)
    return outcomes, totals["run/tuning_wall_s"], started_at


def _export(parts, outcomes, out_dir: Path) -> None:
    tracker, hardware = parts.tracker, parts.hardware
    for outcome in outcomes:
        if outcome.best_config is not None:
            for path in hardware.export(outcome.task, outcome.best_config, out_dir / "best_schedules"):
                tracker.log_artifact(path, "best_schedules")
    measured = [(o.task, o.records) for o in outcomes if o.best_config is not None]
    for path in hardware.export_database(measured, out_dir / "database") if measured else []:
        tracker.log_artifact(path, "database")
    if len(outcomes) == 1:
        png = convergence_png({o.task.name: o.curve() for o in outcomes}, str(out_dir / "convergence.png"))
    else:
        png = convergence_png({"sum of weight x best latency": model_curve(outcomes)}, str(out_dir / "convergence.png"),
                              ylabel="model latency estimate (ms)")
    tracker.log_artifact(png)
    tracker.log_artifact(str(out_dir / "records.jsonl"))
    tracker.log_artifact(str(out_dir / "config.yaml"))
    for log in out_dir.glob("*.log"):  # Hydra's job log
        tracker.log_artifact(str(log), "logs")


def _summary(outcomes) -> str:
    if len(outcomes) > 1:
        return task_table(outcomes) + "\n"
    lines = []
    for o in outcomes:
        if not math.isfinite(o.best_cost):
            latency = "none valid"
        elif o.stopped_because == "pruned":
            latency = f"{o.best_cost * 1e6:.1f} us (while tuning; pruned, not re-measured)"
        else:
            latency = f"{o.best_cost * 1e6:.1f} us (re-measured; {o.tuning_best_cost * 1e6:.1f} us while tuning)"
        lines.append(f"[{o.task.name}] best {latency}  {o.best_gflops:.2f} GFLOP/s  "
                     f"measurements {len(o.records)}  invalid {o.invalid}  (stopped: {o.stopped_because})")
    return "\n".join(lines) + "\n"


def _report(outcomes, e2e, tracker, out_dir: Path) -> None:
    print(_summary(outcomes), end="")
    if e2e:
        print(e2e_line(e2e))
    print(f"records: {out_dir / 'records.jsonl'}")
    print(f"MLflow: {tracker.location}")


# ---- Hydra context -------------------------------------------------------------------------
def _hydra_info() -> dict:
    if not HydraConfig.initialized():
        return {}
    hc = HydraConfig.get()
    info = {"choices": dict(hc.runtime.choices), "overrides": list(hc.overrides.task)}
    if hc.mode == RunMode.MULTIRUN:
        info["sweep_dir"] = str(Path(hc.sweep.dir).resolve())
    return info


def _choice(hydra: dict, cfg, group: str) -> str:
    return hydra.get("choices", {}).get(group) or cfg[group]["_target_"].rsplit(".", 1)[-1]


def _resolve_resume(cfg, hydra: dict):
    """A resumed run continues in its old folder with its saved config; budget.* overrides apply."""
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


def _tags(hydra: dict, cfg) -> dict:
    import torch

    return {
        "overrides": " ".join(hydra.get("overrides", [])) or "(defaults)",
        "git_commit": _git_commit(),
        "torch_version": torch.__version__,
        "model": cfg.model.name,
        "experiment": hydra.get("choices", {}).get("experiment") or "none",
        **{f"choice.{group}": _choice(hydra, cfg, group) for group in ("search", "sampler", "cost_model",
                                                                        "evaluator", "hardware")},
        "seed": str(cfg.seed),
    }


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=os.path.dirname(__file__)).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
