"""Rebuild a run's MLflow run from its folder: records.jsonl is the truth, MLflow a view of it.

    python -m tuning.tools.sync outputs/runs/2026-11-23/10-00-00-000000 [--tracking-uri URI]

after a store outage, a kill -9, or to copy a run into another store. It reopens the run named by
the folder's `mlflow_run_id` (or creates one, with the saved config as params and the saved group
choices as tags), replays the metrics the tracker spooled while the store was out, logs every point
of the tuning curve the run still lacks (rebuilt from the records: `history`), the final metrics and
the folder's files as artifacts, and sets the run's status from
the folder (a run whose process died is KILLED). A run that is still going is left alone: its
folder is locked. A resumed run calls `backfill` itself, so its curve has no hole either.

Syncing is idempotent, in the run's own store and in any other: a copy in another store is tagged
with what it is a copy of (`tunelab.copy_of`: the folder's run id, or its path's hash where the run
never reached its store) and found again by that tag, so a second sync completes the same copy;
curve points and final metrics already there are not logged again.

The saved config is checked as a run's is, except for what it names outside itself: a registered
model the run's search or cost model read (`local_checks_only`) is not needed to re-log its records,
and on a machine where a campaign's runs were restored it may not exist.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from tuning.callbacks import ROUND_TIMES_FILE, best_and_invalid, curve_points
from tuning.config import ConfigError
from tuning.core.component import local_checks_only
from tuning.naming import BEST_SO_FAR, run_name
from tuning.core.outcome import best_from_records, take_chosen
from tuning.core.records import RecordLog, _is_finite, _is_ints
from tuning.run_folder import claim, load_config, on_run_folder, read_status, release, write_private
from tuning.tools.cli_common import add_tracking_uri, new_parser

TASKS_FILE = "tasks.json"  # name, key, flops, weight of every task: the curve needs no TVM to rebuild
FINAL_METRICS_FILE = "final_metrics.json"
CHOSEN_FILE = "best_configs.json"  # each task's reported best: its config and the re-measured readings
SPOOL_FILE = "mlflow_pending.jsonl"  # metrics the store did not take during the run (the tracker's spool)
CURVE_KEY = BEST_SO_FAR  # a run logged under its earlier name (tuning/best_gflops) gets the whole curve again
COPY_TAG = "tunelab.copy_of"  # on a copy in another store: the source run (see the module docstring)


def history(tasks, prior: dict, records) -> list[tuple[int, dict]]:
    """(step, metrics) at every measurement, as the live run logged them (tuning/callbacks.py
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
    from tuning.core.task import build_tasks
    from tuning.whole_model import is_whole_model

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
    files = [(out_dir / name, None) for name in ("records.jsonl", "config.yaml", TASKS_FILE, CHOSEN_FILE,
                                                 "summary.txt", "convergence.png")]
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
    the model, tuning/model_choice.py)."""
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
def sync(out_dir: Path, tracking_uri: str | None = None) -> str:
    """Rebuild the run's MLflow run; returns a one-line account."""
    from hydra.utils import instantiate

    from tuning.config import validate
    from tuning.resume import prior_records
    from tuning.run_folder import saved_choices, saved_commit, saved_hardware
    from tuning.tracking.base import run_params
    from omegaconf import OmegaConf

    cfg = load_config(out_dir / "config.yaml", "run", replaced=("tracking.uri",) if tracking_uri else (),
                      how="name its MLflow store with --tracking-uri")
    own_store = not tracking_uri or tracking_uri == cfg.tracking.get("uri")
    if tracking_uri:
        cfg.tracking.uri = tracking_uri
    with local_checks_only():
        validate(cfg)
    claim(out_dir, resuming=True, key="run")  # refused while the run's own process holds the folder
    try:
        tasks = load_tasks(out_dir, cfg)
        tracker = instantiate(cfg.tracking)
        problem = tracker.unreachable()
        if problem:
            raise ConfigError(problem)
        records = RecordLog(out_dir / "records.jsonl").load()
        prior = prior_records(cfg, tasks, out_dir, tracker)
        choices = saved_choices(out_dir)
        tags = {"model": cfg.model.name, "seed": str(cfg.seed), "tunelab.synced": "true",
                "experiment": choices.get("experiment") or "none", **saved_hardware(out_dir),
                **{f"choice.{group}": name for group, name in choices.items()},
                **({"mlflow.source.git.commit": commit} if (commit := saved_commit(out_dir)) else {})}
        params, path_tags = run_params(OmegaConf.to_container(cfg, resolve=True))
        run_id = _open(tracker, out_dir, cfg, params, {**tags, **path_tags}, choices,
                       own_store)
        replayed = replay_spool(tracker, out_dir)  # before the curve, which only fills steps still missing
        added = backfill(tracker, history(tasks, prior, records))
        times = replay_round_times(tracker, out_dir)
        step, metrics = final_metrics(out_dir)
        metrics = {k: v for k, v in metrics.items() if k not in replayed and step not in tracker.logged_steps(k)}
        if metrics:
            tracker.log_metrics(metrics, step=step)
        for path, folder in run_files(out_dir):
            tracker.log_artifact(str(path), folder)
        status = read_status(out_dir)
        status = "KILLED" if status in (None, "RUNNING") else status  # its process is gone: we hold the lock
        tracker.end(status)
        if tracker.offline:
            raise ConfigError(f"tracking.uri: {tracker.offline}")
        return (f"{out_dir}: MLflow run {run_id} in {cfg.tracking.uri}: {len(replayed)} spooled metric(s) "
                f"replayed, {added} curve point(s) added, {times} round time(s) added, {len(records)} records, status {status}")
    finally:
        release(out_dir)


