"""One tuning job: validate -> instantiate -> prepare -> tune each task -> export -> report.

Called by run.py / `tunelab run` (the thin @hydra.main; `main` returns the sweep objective) and by
`tunelab.tune` (`run_job` returns the outcomes too). The objective (`cfg.objective`, tuning/sweep/multirun.py)
is what Optuna sweeps minimise; a job that is an Optuna trial reports its best-so-far each round and
raises optuna.TrialPruned when pruned (its MLflow run ends KILLED, tagged optuna.state=PRUNED).

This module orders the steps and says what went wrong; the validated config is read once into a frozen JobSpec
(tuning/engine/spec.py) that the steps take. Each step lives with its subject, in tuning/engine/: budget.py,
store_wiring.py, loop.py, final.py, artifacts.py, model_choice.py (a whole model's), job_run.py (the MLflow run).
"""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from omegaconf import DictConfig
from tqdm.contrib.logging import logging_redirect_tqdm

from tuning.config import ConfigError
from tuning.config.cli import tunelab_command
from tuning.config.objective import objective_values
from tuning.core.outcome import summary
from tuning.engine import job_folder, run_folder
from tuning.engine.artifacts import end_whole_model, export_artifacts
from tuning.engine.budget import BudgetPlan, checks_estimate_s, resolve_budget, with_checks, with_plan_size
from tuning.engine.builders import Builders
from tuning.engine.callbacks import Pace, StoreWriter, default_callbacks
from tuning.engine.final import log_final_metrics, print_result
from tuning.engine.first_round import prior_of
from tuning.engine.job_folder import hydra_info as _hydra_info
from tuning.engine.job_run import RunIdentity, end_job_run, start_job_run
from tuning.engine.loop import Components, RunInfo, schedule_without_measuring, tune_tasks
from tuning.engine.network_time import NetworkTime
from tuning.engine.resume import check_records, check_resume, resolve_resume, reused_records
from tuning.engine.run_files import SPOOL_FILE, save_tasks
from tuning.engine.spec import JobSpec
from tuning.engine.store_wiring import check_store_space, wire_store
from tuning.engine.trial import Pruning, current_trial
from tuning.engine.validate import validate
from tuning.engine.whole_model import e2e_line, job_tasks
from tuning.hardware.runners.base import NoDeviceLeft
from tuning.store import StoreError
from tuning.tracking.tags import figure_title, git_commit, method_name


@dataclass(frozen=True)
class Job:
    """A prepared job: what the steps after the checks share."""
    spec: JobSpec
    plan: BudgetPlan  # resolved, its plan size too
    build: Builders  # on the config with its budget resolved (BudgetPlan.applied)
    parts: Components  # on the hardware the store wiring returned
    tasks: list
    prior: dict  # records reused from tuning.database, by workload key
    store_writer: StoreWriter | None
    figure_title: str = ""  # method, workload and seed (tuning/config/naming.py figure_title)


@dataclass(frozen=True)
class JobResult:
    """What a finished job leaves its caller: the sweep objective, each task's outcome, the folder."""
    objective: float | list[float]  # float, or a list for a multi-objective sweep
    outcomes: list
    out_dir: Path
    e2e: dict | None  # a whole model's end-to-end check


class JobFailed(RuntimeError):
    """Stopped after measuring (a full disk, a link where it writes); it said how to continue."""


def main(cfg: DictConfig) -> float | list[float]:
    """run.py's job: the sweep objective; bad input exits with status 2 before any work, a failed job 1."""
    try:
        return run_job(cfg).objective
    except (ConfigError, StoreError) as error:
        print(f"tunelab: {error}", file=sys.stderr)
        sys.exit(2)
    except JobFailed:
        sys.exit(1)


def run_job(cfg: DictConfig) -> JobResult:
    """The job on a composed config (its Hydra context set); ConfigError/StoreError: bad input, nothing done."""
    started = time.monotonic()  # a budget in minutes counts the whole job from here
    hydra = _hydra_info()
    job_folder.scrub_hydra_copies(hydra)
    try:
        cfg, out_dir = resolve_resume(cfg, hydra)  # the folder is this process's from here on
        validate(cfg, hydra.get("choices"), runs_here=True)
        if cfg.resume:
            job_folder.continue_log_in(out_dir, hydra.get("output_dir"))
    except ConfigError:
        job_folder.discard_refused(cfg.get("resume"), hydra.get("output_dir"))
        raise
    try:
        spec = JobSpec.from_cfg(cfg, out_dir, hydra.get("choices", {}))  # what the steps below read
        with run_folder.terminated_by_signals():
            return _run(cfg, spec, hydra, started)
    except (ConfigError, StoreError):
        if not cfg.resume:  # refused before any work (a store or device that cannot be reached): no folder left
            job_folder.discard_untouched(str(out_dir))
        raise
    finally:
        run_folder.release(out_dir)


