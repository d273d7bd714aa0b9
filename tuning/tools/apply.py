"""Apply a run's best schedules to its whole model and time it against the untuned build and torch.

    python -m tuning.tools.apply outputs/runs/2026-11-21/18-00-00-000000

does for a finished (or killed) run what the end of `run.py` does for a network
model: write the run's MetaSchedule database again from its records, each task's
best as the run chose it (best_configs.json: its finalists re-measured at its
end; for a run without that file, its fastest record) first, compile the model
with it, check the output against torch, time tuned / untuned /
torch eager with the run's thread count, print the per-task table and the
end-to-end line, write e2e.json and log `e2e/*` to the run's MLflow run. A run
that measured nothing (budget.trials=0, search=value) applies its database/ as written.
With `--in-model`, the run's heaviest kernels are first re-chosen by their time inside the model,
as a run's end does (tuning/engine/model_choice.py, the run's e2e.in_model_* settings): for a run from
before that step, or to choose again; best_configs.json and in_model.json are rewritten.

For a single operator (gemm, batch_matmul, conv2d) it exports the chosen best's
schedule to best_schedules/<task>.py again, compiles that TVMScript file as a user
would, checks its output (numpy's product for the matmuls, torch's conv2d for a
conv) and times it; exit status 1 when the answer is wrong. A run folder holding a link is refused
before any work (tuning/engine/run_folder.py `refuse_links`); nothing is written through one.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

from tuning.config.cli import new_parser
from tuning.core.outcome import TaskOutcome, chosen_bests, task_table
from tuning.core.records import RecordLog
from tuning.engine.final import log_choice_metrics
from tuning.engine.model_choice import choose_in_model
from tuning.engine.resume import prior_records
from tuning.engine.run_folder import load_config, on_run_folder
from tuning.engine.spec import JobSpec
from tuning.engine.validate import validate
from tuning.engine.whole_model import e2e_line, evaluate_end_to_end, is_whole_model
from tuning.tools.export import export_choice
from tuning.tools.sync import best_as_reported, load_chosen, tracker_of


def apply_run(run_dir: Path, stale_input: bool = False, in_model: bool = False) -> dict:
    """The run folder is untrusted input: its config is checked like run.py's before anything is built.
    `stale_input`: time the model back to back on one untouched input (e2e.fresh_input=false).
    `in_model`: re-choose the heaviest kernels inside the model first."""
    from hydra.utils import instantiate

    cfg = load_config(run_dir / "config.yaml", "run")
    if stale_input:
        cfg.e2e.fresh_input = False
    validate(cfg)
    records = RecordLog(run_dir / "records.jsonl").load()
    if not is_whole_model(cfg.model):
        return check_operator(cfg, run_dir, records)
    if cfg.budget.trials == 0:  # chosen without measuring (search=value): database/ holds the choices
        return apply_unmeasured(cfg, run_dir)
    with instantiate(cfg.hardware) as hardware:
        tasks = hardware.model_tasks(cfg.model, cfg.seed)
        prior = prior_records(cfg, tasks, run_dir, instantiate(cfg.tracking))  # its tuning.database, if any
        chosen, outcomes = load_chosen(run_dir), []
        for task in tasks:
            own = [r for r in records if r.workload_key == task.key]
            outcome = TaskOutcome(task, [*prior.get(task.key, []), *own], reused=len(prior.get(task.key, [])))
            best_as_reported(outcome, chosen, run_dir)
            outcome.stopped_because = "as the run chose" if task.name in chosen else "from records"
            outcomes.append(outcome)
        missing = [o.task.name for o in outcomes if o.best_config is None]
        if missing:
            raise SystemExit(f"tunelab: no valid record for {len(missing)} task(s) of {run_dir}: {', '.join(missing)}")
        hardware.export_database([(o.task, o.records) for o in outcomes], run_dir / "database",
                                 chosen=chosen_bests(outcomes))
        e2e = end_to_end(cfg, hardware, run_dir, outcomes, in_model)
    print(task_table(outcomes))
    print(e2e_line(e2e))
    return e2e


def apply_unmeasured(cfg, run_dir: Path) -> dict:
    """A budget.trials=0 run measured nothing to export from: its database/ is what it applied."""
    from hydra.utils import instantiate

    if not (run_dir / "database" / "database_tuning_record.json").is_file():
        raise SystemExit(f"tunelab: {run_dir} measured nothing (budget.trials=0) and has no database/ to apply")
    with instantiate(cfg.hardware) as hardware:
        e2e = end_to_end(cfg, hardware, run_dir)
    print(e2e_line(e2e))
    return e2e


def end_to_end(cfg, hardware, run_dir: Path, outcomes=None, in_model: bool = False) -> dict:
    """The model compiled with run_dir/database, timed, logged to the run's MLflow run; with
    `in_model`, its heaviest kernels re-chosen inside the model first and the database,
    best_schedules/ and best_configs.json written again with that choice (export_choice)."""
    tracker = tracker_of(cfg, run_dir)
    try:
        job = JobSpec.from_cfg(cfg, run_dir)  # e2e.*, model.*, seed
        if in_model and outcomes and choose_in_model(job.e2e, job.model, job.seed, hardware, outcomes, run_dir,
                                                     tracker):
            export_choice(SimpleNamespace(tracker=tracker, hardware=hardware), outcomes, run_dir)
            log_choice_metrics(outcomes, tracker, run_dir)
        return evaluate_end_to_end(job.e2e, job.model, job.seed, hardware, tracker, run_dir, outcomes)
    finally:
        tracker.end("FINISHED")


def check_operator(cfg, run_dir: Path, records) -> dict:
    """A single operator's best schedule, exported, compiled from its file, checked and timed."""
    from hydra.utils import instantiate

    from tuning.core.task import build_tasks

    [task] = build_tasks(cfg.model)
    outcome = TaskOutcome(task, [r for r in records if r.workload_key == task.key])
    best_as_reported(outcome, load_chosen(run_dir), run_dir)
    if outcome.best_config is None:
        raise SystemExit(f"tunelab: no valid record of {task.name} in {run_dir}")
    with instantiate(cfg.hardware) as hardware:
        [script] = hardware.export(task, outcome.best_config, run_dir / "best_schedules")
        checked = hardware.check_export(task, script)
    gflops = task.flops / checked["seconds"] / 1e9
    print(f"[{task.name}] {script}: compiled; output {'matches' if checked['correct'] else 'DIFFERS FROM'} the "
          f"reference (max |error| {checked['max_abs_error']:.2e} of values up to {checked['reference_max']:.3g}); "
          f"{checked['seconds'] * 1e6:.1f} us, {gflops:.2f} GFLOP/s (median of 10)")
    if not checked["correct"]:
        raise SystemExit(1)
    return checked


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = new_parser("python -m tuning.tools.apply", __doc__.split("\n\n")[0], prog)
    parser.add_argument("run", type=Path, help="a run folder (outputs/runs/<date>/<time>)")
    parser.add_argument("--stale-input", action="store_true",
                        help="time the whole model back to back on one untouched input (e2e.fresh_input=false), "
                             "not with its input written before each call")
    parser.add_argument("--in-model", action="store_true",
                        help="first re-choose the heaviest kernels by their time inside the model (the run's "
                             "e2e.in_model_* settings), rewriting best_configs.json, as a run's end does")
    return parser


def main(argv=None, prog: str | None = None) -> None:
    args = build_parser(prog).parse_args(argv)
    on_run_folder(args.run, lambda run_dir: apply_run(run_dir, args.stale_input, args.in_model))


if __name__ == "__main__":
    main()