def _open(tracker, out_dir: Path, cfg, params: dict, tags: dict, choices: dict, own_store: bool) -> str:
    """Reopen the folder's MLflow run (a new one where the store lacks it); the folder keeps naming
    the run in its own store, not in a store it was copied to."""
    run_id_file = out_dir / "mlflow_run_id"
    known = run_id_file.read_text().strip() if run_id_file.exists() else None
    name = run_name(cfg, choices)
    if not own_store:
        is_id = known is not None and re.fullmatch(r"[0-9a-f]{32}", known)  # the file is untrusted: it goes in a filter
        source = known if is_id else hashlib.sha256(str(out_dir).encode()).hexdigest()[:32]
        tags = {**tags, COPY_TAG: source, "tunelab.copied_from": str(out_dir)}
        known = _earlier_copy(tracker, source)
    run_id = tracker.start(name, params, tags, resume_run_id=known)
    if not run_id:
        raise ConfigError(f"tracking.uri: {tracker.offline}")
    if own_store:
        run_id_file.write_text(run_id)
    return run_id


def _earlier_copy(tracker, source: str) -> str | None:
    """The run an earlier sync copied `source` into, in the tracker's store and experiment."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from tuning.tracking.mlflow_tracker import sqlite_path

    uri = getattr(tracker, "uri", None)
    db = sqlite_path(uri)
    if uri is None or (db is not None and not db.exists()):
        return None  # a store not made yet holds no copy (and is made by the tracker, under its lock)
    try:
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(tracker.experiment)
        if experiment is None:
            return None
        found = client.search_runs([experiment.experiment_id], f"tags.`{COPY_TAG}` = '{source}'", max_results=1)
    except MlflowException as error:
        raise ConfigError(f"tracking.uri: cannot look for an earlier copy of this run in {uri}: {error}") from None
    return found[0].info.run_id if found else None


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = new_parser("python -m tuning.tools.sync", __doc__.split("\n\n")[0], prog)
    parser.add_argument("run", type=Path, help="a run folder (outputs/runs/<date>/<time>)")
    add_tracking_uri(parser, help="the MLflow store the run is written to (another store than its own gets a copy)",
                     default_text="the run's own tracking.uri (its config.yaml)")
    return parser


def main(argv=None, prog: str | None = None) -> None:
    args = build_parser(prog).parse_args(argv)
    print(on_run_folder(args.run, lambda out_dir: sync(out_dir, args.tracking_uri), claim_folder=False))


if __name__ == "__main__":
    main()
