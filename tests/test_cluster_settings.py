"""The cluster pieces that need no server: hydra/launcher=ray's settings, the CPUs a job reserves and
holds on its node, storage=cluster's environment, a retried job's overrides (tests/test_cluster.py
runs them on PostgreSQL, an MLflow server and Ray nodes)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tuning.cluster import cpu_slots
from tuning.config import register
from tuning.config.conf_dir import CONF_DIR

REPO = Path(__file__).resolve().parents[1]


def composed(*overrides: str, hydra: bool = False):
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def test_the_ray_launcher_is_the_labs_with_retries_and_pinning():
    launcher = composed("hydra/launcher=ray", hydra=True).hydra.launcher
    assert launcher._target_ == "hydra_plugins.tunelab_ray_launcher.ray_launcher.RayLauncher"
    assert launcher.pin_cpus is True and launcher.ray.remote.max_retries == 3
    assert launcher.ray.init.address is None


@pytest.mark.parametrize("overrides, cpus", [
    (["hardware=cpu"], 3),                                                  # 2 timing threads + 1 build worker
    (["hardware=cpu", "hardware.num_threads=1", "hardware.build_workers=1"], 2),
    (["hardware=synthetic"], 1),
    (["hardware=cpu", "hardware/runner=rpc", "hardware.build_workers=2"], 2),  # timed on remote devices
    (["hardware=replay", "hardware.store=/x.sqlite", "hardware.on_miss=error"], 1),
    (["hardware=replay", "hardware.store=/x.sqlite", "hardware.backend.num_threads=1"], 2),
])
def test_a_job_reserves_the_cpus_its_measurements_need(overrides, cpus):
    assert cpu_slots.cpus_needed(composed(*overrides)) == cpus


HOLDER = """
import sys, time
from tuning.cluster import cpu_slots
try:
    cpus = cpu_slots.hold(int(sys.argv[1]), wait_s=float(sys.argv[2]), poll_s=0.05)
except TimeoutError as error:
    print("TIMEOUT", error, flush=True)
    sys.exit(3)
import os
print("HOLDS", cpus, sorted(os.sched_getaffinity(0)), flush=True)
print("AT", time.time(), flush=True)
time.sleep(float(sys.argv[3]))
print("DONE", time.time(), flush=True)  # before the process ends, which frees its CPUs
"""


def holder(tmp: Path, count: int, wait_s: float, hold_s: float) -> subprocess.Popen:
    env = {**os.environ, cpu_slots.SLOTS_ENV: str(tmp / "slots")}
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(count), str(wait_s), str(hold_s)], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, text=True)


def held_by(process: subprocess.Popen) -> list[int]:
    line = process.stdout.readline()
    assert line.startswith("HOLDS"), line
    cpus, affinity = line[len("HOLDS"):].strip().split("] [")
    assert cpus + "]" == "[" + affinity, line  # pinned to exactly the CPUs it holds
    return [int(c) for c in cpus.strip("[]").split(",")]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_jobs_on_one_node_hold_different_cpus_and_a_killed_holder_frees_its_own(tmp_path):
    first, second = holder(tmp_path, 1, 5, 60), None
    try:
        mine = held_by(first)
        second = holder(tmp_path, 1, 5, 60)
        theirs = held_by(second)
        assert set(mine).isdisjoint(theirs)
        all_taken = holder(tmp_path, 1, 0.5, 0)  # every CPU of this machine held (on a 2-core host)
        if len(os.sched_getaffinity(0)) == 2:
            assert all_taken.wait(30) == 3 and "TIMEOUT" in all_taken.stdout.read()
        waiting = holder(tmp_path, 1, 30, 0)
        time.sleep(0.5)
        first.kill()  # SIGKILL: its lock goes with it
        assert held_by(waiting) == mine or len(os.sched_getaffinity(0)) > 2
        assert waiting.wait(30) == 0
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()


def test_a_job_asking_for_more_cpus_than_it_may_use_gets_all_of_them(tmp_path):
    process = holder(tmp_path, 64, 5, 0)
    assert held_by(process) == sorted(os.sched_getaffinity(0))
    assert process.wait(30) == 0


def test_storage_cluster_without_its_environment_is_refused_naming_the_keys(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TUNELAB_MLFLOW_URI", "TUNELAB_OPTUNA_URI",
                                                            "MLFLOW_TRACKING_URI")}
    env["TUNELAB_OUTPUTS"] = str(tmp_path / "outputs")
    done = subprocess.run([sys.executable, "run.py", "storage=cluster", "hardware=synthetic", "model=gemm_64",
                           "budget.trials=4", f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "storage.mlflow_uri: the environment variable TUNELAB_MLFLOW_URI is not set" in done.stderr
    assert "storage.optuna_uri: the environment variable TUNELAB_OPTUNA_URI is not set" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run" / "records.jsonl").exists()


def test_storage_cluster_reads_its_places_from_the_environment(monkeypatch):
    monkeypatch.setenv("TUNELAB_MLFLOW_URI", "http://mlflow.lab:5000")
    monkeypatch.setenv("TUNELAB_OPTUNA_URI", "postgresql://lab@db.lab/optuna")
    cfg = composed("storage=cluster", "hparams_search=kmeans_threshold", hydra=True)
    assert cfg.storage.mlflow_uri == "http://mlflow.lab:5000"
    assert cfg.hydra.sweeper.storage == "postgresql://lab@db.lab/optuna"


def test_a_retried_job_reads_its_escaped_multirun_overrides_as_hydra_does():
    from tuning.engine.resume import _override_values

    values = _override_values(["tracking.uri=http\\://127.0.0.1\\:5000", "budget.trials=64"])
    assert OmegaConf.to_container(values) == {"tracking": {"uri": "http://127.0.0.1:5000"}, "budget": {"trials": 64}}


def test_a_database_password_never_becomes_an_mlflow_param():
    from tuning.tracking.base import flatten

    flat = flatten({"hardware": {"store": "postgresql://lab:s3cret@db.lab:5432/store"},
                    "storage": {"optuna_uri": "postgresql://lab@db.lab/optuna", "stores_dir": "/a:b@c"}})
    assert flat["hardware.store"] == "postgresql://lab:***@db.lab:5432/store"
    assert flat["storage.optuna_uri"] == "postgresql://lab@db.lab/optuna" and flat["storage.stores_dir"] == "/a:b@c"


def test_cpus_go_to_waiting_jobs_in_the_order_they_asked(tmp_path):
    """A job waiting for the whole node is not overtaken by a later job that needs one CPU."""
    first = holder(tmp_path, 64, 5, 2.5)  # the whole node, until both others wait for it
    held_by(first)
    whole = holder(tmp_path, 64, 60, 2)  # asks next, for the whole node
    time.sleep(0.5)
    one = holder(tmp_path, 1, 60, 0)  # asks last, for one CPU
    held_by(whole)
    held_by(one)
    got_one = float(one.stdout.readline().split()[1])
    whole.stdout.readline()
    whole_done = float(whole.stdout.readline().split()[1])
    assert got_one >= whole_done  # the one-CPU job got its CPU only once the earlier job was done
    for process in (first, whole, one):
        assert process.wait(30) == 0
