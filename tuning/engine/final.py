"""A tuning job's result, once every task's best is re-measured: its final metrics, logged at step =
the measurements of the run and saved to the run folder (tuning/tools/sync.py `save_final_metrics`):
the run's headline (tuning/config/naming.py: `best/final_gflops`, and `best/final_latency_us` or a whole
model's `best/final_latency_ms`), `tuning/*` totals and `run/*` seconds; a run of several tasks also
per task `task/<name>/final_latency_us`, `final_gflops` (and `best_true_us`, the store's median of the
best config, with a measurement store), which one task's run would only repeat. And `print_result`,
the summary printed when the job ends."""
from __future__ import annotations

import math

from tuning.config.naming import FINAL_GFLOPS, FINAL_LATENCY_MS, FINAL_LATENCY_US
from tuning.core.outcome import summary, weighted_latency_ms
from tuning.engine.loop import ROUND_TIMES
from tuning.engine.run_files import final_metrics, save_final_metrics
from tuning.engine.whole_model import e2e_line

TIME_KEYS = ROUND_TIMES


def log_final_metrics(outcomes, parts, progress, tuning_wall_s: float, out_dir, store_writer=None) -> None:
    """`progress`: the loop's Progress (measurements, simulated seconds); `tuning_wall_s`: the
    seconds of tuning and the final re-measurements."""
    several = len(outcomes) > 1
    per_task = {}
    for outcome in outcomes:
        if store_writer is not None and outcome.best_config is not None:
            outcome.true_cost = store_writer.truth(outcome.task, parts.hardware.space(outcome.task),
                                                   outcome.best_config)
        if several and math.isfinite(outcome.best_cost):
            metrics = task_metrics(outcome)
            parts.tracker.log_metrics(metrics, step=progress.measured)
            per_task.update(metrics)
    final = {**headline_metrics(outcomes), **run_totals(outcomes, parts, progress, tuning_wall_s)}
    parts.tracker.log_metrics(final, step=progress.measured)
    # the per-task lines too: each kernel's prediction, read back by `sync` and the in-model probe
    save_final_metrics(out_dir, progress.measured, {k: v for k, v in {**per_task, **final}.items() if math.isfinite(v)})


def log_choice_metrics(outcomes, tracker, out_dir) -> None:
    """After the run's end chose again inside the model (tuning/engine/model_choice.py): the metrics the
    choice decides (each task's final latency and GFLOP/s, the headline, the weighted latency)
    logged again at the run's final step and written over theirs in final_metrics.json."""
    step, saved = final_metrics(out_dir)
    chosen = {k: v for o in outcomes if len(outcomes) > 1 and math.isfinite(o.best_cost)
              for k, v in task_metrics(o).items()}
    chosen.update(headline_metrics(outcomes), **chosen_totals(outcomes))
    chosen = {k: v for k, v in chosen.items() if math.isfinite(v)}
    tracker.log_metrics(chosen, step=step)
    save_final_metrics(out_dir, step, {**saved, **chosen})


def run_totals(outcomes, parts, progress, tuning_wall_s: float) -> dict:
    """tuning/* counts and run/* seconds; tuning/final_gflops (the tasks' GFLOP/s summed, what a sweep's
    `final_gflops` objective is) only for several tasks: for one it is the headline again."""
    totals = {f"run/{key}": sum(o.times.get(key, 0.0) for o in outcomes) for key in TIME_KEYS}
    totals["run/tuning_wall_s"] = tuning_wall_s
    if parts.hardware.simulated_clock:
        totals["run/simulated_s"] = progress.simulated_s
    if len(outcomes) == 1 and outcomes[0].true_cost:
        totals["tuning/best_true_us"] = outcomes[0].true_cost * 1e6
    return {"tuning/measurements": progress.measured,
            "tuning/new_measurements": progress.measured - sum(o.reused for o in outcomes),
            **chosen_totals(outcomes), **totals}


def chosen_totals(outcomes) -> dict:
    """The tuning/* totals the chosen configs decide: the weighted latency and, for several tasks,
    tuning/final_gflops."""
    totals = {"tuning/weighted_latency_ms": weighted_latency_ms(outcomes)}
    if len(outcomes) > 1:
        totals["tuning/final_gflops"] = sum(o.best_gflops for o in outcomes)
    return totals


def task_metrics(outcome) -> dict:
    name = outcome.task.name
    return {f"task/{name}/final_latency_us": outcome.best_cost * 1e6, f"task/{name}/final_gflops": outcome.best_gflops,
            **({f"task/{name}/best_true_us": outcome.true_cost * 1e6} if outcome.true_cost else {})}


def headline_metrics(outcomes) -> dict:
    """The run's result, re-measured, first on its MLflow page: best/final_gflops (a whole model's: its
    FLOPs over its weighted kernel latency, not a sum of per-kernel rates) and the latency."""
    if len(outcomes) == 1:
        return {FINAL_GFLOPS: outcomes[0].best_gflops, FINAL_LATENCY_US: outcomes[0].best_cost * 1e6}
    latency_ms = weighted_latency_ms(outcomes)
    flops = sum(o.task.weight * o.task.flops for o in outcomes)
    return {FINAL_GFLOPS: flops / latency_ms / 1e6 if math.isfinite(latency_ms) and latency_ms > 0 else 0.0,
            FINAL_LATENCY_MS: latency_ms}


def print_result(outcomes, e2e: dict | None, tracker, out_dir, wall: str | None = None) -> None:
    """`wall`: the budget's last word (BudgetPlan.wall_line), under budget.minutes."""
    print(summary(outcomes), end="")
    if e2e:
        print(e2e_line(e2e))
    print(f"records: {out_dir / 'records.jsonl'}")
    print(f"MLflow: {tracker.location}")
    if wall:
        print(wall)
