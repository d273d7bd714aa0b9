"""Sweeps and grids beyond one machine, all on this one: PostgreSQL (Debian's, run as the postgres user),
an MLflow tracking server on it, and a Ray head plus a worker node (separate raylets on loopback).

Slow (`make test-full`): the services take 20-40 s to start and each sweep runs real processes. The
default `make test` needs none of them: tests/test_cluster_settings.py checks the settings alone."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("ray")
pytest.importorskip("psycopg")
pytest.importorskip("hydra_plugins.hydra_ray_launcher")

from tuning.cluster.hosts import MLflowServer, Postgres, RayNodes, postgres_bin  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STUDY = "kmeans_threshold-gemm_64"

try:
    postgres_bin()
except RuntimeError as missing:
    pytest.skip(str(missing), allow_module_level=True)


@pytest.fixture(scope="module")
def services():
    folder = Path(tempfile.mkdtemp(prefix="tunelab-cluster-"))
    folder.chmod(0o755)  # PostgreSQL runs as the postgres user, who must reach its data folder
    pg = Postgres(folder / "pg").start()
    mlflow = ray = None
    try:
        mlflow = MLflowServer(pg.create_database("mlflow"), folder / "artifacts",
                              folder / "mlflow.log").start()
        ray = RayNodes(folder / "ray", cpus=1).start(workers=1)
        yield SimpleNamespace(folder=folder, pg=pg, mlflow=mlflow, ray=ray)
    finally:
        for service in (ray, mlflow, pg):
            if service is not None:
                service.stop()
        shutil.rmtree(folder, ignore_errors=True)


def sweep_command(tmp: Path, optuna_url: str, mlflow_uri: str, store_url: str, *args: str) -> list[str]:
    return [sys.executable, "run.py", "-m", "hparams_search=kmeans_threshold", "hardware=synthetic",
            "model=gemm_64", "budget.plan_size=16", f"hydra.sweeper.storage={optuna_url}",
            f"tracking.uri={mlflow_uri}", f"hardware.store={store_url}", f"hydra.sweep.dir={tmp / 'sweep'}", *args]


def lab_env(tmp: Path, *extra: dict) -> dict:
    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp / "outputs"), "PYTHONWARNINGS": "ignore"}
    env.pop("MLFLOW_TRACKING_URI", None)
    for more in extra:
        env.update(more)
    return env


def holder_pid(job_dir: Path) -> int | None:
    try:
        return int((job_dir / ".tunelab.lock").read_text().strip())
    except (OSError, ValueError):
        return None


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether `pid` is a process started (at any depth) by `ancestor`: a job of that Ray node."""
    import psutil

    try:
        return any(parent.pid == ancestor for parent in psutil.Process(pid).parents())
    except psutil.Error:
        return False