def _run(cfg: DictConfig, spec: JobSpec, hydra: dict, started: float) -> JobResult:
    """The component-building step keeps the raw config (Builders: Hydra's `instantiate`, config.yaml, the
    method's name, the MLflow run's params and tags, from it with its budget resolved); the rest reads `spec`.
    `started`: time.monotonic() at the job's start, from which a budget in minutes counts."""
    out_dir = spec.out_dir
    build = Builders(cfg)
    parts = build.components()
    parts.tracker.spool_to(str(out_dir / SPOOL_FILE))
    parts, tasks, plan, store_writer, prior = _prepare(spec, build, parts, started)
    applied = plan.applied(cfg)  # config.yaml and the tracked params hold the numbers the run uses
    job = Job(spec, plan, Builders(applied), parts, tasks, prior, store_writer, figure_title(hydra, cfg))
    _write_run_files(job)
    trial = current_trial()  # the Optuna trial this job is, in a sweep; else None
    pruning = Pruning(trial, spec.objective, plan.trials) if trial is not None else None
    callbacks = (default_callbacks(parts.tracker) + [Pace.of_job(spec, tasks, parts.evaluator)]
                 + ([NetworkTime(parts.tracker)] if spec.model.whole else [])
                 + [callback for callback in (pruning, store_writer) if callback is not None])
    plan.say(tasks, parts.sampler.measured_per_round(plan.plan_size) if plan.plan_size else None)
    start_job_run(parts.tracker, RunIdentity.of(applied, hydra, trial), out_dir, tasks, prior)
    outcomes, e2e, clock = _tune_and_export(job, method_name(hydra, applied), callbacks, trial, pruning)
    print_result(outcomes, e2e, parts.tracker, out_dir, plan.wall_line())
    if pruning is not None and pruning.pruned_at is not None:
        import optuna

        raise optuna.TrialPruned(f"pruned after {pruning.pruned_at} measurements")
    return JobResult(objective_values(spec.objective, outcomes, *clock), outcomes, out_dir, e2e)


def _prepare(spec, build, parts, started: float):
    """Every check before the run folder is written (`spec`: the JobSpec, `build`: its Builders): (parts, tasks,
    budget with its plan size and deadline, store writer, prior records). Bad input: exit status 2; an
    interrupt says nothing was measured."""
    try:
        problem = parts.tracker.unreachable() or parts.hardware.unreachable()
        if problem:
            raise ConfigError(problem)
        records = check_records(spec.out_dir) if spec.resume else []
        hardware, store_writer = wire_store(spec.model.space, parts.hardware, parts.evaluator.spec)
        parts = replace(parts, hardware=hardware)
        tasks = job_tasks(spec, parts.hardware)
        plan = with_plan_size(resolve_budget(spec.budget, spec.model, tasks), parts.search.default_plan_size, tasks,
                              parts.hardware)
        plan = with_checks(plan, started, checks_estimate_s(tasks, spec.e2e if spec.model.whole else None,
                                                            parts.evaluator.final_candidates))
        check_store_space(spec.model.space, tasks, parts.hardware)
        prior = reused_records(spec.database, tasks, spec.out_dir, parts.tracker, parts.hardware)
        if spec.resume:
            check_resume(spec, plan, spec.out_dir, records, tasks, parts.hardware, build.fresh_state)
    except (ConfigError, StoreError):
        parts.hardware.close()
        raise
    except KeyboardInterrupt as interrupt:  # e.g. during a whole model's import: nothing measured yet
        parts.hardware.close()
        again = tunelab_command("run", f"resume={spec.out_dir}") if spec.resume else "the same command"
        print(f"\ntunelab: interrupted ({str(interrupt) or 'SIGINT'}) before the first measurement; nothing was "
              f"measured; run {again} again", file=sys.stderr)
        raise
    return parts, tasks, plan, store_writer, prior


