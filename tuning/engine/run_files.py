"""A run's own files, read and written by the job and by the tools that rebuild it: tasks.json (each
task's name, key, FLOPs and weight: the curve needs no TVM to rebuild), final_metrics.json,
best_configs.json (each task's reported best), the tracker's spool of metrics its store did not take,
round_times.jsonl, and the tuning curve's points rebuilt from the records (`history`, `backfill`)."""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from tuning.config import ConfigError
from tuning.config.files import write_private
from tuning.config.naming import BEST_SO_FAR
from tuning.core.outcome import best_from_records, take_chosen
from tuning.core.records import _is_finite, _is_ints
from tuning.engine.callbacks import ROUND_TIMES_FILE, best_and_invalid, curve_points
from tuning.engine.network_time import FIGURE_FILE, TABLE_FILE

TASKS_FILE = "tasks.json"  # name, key, flops, weight of every task: the curve needs no TVM to rebuild
FINAL_METRICS_FILE = "final_metrics.json"
CHOSEN_FILE = "best_configs.json"  # each task's reported best: its config and the re-measured readings
SPOOL_FILE = "mlflow_pending.jsonl"  # metrics the store did not take during the run (the tracker's spool)
CURVE_KEY = BEST_SO_FAR  # a run logged under its earlier name (tuning/best_gflops) gets the whole curve again
COPY_TAG = "tunelab.copy_of"  # on a copy in another store: the source run (see the module docstring)


def history(tasks, prior: dict, records) -> list[tuple[int, dict]]:
    """(step, metrics) at every measurement, as the live run logged them (tuning/engine/callbacks.py
    StepMetrics: the measured task's best-so-far and invalid count, at step = measurements of the
    whole run)."""
    by_key = {task.key: task for task in tasks}
    state = {key: best_and_invalid(by_key[key], rows) for key, rows in prior.items() if key in by_key}
    step = sum(len(rows) for key, rows in prior.items() if key in by_key)
    points = []
    for record in (r for r in records if r.workload_key in by_key):
        task = by_key[record.workload_key]
        [point] = curve_points(task, [record], step, *state.get(task.key, (0.0, 0)), per_task=len(by_key) > 1)
        state[task.key] = (point[1][BEST_SO_FAR], point[1]["tuning/invalid"])
        points.append(point)
        step += 1
    return points


def replay_spool(tracker, out_dir: Path) -> set[str]:
    """Log the metrics the tracker spooled while the store was out; the file is then renamed, so a
    second sync does not log them twice. Lines that are not metric points are skipped. Returns the
    metric names replayed."""
    path = out_dir / SPOOL_FILE
    if not path.exists():
        return set()
    by_step = _points_by_step(path)
    for step, metrics in sorted(by_step.items()):
        tracker.log_metrics(metrics, step=step)
    tracker.flush()
    if not tracker.offline:
        path.rename(path.with_suffix(".synced"))
    return {key for metrics in by_step.values() for key in metrics}


def replay_round_times(tracker, out_dir: Path) -> int:
    """The folder's per-round time/* points (round_times.jsonl, written by the live run) that the
    MLflow run lacks, logged at their steps: a run re-logged elsewhere keeps its search and model
    seconds per round. Lines that are not time/* points are skipped. Returns how many were logged."""
    path = out_dir / ROUND_TIMES_FILE
    if not path.is_file():
        return 0
    by_step = _points_by_step(path, "time/")
    have = {key: tracker.logged_steps(key) for key in {k for metrics in by_step.values() for k in metrics}}
    logged = 0
    for step, metrics in sorted(by_step.items()):
        missing = {k: v for k, v in metrics.items() if step not in have[k]}
        if missing:
            tracker.log_metrics(missing, step=step)
            logged += len(missing)
    tracker.flush()
    return logged


def _points_by_step(path: Path, prefix: str = "") -> dict[int, dict]:
    """{step: {key: value}} of a file of metric points ({key, value, step} a line) whose key starts with
    `prefix`; lines that are not such points are skipped."""
    by_step: dict[int, dict] = {}
    for line in path.read_text(errors="replace").splitlines():
        point = _metric_point(line)
        if point is not None and point[0].startswith(prefix):
            by_step.setdefault(point[2], {})[point[0]] = point[1]
    return by_step


def _metric_point(line: str) -> tuple[str, float, int] | None:
    try:
        data = json.loads(line)
        key, value, step = str(data["key"]), float(data["value"]), data["step"]
    except (ValueError, TypeError, KeyError):
        return None
    return (key, value, step) if isinstance(step, int) and value == value and abs(value) != float("inf") else None


def backfill(tracker, points) -> int:
    """Log the points whose step the run's curve lacks; returns how many."""
    have = tracker.logged_steps(CURVE_KEY)
    missing = [(step, metrics) for step, metrics in points if step not in have]
    for step, metrics in missing:
        tracker.log_metrics(metrics, step=step)
    tracker.flush()
    return len(missing)


