"""What a tuning job leaves once tuning is over: each task's best schedule, the MetaSchedule database,
the convergence plot and the run's files as MLflow artifacts; for a whole model, its heaviest
kernels re-chosen inside the model (tuning/engine/model_choice.py), where its tuning time went
(tuning/engine/network_time.py) and its end-to-end timing (tuning/engine/whole_model.py)."""
from __future__ import annotations

from pathlib import Path

from tuning.core.outcome import best_so_far, chosen_bests, weighted_latency_ms
from tuning.engine.final import log_choice_metrics
from tuning.engine.loop import remeasure_deferred
from tuning.engine.model_choice import choose_in_model
from tuning.engine.network_time import export_network_time
from tuning.engine.run_files import CHOSEN_FILE, save_chosen
from tuning.engine.spec import JobSpec
from tuning.engine.whole_model import evaluate_end_to_end
from tuning.tracking.plot import convergence_png


def export_artifacts(parts, outcomes, out_dir: Path, title: str = "") -> None:
    """A finished tuning job's results into its folder and its MLflow run: best_schedules/,
    database/ (the MetaSchedule database of the best schedules), convergence.png (titled `title`),
    and the records, config, tasks and Hydra job log."""
    tracker = parts.tracker
    export_choice(parts, outcomes, out_dir)
    tracker.log_artifact(_convergence(outcomes, out_dir, title))
    for name in ("records.jsonl", "config.yaml", "tasks.json"):
        tracker.log_artifact(str(out_dir / name))
    for log in out_dir.glob("*.log"):  # Hydra's job log
        tracker.log_artifact(str(log), "logs")


def export_choice(parts, outcomes, out_dir: Path) -> None:
    """What the run chose, into its folder and its MLflow run: best_schedules/, database/ (its choice
    ranked first) and best_configs.json; again after a choice changes (tuning/engine/model_choice.py)."""
    tracker, hardware = parts.tracker, parts.hardware
    for outcome in outcomes:
        if outcome.best_config is not None:
            for path in hardware.export(outcome.task, outcome.best_config, out_dir / "best_schedules"):
                tracker.log_artifact(path, "best_schedules")
    measured = [(o.task, o.records) for o in outcomes if o.best_config is not None and o.records]
    unmeasured = [(o.task, o.best_config, o.best_cost if o.predicted_cost is None else o.predicted_cost)
                  for o in outcomes if o.best_config is not None and not o.records]  # seconds: predicted, else timed
    exported = hardware.export_database(measured, out_dir / "database", unmeasured, chosen_bests(outcomes)) \
        if measured or unmeasured else []
    for path in exported:
        tracker.log_artifact(path, "database")
    save_chosen(out_dir, outcomes)
    tracker.log_artifact(str(out_dir / CHOSEN_FILE))


def end_whole_model(job: JobSpec, parts, outcomes, out_dir: Path, title: str = "", pruned: bool = False) -> dict | None:
    """A whole model's run end: its heaviest kernels re-chosen inside the model, where the tuning time
    went (tuning/engine/network_time.py: network_time.csv and .png, read from the final choice), then
    the model compiled with the database and timed end to end; the end-to-end result, None when
    e2e.enabled is false or the run was a pruned trial (neither re-chosen nor timed)."""
    timed = job.e2e.enabled and not pruned
    if timed:
        choose_in_model_and_export(job, parts, outcomes, out_dir)
    elif remeasure_deferred(outcomes, parts.evaluator, parts.hardware):
        export_choice(parts, outcomes, out_dir)
        log_choice_metrics(outcomes, parts.tracker, out_dir)
    export_network_time(outcomes, out_dir, parts.tracker, title)
    if not timed:
        return None
    return evaluate_end_to_end(job.e2e, job.model, job.seed, parts.hardware, parts.tracker, out_dir, outcomes)


def choose_in_model_and_export(job: JobSpec, parts, outcomes, out_dir: Path) -> None:
    """A whole model's run end: its heaviest kernels re-chosen inside the model (tuning/engine/model_choice.py),
    any the loop left to that choice and it did not take re-measured alone, then the database,
    best_schedules/, best_configs.json and the final metrics the choice decides written again when
    they were."""
    chosen = choose_in_model(job.e2e, job.model, job.seed, parts.hardware, outcomes, out_dir, parts.tracker)
    if remeasure_deferred(outcomes, parts.evaluator, parts.hardware) or chosen:
        export_choice(parts, outcomes, out_dir)
        log_choice_metrics(outcomes, parts.tracker, out_dir)


def _convergence(outcomes, out_dir: Path, title: str) -> str:
    """A single operator's best GFLOP/s so far; a model's estimated latency (sum of weight x best)."""
    if len(outcomes) == 1:
        return convergence_png({o.task.name: o.curve() for o in outcomes}, str(out_dir / "convergence.png"),
                               final=outcomes[0].best_gflops, title=title)
    return convergence_png({"sum of weight x best latency": best_so_far(outcomes, "latency_ms")},
                           str(out_dir / "convergence.png"),
                           ylabel="model latency estimate (ms)", final=weighted_latency_ms(outcomes), title=title)