def _write_run_files(job: Job) -> None:
    out_dir, hardware, writer = job.spec.out_dir, job.parts.hardware, job.store_writer
    run_folder.write_private(out_dir / "config.yaml", job.build.config_yaml())
    (out_dir / "records.jsonl").touch()  # exists even when reused records leave nothing to measure
    run_folder.save_identity(out_dir, dict(job.spec.choices), git_commit())
    rows = (lambda task: writer.table(task, hardware.space(task))) if writer else None
    save_tasks(out_dir, job.tasks, store_rows=rows)
    run_folder.mark_status(out_dir, "RUNNING")


def _tune_and_export(job: Job, method: str, callbacks, trial, pruning) -> tuple:
    """(outcomes, e2e result or None, (tuning seconds, the clock at the start)); the run's status
    is written and its MLflow run ended whatever happens."""
    parts, out_dir, plan = job.parts, job.spec.out_dir, job.plan
    status, e2e, pruned, outcomes = "FAILED", None, False, []
    try:
        with parts.hardware:
            parts.tracker.set_tags(run_folder.save_hardware(out_dir, parts.hardware.describe()))
            with logging_redirect_tqdm(loggers=[logging.getLogger()]):  # notices above the progress bar
                run = RunInfo(job.spec.seed, out_dir, method, plan.trials, plan.plan_size,  # type: ignore[arg-type]  # an int since with_plan_size
                              plan.deadline(), plan.early_stop, plan.min_trials_per_task or 0, plan.rounds_per_task, callbacks,
                              init_random=plan.init_random,
                              first_round_prior=prior_of(job.spec.prior, job.spec.seed, parts.hardware),
                              in_model_kernels=job.spec.chosen_in_model(len(job.tasks)))
                outcomes, clock = _tune(job, run)
            pruned = pruning is not None and pruning.pruned_at is not None
            e2e = _export(job, outcomes, pruned)
        status = "KILLED" if pruned else "FINISHED"
    except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM/SIGHUP (Terminated)
        status = "KILLED"
        again = ("re-running the sweep runs this trial again" if trial is not None
                 else f"continue with: {tunelab_command('run', f'resume={out_dir}')}")
        print(f"\ntunelab: interrupted ({str(interrupt) or 'SIGINT'}); every measurement so far is in "
              f"{out_dir / 'records.jsonl'}; {again}", file=sys.stderr)
        raise
    except (StoreError, ConfigError, NoDeviceLeft, OSError) as error:  # a full disk, a link where it writes, no device
        reason = job_folder.stop_reason(error, out_dir)
        if reason is None:
            raise
        print(f"\ntunelab: {reason}; every measurement written before it is in {out_dir / 'records.jsonl'}; "
              f"once that is mended continue with: {tunelab_command('run', f'resume={out_dir}')}", file=sys.stderr)
        raise JobFailed(reason) from None
    finally:
        run_folder.mark_status(out_dir, status)
        end_job_run(parts.tracker, status, out_dir, job.tasks, job.prior, pruned, trial)
    return outcomes, e2e, clock


def _tune(job: Job, run: RunInfo) -> tuple:
    """Tune, log the final metrics; returns (outcomes, (tuning seconds, the clock at the start)):
    with a simulated clock (replay) the stored seconds of the measurements and 0."""
    tasks, parts = job.tasks, job.parts

    def components_for(index: int) -> Components:  # each task learns its own model and search state
        if len(tasks) == 1:
            return parts
        return replace(parts, **job.build.task_parts())

    started, started_at = time.perf_counter(), time.time()
    if run.trials == 0:
        outcomes = schedule_without_measuring(tasks, components_for, job.spec.seed)
    else:
        outcomes = tune_tasks(tasks, components_for, run, job.build.scheduler(), job.prior)
    wall_s = time.perf_counter() - started  # tuning and the final re-measurements
    log_final_metrics(outcomes, parts, run.progress, wall_s, job.spec.out_dir, job.store_writer)
    if parts.hardware.simulated_clock:
        return outcomes, (run.progress.simulated_s, 0.0)
    return outcomes, (wall_s, started_at)


def _export(job: Job, outcomes, pruned: bool) -> dict | None:
    """The artifacts, a whole model's end (tuning/engine/artifacts.py end_whole_model) and summary.txt."""
    spec, parts, out_dir = job.spec, job.parts, job.spec.out_dir
    export_artifacts(parts, outcomes, out_dir, job.figure_title)
    e2e = end_whole_model(spec, parts, outcomes, out_dir, job.figure_title, pruned) if spec.model.whole else None
    (out_dir / "summary.txt").write_text(summary(outcomes) + (e2e_line(e2e) + "\n" if e2e else ""))
    parts.tracker.log_artifact(str(out_dir / "summary.txt"))
    return e2e
