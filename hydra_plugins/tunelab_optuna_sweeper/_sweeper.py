"""The sweeper: ask Optuna for a batch of trials, launch them as Hydra jobs, tell the results.

    study  = the named study in `storage` (created, or resumed: n_trials is its total); it records the settings
             its trials run under (everything but the swept keys and the seed: tuning/config/identity.py) and
             its metrics' names, and a sweep under other settings or metrics is refused before any trial
    until the study has n_trials trials taken (finished, or running in any sweep process):
        under the study's lock (sqlite: a file beside the database; PostgreSQL: an advisory lock):
            fail the dead trials (heartbeat older than grace_period), enqueue their params again
            trials = up to n_jobs x study.ask(search space)
        nothing left to ask but another process's trials still run: wait for them (they may be dead)
        while the jobs run, a thread records each trial's heartbeat
        returns = launcher.launch(each trial's params as overrides)   # job folder: <sweep dir>/trial_<n>
        tell each: COMPLETE with the job's return value(s), PRUNED when the job raised
                   optuna.TrialPruned, FAIL when it raised anything else
        write optimization_results.yaml, trials.csv (and pareto_front.csv) to the sweep folder
    interrupted (Ctrl-C, SIGTERM, SIGHUP): the batch's trials FAIL and are enqueued again, the sweep's
        MLflow parent run ends KILLED (FAILED when the sweep stops on an error)
"""
from __future__ import annotations

import csv
import fcntl
import gc
import hashlib
import logging
import math
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from datetime import datetime, timedelta
from pathlib import Path

import optuna
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from optuna.exceptions import ExperimentalWarning
from optuna.trial import TrialState

from tuning.config.identity import config_settings, differing
from tuning.config.storage import database_scheme
from tuning.engine import trial as trial_side
from tuning.engine.run_folder import terminated_by_signals
from tuning.tracking.mlflow_tracker import sqlite_path

from . import _search_space as search_space
from . import config as _config  # also registers hydra/sweeper=optuna and its sampler/pruner groups

log = logging.getLogger(__name__)
RESULTS_FILE = trial_side.RESULTS_FILE
# PostgreSQL connections: give up on an unreachable server after 10 s; TCP keepalives both ways (the
# client's, and the server's for this session through `options`), so that a lost server is noticed here
# and a client whose node died is noticed there, its session and advisory lock ended within a minute
PG_CONNECT_ARGS = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 20, "keepalives_interval": 5,
                   "keepalives_count": 4,
                   "options": "-c tcp_keepalives_idle=20 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=4"}


def pg_connect_args(storage: str) -> dict:
    """PG_CONNECT_ARGS, and SCRAM or no authentication asked of libpq (tuning/store/postgres.py)."""
    from tuning.store.postgres import auth_connect_args

    return {**PG_CONNECT_ARGS, **auth_connect_args(storage)}


POLL_S = 1.0  # how often a sweep waiting for another process's trials looks again
# Optuna 5 warns on every ask() of a heartbeat storage outside study.optimize; this sweeper beats itself.
_ASK_WARNING = "Heartbeat of storage is supposed to be used with Study.optimize"
SETTINGS_ATTR = "tunelab.settings"  # the study's user attr: what its trials run under (config_settings)


class StudyMismatch(ValueError):
    """A study that cannot take this sweep's trials (other settings, metrics or directions): refused before any trial."""