# ---- what the folder holds ----------------------------------------------------------------------
def save_tasks(out_dir: Path, tasks, store_rows=None) -> None:
    """tasks.json: each task's name, key, flops and weight; with a measurement store also where its
    rows are (`store`: the file's absolute path or the database's URL without its password,
    `store_key`: [hardware, task, space]), which is
    how `python -m tuning.tools.compare` scores the run by the store's truth."""
    rows = []
    for task in tasks:
        row = {"name": task.name, "key": task.key, "flops": task.flops, "weight": task.weight}
        if store_rows is not None:
            table = store_rows(task)
            row.update(store=table.store.address, store_key=list(table.key))
        rows.append(row)
    write_private(out_dir / TASKS_FILE, json.dumps(rows))  # it names the store


@dataclass(frozen=True)
class SavedTask:
    """What the curve needs of a task, as saved in tasks.json."""
    name: str
    key: str
    flops: float
    weight: int


def load_tasks(out_dir: Path, cfg) -> list:
    from tuning.core.task import build_tasks, is_whole_model

    path = out_dir / TASKS_FILE
    if not path.exists():
        if is_whole_model(cfg.model):
            raise ConfigError(f"run: {out_dir} has no {TASKS_FILE} (a whole-model run from before tuning.tools.sync)")
        return build_tasks(cfg.model)
    try:
        rows = json.loads(path.read_text())
        return [SavedTask(str(r["name"]), str(r["key"]), float(r["flops"]), int(r["weight"])) for r in rows]
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError) as error:
        raise ConfigError(f"run: {path} is not a tunelab task list ({type(error).__name__}: {error})") from None


def run_files(out_dir: Path) -> list[tuple[Path, str | None]]:
    """(file, artifact folder) of everything run.py logs as an artifact, where the folder has it."""
    files: list[tuple[Path, str | None]]
    files = [(out_dir / name, None) for name in ("records.jsonl", "config.yaml", TASKS_FILE, CHOSEN_FILE,
                                                 "summary.txt", "convergence.png", TABLE_FILE, FIGURE_FILE)]
    files += [(p, "best_schedules") for p in sorted((out_dir / "best_schedules").glob("*"))]
    files += [(p, "database") for p in sorted((out_dir / "database").glob("*"))]
    files += [(p, "logs") for p in sorted(out_dir.glob("*.log"))]
    return [(path, folder) for path, folder in files if path.is_file()]


def final_metrics(out_dir: Path) -> tuple[int, dict]:
    path = out_dir / FINAL_METRICS_FILE
    if not path.exists():
        return 0, {}
    try:
        data = json.loads(path.read_text())
        return int(data["step"]), {str(k): float(v) for k, v in data["metrics"].items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return 0, {}


def tracker_of(cfg, run_dir: Path):
    """The run's own MLflow run, resumed (a NoTracker for a run without one): what apply and
    export log to."""
    from hydra.utils import instantiate

    from tuning.tracking.base import NoTracker

    run_id_file = run_dir / "mlflow_run_id"
    if not run_id_file.exists():
        return NoTracker()
    tracker = instantiate(cfg.tracking)
    tracker.start(cfg.model.name, {}, {}, resume_run_id=run_id_file.read_text().strip())
    return tracker


def save_final_metrics(out_dir: Path, step: int, metrics: dict) -> None:
    (out_dir / FINAL_METRICS_FILE).write_text(json.dumps({"step": step, "metrics": metrics}))


def save_chosen(out_dir: Path, outcomes) -> None:
    """best_configs.json: each task's reported best, the config the run's end chose by re-measuring its
    finalists and those readings, so that apply, export and the in-model probe use the config the
    run reports rather than the records' fastest single reading ("in_model": chosen and read inside
    the model, tuning/engine/model_choice.py)."""
    rows = [{"task": o.task.name, "config": [int(v) for v in o.best_config], "costs": [float(c) for c in o.final_costs],
             **({"in_model": True} if o.chosen_in_model else {})}
            for o in outcomes if o.best_config is not None and o.final_costs]
    (out_dir / CHOSEN_FILE).write_text(json.dumps(rows))


def load_chosen(out_dir: Path) -> dict:
    """{task name: (config, re-measured seconds)} from best_configs.json, {} where a run has none (a run
    from before the file, or one killed before its end); ConfigError where the file is not one."""
    path = out_dir / CHOSEN_FILE
    if not path.exists():
        return {}
    try:
        rows = json.loads(path.read_text())
        chosen = {str(row["task"]): (_ints(row["config"]), _seconds(row["costs"])) for row in rows}
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as error:
        raise ConfigError(f"run: {path} is not a tunelab list of chosen configs ({type(error).__name__}: {error})") \
            from None
    return chosen


def best_as_reported(outcome, chosen: dict, run_dir: Path) -> None:
    """The outcome's result as its run reported it (`chosen`: load_chosen's), else its records' fastest."""
    best_from_records(outcome)
    if outcome.best_config is not None and outcome.task.name in chosen:
        try:
            take_chosen(outcome, *chosen[outcome.task.name])
        except ValueError as error:
            raise ConfigError(f"run: {run_dir / CHOSEN_FILE}: {error}") from None


def _ints(values) -> tuple:
    if not _is_ints(values):
        raise TypeError(f"config {values!r} is not a list of integers")
    return tuple(values)


def _seconds(costs) -> float:
    if not isinstance(costs, list) or not costs or not all(_is_finite(c) and c > 0 for c in costs):
        raise ValueError(f"costs {costs!r} are not positive finite seconds")
    return statistics.median(costs)


# ---- the command -----------------------------------------------------------------------------
