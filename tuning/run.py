"""One tuning job: validate -> instantiate -> tune each task -> export -> report.

Called by run.py (the thin @hydra.main). Returns the sweep objective
(`cfg.objective`, tuning/sweep.py) so Optuna sweeps can use it; a job that is an
Optuna trial reports its best-so-far each round and raises optuna.TrialPruned
when pruned (its MLflow run ends KILLED, tagged optuna.state=PRUNED).
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from tuning.trial import current_trial
from omegaconf import DictConfig, OmegaConf
from tqdm.contrib.logging import logging_redirect_tqdm

from tuning.callbacks import Pace, StoreWriter, default_callbacks
from tuning.config import ConfigError, validate
from tuning.hardware.replay import ReplayHardware, store_path, with_store, writes_store
from tuning import naming
from tuning.loop import Components, RunInfo, schedule_without_measuring, tune_tasks
from tuning.objective import objective_values
from tuning.outcome import best_so_far, summary, weighted_latency_ms
from tuning.records import RecordError, RecordLog
from tuning.resume import (check_budget, check_plausible, check_records, check_states, prior_records,
                           resolve_resume)
from tuning.run_folder import mark_status, release, save_identity, terminated_by_signals
from tuning.store import StoreError, open_store
from tuning.sweep import Pruning, trial_tags
from tuning.sync import SPOOL_FILE, backfill, history, save_final_metrics, save_tasks
from tuning.task import build_tasks
from tuning.tracking.base import option_name, run_params
from tuning.tracking.plot import convergence_png
from tuning.whole_model import e2e_line, evaluate_end_to_end, is_whole_model

log = logging.getLogger("tunelab")


def main(cfg: DictConfig) -> float:
    hydra = _hydra_info()
    try:
        cfg, out_dir = resolve_resume(cfg, hydra)  # the folder is this process's from here on
        validate(cfg, hydra.get("choices"))
        if cfg.resume:
            _continue_log_in(out_dir, hydra.get("output_dir"))
    except ConfigError as error:
        print(f"tunelab: {error}", file=sys.stderr)
        if not cfg.get("resume"):
            _discard_untouched(hydra.get("output_dir"))
        sys.exit(2)
    try:
        with terminated_by_signals():
            return _run(cfg, hydra, out_dir)
    finally:
        release(out_dir)


def _run(cfg: DictConfig, hydra: dict, out_dir: Path) -> float:
    parts = Components(*(instantiate(cfg[g]) for g in ("search", "sampler", "evaluator", "cost_model",
                                                         "hardware", "tracking")))
    parts.tracker.spool_to(str(out_dir / SPOOL_FILE))
    try:
        problem = parts.tracker.unreachable()
        if problem:
            raise ConfigError(problem)
        records = check_records(out_dir) if cfg.resume else []
        store_writer = _with_store(cfg, parts)
        tasks = _tasks(cfg, parts.hardware)
        _check_store_space(cfg, tasks, parts.hardware)
        prior = prior_records(cfg, tasks, out_dir, parts.tracker, parts.hardware)
        if cfg.resume:
            check_plausible(out_dir / "records.jsonl", records, tasks, parts.hardware)
            check_budget(cfg, out_dir, records)
            check_states(cfg, out_dir, tasks, records, lambda _: (instantiate(cfg.search), instantiate(cfg.cost_model)))
    except (ConfigError, StoreError) as error:
        parts.hardware.close()
        print(f"tunelab: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as interrupt:  # e.g. during a whole model's import: nothing measured yet
        parts.hardware.close()
        again = f"python run.py resume={out_dir}" if cfg.resume else "the same command"
        print(f"\ntunelab: interrupted ({str(interrupt) or 'SIGINT'}) before the first measurement; nothing was "
              f"measured; run {again} again", file=sys.stderr)
        raise
    if cfg.budget.plan_size is None:
        cfg.budget.plan_size = parts.search.default_plan_size
    _fit_plan_size(cfg, tasks, parts.hardware)
    # written once the budget is resolved, so config.yaml and the tracked params hold the numbers used
    (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (out_dir / "records.jsonl").touch()  # exists even when reused records leave nothing to measure
    save_identity(out_dir, hydra.get("choices", {}))
    save_tasks(out_dir, tasks, store_rows=(lambda task: store_writer.table(task, parts.hardware.space(task)))
               if store_writer else None)
    mark_status(out_dir, "RUNNING")
    method = f"{_choice(hydra, cfg, 'search')}+{_choice(hydra, cfg, 'sampler')}"
    run_name = naming.run_name(cfg, {g: _choice(hydra, cfg, g) for g in ("search", "sampler", "hardware")})
    trial = current_trial()  # the Optuna trial this job is, in a sweep; else None
    pruning = Pruning(trial, cfg.objective, cfg.budget.trials) if trial is not None else None
    callbacks = (default_callbacks(parts.tracker) + [_pace(cfg, tasks, parts.evaluator)] + ([pruning] if pruning else [])
                 + ([store_writer] if store_writer else []))
    log.info(_budget_line(cfg, tasks))
    if trial is not None:
        run_name += f"-trial{trial.number}"
    run_id_file = out_dir / "mlflow_run_id"
    resumed_id = run_id_file.read_text().strip() if run_id_file.exists() else None
    params, path_tags = run_params(OmegaConf.to_container(cfg, resolve=True))
    run_id = parts.tracker.start(
        run_name, params, {**_tags(hydra, cfg), **path_tags, **(trial_tags(trial) if trial is not None else {})},
        parent=hydra.get("sweep_dir"), resume_run_id=resumed_id)
    if run_id:
        run_id_file.write_text(run_id)
        parts.tracker.monitor_system()  # the tuning job's CPU and memory, not those of apply/export/sync
    if resumed_id and run_id:  # a killed run's curve may lack its last rounds: rebuilt from the records
        backfill(parts.tracker, history(tasks, prior, RecordLog(out_dir / "records.jsonl").load()))

    status, e2e, pruned, outcomes = "FAILED", None, False, []
    try:
        with parts.hardware:
            parts.tracker.set_tags(parts.hardware.describe())
            with logging_redirect_tqdm(loggers=[logging.getLogger()]):  # notices above the progress bar
                outcomes, tuning_s, started_at = _tune_all(cfg, tasks, parts, out_dir, method, prior, callbacks,
                                                           store_writer)
            pruned = pruning is not None and pruning.pruned_at is not None
            _export(parts, outcomes, out_dir)
            if is_whole_model(cfg.model) and cfg.e2e.enabled and not pruned:
                e2e = evaluate_end_to_end(cfg, parts.hardware, parts.tracker, out_dir)
            (out_dir / "summary.txt").write_text(summary(outcomes) + (e2e_line(e2e) + "\n" if e2e else ""))
            parts.tracker.log_artifact(str(out_dir / "summary.txt"))
        status = "KILLED" if pruned else "FINISHED"
    except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM/SIGHUP (Terminated)
        status = "KILLED"
        again = ("re-running the sweep runs this trial again" if trial is not None
                 else f"continue with: python run.py resume={out_dir}")
        print(f"\ntunelab: interrupted ({str(interrupt) or 'SIGINT'}); every measurement so far is in "
              f"{out_dir / 'records.jsonl'}; {again}", file=sys.stderr)
        raise
    except (StoreError, ConfigError) as error:  # the store's disk filled up, a link where the run writes
        print(f"\ntunelab: {error}; every measurement so far is in {out_dir / 'records.jsonl'}; "
              f"once that is mended continue with: python run.py resume={out_dir}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        mark_status(out_dir, status)
        if status != "FINISHED":  # the round it stopped in has no curve point yet
            _backfill_quietly(parts.tracker, tasks, prior, out_dir)
        if trial is not None:
            parts.tracker.set_tags({"optuna.state": {"FINISHED": "COMPLETE", "KILLED": "PRUNED"}.get(status, "FAIL")})
        interrupted = status == "KILLED" and not pruned
        parts.tracker.end(status, parent_status="KILLED" if interrupted else "FINISHED")
        if parts.tracker.offline:
            print(f"tunelab: MLflow is missing part of this run ({parts.tracker.offline}); once the store is "
                  f"back: python -m tuning.sync {out_dir}", file=sys.stderr)
    _report(outcomes, e2e, parts.tracker, out_dir)
    if pruned:
        import optuna

        raise optuna.TrialPruned(f"pruned after {pruning.pruned_at} measurements")
    return objective_values(cfg.objective, outcomes, tuning_s, started_at)


def _discard_untouched(job_dir: str | None) -> None:
    """A new job refused before any work leaves no folder behind: the one Hydra made for it is
    removed while it holds nothing but Hydra's files, an empty run.log and the lock."""
    out_dir = Path(job_dir).resolve() if job_dir else None
    if out_dir is None or not out_dir.is_dir():
        return
    release(out_dir)
    made_here = {".hydra", "run.log", ".tunelab.lock"}
    if all(p.name in made_here and not (p.name == "run.log" and p.stat().st_size) for p in out_dir.iterdir()):
        shutil.rmtree(out_dir, ignore_errors=True)


