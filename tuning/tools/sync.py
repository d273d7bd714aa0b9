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
and on a machine where the run folder was copied to it may not exist.
"""
from __future__ import annotations

import argparse
import hashlib
import re
from pathlib import Path

from tuning.config import ConfigError
from tuning.config.cli import add_tracking_uri, new_parser
from tuning.config.naming import run_name
from tuning.core.component import local_checks_only
from tuning.core.records import RecordLog
from tuning.engine.run_files import (  # noqa: F401 - also this tool's names from before they moved
    CHOSEN_FILE,
    COPY_TAG,
    CURVE_KEY,
    FINAL_METRICS_FILE,
    SPOOL_FILE,
    TASKS_FILE,
    SavedTask,
    _ints,
    _seconds,
    backfill,
    best_as_reported,
    final_metrics,
    history,
    load_chosen,
    load_tasks,
    replay_round_times,
    replay_spool,
    run_files,
    save_chosen,
    save_final_metrics,
    save_tasks,
    tracker_of,
)
from tuning.engine.run_folder import claim, load_config, on_run_folder, read_status, release


def sync(out_dir: Path, tracking_uri: str | None = None) -> str:
    """Rebuild the run's MLflow run; returns a one-line account."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from tuning.engine.resume import prior_records
    from tuning.engine.run_folder import saved_choices, saved_commit, saved_hardware
    from tuning.engine.validate import validate
    from tuning.tracking.base import run_params

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

    from tuning.config.tracking_uri import sqlite_path

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