class OptunaSweeperImpl(Sweeper):
    def __init__(self, sampler, pruner, direction, storage, study_name, n_trials: int, n_jobs: int,
                 max_failure_rate: float, retry_interrupted: bool, params,
                 heartbeat_interval: int | None = _config.OptunaSweeperConf.heartbeat_interval,
                 grace_period: int | None = _config.OptunaSweeperConf.grace_period):
        self.sampler_conf = sampler
        self.pruner_conf = pruner
        self.direction = direction
        self.storage = _absolute_sqlite(storage)
        self.study_name = study_name
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.max_failure_rate = max_failure_rate
        self.retry_interrupted = retry_interrupted
        self.params = params
        self.heartbeat_interval = heartbeat_interval if self.storage else None  # in memory: one process
        self.grace_period = grace_period
        self.config = self.launcher = self.hydra_context = None
        self.job_idx = 0
        self._rdb = None  # the RDBStorage that beats, when heartbeats are on
        self._seeded = False

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(config=config, hydra_context=hydra_context,
                                                                task_function=task_function)

    def sweep(self, arguments: list[str]) -> optuna.Study:
        space, fixed = search_space.parse([f"{k}={v}" for k, v in (self.params or {}).items()] + list(arguments))
        directions = self._directions()
        _check_settings(self.n_trials, self.n_jobs, self.max_failure_rate, self.heartbeat_interval,
                        self.grace_period)
        n_trials = self._total(space)
        sweep_dir, names = Path(self.config.hydra.sweep.dir), self._objective_names(len(directions))
        try:
            study = self._study(directions, names, self._settings(space, fixed))
        except StudyMismatch as refused:
            print(f"tunelab: {refused}", file=sys.stderr)
            self._end_parent("FAILED")
            sys.exit(2)
        try:
            with terminated_by_signals():  # SIGTERM/SIGHUP like Ctrl-C: trials run again, parent KILLED
                self._optimize(study, space, fixed, n_trials, sweep_dir, names)
        except KeyboardInterrupt:
            self._end_parent("KILLED")
            raise
        except BaseException:
            self._end_parent("FAILED")
            raise
        write_results(study, sweep_dir, names, self.storage)
        return study

    def _optimize(self, study, space, fixed, n_trials: int, sweep_dir: Path, names: list[str]) -> None:
        while (trials := self._next_batch(study, space, n_trials)) is not None:
            if not trials:
                time.sleep(POLL_S)
                continue
            beating = _Heartbeat(self._rdb, trials, self.heartbeat_interval) if self._rdb else nullcontext()
            with beating:
                returns = self._launch(study, trials, fixed)
                failures = [error for trial, ret in zip(trials, returns)
                            if (error := _tell(study, trial, ret, len(names))) is not None]
            write_results(study, sweep_dir, names, self.storage)
            if len(failures) / len(trials) > self.max_failure_rate:
                raise failures[0]

    # -- pieces ------------------------------------------------------------------------------

    def _directions(self) -> list[str]:
        declared = OmegaConf.select(self.config, "objective.directions")
        declared = [str(d) for d in declared] if declared else None
        if self.direction is None:
            return declared or ["minimize"]
        given = [self.direction] if isinstance(self.direction, str) else [str(d) for d in self.direction]
        bad = [d for d in given if d not in ("minimize", "maximize")]
        if bad:
            raise ValueError(f"hydra.sweeper.direction: expected minimize or maximize, got {bad[0]!r}")
        if declared and declared != given:
            raise ValueError(f"hydra.sweeper.direction: {given} contradicts objective.directions {declared} "
                             "(the job returns the objective's values); set only one of them")
        return given

    def _objective_names(self, count: int) -> list[str]:
        names = OmegaConf.select(self.config, "objective.metrics")
        return [str(n) for n in names] if names and len(names) == count else [f"value_{i}" for i in range(count)]

    def _study(self, directions, names: list[str], settings: dict[str, str]) -> optuna.Study:
        """The study, created or resumed; one that optimises other directions or metrics, or whose trials ran
        under other settings, is a StudyMismatch. A new study (or one from before studies kept their settings)
        records the settings and names its metrics (optuna-dashboard shows them, not "Objective 0")."""
        with _study_lock(self.storage, self.study_name):  # two sweeps creating one sqlite study would race on its tables
            study = optuna.create_study(storage=self._open_storage(), study_name=self.study_name,
                                        directions=directions, load_if_exists=True,
                                        pruner=instantiate(self.pruner_conf) if self.pruner_conf else None)
            where = f"hydra.sweeper.study_name: study {study.study_name!r} in {self.storage or 'memory'}"
            existing = [d.name.lower() for d in study.directions]
            if existing != directions:
                raise StudyMismatch(f"{where} optimises {existing}, not {directions}; pick another study name")
            _check_metric_names(study, names, where)
            _check_settings_of(study, settings, where)
        return study

    def _settings(self, space, fixed: dict) -> dict[str, str]:
        """What this sweep's trials run under: the job config with the preset's fixed params applied, less the
        swept keys and the seed (tuning/config/identity.py)."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        container = OmegaConf.to_container(self.config, resolve=False)
        for key in ("hydra", "output_dir"):  # Hydra's own, and a path its resolver fills per job
            container.pop(key, None)
        node = OmegaConf.create(container)
        parser = OverridesParser.create()
        for key, value in fixed.items():  # the command line's are in the config already; the preset's are not
            if key.startswith(("+", "~")) or OmegaConf.is_config(OmegaConf.select(node, key, default=None)):
                continue  # an added or removed key, or a group's choice: not a value of this config
            OmegaConf.update(node, key, parser.parse_override(f"{key}={value}").value(), merge=False)
        try:
            config = OmegaConf.to_container(node, resolve=True)
        except Exception as error:  # noqa: BLE001 - an interpolation the jobs resolve (they say which)
            log.warning(f"the sweep's settings could not be resolved ({type(error).__name__}: {error}); "
                        "they are kept as written")
            config = OmegaConf.to_container(node, resolve=False)
        return config_settings(config, space)

    def _open_storage(self):
        """The storage URL, or with heartbeats its RDBStorage: stale trials are failed and handed to `_dead`."""
        # a server database: connections checked before use, so a restarted server is reconnected to
        engine = {"pool_pre_ping": True, "connect_args": pg_connect_args(self.storage)} if _is_postgres(self.storage) else None
        if self.heartbeat_interval is None:
            return optuna.storages.RDBStorage(self.storage, engine_kwargs=engine) if engine else self.storage
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)  # heartbeat_interval is experimental in Optuna 5
            self._rdb = optuna.storages.RDBStorage(self.storage, heartbeat_interval=self.heartbeat_interval,
                                                   grace_period=self.grace_period,
                                                   heartbeat_stale_trial_callback=self._dead, engine_kwargs=engine)
        return self._rdb

    def _total(self, space) -> int:
        """n_trials, capped at the grid's size for the grid sampler."""
        if not self._is_grid():
            return self.n_trials
        size = 1
        for values in search_space.grid(space).values():
            size *= len(values)
        return min(self.n_trials, size)

    def _is_grid(self) -> bool:
        return bool(self.sampler_conf) and str(self.sampler_conf["_target_"]).endswith("GridSampler")

    def _sampler(self, trials_so_far: int, space) -> optuna.samplers.BaseSampler:
        """The sampler, its seed offset by the study's trials (a resumed study draws new points)."""
        conf = OmegaConf.to_container(self.sampler_conf, resolve=True) if self.sampler_conf else {
            "_target_": "optuna.samplers.TPESampler", "seed": None}
        if conf.get("seed") is not None:
            conf["seed"] += trials_so_far
        return instantiate(conf, search_space=search_space.grid(space)) if self._is_grid() else instantiate(conf)

    def _next_batch(self, study, space, n_trials: int) -> list | None:
        """Under the study's lock: fail dead trials, count the taken ones, ask for up to n_jobs more.
        [] while only other processes' running trials are left (they may yet die), None when done."""
        with _study_lock(self.storage, study.study_name):
            self._fail_dead(study)
            if not self._seeded:  # seeded here, so a sweep started beside another sees its first trials
                study.sampler, self._seeded = self._sampler(len(study.trials), space), True
                log.info(f"Optuna study {study.study_name!r} in {self.storage or 'memory'}: "
                         f"{type(study.sampler).__name__}, {type(study.pruner).__name__}, directions "
                         f"{[d.name.lower() for d in study.directions]}, {n_trials} trials in all")
            taken = _taken(study)
            if len(taken) < n_trials:
                return [self._ask(study, space) for _ in range(min(self.n_jobs, n_trials - len(taken)))]
        running = any(t.state == TrialState.RUNNING for t in taken)
        return [] if running and self.heartbeat_interval is not None else None

    def _ask(self, study, space) -> optuna.Trial:
        if self._rdb is None:
            return study.ask(space)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_ASK_WARNING)
            trial = study.ask(space)
        self._rdb.record_heartbeat(trial._trial_id)  # alive before the lock is let go
        return trial

    def _fail_dead(self, study) -> None:
        """Fail the running trials that are dead: Optuna's check (last heartbeat older than grace_period,
        then `_dead`), and trials that never beat (a sweep without heartbeats) started that long ago."""
        if self._rdb is None:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)  # fail_stale_trials is experimental in Optuna 5
            optuna.storages.fail_stale_trials(study)
        grace = self.grace_period or 2 * self.heartbeat_interval
        cutoff = datetime.now() - timedelta(seconds=grace)  # Optuna stamps datetime_start in local time
        old = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if t.datetime_start < cutoff]
        for trial in self._never_beat(old) if old else []:
            log.warning(f"trial {trial.number} has been RUNNING since {trial.datetime_start:%Y-%m-%d %H:%M:%S} "
                        "without a heartbeat (left by a sweep without heartbeats): "
                        f"marked FAIL{', run again' if self.retry_interrupted else ''}")
            _fail(study, trial.number, retry=self.retry_interrupted)

    def _never_beat(self, trials) -> list:
        """The trials without a heartbeat in the storage.

        Private API, as Optuna 5 has no public way to ask whether a trial ever beat (and its stale
        check skips those that never did, which would stay RUNNING for ever): the heartbeat table's
        model, optuna.storages._rdb.models.TrialHeartbeatModel, queried through the storage's
        engine, and FrozenTrial._trial_id, the key of that table."""
        from optuna.storages._rdb.models import TrialHeartbeatModel
        from sqlalchemy.orm import Session

        by_id = {trial._trial_id: trial for trial in trials}
        with Session(self._rdb.engine) as session:
            beat = {trial_id for (trial_id,) in session.query(TrialHeartbeatModel.trial_id)
                    .filter(TrialHeartbeatModel.trial_id.in_(list(by_id)))}
        return [trial for trial_id, trial in by_id.items() if trial_id not in beat]

    def _dead(self, study, trial) -> None:
        """Optuna's heartbeat_stale_trial_callback: the trial was just marked FAIL."""
        log.warning(f"trial {trial.number}: no heartbeat for over {self.grace_period or 2 * self.heartbeat_interval} s "
                    f"(its sweep was killed): marked FAIL{', run again' if self.retry_interrupted else ''}")
        if self.retry_interrupted:
            _retry(study, trial)

    def _launch(self, study, trials, fixed) -> Sequence[JobReturn]:
        overrides = [tuple(search_space.override(k, v) for k, v in trial.params.items())
                     + tuple(f"{k}={v}" for k, v in fixed.items())
                     + (f"++hydra.job.env_set.{trial_side.TRIAL_ID_ENV}={trial._trial_id}",
                        # the job's folder is its trial's: a re-run into this sweep dir never reuses one
                        f"hydra.sweep.subdir=trial_{trial.number}",
                        search_space.override("hydra.sweeper.study_name", study.study_name),
                        search_space.override("hydra.sweeper.storage", self.storage))
                     for trial in trials]
        self.validate_batch_is_legal(overrides)
        trial_side.hand_over(trials)
        try:
            returns = self.launcher.launch(overrides, initial_job_idx=self.job_idx)
        except BaseException as error:  # no trial stays RUNNING; interrupted ones run again
            _release_connections(error)
            for trial in trials:
                _fail(study, trial.number, retry=self.retry_interrupted and isinstance(error, KeyboardInterrupt))
            raise
        finally:
            trial_side.hand_over([])
        self.job_idx += len(returns)
        return returns

    def _end_parent(self, status: str) -> None:
        """Close the sweep's MLflow parent run (the tracker contract: tuning/tracking/base.py)."""
        if OmegaConf.select(self.config, "tracking") is None:
            return
        from tuning.sweep.multirun import end_parent  # the job side's; already imported when run.py is the task

        try:
            end_parent(self.config, status)
        except Exception as error:  # noqa: BLE001 - the sweep's own error is the one to report
            log.warning(f"could not end the sweep's MLflow parent run {status}: {type(error).__name__}: {error}")


