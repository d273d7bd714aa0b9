"""The tracker contract.

A Tracker records one tuning job: its parameters, its step metrics and its
artifacts. The loop drives it in this order:

    run_id = tracker.start(run_name, params, tags, parent=None, resume_run_id=None)
        Open the run and return its id ('' when nothing is tracked).
        `params` is a FLAT dict (key -> str/int/float/bool; see `flatten`).
        `tags` values are stringified. `parent` is a multirun key (e.g. the
        Hydra sweep dir): every job started with the same key becomes a
        child of one shared parent run, also across processes.
        `resume_run_id` reopens an earlier run instead of creating one (it
        takes `run_name`); params it already has are not logged again.
    tracker.log_metrics({"best/gflops_so_far": 12.3, ...}, step=measurements)
        Buffered; non-finite values are dropped. Keys may contain '/' (MLflow's
        UI groups charts by the text before the last one).
    tracker.log_artifact(path, artifact_path=None)   copy a local file into the run
    tracker.log_text(text, artifact_file)            write a text artifact
    tracker.set_tags(tags)
    tracker.flush()                                  write buffered metrics now (the loop: every round)
    tracker.end(status="FINISHED", parent_status="FINISHED")
                                                     flush, then close the run as FINISHED | FAILED |
                                                     KILLED (and a multirun's parent as parent_status)
    tracker.unreachable() -> str | None              before any work: why the store cannot be reached
    tracker.logged_steps(key) -> set[int]            the steps of a metric the run already has
    tracker.monitor_system()                         sample system metrics into the open run until end()
    tracker.spool_to(path)                           where metrics go that the store does not take
                                                     (JSON lines: key, value, timestamp, step)
    tracker.offline -> str | None                    why the store was given up on during the job (then
                                                     every call is a no-op; the run folder keeps all,
                                                     `python -m tuning.tools.sync` rebuilds the run from it)
    tracker.location                                 where to find the run, for humans
    tracker.run_page(run_id) -> str                  how to open a run of the tracker's experiment in
                                                     the store's UI, once connected ('' when nothing is
                                                     tracked)
    tracker.download(run_id, artifact, dst_dir)      fetch an artifact of any run in the store
                                                     (needs no open run); returns the local path
    tracker.log_to_parent(parent, params, metrics, tags, artifacts)
                                                     annotate the multirun's parent run (needs no
                                                     open run): a sweep's best params, its results
    tracker.end_parent(parent, status)               close the multirun's parent run (needs no open run):
                                                     KILLED when the sweep itself was interrupted
    tracker.open_parent(parent) -> str               the launching process, before any job: create the
                                                     multirun's parent run (or find an earlier run's into
                                                     the same key) and return its id for the jobs
    tracker.children(parent_run_id) -> list[dict]    the finished runs under a multirun's parent run, oldest
                                                     first (needs no open run): run_id, name, start, params,
                                                     tags, metrics; [] when nothing is tracked

A tracker never fails a tuning job once it has started: a store that stops answering is
retried, then given up on (`offline`). __init__ stores settings only: no I/O, no threads, no clients.
"""
from __future__ import annotations

import json
import re
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

from tuning.config.untrusted import without_password_parameters
from tuning.core.component import Component


