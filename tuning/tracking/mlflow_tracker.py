"""MLflow tracker: one run per job, one parent run per multirun, batched metrics.

Talks to the store through its own `MlflowClient`, never through mlflow's
global active-run state, so several trackers can live in one process.

The store is a view of the run folder, never a reason to lose a run: every call
to it is retried with backoff for up to `retry_s` seconds (a locked sqlite file,
a restarting server); after that the tracker goes `offline` for the rest of the
job, says so once, and the run finishes with everything on disk: the metrics the
store did not take go to the run folder's spool (`spool_to`), from which
`python -m tuning.tools.sync <run dir>` replays them when it rebuilds the MLflow run.

What the retries cannot mend is refused before any work instead (`check`, called by the config
validation): a tracking URI MLflow keeps no runs in, an experiment name it would refuse.

A multirun's parent run is opened by the launching process (`open_parent`, from the Hydra callback
tuning.sweep.multirun.SweepParent), which hands its id to the jobs in PARENT_RUN_ENV; a job attaches to it
by that id, or, where a launcher does not carry the environment, finds it by its MULTIRUN_TAG (the
sweep's folder, the `parent` key). Nothing about the parent is kept in the sweep's folder. The only
lock file is a sqlite store's (beside the database, `<db>.lock`): a one-host guard that serialises
creating the schema, the experiment and a parent run; a server or a PostgreSQL store needs none.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import re
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from tuning.config.cli import tunelab_command
from tuning.config.naming import sweep_name
from tuning.config.tracking_uri import (  # noqa: F401
    DATABASE_SCHEMES,
    SERVER_SCHEMES,
    SQLITE_HINT,
    SQLITE_MAGIC,
    sqlite_path,
    uri_problems,
)
from tuning.config.untrusted import without_secrets
from tuning.tracking.base import Tracker
from tuning.tracking.empty_store import seed

# MLflow's limits (mlflow.utils.validation): longer values are rejected, not cut.
MAX_KEY_CHARS = 250
MAX_EXPERIMENT_CHARS = 500
MAX_PARAM_CHARS = 6000
MAX_TAG_CHARS = 8000
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000

# MLflow 3's UI picks an experiment's page from this tag; without it a new experiment opens in the
# GenAI view (traces, judges, prompts) instead of the runs table and metric charts
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}

# MLflow 3's UI opens in its GenAI view unless a link asks for the model-training one (runs, metric charts)
MODEL_TRAINING_VIEW = "workflowType=machine_learning"
LOCAL_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves a database store by default

# "Creating initial MLflow database tables...", alembic's migrations, "Started monitoring system metrics"
QUIET_LOGGERS = ("mlflow.store.db.utils", "alembic", "mlflow.system_metrics")

# the stores MLflow's server keeps runs in (mlflow.store.db.db_types), as URI schemes; a
# `+driver` suffix (postgresql+psycopg2://) names the SQLAlchemy driver
PARENT_RUN_ENV = "TUNELAB_MLFLOW_PARENT_RUN_ID"  # set by the launching process for its jobs
MULTIRUN_TAG = "tunelab.multirun"  # on a parent run: its multirun key (the absolute sweep folder)


class MlflowTracker(Tracker):
    """Track to MLflow.

    uri: `sqlite:////abs/outputs/mlflow.db` (embedded store, no server; its
        parent folder is created, artifacts go to `mlartifacts/` beside it)
        or another database MLflow's server keeps runs in (postgresql://, mysql://,
        mssql://, with its driver installed), or a server (http://host:5000).
        Checked before any work (`uri_problems`): a folder or `file:` URI (MLflow 3's
        file store, in maintenance mode) is refused, as is a sqlite path that is a
        folder or a file that is not a sqlite database.
    experiment: experiment name, created if missing; 1 to 500 characters (MLflow's
        limit), no control characters.
    flush_every: buffered metrics that trigger a write (one sqlite
        log_metric costs ~8 ms; a batch of 1000 costs about the same);
        the loop also flushes after every round.
    retry_s: how long (wall clock, from the call) a failing call to the store
        is retried, with backoff 0.5, 1, 2, ... s, before the tracker goes
        offline. MLflow itself waits up to 20 s on a locked sqlite file.
    system_metrics_s: MLflow's system metrics (system/cpu_utilization_percentage,
        memory, disk, network) sampled every this many seconds while the run is
        open, by MLflow's own monitor thread; 0 turns them off. CPU contention is
        the first suspect when a reading looks wrong.
    """
    ranges = {"flush_every": (1, None), "retry_s": (0, 3600), "system_metrics_s": (0, 3600)}

    @classmethod
    def check(cls, params: dict, group: str) -> list[str]:
        return (uri_problems(f"{group}.uri", params.get("uri"))
                + experiment_problems(f"{group}.experiment", params.get("experiment")))

    def __init__(self, uri: str, experiment: str, flush_every: int = 200, retry_s: float = 30.0,
                 system_metrics_s: float = 10.0):
        self.uri = uri
        self.experiment = experiment
        self.flush_every = flush_every
        self.retry_s = retry_s
        self.system_metrics_s = system_metrics_s
        self._monitor = None
        self.offline: str | None = None
        self._spool_path: Path | None = None
        self._client = None
        self._experiment_id: str | None = None
        self._run_id: str | None = None
        self._parent_run_id: str | None = None
        self._active = False
        self._buffer: list = []

    # -- lifecycle ---------------------------------------------------------

    def start(self, run_name, params, tags, parent=None, resume_run_id=None) -> str:
        if self._active:
            raise RuntimeError(f"run {self._run_id} is still open; end() it first")
        run_id = self._call("start the run", self._start, run_name, params, tags, parent, resume_run_id)
        return run_id or ""

    def _start(self, run_name, params, tags, parent, resume_run_id) -> str:
        self._connect()
        tags = {str(k): v for k, v in tags.items()}
        if parent is not None:
            self._parent_run_id = self._parent(parent)
            tags["mlflow.parentRunId"] = self._parent_run_id
            self._client.update_run(self._parent_run_id, status="RUNNING")

        run = self._existing_run(resume_run_id) if resume_run_id else None
        reopened = run is not None
        if reopened:  # renamed: a resume with a larger budget is a run of that budget
            self._run_id = run.info.run_id
            self._client.update_run(self._run_id, status="RUNNING", name=run_name)
            already_logged = set(run.data.params)
        else:
            run = self._client.create_run(self._experiment_id, run_name=run_name,
                                          tags={_key(k): _cut(v, MAX_TAG_CHARS) for k, v in tags.items()})
            self._run_id = run.info.run_id
            already_logged = set()
        self._active = True
        if reopened:
            self.set_tags(tags)
        self._log_params(params, skip=already_logged)
        return self._run_id

    def monitor_system(self) -> None:
        if not self.system_metrics_s or not self._active or self._monitor is not None:
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        try:  # a view of the host, never a reason to fail the job
            self._monitor = SystemMetricsMonitor(self._run_id, sampling_interval=self.system_metrics_s,
                                                 resume_logging=True, tracking_uri=self.uri)
            self._monitor.start()
        except Exception as error:  # noqa: BLE001 - psutil or the store may be missing pieces
            self._monitor = None
            print(f"tunelab: no system metrics ({type(error).__name__}: {error})", file=sys.stderr)

    def _existing_run(self, run_id: str):
        """The run to reopen, or None when this store does not have it (the folder's run was
        tracked elsewhere, or never reached the store): then a new run is created."""
        from mlflow.exceptions import MlflowException

        try:
            run = self._client.get_run(run_id)
        except MlflowException as error:
            if error.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            return None
        return run if run.info.experiment_id == self._experiment_id else None

    def unreachable(self) -> str | None:
        if not _is_server(self.uri):
            return None
        import requests

        try:
            requests.get(f"{self.uri.rstrip('/')}/health", timeout=5).raise_for_status()
        except requests.RequestException as error:
            return (f"tracking.uri: no MLflow server answers at {self.uri} ({type(error).__name__}); start it, "
                    "or track locally (tracking.uri=sqlite:///$PWD/outputs/mlflow.db), or tracking=none")
        return None

    def end(self, status: str = "FINISHED", parent_status: str = "FINISHED") -> None:
        if not self._active:
            return
        try:
            if self._monitor is not None:
                self._monitor.finish()
                self._monitor = None
            self.flush()
        finally:
            self._active = False
            self._call("end the run", self._terminate, status, parent_status)

    def _terminate(self, status: str, parent_status: str) -> None:
        self._client.set_terminated(self._run_id, status)
        if self._parent_run_id is not None:
            self._client.set_terminated(self._parent_run_id, parent_status)

    def open_parent(self, parent) -> str:
        """The launching process's side: the multirun's parent run, created (SCHEDULED until a job
        starts) unless a run into the same sweep folder made it before; its id, '' when offline."""
        return self._call("open the sweep's parent run", self._open_parent, parent) or ""

    def _open_parent(self, parent) -> str:
        self._connect()
        with self._store_lock():
            run_id = self._tagged_parent(parent)
            if run_id is None:
                run_id = self._create_parent(parent)
                self._client.update_run(run_id, status="SCHEDULED")
        return run_id

    def log_to_parent(self, parent, params, metrics, tags, artifacts) -> None:
        self._call("annotate the sweep's parent run", self._log_to_parent, parent, params, metrics, tags, artifacts)

    def _log_to_parent(self, parent, params, metrics, tags, artifacts) -> None:
        from mlflow.entities import Metric, Param, RunTag

        self._connect()
        run_id = self._parent(parent)
        now_ms = int(time.time() * 1000)
        self._client.log_batch(
            run_id, synchronous=True,
            params=[Param(_key(k), _cut(v, MAX_PARAM_CHARS)) for k, v in params.items()],
            metrics=[Metric(_key(k), float(v), now_ms, 0) for k, v in metrics.items() if math.isfinite(float(v))],
            tags=[RunTag(_key(k), _cut(v, MAX_TAG_CHARS)) for k, v in tags.items()])
        for path in artifacts:
            self._client.log_artifact(run_id, path)
        self._client.set_terminated(run_id, "FINISHED")

    def end_parent(self, parent, status) -> None:
        self._call("close the sweep's parent run", self._end_parent, parent, status)

    def children(self, parent_run_id: str) -> list[dict]:
        return self._call("read the sweep's runs", self._children, parent_run_id) or []

    def _children(self, parent_run_id: str) -> list[dict]:
        self._connect()
        query = f"tags.`mlflow.parentRunId` = '{parent_run_id}' and attributes.status = 'FINISHED'"
        runs = self._client.search_runs([self._experiment_id], query, max_results=50_000,
                                        order_by=["attributes.start_time ASC"])
        return [{"run_id": r.info.run_id, "name": r.info.run_name, "start": r.info.start_time,
                 "params": dict(r.data.params), "tags": dict(r.data.tags), "metrics": dict(r.data.metrics)}
                for r in runs]

    def _end_parent(self, parent, status) -> None:
        self._connect()
        self._client.set_terminated(self._parent(parent), status)

    # -- logging -----------------------------------------------------------

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        if not self._require_run():
            self._spool([Metric(_key(k), v, int(time.time() * 1000), int(step)) for k, v in _finite(metrics)])
            return
        now_ms = int(time.time() * 1000)
        self._buffer += [Metric(_key(name), value, now_ms, int(step)) for name, value in _finite(metrics)]
        if len(self._buffer) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self._active:
            return
        while self._buffer and not self.offline:
            chunk = self._buffer[:METRICS_PER_BATCH]
            self._call("log metrics", self._client.log_batch, self._run_id, metrics=chunk, synchronous=True)
            if not self.offline:
                del self._buffer[:len(chunk)]  # only after the write: what failed goes to the spool
        self._spool(self._buffer)
        self._buffer = []

    def spool_to(self, path: str) -> None:
        self._spool_path = Path(path)

    def _spool(self, metrics) -> None:
        """Metrics the store did not take, as JSON lines for `python -m tuning.tools.sync` to replay."""
        if not metrics or self._spool_path is None:
            return
        with self._spool_path.open("a") as handle:
            handle.writelines(json.dumps({"key": m.key, "value": m.value, "timestamp": m.timestamp, "step": m.step})
                              + "\n" for m in metrics)

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        if not self._require_run():
            return
        self._call(f"log {Path(path).name}", self._client.log_artifact, self._run_id, path, artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        if not self._require_run():
            return
        self._call(f"log {artifact_file}", self._client.log_text, self._run_id, text, artifact_file)

    def set_tags(self, tags: dict) -> None:
        from mlflow.entities import RunTag

        if not self._require_run():
            return
        run_tags = [RunTag(_key(k), _cut(v, MAX_TAG_CHARS)) for k, v in tags.items()]
        for i in range(0, len(run_tags), PARAMS_PER_BATCH):
            self._call("set tags", self._client.log_batch, self._run_id, tags=run_tags[i:i + PARAMS_PER_BATCH],
                       synchronous=True)

    def logged_steps(self, key: str) -> set[int]:
        if not self._require_run():
            return set()
        history = self._call(f"read {key}", self._client.get_metric_history, self._run_id, _key(key))
        return {m.step for m in history or ()}

    def _call(self, what: str, function, *args, **kwargs):
        """`function(*args, **kwargs)`, retried with backoff for up to retry_s seconds; then offline
        (None from here on). Any error counts: the store is a view, and the run must finish."""
        if self.offline:
            return None
        deadline, delay = time.monotonic() + self.retry_s, 0.5  # wall clock: a locked sqlite call blocks 20 s
        while True:
            try:
                return function(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - see the docstring
                left = deadline - time.monotonic()
                if left <= 0:
                    self._go_offline(what, error)
                    return None
                time.sleep(min(delay, left))
                delay *= 2

    def _go_offline(self, what: str, error: Exception) -> None:
        detail = " ".join(str(error).split())[:300]
        self.offline = f"could not {what} in {self.uri} after {self.retry_s:g} s: {type(error).__name__}: {detail}"
        print(f"tunelab: MLflow {self.offline}\n  the run goes on without MLflow; its folder keeps everything "
              f"({tunelab_command('sync')} <run dir> rebuilds the MLflow run)", file=sys.stderr)

    def download(self, run_id: str, artifact: str, dst_dir: str) -> str:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        try:
            return MlflowClient(tracking_uri=self.uri).download_artifacts(run_id, artifact, dst_dir)
        except MlflowException as error:
            raise FileNotFoundError(f"no artifact {artifact} in run {run_id} of {self.uri}: {error}") from error

    @property
    def location(self) -> str:
        experiment = f"experiment={self.experiment}"
        if self._experiment_id is not None:
            experiment += f" (id {self._experiment_id})"
        run = f"run={self._run_id}" if self._run_id else "run=(not started)"
        return f"{without_secrets(self.uri)}  {experiment}  {run}\n  browse: {self._browse(f'/#/experiments/{self._experiment_id}')}"

    def run_page(self, run_id: str) -> str:
        return self._browse(f"/#/experiments/{self._experiment_id}/runs/{run_id}")

    def _browse(self, route: str) -> str:
        """How to open a route of MLflow's UI in its model-training view."""
        address = ui_link(self.uri, route)
        serve = ui_command(self.uri)
        return f"{serve}, then open {address}" if serve else address

    # -- helpers -----------------------------------------------------------

    def _require_run(self) -> bool:
        """False when the store was given up on (the call is then a no-op); raises if start() was never called."""
        if self.offline:
            return False
        if not self._active:
            raise RuntimeError("no open run: call start() first")
        return True

    def _connect(self) -> None:
        from mlflow.tracking import MlflowClient

        for name in QUIET_LOGGERS:  # their INFO lines on every run say nothing a user acts on
            logging.getLogger(name).setLevel(logging.WARNING)
        # MLflow's own HTTP retries (7, backoff factor 2) take minutes per call; _call retries instead
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        db = sqlite_path(self.uri)
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
        with self._store_lock():  # concurrent jobs on a fresh sqlite file would race on schema creation
            if db is not None:
                seed(db)  # a new store: a copy of an empty one, not MLflow's migrations (empty_store.py)
            self._client = MlflowClient(tracking_uri=self.uri)
            self._experiment_id = get_or_create_experiment(self._client, self.experiment, db)

    def _store_lock(self):
        """A sqlite store's one-host guard (a lock file beside the database); other stores need none."""
        db = sqlite_path(self.uri)
        return _locked(db.with_name(db.name + ".lock")) if db is not None else nullcontext()

    def _parent(self, key: str) -> str:
        """The multirun's parent run: the one the launching process handed down, else the one tagged
        with `key`, else (a job started without the launching process's callback) a new one."""
        handed = os.environ.get(PARENT_RUN_ENV)
        if handed and self._is_parent_of(handed, key):
            return handed
        with self._store_lock():
            return self._tagged_parent(key) or self._create_parent(key)

    def _is_parent_of(self, run_id: str, key: str) -> bool:
        """Whether `run_id` is this store's live parent run of `key` (an id handed down by another
        sweep, or valid in another store, is not)."""
        run = self._existing_run(run_id)
        return (run is not None and run.info.lifecycle_stage == "active"
                and run.data.tags.get(MULTIRUN_TAG) == str(key))

    def _tagged_parent(self, key: str) -> str | None:
        """The newest live parent run of `key` in the experiment, found by its MULTIRUN_TAG."""
        quote = "'" if "'" not in str(key) else '"'
        found = self._client.search_runs([self._experiment_id], f"tags.`{MULTIRUN_TAG}` = {quote}{key}{quote}",
                                         max_results=1, order_by=["attributes.start_time DESC"])
        return found[0].info.run_id if found else None

    def _create_parent(self, key: str) -> str:
        run = self._client.create_run(self._experiment_id, run_name=sweep_name(Path(key)),
                                      tags={MULTIRUN_TAG: str(key)})
        return run.info.run_id

    def _log_params(self, params: dict, skip: set[str]) -> None:
        from mlflow.entities import Param

        cleaned = {_key(k): _cut(v, MAX_PARAM_CHARS) for k, v in params.items()}
        fresh = [Param(k, v) for k, v in cleaned.items() if k not in skip]
        for i in range(0, len(fresh), PARAMS_PER_BATCH):
            self._client.log_batch(self._run_id, params=fresh[i:i + PARAMS_PER_BATCH], synchronous=True)