def _continue_log_in(out_dir: Path, job_dir: str | None) -> None:
    """A resumed run logs to its own folder's run.log; the folder Hydra made for this job holds
    nothing else, and is removed rather than left behind empty."""
    if not job_dir or Path(job_dir).resolve() == out_dir:
        return
    job_dir = Path(job_dir).resolve()
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == job_dir:
            handler.close()
            handler.baseFilename = str(out_dir / Path(handler.baseFilename).name)  # reopened on the next record
            handler.mode = "a"
    leftovers = [p for p in job_dir.iterdir() if p.name != ".hydra" and not (p.suffix == ".log" and p.stat().st_size == 0)]
    if not leftovers:
        shutil.rmtree(job_dir, ignore_errors=True)


def _backfill_quietly(tracker, tasks, prior, out_dir: Path) -> None:
    """The stopped round's curve point, unless the records cannot be read (a full disk, a bad line):
    then the error that stopped the run is the one to report, and resume or tuning.sync fill it later."""
    try:
        backfill(tracker, history(tasks, prior, RecordLog(out_dir / "records.jsonl").load()))
    except (OSError, RecordError):
        pass


def _with_store(cfg, parts) -> StoreWriter | None:
    """hardware.store: every reading goes to the measurement store (a StoreWriter callback); with
    hardware.reuse (or model.space=store) the hardware answers stored configs from it."""
    space = cfg.model.get("space", "full")
    path = store_path(parts.hardware)
    if path is None:
        if space == "store":
            raise ConfigError("model.space: `store` needs a measurement store (hardware=replay "
                              "hardware.store=FILE, or hardware.store=FILE hardware.reuse=true)")
        return None
    if space == "store" and not isinstance(parts.hardware, ReplayHardware):
        parts.hardware.reuse = True
    parts.hardware = with_store(parts.hardware)
    if space == "store":
        parts.hardware.restrict_to_store(parts.evaluator.spec)
    return StoreWriter(open_store(path, "hardware.store", read_only=not writes_store(parts.hardware)), parts.hardware,
                       parts.evaluator.spec)