class _Heartbeat:
    """While a batch's jobs run, a thread of the sweeper's process records each trial's heartbeat
    every `interval` seconds. Optuna beats only inside study.optimize; this sweeper asks and tells,
    so it beats through the storage's public `record_heartbeat` (the first beat is `_ask`'s)."""

    def __init__(self, storage, trials, interval: int):
        self.storage, self.interval = storage, interval
        self.trial_ids = [trial._trial_id for trial in trials]  # Optuna has no public trial id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="optuna-heartbeat", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            for trial_id in self.trial_ids:
                try:
                    self.storage.record_heartbeat(trial_id)
                except Exception as error:  # noqa: BLE001 - a missed beat is one of several in grace_period
                    log.warning(f"heartbeat of trial id {trial_id} not recorded: {type(error).__name__}: {error}")


@contextmanager
def _study_lock(storage, study_name: str):
    """Serialises the study's creation and each "fail dead, count, ask" between sweep processes.
    sqlite: a lock file beside the database (sqlite is one host's anyway). PostgreSQL: a session
    advisory lock on the study's name, held on a connection of its own, which the server frees when
    that connection ends, so a sweep that dies with its node never leaves the study locked. Other
    databases (MySQL) are not serialised: two sweeps there may overshoot n_trials by a batch."""
    path = sqlite_path(storage)
    if path is not None:
        with open(path.with_name(path.name + ".lock"), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
            yield
    elif _is_postgres(storage):
        with _advisory_lock(storage, f"tunelab optuna study {study_name}"):
            yield
    else:
        yield


def _is_postgres(storage) -> bool:
    return database_scheme(storage) in ("postgresql", "postgres")


@contextmanager
def _advisory_lock(storage: str, name: str):
    import sqlalchemy

    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    engine = sqlalchemy.create_engine(storage, poolclass=sqlalchemy.pool.NullPool, connect_args=pg_connect_args(storage))
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": key})
            conn.commit()
            yield  # the connection's end (closed here, or lost) frees the lock
    finally:
        engine.dispose()


def _release_connections(error: BaseException) -> None:
    """Close the database connections a job left open when `error` stopped it. An interrupt that lands
    inside a write (a trial's report, an MLflow metric) leaves that connection, its transaction open,
    in the frames of the traceback, and on sqlite its write lock stops every later write (the trials'
    FAIL, the parent run's end) with "database is locked". Clearing those frames' locals and collecting
    the cycles they were part of closes the connections, which rolls their transactions back."""
    traceback.clear_frames(error.__traceback__)
    gc.collect()


def _absolute_sqlite(storage):
    """A relative sqlite path is taken from the launching folder, also for jobs that chdir;
    its folder is created."""
    path = sqlite_path(storage)
    if path is None:
        return storage
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    query = storage.partition("?")[1:]
    return f"sqlite:///{path}{''.join(query)}"


def _check_metric_names(study, names: list[str], where: str) -> None:
    """The study's metric names, set if it has none (Optuna 5 marks set_metric_names experimental)."""
    if study.metric_names is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            study.set_metric_names(names)
    elif list(study.metric_names) != names:
        raise StudyMismatch(f"{where} optimises {list(study.metric_names)}, not {names} (objective.metrics); pick "
                            "another study name")


def _check_settings_of(study, settings: dict[str, str], where: str) -> None:
    """The settings the study's trials ran under are this sweep's (keys only one side holds aside); a study
    from before studies kept them takes this sweep's, with a warning."""
    kept = study.user_attrs.get(SETTINGS_ATTR)
    if not isinstance(kept, dict):
        if study.trials:
            log.warning(f"{where} does not say what its {len(study.trials)} trials ran under (made before tunelab "
                        "recorded it): it is taken to be this sweep's settings from now on")
        study.set_user_attr(SETTINGS_ATTR, settings)
        return
    differ = differing(kept, settings)
    if differ:
        shown = "; ".join(f"{key}: {kept[key]} in the study, {settings[key]} now" for key in differ[:8])
        more = f" (and {len(differ) - 8} more)" if len(differ) > 8 else ""
        raise StudyMismatch(f"{where} ran its {len(study.trials)} trials under other settings: {shown}{more}. A "
                            "study never mixes budgets, hardware or spaces: run the sweep with the study's settings, "
                            "or name another study (hydra.sweeper.study_name=...)")


def _check_settings(n_trials, n_jobs, max_failure_rate, heartbeat_interval, grace_period) -> None:
    if n_trials < 1:
        raise ValueError(f"hydra.sweeper.n_trials: must be >= 1, got {n_trials}")
    if n_jobs < 1:
        raise ValueError(f"hydra.sweeper.n_jobs: must be >= 1, got {n_jobs}")
    if not 0.0 <= max_failure_rate <= 1.0:
        raise ValueError(f"hydra.sweeper.max_failure_rate: must be in [0, 1], got {max_failure_rate}")
    if heartbeat_interval is not None and heartbeat_interval < 1:
        raise ValueError(f"hydra.sweeper.heartbeat_interval: must be >= 1 (seconds) or null, got {heartbeat_interval}")
    if heartbeat_interval is not None and grace_period is not None and grace_period <= heartbeat_interval:
        raise ValueError(f"hydra.sweeper.grace_period: must exceed heartbeat_interval ({heartbeat_interval} s), "
                         f"or a live trial is taken for dead between two beats; got {grace_period}")


def _taken(study) -> list:
    """The trials n_trials counts: finished, or running in any process; not failed ones whose
    params were enqueued again (their retry counts once it runs)."""
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get("retry_of") for t in trials}
    return [t for t in trials if (t.state.is_finished() or t.state == TrialState.RUNNING)
            and t.number not in retried]