def _finite(metrics: dict):
    for name, value in metrics.items():
        try:
            value = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(value):
            yield name, value


def get_or_create_experiment(client, name: str, db: Path | None) -> str:
    """The experiment's id, created (artifacts in `mlartifacts/` beside a sqlite store `db`) or
    restored as needed; safe when another process creates it at the same moment."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is None:
        # A fresh sqlite store would put artifacts under ./mlruns of whatever the CWD is.
        artifacts = (db.parent.resolve() / "mlartifacts").as_uri() if db is not None else None
        try:
            return client.create_experiment(name, artifact_location=artifacts, tags=EXPERIMENT_TAGS)
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            found = client.get_experiment_by_name(name)
    if found.lifecycle_stage == "deleted":
        client.restore_experiment(found.experiment_id)
    for key, value in EXPERIMENT_TAGS.items():  # an experiment made before the tag (a user's own choice stays)
        if key not in found.tags:
            client.set_experiment_tag(found.experiment_id, key, value)
    return found.experiment_id


def experiment_problems(key: str, name) -> list[str]:
    """MLflow's rules for an experiment name (non-empty, at most 500 characters), plus no control
    characters: the name is typed on command lines and shown in the UI."""
    if not isinstance(name, str) or not name.strip():
        return [f"{key}: expected a non-empty experiment name, got {name!r}"]
    if len(name) > MAX_EXPERIMENT_CHARS:
        return [f"{key}: at most {MAX_EXPERIMENT_CHARS} characters (MLflow's limit), got {len(name)}"]
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return [f"{key}: control characters (newlines, tabs, ...) are not allowed, got {name!r}"]
    return []


def ui_address(uri: str) -> str:
    """Where MLflow's UI for the store `uri` is: the server itself, or `mlflow ui` on this host."""
    return uri.rstrip("/") if _is_server(uri) else LOCAL_UI


def ui_link(uri: str, route: str) -> str:
    """A route of MLflow's UI for the store `uri` (e.g. /#/experiments/1), in its model-training view."""
    return f"{ui_address(uri)}{route}?{MODEL_TRAINING_VIEW}"


def ui_command(uri: str) -> str | None:
    """The command that serves a database store's UI, as it runs when printed (None for a server, which
    serves its own)."""
    return None if _is_server(uri) else tunelab_command("ui", "--tracking-uri", uri)


def _is_server(uri: str) -> bool:
    return uri.startswith(tuple(f"{scheme}://" for scheme in SERVER_SCHEMES))


_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")


def _key(name) -> str:
    """A key MLflow accepts: allowed characters only, at most 250 of them."""
    key = _BAD_KEY_CHARS.sub("_", str(name))
    if len(key) > MAX_KEY_CHARS:  # keep distinct long keys distinct
        digest = hashlib.sha1(key.encode()).hexdigest()[:8]
        key = f"{key[:MAX_KEY_CHARS - 9]}-{digest}"
    return key


def _cut(value, limit: int) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


@contextmanager
def _locked(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