def trial_on_node(sweep_dir: Path, node: subprocess.Popen, timeout_s: float = 180) -> Path:
    """The folder of a trial whose job runs on `node` (a process of its session) and has measured."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for job_dir in sorted(sweep_dir.glob("trial_*")):
            pid = holder_pid(job_dir)
            records = job_dir / "records.jsonl"
            if pid is not None and descends_from(pid, node.pid) and records.exists() and records.stat().st_size > 0:
                return job_dir
        time.sleep(0.2)
    raise AssertionError(f"no trial ran on the worker node within {timeout_s:g} s")


def stored_configs(store_url: str) -> set:
    from tuning.store import open_store

    store = open_store(store_url, "store", read_only=True)
    return {(task, tuple(config)) for hardware, task, space in store.keys()
            for config in store.configs(hardware, task, space)}


def recorded_configs(sweep_dir: Path) -> list:
    found = []
    for records in sweep_dir.glob("trial_*/records.jsonl"):
        for line in records.read_text().splitlines():
            if line.strip():
                found.append(tuple(json.loads(line)["config"]))
    return found


def sweep_runs(client, experiment_id: str, sweep_dir: Path) -> tuple[list, object]:
    """(the child runs, the parent run) of the multirun in `sweep_dir`: one parent, tagged with the folder."""
    from tuning.tracking.mlflow_tracker import MULTIRUN_TAG

    parents = client.search_runs([experiment_id], f"tags.`{MULTIRUN_TAG}` = '{sweep_dir}'")
    assert len(parents) == 1, [p.info.run_name for p in parents]
    children = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'",
                                  max_results=500)
    return children, parents[0]


def test_a_sweep_on_ray_survives_a_worker_node_killed_mid_trial(services, tmp_path):
    optuna_url = services.pg.create_database("optuna_kill")
    store_url = services.pg.create_database("store_kill")
    command = sweep_command(tmp_path, optuna_url, services.mlflow.uri, store_url, "hardware.delay_s=0.15",
                            "budget.trials=64", "hydra.sweeper.n_trials=4", "hydra.sweeper.n_jobs=2",
                            "hydra/launcher=ray", f"hydra.launcher.ray.init.address={services.ray.address}")
    log = tmp_path / "sweep.log"
    with open(log, "w") as out:
        sweep = subprocess.Popen(command, cwd=REPO, env=lab_env(tmp_path, services.ray.env), stdout=out,
                                 stderr=subprocess.STDOUT)
        try:
            victim = trial_on_node(tmp_path / "sweep", services.ray.workers[0])
            services.ray.kill_worker(0)
            code = sweep.wait(600)
        finally:
            if sweep.poll() is None:
                sweep.kill()
    text = log.read_text()
    assert code == 0, text[-5000:]
    assert f"{victim} holds the run of an attempt whose node died; resuming it" in text

    import optuna

    trials = optuna.load_study(study_name=STUDY, storage=optuna_url).trials
    assert len(trials) == 4 and all(t.state.name in ("COMPLETE", "PRUNED") for t in trials), \
        [(t.number, t.state.name) for t in trials]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(services.mlflow.uri)
    experiment = client.get_experiment_by_name("tunelab")
    children, parent = sweep_runs(client, experiment.experiment_id, tmp_path / "sweep")
    assert parent.info.status == "FINISHED"
    assert sorted(r.info.run_name.rsplit("-", 1)[-1] for r in children) == [f"trial{t.number}" for t in trials]
    assert all(r.info.status == "FINISHED" for r in children), [(r.info.run_name, r.info.status) for r in children]
    assert experiment.artifact_location.startswith("mlflow-artifacts:")
    assert list((services.folder / "artifacts").rglob("records.jsonl"))  # artifacts went through the server

    recorded = recorded_configs(tmp_path / "sweep")
    stored = {config for _, config in stored_configs(store_url)}
    assert len(recorded) >= 4 * 64 and set(recorded) <= stored


def run_sweep(tmp: Path, command: list[str], env: dict, log_name: str = "sweep.log") -> subprocess.Popen:
    out = open(tmp / log_name, "w")
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def finished(process: subprocess.Popen, log: Path, timeout_s: float = 600) -> str:
    try:
        code = process.wait(timeout_s)
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert code == 0, text[-5000:]
    return text


def states(optuna_url: str) -> list[str]:
    import optuna

    return [t.state.name for t in optuna.load_study(study_name=STUDY, storage=optuna_url).trials]


def test_a_second_sweep_attaching_to_the_study_shares_its_trials(services, tmp_path):
    """Two sweep processes on one PostgreSQL study (here both on this host, on loopback): the advisory
    lock keeps them from asking for more than n_trials between them."""
    optuna_url = services.pg.create_database("optuna_attach")
    store_url = services.pg.create_database("store_attach")
    sweeps = []
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        command = sweep_command(folder, optuna_url, services.mlflow.uri, store_url, "hardware.delay_s=0.05",
                                "budget.trials=32", "hydra.sweeper.n_trials=5", "hydra.sweeper.n_jobs=1")
        sweeps.append((run_sweep(folder, command, lab_env(folder)), folder / "sweep.log"))
    for process, log in sweeps:
        finished(process, log)
    assert states(optuna_url) == ["COMPLETE"] * 5


def test_a_sweep_goes_on_when_postgresql_restarts_under_it(services, tmp_path):
    optuna_url = services.pg.create_database("optuna_restart")
    store_url = services.pg.create_database("store_restart")
    command = sweep_command(tmp_path, optuna_url, services.mlflow.uri, store_url, "hardware.delay_s=0.1",
                            "budget.trials=48", "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=1")
    sweep = run_sweep(tmp_path, command, lab_env(tmp_path))
    try:
        records = tmp_path / "sweep" / "trial_1" / "records.jsonl"
        deadline = time.monotonic() + 180
        while not (records.exists() and records.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.2)
        services.pg.restart(down_s=3)
    finally:
        text = finished(sweep, tmp_path / "sweep.log")
    assert states(optuna_url) == ["COMPLETE"] * 3, text[-3000:]
    recorded = recorded_configs(tmp_path / "sweep")
    assert len(recorded) == 3 * 48 and set(recorded) <= {c for _, c in stored_configs(store_url)}


def test_a_run_outlives_its_mlflow_server_and_sync_delivers_what_it_missed(services, tmp_path):
    """The MLflow server killed mid-run: the run finishes on its spool, and `tunelab sync` hands the
    spooled steps to the server once it is back (the tracker's own guarantees, across processes)."""
    run_dir = tmp_path / "run"
    server = MLflowServer(services.mlflow.backend_uri, services.mlflow.artifacts, tmp_path / "mlflow2.log").start()
    command = [sys.executable, "run.py", "hardware=synthetic", "model=gemm_64", "search=random", "cost_model=none",
               "hardware.delay_s=0.1", "budget.trials=64", "budget.plan_size=16", f"tracking.uri={server.uri}",
               f"hydra.run.dir={run_dir}"]
    with open(tmp_path / "run.log", "w") as out:
        run = subprocess.Popen(command, cwd=REPO, env=lab_env(tmp_path), stdout=out, stderr=subprocess.STDOUT)
    try:
        records = run_dir / "records.jsonl"
        deadline = time.monotonic() + 120
        while not (records.exists() and len(records.read_text().splitlines()) >= 16) and time.monotonic() < deadline:
            time.sleep(0.2)
        server.kill()
        assert run.wait(300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
    server.start()
    try:
        synced = subprocess.run([sys.executable, "-m", "tuning.tools.sync", str(run_dir)], cwd=REPO,
                                env=lab_env(tmp_path), capture_output=True, text=True, timeout=300)
        assert synced.returncode == 0, synced.stderr[-3000:]
        from mlflow.tracking import MlflowClient

        client = MlflowClient(server.uri)
        run_id = (run_dir / "mlflow_run_id").read_text().strip()
        found = client.get_run(run_id)
        assert found.info.status == "FINISHED"
        steps = {m.step for m in client.get_metric_history(run_id, "best/gflops_so_far")}
        assert max(steps) == 64
    finally:
        server.stop()


def test_a_sweep_that_died_with_its_node_is_finished_by_a_sweep_on_another(services, tmp_path):
    """The sweep process SIGKILLed mid-trial (as when its node dies) while it may hold the study's
    advisory lock: its heartbeats stop, its connections end, and a sweep started elsewhere fails its
    trial once stale, runs its params again and finishes the study."""
    optuna_url = services.pg.create_database("optuna_dead")
    store_url = services.pg.create_database("store_dead")
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    common = ("hydra.sweeper.n_trials=2", "hydra.sweeper.heartbeat_interval=1", "hydra.sweeper.grace_period=5",
              "hardware.delay_s=0.2", "budget.trials=32")  # the study's settings, the rerun's too
    killed = run_sweep(first, sweep_command(first, optuna_url, services.mlflow.uri, store_url, *common), lab_env(first))
    records = first / "sweep" / "trial_0" / "records.jsonl"
    deadline = time.monotonic() + 180
    while not (records.exists() and records.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    killed.kill()
    killed.wait(60)
    again = run_sweep(second, sweep_command(second, optuna_url, services.mlflow.uri, store_url, *common),
                      lab_env(second))
    finished(again, second / "sweep.log")
    import optuna

    trials = optuna.load_study(study_name=STUDY, storage=optuna_url).trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE", "COMPLETE"]
    [retry] = [t for t in trials if t.user_attrs.get("retry_of") == 0]
    assert retry.params == trials[0].params


def test_a_job_whose_ray_task_cannot_finish_fails_its_own_trial_only(tmp_path):
    """No retries, and one trial's job killed: that trial is FAIL, its batch-mate COMPLETE, and the
    sweep goes on to its n_trials (a Ray instance of the sweep's own: address null)."""
    optuna_url = f"sqlite:///{tmp_path / 'optuna.db'}"
    command = sweep_command(tmp_path, optuna_url, f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "store.sqlite"),
                            "hardware.delay_s=0.1", "budget.trials=64", "hydra.sweeper.n_trials=4",
                            "hydra.sweeper.n_jobs=2", "hydra.sweeper.max_failure_rate=1.0", "hydra/launcher=ray",
                            "hydra.launcher.ray.remote.max_retries=0")
    sweep = run_sweep(tmp_path, command, lab_env(tmp_path, {"RAY_AUTH_MODE": "disabled",
                                                           "RAY_USAGE_STATS_ENABLED": "0"}))
    try:
        job_dir = tmp_path / "sweep" / "trial_0"
        deadline = time.monotonic() + 180
        while holder_pid(job_dir) is None or not (job_dir / "records.jsonl").exists():
            assert time.monotonic() < deadline, (tmp_path / "sweep.log").read_text()[-3000:]
            time.sleep(0.2)
        os.kill(holder_pid(job_dir), signal.SIGKILL)
    finally:
        text = finished(sweep, tmp_path / "sweep.log")
    assert "did not finish: WorkerCrashedError" in text
    import optuna

    trials = optuna.load_study(study_name=STUDY, storage=optuna_url).trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE", "COMPLETE", "COMPLETE"], text[-3000:]


def cluster_processes() -> list[str]:
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if any(mark in line for mark in ("bin/postgres", "mlflow server", "raylet", "gcs_server", "run.py -m")):
            found.append(f"{process.pid} {line[:120]}")
    return found


def test_the_cluster_demo_stops_everything_on_ctrl_c(tmp_path):
    """make cluster-demo's script, interrupted while its sweep runs: every service and the multirun stop."""
    before = cluster_processes()
    folder = Path(tempfile.mkdtemp(prefix="tunelab-demo-"))
    folder.chmod(0o755)  # its PostgreSQL runs as the postgres user, who must reach its data folder
    demo = subprocess.Popen([sys.executable, "examples/cluster_demo.py", "--folder", str(folder)], cwd=REPO,
                            env=lab_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in demo.stdout:
        seen.append(line)
        if "pinned to CPUs" in line:  # a sweep's job runs on a Ray node
            break
    demo.send_signal(signal.SIGINT)
    rest, _ = demo.communicate(timeout=180)
    text = "".join(seen) + rest
    assert demo.returncode == 0 and "interrupted" in text and "stopped;" in text, text[-3000:]
    deadline = time.monotonic() + 30
    while (left := [p for p in cluster_processes() if p not in before]) and time.monotonic() < deadline:
        time.sleep(1)
    assert left == []
    shutil.rmtree(folder, ignore_errors=True)


def test_a_ray_address_with_no_cluster_behind_it_is_an_error_naming_the_key(tmp_path):
    from tuning.cluster.hosts import free_port

    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "run.py", "-m", "hardware=synthetic", "model=gemm_64", "seed=0,1",
                           "budget.trials=8", "hydra/launcher=ray", f"hydra.launcher.ray.init.address={address}",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=REPO, env=lab_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and time.monotonic() - started < 60
    assert f"hydra.launcher.ray.init.address: no Ray cluster at {address}" in done.stderr
    assert not list((tmp_path / "sweep").glob("*/records.jsonl"))