def _fail(study, number: int, retry: bool) -> None:
    """Tell FAIL (unless already finished); with `retry`, enqueue the same params as a new trial."""
    if _told(study, number, state=TrialState.FAIL) and retry:
        _retry(study, study.get_trials(deepcopy=False)[number])


def _retry(study, trial) -> None:
    study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})


def _tell(study, trial, ret: JobReturn, n_objectives: int) -> Exception | None:
    """Record one job's outcome; returns the failure, if it failed."""
    outcome, failure = _outcome(trial, ret, n_objectives)
    if not _told(study, trial, **outcome):
        log.warning(f"trial {trial.number} was marked FAIL by another sweep process while its job ran (no "
                    "heartbeat for grace_period): this result is dropped, the trial's retry runs it again")
        return None
    return failure


def _outcome(trial, ret: JobReturn, n_objectives: int) -> tuple[dict, Exception | None]:
    """(study.tell's arguments, the failure if the job failed) for one job's return."""
    # The field itself: reading .return_value of a failed job prints "Error executing job" first.
    if ret.status == JobStatus.FAILED and isinstance(ret._return_value, optuna.TrialPruned):
        log.info(f"trial {trial.number} pruned: {ret._return_value}")
        return {"state": TrialState.PRUNED}, None
    try:
        value = ret.return_value  # re-raises what the job raised
    except Exception as error:  # noqa: BLE001 - a crashed job is a FAIL trial, not a crashed sweep
        log.warning(f"trial {trial.number} failed: {type(error).__name__}: {error}")
        return {"state": TrialState.FAIL}, error
    values = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value]
    try:
        values = [float(v) for v in values]
    except (TypeError, ValueError):
        values = []
    if len(values) != n_objectives or any(math.isnan(v) for v in values):
        return {"state": TrialState.FAIL}, ValueError(f"trial {trial.number}: the job returned {value!r}; the "
                                                      f"study needs {n_objectives} number(s), not NaN")
    return {"values": values}, None