class Tracker(Component):
    """Run lifecycle for one tuning job. __init__ stores settings only (no I/O)."""

    @abstractmethod
    def start(self, run_name: str, params: dict[str, Any], tags: dict[str, Any], parent: str | None = None,
              resume_run_id: str | None = None) -> str:
        """Open (or reopen) the run; returns its id."""

    @abstractmethod
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Buffered step metrics."""

    @abstractmethod
    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        """Copy a local file into the run."""

    @abstractmethod
    def log_text(self, text: str, artifact_file: str) -> None:
        """Write a text artifact."""

    @abstractmethod
    def set_tags(self, tags: dict[str, Any]) -> None:
        """Set the run's tags."""

    offline: str | None = None

    def flush(self) -> None:
        pass

    def unreachable(self) -> str | None:
        """Before any work: a message naming the key when the store cannot be reached, else None."""
        return None

    def logged_steps(self, key: str) -> set[int]:
        return set()

    def spool_to(self, path: str) -> None:
        pass

    def monitor_system(self) -> None:
        """Sample CPU, memory and disk into the open run until it ends (the tuning job calls this)."""

    @abstractmethod
    def end(self, status: str = "FINISHED", parent_status: str = "FINISHED") -> None:
        """Flush, then close the run (and set a multirun's parent run to parent_status)."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where to find the run, for humans."""

    def run_page(self, run_id: str) -> str:
        return ""

    def download(self, run_id: str, artifact: str, dst_dir: str) -> str:
        raise FileNotFoundError(f"{type(self).__name__} keeps no runs to download {artifact} from")

    @abstractmethod
    def log_to_parent(self, parent: str, params: dict[str, Any], metrics: dict[str, float], tags: dict[str, Any],
                      artifacts: list[str]) -> None:
        """Annotate the multirun's parent run."""

    def end_parent(self, parent: str, status: str) -> None:
        """Close the multirun's parent run with `status` (a sweep that was interrupted ends it KILLED)."""

    def open_parent(self, parent: str) -> str:
        """Before any job of a multirun: its parent run's id ('' when nothing is tracked)."""
        return ""

    def children(self, parent_run_id: str) -> list[dict[str, Any]]:
        """The finished runs under a multirun's parent run, oldest first ([] when nothing is tracked)."""
        return []


class NoTracker(Tracker):
    """Tracking disabled: every call is accepted and ignored."""

    def start(self, run_name: str, params: dict[str, Any], tags: dict[str, Any], parent: str | None = None,
              resume_run_id: str | None = None) -> str:
        return ""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        pass

    def log_text(self, text: str, artifact_file: str) -> None:
        pass

    def set_tags(self, tags: dict[str, Any]) -> None:
        pass

    def end(self, status: str = "FINISHED", parent_status: str = "FINISHED") -> None:
        pass

    def log_to_parent(self, parent: str, params: dict[str, Any], metrics: dict[str, float], tags: dict[str, Any],
                      artifacts: list[str]) -> None:
        pass

    @property
    def location(self) -> str:
        return "tracking disabled"


# where a run's files are: tags (tunelab.<key>), not params, so MLflow's compare view ("diff only",
# parallel coordinates) shows what differs in the method, not where each run wrote
PATH_KEYS = ("output_dir", "resume", "tracking.uri", "tuning.database", "hardware.store", "model.path",
             "storage.mlflow_uri", "storage.optuna_uri", "storage.stores_dir")


def run_params(config: Mapping[str, Any]) -> tuple[dict[str, str | int | float | bool], dict[str, str]]:
    """A run's resolved config as (params, path tags): every key flattened, the path-valued ones
    (PATH_KEYS; "null" ones dropped) as `tunelab.<key>` tags."""
    flat = flatten(config)
    tags = {f"tunelab.{key}": str(flat[key]) for key in PATH_KEYS if flat.get(key, "null") != "null"}
    return {k: v for k, v in flat.items() if k not in PATH_KEYS}, tags


def option_name(choice: str | None, target: str, aliases: Mapping[str, str] | None = None) -> str:
    """Which option a config group used: its Hydra choice (the `choice.<group>` tag), else the last
    part of its `_target_` class path, renamed through `aliases` (class name -> option name)."""
    if choice:
        return choice
    name = str(target).rsplit(".", 1)[-1]
    return (aliases or {}).get(name, name)



URL_PASSWORD = re.compile(r"(://[^:/@\s]+):[^@/\s]+@")  # scheme://user:password@host


def flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, str | int | float | bool]:
    """Nested dicts -> {'a.b.c': value}; lists -> JSON strings; None -> 'null'."""
    flat: dict[str, str | int | float | bool] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, prefix=f"{name}."))
        elif isinstance(value, Mapping):
            flat[name] = "{}"  # keep the key visible: an empty group is a choice too
        elif isinstance(value, (list, tuple)):
            flat[name] = json.dumps(list(value), default=str)
        elif value is None:
            flat[name] = "null"
        elif isinstance(value, str):
            flat[name] = URL_PASSWORD.sub(r"\1:***@", without_password_parameters(value))  # a database URL's password is no param
        elif isinstance(value, (int, float, bool)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat
