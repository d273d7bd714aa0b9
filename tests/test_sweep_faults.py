"""Optuna sweeps under faults: two sweep processes on one study, a sweep killed mid-trial and
run again into its sweep dir, a sweep interrupted (its MLflow parent run ends KILLED).

The sweeper's logic runs in-process first (a fake launcher, a recording tracker), then end to end:
`python run.py -m hparams_search=kmeans_threshold` on the synthetic hardware, with heartbeats
every second so that a dead trial is found in seconds."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
from hydra.core.utils import JobReturn, JobStatus
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from optuna.distributions import FloatDistribution
from optuna.exceptions import ExperimentalWarning
from optuna.trial import TrialState

from hydra_plugins.tunelab_optuna_sweeper import config as sweeper_config
from hydra_plugins.tunelab_optuna_sweeper._sweeper import OptunaSweeperImpl as OptunaSweeper

REPO = Path(__file__).resolve().parents[1]
PEAK = "hardware.peak_gflops=interval(50.0, 150.0)"  # in the e2e sweeps: distinct params, distinct values
STUDY = "kmeans_threshold-gemm_64"
SPACE = {"x": FloatDistribution(-2.0, 2.0)}
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")
optuna.logging.set_verbosity(optuna.logging.WARNING)


# ---- the sweeper in-process -----------------------------------------------------------------------
class Launcher:
    """Runs each trial in-process: (x - 0.5)^2; `fault()`, if given, is called at each launch first."""

    def __init__(self, fault=None):
        self.fault, self.launched = fault, []

    def launch(self, job_overrides, initial_job_idx):
        if self.fault is not None:
            self.fault()
        returns = []
        for overrides in job_overrides:
            params = dict(o.split("=", 1) for o in overrides)
            self.launched.append((params, datetime.now()))
            returns.append(JobReturn(status=JobStatus.COMPLETED, _return_value=(float(params["x"]) - 0.5) ** 2,
                                     overrides=list(overrides)))
        return returns


class RecordingTracker:
    """tracking._target_ for the sweeper's end_parent: records (parent, status)."""
    ended: list = []

    def end_parent(self, parent, status):
        RecordingTracker.ended.append((parent, status))


def in_process(tmp_path, n_trials: int, launcher: Launcher, storage: str | None = None, grace_period: int = 2,
               config=None) -> optuna.Study:
    sweeper = OptunaSweeper(OmegaConf.structured(sweeper_config.RandomSamplerConf), None, "minimize", storage, "s",
                            n_trials, 1, 0.0, True, {"x": "interval(-2.0, 2.0)"},
                            heartbeat_interval=1, grace_period=grace_period)
    sweeper.config = config or OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}})
    sweeper.launcher = launcher
    sweeper.validate_batch_is_legal = lambda batch: None
    return sweeper.sweep([])


def heartbeat_storage(path: Path) -> optuna.storages.RDBStorage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        return optuna.storages.RDBStorage(f"sqlite:///{path}", heartbeat_interval=1)


def ask(study) -> optuna.Trial:
    """A trial as another process asks it (Optuna warns: heartbeats outside study.optimize)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return study.ask(SPACE)


def test_a_dead_trial_is_failed_only_once_its_heartbeat_is_stale_and_then_run_again(tmp_path):
    storage = heartbeat_storage(tmp_path / "study.db")
    study = optuna.create_study(study_name="s", storage=storage)
    dead = ask(study)  # as a sweep killed mid-trial leaves it: RUNNING, its last heartbeat now
    storage.record_heartbeat(dead._trial_id)
    beat_at = datetime.now()
    launcher = Launcher()
    study = in_process(tmp_path, 3, launcher, storage.url, grace_period=2)
    trials = study.trials
    assert [t.state for t in trials] == [TrialState.FAIL] + [TrialState.COMPLETE] * 3
    assert trials[0].datetime_complete - beat_at >= timedelta(seconds=2)  # not at the sweep's start
    assert launcher.launched[0][1] < trials[0].datetime_complete  # it counted as taken meanwhile
    retry = [t for t in trials if t.user_attrs.get("retry_of") == 0]
    assert len(retry) == 1 and retry[0].params == trials[0].params
    assert [p["hydra.sweep.subdir"] for p, _ in launcher.launched] == ["trial_1", "trial_2", "trial_3"]


def test_another_process_s_live_trial_counts_as_taken_and_is_waited_for(tmp_path):
    storage = heartbeat_storage(tmp_path / "study.db")
    study = optuna.create_study(study_name="s", storage=storage)
    live = ask(study)

    def other_process():  # another sweep's trial: beats for 3 s, then is told
        for _ in range(6):
            storage.record_heartbeat(live._trial_id)
            time.sleep(0.5)
        study.tell(live, 1.0)

    other = threading.Thread(target=other_process)
    other.start()
    launcher = Launcher()
    started = time.monotonic()
    finished = in_process(tmp_path, 3, launcher, storage.url, grace_period=2)
    other.join()
    assert time.monotonic() - started >= 2.5  # the sweep waited for the other trial to end
    assert [t.state for t in finished.trials] == [TrialState.COMPLETE] * 3 and len(launcher.launched) == 2
    assert finished.trials[0].value == 1.0 and not any("retry_of" in t.user_attrs for t in finished.trials)


def test_a_trial_that_never_beat_is_dead_once_older_than_the_grace_period(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="s", storage=storage).ask(SPACE)  # a sweep without heartbeats
    study = in_process(tmp_path, 1, Launcher(), storage, grace_period=2)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert study.trials[1].user_attrs["retry_of"] == 0 and study.trials[1].params == study.trials[0].params


def ctrl_c():
    raise KeyboardInterrupt


def sigterm():
    os.kill(os.getpid(), signal.SIGTERM)  # the sweeper's handler raises it as an interrupt
    time.sleep(5)


def launcher_broke():
    raise RuntimeError("launcher broke")


@pytest.mark.parametrize("fault, error, status", [(ctrl_c, KeyboardInterrupt, "KILLED"),
                                                  (sigterm, KeyboardInterrupt, "KILLED"),
                                                  (launcher_broke, RuntimeError, "FAILED")])
def test_an_interrupted_sweep_ends_its_parent_run_killed(tmp_path, compose_cfg, fault, error, status):
    RecordingTracker.ended.clear()
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    config = compose_cfg("hardware=synthetic", "model=gemm_64", "objective=latency",
                         f"hydra.sweep.dir={tmp_path / 'sweep'}")
    config.tracking = {"_target_": f"{__name__}.RecordingTracker"}
    with pytest.raises(error):
        in_process(tmp_path, 2, Launcher(fault), storage, config=config)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored
    assert RecordingTracker.ended == [(str((tmp_path / "sweep").resolve()), status)]
    trials = optuna.load_study(study_name="s", storage=storage).trials
    retried = error is KeyboardInterrupt  # a broken launcher's trial is not run again
    assert [t.state for t in trials] == [TrialState.FAIL] + [TrialState.WAITING] * retried


def test_ctrl_c_inside_a_job_s_database_write_leaves_the_study_writable(tmp_path):
    """The interrupt's traceback holds the job's connection, its write transaction open (as when
    Ctrl-C lands in a trial's report); the sweeper still fails the trial and enqueues it again."""
    database = tmp_path / "study.db"

    def interrupted_mid_write():
        connection = sqlite3.connect(database, timeout=1)
        connection.execute("BEGIN IMMEDIATE")  # sqlite's write lock, held until the connection closes
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        in_process(tmp_path, 2, Launcher(interrupted_mid_write), f"sqlite:///{database}")
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{database}").trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]


def test_heartbeat_settings_are_checked():
    with pytest.raises(ValueError, match="hydra.sweeper.grace_period"):
        in_process(Path("/nonexistent"), 1, Launcher(), "sqlite:////tmp/x.db", grace_period=1)


# ---- end to end -------------------------------------------------------------------------------------
def command(tmp: Path, sweep_dir: str, *args: str) -> list[str]:
    return [sys.executable, "run.py", "-m", "hardware=synthetic", "model=gemm_64", "hparams_search=kmeans_threshold",
            f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}", f"hydra.sweep.dir={tmp / sweep_dir}",
            "hydra.sweeper.heartbeat_interval=1", PEAK, *args]


def start(tmp: Path, sweep_dir: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp / "outputs")}
    return subprocess.Popen(command(tmp, sweep_dir, *args), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    stderr = proc.communicate(timeout=timeout)[1]
    assert proc.returncode == 0, stderr[-5000:]
    return stderr


def wait_for_records(path: Path, count: int, timeout: float = 120) -> None:
    """Not helpers.wait_for_records: a trial's file, watched without its process, and past the deadline
    the test goes on to its own checks (only the file must exist)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (path.exists() and path.read_text().count("\n") >= count):
        time.sleep(0.1)
    assert path.exists(), path


def study_trials(tmp: Path) -> list:
    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp / 'outputs' / 'optuna.db'}").trials


def assert_no_copied_value(trials, sweep_dirs: list[Path]) -> None:
    """No two trials share a value unless they share their params, and each complete trial's job
    folder (trial_<n> in one of the sweep dirs) ran its params."""
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    for a in complete:
        for b in complete:
            assert a is b or a.value != b.value or a.params == b.params, (a.number, b.number)
    for t in complete:
        [folder] = [d / f"trial_{t.number}" for d in sweep_dirs if (d / f"trial_{t.number}").exists()]
        ran = OmegaConf.load(folder / "config.yaml")
        assert {k: OmegaConf.select(ran, k) for k in t.params} == pytest.approx(t.params), folder


@pytest.mark.slow
def test_two_sweep_processes_share_one_study(tmp_path):
    procs = [start(tmp_path, f"sweep{i}", "budget.trials=16", "hydra.sweeper.n_trials=6",
                   "hydra.sweeper.grace_period=10") for i in range(2)]
    for proc in procs:
        finish(proc)
    trials = study_trials(tmp_path)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 6
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 6  # each sweep drew its own points
    assert_no_copied_value(trials, [tmp_path / "sweep0", tmp_path / "sweep1"])
    folders = [p.name for i in range(2) for p in (tmp_path / f"sweep{i}").glob("trial_*")]
    assert sorted(folders) == [f"trial_{n}" for n in range(6)]  # each trial ran once, in one of them


# trials still under way a few seconds in (a pause before each result), rerun under the study's own settings
SLOW_TRIALS = ("budget.trials=16", "hardware.delay_s=0.3")


def test_a_sweep_killed_mid_trial_is_finished_by_a_rerun_into_its_sweep_dir(tmp_path):
    killed = start(tmp_path, "sweep", *SLOW_TRIALS, "hydra.sweeper.n_trials=2")
    records = tmp_path / "sweep" / "trial_0" / "records.jsonl"
    wait_for_records(records, 1)
    killed.kill()  # SIGKILL: trial 0 stays RUNNING, its heartbeat stops
    killed_at = datetime.now()
    killed.communicate(timeout=60)
    left = records.read_text()
    # a grace period the rerun's start (seconds on a loaded 2-core host) stays well inside
    finish(start(tmp_path, "sweep", *SLOW_TRIALS, "hydra.sweeper.n_trials=2", "hydra.sweeper.grace_period=15"))
    trials = study_trials(tmp_path)
    assert [t.state for t in trials] == [TrialState.FAIL] + [TrialState.COMPLETE] * 2
    dead = trials[0]
    assert dead.datetime_complete - killed_at >= timedelta(seconds=15 - 1)  # failed once stale, not at start
    assert trials[1].datetime_start < dead.datetime_complete  # meanwhile it counted as taken
    [retry] = [t for t in trials if t.user_attrs.get("retry_of") == 0]
    assert retry.params == dead.params
    assert records.read_text() == left  # nobody continued the killed trial's folder
    for t in trials[1:]:
        assert (tmp_path / "sweep" / f"trial_{t.number}" / "records.jsonl").read_text().count("\n") == 16
    assert_no_copied_value(trials, [tmp_path / "sweep"])


@pytest.mark.slow
def test_a_sweep_stopped_with_sigterm_ends_its_parent_run_killed_and_a_rerun_finishes_it(tmp_path):
    proc = start(tmp_path, "sweep", "budget.trials=32", "hardware.delay_s=0.5", "hydra.sweeper.n_trials=1")
    wait_for_records(tmp_path / "sweep" / "trial_0" / "records.jsonl", 20)
    proc.send_signal(signal.SIGTERM)
    stderr = proc.communicate(timeout=120)[1]
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tunelab").experiment_id
    [parent] = client.search_runs([experiment], f"tags.`tunelab.multirun` = '{tmp_path / 'sweep'}'")
    parent_id = parent.info.run_id
    assert client.get_run(parent_id).info.status == "KILLED", stderr[-3000:]
    assert [t.state for t in study_trials(tmp_path)] == [TrialState.FAIL, TrialState.WAITING]

    finish(start(tmp_path, "sweep", "budget.trials=32", "hardware.delay_s=0.5", "hydra.sweeper.n_trials=1"))
    trials = study_trials(tmp_path)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[1].user_attrs["retry_of"] == 0 and trials[1].params == trials[0].params
    runs = client.search_runs([experiment], max_results=50)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [p.info.run_id for p in parents] == [parent_id] and parents[0].info.status == "FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in runs if r not in parents} == {parent_id}