def _check_store_space(cfg, tasks, hardware) -> None:
    if cfg.model.get("space", "full") != "store":
        return
    for task in tasks:
        if hardware.space(task).size == 0:
            raise ConfigError(f"model.space: the store {hardware.store} holds no reading of {task.name} for this "
                              "hardware and evaluator (python -m tuning.dataset stats lists what it holds)")


def _fit_plan_size(cfg, tasks, hardware) -> None:
    """A single operator's rounds cannot measure more than its whole space: budget.plan_size is cut
    to it, with a notice, so config.yaml and the tracked params hold the number used. (A whole
    model's plan size is shared by kernels of every size; the loop measures a small one's space
    config by config.)"""
    if len(tasks) != 1:
        return
    size = hardware.space(tasks[0]).size
    if 0 < size < cfg.budget.plan_size:
        log.info(f"budget.plan_size={cfg.budget.plan_size} is more than {tasks[0].name}'s whole space "
                 f"({size} configs); rounds measure at most {size}")
        cfg.budget.plan_size = size


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


DEFAULT_TRIALS = 256  # budget.trials left null: a single operator's budget...
DEFAULT_TRIALS_PER_KERNEL = 32  # ...and a whole model's, per distinct kernel (704 for ResNet-18's 22)


def _with_budget(cfg, tasks) -> list:
    """Resolve budget.trials (trials_per_task, or null: the defaults above) and, when the budget
    cannot give every task budget.min_trials_per_task, lower that minimum to an even share:
    trials // tasks each, the rest to the scheduler (README §Whole models)."""
    if cfg.budget.trials_per_task is not None:
        cfg.budget.trials = cfg.budget.trials_per_task * len(tasks)
    elif cfg.budget.trials is None:
        cfg.budget.trials = DEFAULT_TRIALS_PER_KERNEL * len(tasks) if is_whole_model(cfg.model) else DEFAULT_TRIALS
    if cfg.budget.trials == 0:  # a search that schedules without measuring (validated)
        return tasks
    if cfg.budget.trials < len(tasks):
        raise ConfigError(f"budget.trials: {cfg.model.name} has {len(tasks)} tasks and every one needs at "
                          f"least one measurement; got {cfg.budget.trials}")
    share = even_share(cfg.budget.trials, len(tasks), cfg.budget.min_trials_per_task)
    if share < cfg.budget.min_trials_per_task:
        log.info(f"{cfg.budget.trials} measurements cannot give each of {len(tasks)} kernels "
                 f"budget.min_trials_per_task={cfg.budget.min_trials_per_task}: each gets {share} first, the "
                 f"scheduler places the other {cfg.budget.trials - share * len(tasks)}")
        cfg.budget.min_trials_per_task = share
    return tasks


def _budget_line(cfg, tasks) -> str:
    if cfg.budget.trials == 0:
        return (f"budget: 0 measurements: the search chooses each of {len(tasks)} kernel schedules without "
                f"measuring; each chosen kernel is then timed once")
    per_round = f"up to {cfg.budget.plan_size} per round"
    if len(tasks) == 1:
        return f"budget: {cfg.budget.trials} measurements of {tasks[0].name}, {per_round} (budget.trials=N to change)"
    return (f"budget: {cfg.budget.trials} measurements over {len(tasks)} kernels, {cfg.budget.min_trials_per_task} "
            f"each first, {per_round} (budget.trials=N or budget.trials_per_task=N to change)")


def _pace(cfg, tasks, evaluator) -> Pace:
    finalists = len(tasks) * evaluator.final_candidates  # each task's best few, re-measured at the end
    if is_whole_model(cfg.model) and cfg.e2e.enabled:  # tuned, untuned and torch timed
        return Pace(kernels=len(tasks), e2e_timing_s=3 * cfg.e2e.max_seconds, finalists=finalists)
    return Pace(finalists=finalists)


def even_share(trials: int, tasks: int, minimum: int) -> int:
    """Each task's first measurements: the minimum if the budget covers every task's, else an even share."""
    if tasks <= 1 or trials >= tasks * minimum:
        return minimum
    return trials // tasks