def _told(study, trial, **outcome) -> bool:
    """study.tell; False when the trial was already finished (another sweep process took it for dead).
    The grid sampler calls Study.stop() once its grid is done, which raises outside study.optimize
    after the trial is recorded."""
    number = trial if isinstance(trial, int) else trial.number
    try:
        study.tell(trial, **outcome)
    except ValueError:
        if study.get_trials(deepcopy=False)[number].state.is_finished():
            return False
        raise
    except RuntimeError as error:
        if "Study.stop" not in str(error):
            raise
    return True


# ---- results in the sweep folder --------------------------------------------------------------
def write_results(study, sweep_dir: Path, names: list[str], storage) -> None:
    """optimization_results.yaml (the best trial, or the Pareto front), trials.csv, pareto_front.csv."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    trials = study.get_trials(deepcopy=False)
    results = {"study_name": study.study_name, "storage": storage,
               "directions": [d.name.lower() for d in study.directions], "objectives": names,
               "trials": dict(Counter(t.state.name for t in trials))}
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if complete and len(names) == 1:
        best = study.best_trial
        results.update(best_params=dict(best.params), best_value=best.value, best_trial=best.number)
    elif complete:
        front = sorted(study.best_trials, key=lambda t: t.values)
        results["pareto_front"] = [{"trial": t.number, "values": dict(zip(names, t.values)), "params": dict(t.params)}
                                   for t in front]
        _write_csv(sweep_dir / "pareto_front.csv", front, names)
    _write_csv(sweep_dir / "trials.csv", trials, names)
    (sweep_dir / RESULTS_FILE).write_text(OmegaConf.to_yaml(OmegaConf.create(results)))


def _write_csv(path: Path, trials, names: list[str]) -> None:
    """One row per trial; values only for COMPLETE ones (Optuna gives a pruned trial its last
    reported value), and the last reported step (where a pruned trial stopped)."""
    params = sorted({k for t in trials for k in t.params})
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["trial", "state", *names, "last_step", *params])
        for t in trials:
            values = t.values if t.state == TrialState.COMPLETE else [""] * len(names)
            last_step = max(t.intermediate_values, default="")
            writer.writerow([t.number, t.state.name, *values, last_step, *(t.params.get(p, "") for p in params)])
