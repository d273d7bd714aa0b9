"""A tuning job's MLflow run: started with its name, params (the config's, and `method`) and tags (a
resumed run continues its own run under its new name, its curve rebuilt from the records), and ended
with the job's status (an Optuna trial's `optuna.state` tag beside it; a stopped run's last round
backfilled from the records)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from omegaconf import OmegaConf

from tuning.config.cli import tunelab_command
from tuning.config.untrusted import is_server, without_secrets
from tuning.core.records import RecordError, RecordLog
from tuning.engine.run_files import backfill, history
from tuning.engine.trial import trial_tags
from tuning.tracking.base import run_params
from tuning.tracking.tags import job_run_name, method_label, run_tags

RUN_ID_FILE = "mlflow_run_id"
OPTUNA_STATES = {"FINISHED": "COMPLETE", "KILLED": "PRUNED"}  # any other status: FAIL


@dataclass(frozen=True)
class RunIdentity:
    """What a job's MLflow run is started with: its name, params and tags, and the sweep's parent run."""
    name: str
    params: Mapping[str, Any]
    tags: Mapping[str, Any]
    parent: str | None = None  # a multirun's folder: its MLflow parent run

    @classmethod
    def of(cls, cfg, hydra: dict, trial=None) -> RunIdentity:
        """From the job's config with its budget resolved (BudgetPlan.applied), once: the component-building
        step's (tuning/engine/run.py); `trial`: the Optuna trial the job is, else None."""
        params, path_tags = run_params(OmegaConf.to_container(cfg, resolve=True))
        params["method"] = method_label(hydra, cfg)  # beside the class paths of search._target_ and the rest
        tags = {**run_tags(hydra, cfg), **path_tags, **(trial_tags(trial) if trial is not None else {})}
        return cls(job_run_name(hydra, cfg, trial), params, tags, hydra.get("sweep_dir"))


def start_job_run(tracker, identity: RunIdentity, out_dir: Path, tasks, prior) -> None:
    """`prior`: the records reused from tuning.database, by workload key."""
    run_id_file = out_dir / RUN_ID_FILE
    resumed_id = run_id_file.read_text().strip() if run_id_file.exists() else None
    run_id = tracker.start(identity.name, dict(identity.params), dict(identity.tags), parent=identity.parent,
                           resume_run_id=resumed_id)
    if run_id:
        run_id_file.write_text(run_id)
        tracker.monitor_system()  # the tuning job's CPU and memory, not those of apply/export/sync
    if resumed_id and run_id:  # a killed run's curve may lack its last rounds: rebuilt from the records
        _backfill(tracker, tasks, prior, out_dir)


def end_job_run(tracker, status: str, out_dir: Path, tasks, prior, pruned: bool = False, trial=None) -> None:
    """`status`: FINISHED, KILLED (interrupted, or `pruned`) or FAILED."""
    if status != "FINISHED":  # the round it stopped in has no curve point yet
        _backfill_quietly(tracker, tasks, prior, out_dir)
    if trial is not None:
        tracker.set_tags({"optuna.state": OPTUNA_STATES.get(status, "FAIL")})
    interrupted = status == "KILLED" and not pruned
    tracker.end(status, parent_status="KILLED" if interrupted else "FINISHED")
    if tracker.offline:
        print(f"tunelab: MLflow is missing part of this run ({tracker.offline}); once the store is "
              f"back: {sync_command(tracker, out_dir)}", file=sys.stderr)


def sync_command(tracker, out_dir: Path) -> str:
    """The command that fills the run's MLflow run from its folder; a server store is named on it,
    since sync sends nothing to a server that only the folder names."""
    uri = getattr(tracker, "uri", None)
    named = ["--tracking-uri", without_secrets(uri)] if isinstance(uri, str) and is_server(uri) else []
    return tunelab_command("sync", str(out_dir), *named)


def _backfill_quietly(tracker, tasks, prior, out_dir: Path) -> None:
    """The stopped round's curve point, unless the records cannot be read (a full disk, a bad line):
    then the error that stopped the run is the one to report, and resume or tuning.tools.sync fill it later."""
    try:
        _backfill(tracker, tasks, prior, out_dir)
    except (OSError, RecordError):
        pass


def _backfill(tracker, tasks, prior, out_dir: Path) -> None:
    """The curve points MLflow lacks, from the run folder's records."""
    backfill(tracker, history(tasks, prior, RecordLog(out_dir / "records.jsonl").load()))