def _tune_all(cfg, tasks, parts, out_dir, method, prior, callbacks, store_writer=None):
    """Tune, log the totals; returns (outcomes, tuning seconds, the clock at the start): with a
    simulated clock (replay) the stored seconds of the measurements and 0."""
    deadline = time.monotonic() + cfg.budget.time_limit_s if cfg.budget.time_limit_s else None
    run = RunInfo(cfg.seed, out_dir, method, cfg.budget.trials, cfg.budget.plan_size, deadline, cfg.budget.early_stop,
                  cfg.budget.min_trials_per_task, cfg.budget.rounds_per_task, callbacks,
                  init_random=cfg.budget.get("init_random") or 0)

    def components_for(index: int) -> Components:  # each task learns its own model and search state
        if len(tasks) == 1:
            return parts
        return replace(parts, **{g: instantiate(cfg[g]) for g in ("search", "sampler", "cost_model")})

    started, started_at = time.perf_counter(), time.time()
    if cfg.budget.trials == 0:
        outcomes = schedule_without_measuring(tasks, components_for)
        log.info(f"scheduled {len(tasks)} kernels without measuring in "
                 f"{sum(o.times['search_s'] for o in outcomes):.1f} s of search")
    else:
        outcomes = tune_tasks(tasks, components_for, run, instantiate(cfg.scheduler), prior)
    totals = {f"run/{key}": sum(o.times.get(key, 0.0) for o in outcomes)
              for key in ("search_s", "model_s", "build_s", "run_s")}
    totals["run/tuning_wall_s"] = time.perf_counter() - started  # tuning and the final re-measurements
    if parts.hardware.simulated_clock:
        totals["run/simulated_s"] = run.simulated_s
    for outcome in outcomes:
        if store_writer is not None and outcome.best_config is not None:
            outcome.true_cost = store_writer.truth(outcome.task, parts.hardware.space(outcome.task),
                                                   outcome.best_config)
        if math.isfinite(outcome.best_cost):
            parts.tracker.log_metrics({
                f"task/{outcome.task.name}/final_latency_us": outcome.best_cost * 1e6,
                f"task/{outcome.task.name}/final_gflops": outcome.best_gflops,
                **({f"task/{outcome.task.name}/best_true_us": outcome.true_cost * 1e6} if outcome.true_cost else {}),
            }, step=run.measured)
    if len(outcomes) == 1 and outcomes[0].true_cost:
        totals["tuning/best_true_us"] = outcomes[0].true_cost * 1e6
    total = sum(o.best_gflops for o in outcomes)
    final = {**headline_metrics(outcomes), "tuning/final_gflops": total, "tuning/measurements": run.measured,
             "tuning/new_measurements": run.measured - sum(o.reused for o in outcomes),
             "tuning/weighted_latency_ms": weighted_latency_ms(outcomes), **totals}
    parts.tracker.log_metrics(final, step=run.measured)
    save_final_metrics(out_dir, run.measured, {k: v for k, v in final.items() if math.isfinite(v)})
    if parts.hardware.simulated_clock:
        return outcomes, run.simulated_s, 0.0
    return outcomes, totals["run/tuning_wall_s"], started_at


def headline_metrics(outcomes) -> dict:
    """The run's result, re-measured, first in MLflow's columns: final_gflops (a whole model's: its
    FLOPs over its weighted kernel latency, not a sum of per-kernel rates) and the latency."""
    if len(outcomes) == 1:
        return {"final_gflops": outcomes[0].best_gflops, "final_latency_us": outcomes[0].best_cost * 1e6}
    latency_ms = weighted_latency_ms(outcomes)
    flops = sum(o.task.weight * o.task.flops for o in outcomes)
    return {"final_gflops": flops / latency_ms / 1e6 if math.isfinite(latency_ms) and latency_ms > 0 else 0.0,
            "final_latency_ms": latency_ms}


def _export(parts, outcomes, out_dir: Path) -> None:
    tracker, hardware = parts.tracker, parts.hardware
    for outcome in outcomes:
        if outcome.best_config is not None:
            for path in hardware.export(outcome.task, outcome.best_config, out_dir / "best_schedules"):
                tracker.log_artifact(path, "best_schedules")
    measured = [(o.task, o.records) for o in outcomes if o.best_config is not None and o.records]
    unmeasured = [(o.task, o.best_config, o.predicted_cost) for o in outcomes
                  if o.best_config is not None and not o.records]
    exported = hardware.export_database(measured, out_dir / "database", unmeasured) if measured or unmeasured else []
    for path in exported:
        tracker.log_artifact(path, "database")
    if len(outcomes) == 1:
        png = convergence_png({o.task.name: o.curve() for o in outcomes}, str(out_dir / "convergence.png"),
                              final=outcomes[0].best_gflops)
    else:
        png = convergence_png({"sum of weight x best latency": best_so_far(outcomes, "latency_ms")},
                              str(out_dir / "convergence.png"),
                              ylabel="model latency estimate (ms)", final=weighted_latency_ms(outcomes))
    tracker.log_artifact(png)
    tracker.log_artifact(str(out_dir / "records.jsonl"))
    tracker.log_artifact(str(out_dir / "config.yaml"))
    tracker.log_artifact(str(out_dir / "tasks.json"))
    for log in out_dir.glob("*.log"):  # Hydra's job log
        tracker.log_artifact(str(log), "logs")


def _report(outcomes, e2e, tracker, out_dir: Path) -> None:
    print(summary(outcomes), end="")
    if e2e:
        print(e2e_line(e2e))
    print(f"records: {out_dir / 'records.jsonl'}")
    print(f"MLflow: {tracker.location}")


# ---- Hydra context -------------------------------------------------------------------------
def _hydra_info() -> dict:
    if not HydraConfig.initialized():
        return {}
    hc = HydraConfig.get()
    info = {"choices": dict(hc.runtime.choices), "overrides": list(hc.overrides.task),
            "output_dir": hc.runtime.output_dir}
    if hc.mode == RunMode.MULTIRUN:
        info["sweep_dir"] = str(Path(hc.sweep.dir).resolve())
    return info


def _choice(hydra: dict, cfg, group: str) -> str:
    return option_name(hydra.get("choices", {}).get(group), cfg[group]["_target_"])


def _tags(hydra: dict, cfg) -> dict:
    import torch

    overrides = " ".join(hydra.get("overrides", []))
    return {
        "overrides": overrides or "(defaults)",
        # MLflow's own tags: the run page's Source, Git commit, Created by and Description
        "mlflow.source.name": str(Path(sys.argv[0]).resolve()) if sys.argv and sys.argv[0] else "run.py",
        "mlflow.source.type": "LOCAL",
        "mlflow.source.git.commit": _git_commit(),
        "mlflow.user": _user(),
        "mlflow.note.content": _note(hydra, cfg, overrides),
        "torch_version": torch.__version__,
        "model": cfg.model.name,
        "experiment": hydra.get("choices", {}).get("experiment") or "none",
        **{f"choice.{group}": _choice(hydra, cfg, group) for group in ("search", "sampler", "cost_model",
                                                                        "evaluator", "hardware")},
        "seed": str(cfg.seed),
        # rows of an experiment (+experiment/adatune_row=..., +experiment/chameleon_row=...): what
        # `tuning.compare --method-by choice.experiment/<group>` names a method by
        **{f"choice.{group}": str(option) for group, option in hydra.get("choices", {}).items()
           if group.startswith("experiment/") and option},
    }


def _headline_names(cfg) -> str:
    return "`final_gflops` / `final_latency_ms`" if is_whole_model(cfg.model) else "`final_gflops` / `final_latency_us`"


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no passwd entry and no USER
        return "unknown"


def _note(hydra: dict, cfg, overrides: str) -> str:
    """The run page's description: what ran, where its files are, which metric is the result."""
    choice = {g: _choice(hydra, cfg, g) for g in ("search", "sampler", "cost_model", "evaluator", "hardware")}
    return (f"{naming.workload_label(cfg.model)} tuned by search={choice['search']} sampler={choice['sampler']} "
            f"(cost_model={choice['cost_model']}, evaluator={choice['evaluator']}) on hardware={choice['hardware']}: "
            f"{cfg.budget.trials} measurements, seed {cfg.seed}. Command: `python run.py {overrides}`. "
            f"The result is {_headline_names(cfg)} (the best schedule re-measured at the end"
            f"{'; `e2e/*` times the whole model' if is_whole_model(cfg.model) else ''}); `tuning/best_gflops` is "
            f"the best reading while tuning, one point per measurement. Records, config and log: {cfg.output_dir}.")


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=os.path.dirname(__file__)).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
