"""Fault probes, repeated: run identity, untrusted run folders, durable tracking (docs/runs.md
§What survives what). Synthetic hardware with a real pause per result (hardware.delay_s), so a run is still
going when a test kills it; a real sqlite MLflow store (and, in `make test-full`, a real mlflow server).
"""
from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from helpers import wait_for_records
from test_loop import check_resumed

REPO = Path(__file__).resolve().parents[1]
GEMM_64_FLOPS = 2.0 * 64 ** 3
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")


def start(tmp: Path, *args: str, uri: str | None = None, delay: float = 0.005) -> subprocess.Popen:
    uri = uri or f"sqlite:///{tmp / 'mlflow.db'}"
    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp / "outputs")}
    command = [sys.executable, "run.py", "hardware=synthetic", f"hardware.delay_s={delay}", "model=gemm_64",
               f"tracking.uri={uri}", "tracking.experiment=faults", "tracking.retry_s=1", *args]
    if any(a.startswith("resume=") for a in args):  # a resume takes its saved config: these would be ignored
        command = [sys.executable, "run.py", *args]
    return subprocess.Popen(command, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


SA = ("search=sa", "search.n_iter=50")


def done(proc: subprocess.Popen, code: int = 0, timeout: float = 180) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == code, f"exit {proc.returncode}\n{out[-2000:]}\n{err[-3000:]}"
    return out, err


def run(tmp: Path, *args: str, code: int = 0, **kw) -> tuple[str, str]:
    return done(start(tmp, *args, **kw), code)


def module(tmp: Path, name: str, *args: str, code: int = 0) -> tuple[str, str]:
    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp / "outputs")}
    proc = subprocess.run([sys.executable, "-m", name, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout, proc.stderr


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]


def mlflow_run(run_dir: Path, uri: str, run_id: str | None = None):
    client = MlflowClient(tracking_uri=uri)
    return client, client.get_run(run_id or (run_dir / "mlflow_run_id").read_text().strip())


def best_so_far(records: list[dict]) -> tuple[dict[int, float], set[int]]:
    """(step -> best GFLOP/s so far, the steps that end a round) from the records alone (gemm_64)."""
    best, curve, ends = 0.0, {}, set()
    for step, record in enumerate(records, start=1):
        costs = record["result"]["costs"]
        if record["result"].get("error") is None and costs:
            best = max(best, GEMM_64_FLOPS / sorted(costs)[len(costs) // 2] / 1e9)
        curve[step] = best
        if step == len(records) or records[step]["round"] != record["round"]:
            ends.add(step)
    return curve, ends


def assert_curve_complete(run_dir: Path, uri: str, run_id: str | None = None) -> None:
    """Every round's end has its point (a stop mid-round adds one where it stopped), each the best so far."""
    client, found = mlflow_run(run_dir, uri, run_id)
    logged = {m.step: m.value for m in client.get_metric_history(found.info.run_id, "best/gflops_so_far")}
    curve, ends = best_so_far(rows(run_dir))
    assert ends <= set(logged), f"curve points missing at steps {sorted(ends - set(logged))}"
    assert all(abs(value - curve[step]) <= 1e-6 * curve[step] for step, value in logged.items())


def assert_round_metrics_complete(run_dir: Path, uri: str) -> None:
    """Metrics that only the live run knows (round/*, search/*) are in the spool when the store was
    out, and `tuning.tools.sync` replays them: every round has them."""
    client, found = mlflow_run(run_dir, uri)
    _, ends = best_so_far(rows(run_dir))
    for key in ("round/batch", "round/search_s", "time/search_s"):
        assert {m.step for m in client.get_metric_history(found.info.run_id, key)} == ends, key


def finished_run(tmp: Path, *args: str, trials: int = 48) -> Path:
    """A finished random-search run made by `run` (run.py in a fresh process, this module's MLflow store)."""
    run_dir = tmp / "run"
    run(tmp, "search=random", "cost_model=none", f"budget.trials={trials}", f"hydra.run.dir={run_dir}", *args,
        delay=0.0)
    return run_dir


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """A finished 16-measurement run (random search), copied by the tests that only read or refuse it;
    made in this process (tunelab.tune), with the settings `start` gives a run."""
    import tunelab

    tmp = tmp_path_factory.mktemp("small")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TUNELAB_OUTPUTS", str(tmp / "outputs"))
        tunelab.tune(["hardware=synthetic", "hardware.delay_s=0.0", "model=gemm_64",
                      f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}", "tracking.experiment=faults", "tracking.retry_s=1",
                      "search=random", "cost_model=none", "budget.trials=16", f"output_dir={tmp / 'run'}"])
    return tmp / "run"


def copy_of(run_dir: Path, tmp: Path) -> Path:
    copy = tmp / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns(".tunelab.lock"))
    return copy


# ---- run identity ------------------------------------------------------------------------------
def test_a_folder_that_holds_a_run_is_refused(tmp_path, small_run):
    run_dir = copy_of(small_run, tmp_path)
    before = (run_dir / "records.jsonl").read_bytes()
    _, err = run(tmp_path, *SA, "seed=7", f"hydra.run.dir={run_dir}", code=2)
    assert "already holds a run" in err and f"resume={run_dir}" in err and "Traceback" not in err
    assert (run_dir / "records.jsonl").read_bytes() == before


def test_a_second_writer_on_a_folder_is_refused_at_once(tmp_path, small_run):
    run_dir = copy_of(small_run, tmp_path)
    with open(run_dir / ".tunelab.lock", "a") as held:  # another process is writing it
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        _, err = run(tmp_path, f"resume={run_dir}", "budget.trials=96", f"hydra.run.dir={tmp_path / 'job'}", code=2)
        assert time.monotonic() - started < 30
    assert "being written by another tunelab process" in err and "Traceback" not in err
    assert len(rows(run_dir)) == 16
    assert not (tmp_path / "job").exists()  # the folder Hydra made for the refused job is gone


@pytest.mark.slow
def test_two_resumes_at_once_one_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    run(tmp_path, "search=random", "cost_model=none", "budget.trials=48", f"hydra.run.dir={run_dir}", delay=0.05)
    first = start(tmp_path, f"resume={run_dir}", "budget.trials=400", f"hydra.run.dir={tmp_path / 'r1'}")
    wait_for_records(run_dir / "records.jsonl", 60, first)
    _, err = run(tmp_path, f"resume={run_dir}", "budget.trials=400", f"hydra.run.dir={tmp_path / 'r2'}", code=2)
    assert "being written by another tunelab process" in err
    done(first)
    assert len(rows(run_dir)) == 400 and len({tuple(r["config"]) for r in rows(run_dir)}) == 400


def test_resume_into_its_own_folder_keeps_the_runs_methods(tmp_path, small_run):
    """Hydra rewrites .hydra/ of `hydra.run.dir=DIR` before the job: the names come from run.yaml."""
    run_dir = copy_of(small_run, tmp_path)
    run(tmp_path, f"resume={run_dir}", "budget.trials=32", f"hydra.run.dir={run_dir}")
    assert len(rows(run_dir)) == 32 and {r["method"] for r in rows(run_dir)} == {"random+greedy"}
    _, found = mlflow_run(run_dir, f"sqlite:///{small_run.parent / 'mlflow.db'}")
    assert found.data.tags["choice.search"] == "random" and found.data.tags["choice.cost_model"] == "none"


def test_a_run_folder_names_the_commit_it_started_at_and_a_forged_one_is_ignored(tmp_path, small_run):
    """run.yaml keeps the commit, so a copy of the run on another machine (a run folder carried over,
    `tuning.tools.sync`) still names the code that made it; the file is untrusted."""
    from tuning.engine.run_folder import saved_commit

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    if not head:
        pytest.skip("not a git checkout: no commit to name")
    assert saved_commit(small_run) == head and len(head) == 40
    assert mlflow_run(small_run, f"sqlite:///{small_run.parent / 'mlflow.db'}")[1].data.tags[
        "mlflow.source.git.commit"] == head
    for forged in ("choices: {}\ncommit: [1]\n", "choices: {}\ncommit: 'HEAD; rm -rf /'\n", "- a list\n", "{{{"):
        (tmp_path / "run.yaml").write_text(forged)
        assert saved_commit(tmp_path) is None
    assert saved_commit(tmp_path / "missing") is None


@pytest.mark.slow
def test_a_moved_folder_names_its_missing_store_and_takes_another(tmp_path):
    run_dir = finished_run(tmp_path)
    moved_store = tmp_path / "elsewhere" / "mlflow.db"
    moved_store.parent.mkdir()
    (tmp_path / "mlflow.db").rename(moved_store)
    _, err = run(tmp_path, f"resume={run_dir}", "budget.trials=64", code=2)
    assert "tracking.uri" in err and "does not exist" in err and not (tmp_path / "mlflow.db").exists()
    run(tmp_path, f"resume={run_dir}", "budget.trials=64", f"tracking.uri=sqlite:///{moved_store}")
    assert not (tmp_path / "mlflow.db").exists(), "a stray empty store was created"
    assert len(rows(run_dir)) == 64


# ---- untrusted run folders ----------------------------------------------------------------------
CRAFTED = {
    "search._target_": lambda cfg, marker: cfg["search"].update({"_target_": "subprocess.getoutput",
                                                                  "cmd": f"touch {marker}"}),
    "hardware.backend._target_": lambda cfg, marker: cfg["hardware"].update(
        {"backend": {"_target_": "os.system", "command": f"touch {marker}"}}),
    "sampler._args_": lambda cfg, marker: cfg["sampler"].update({"_args_": [f"touch {marker}"]}),
    "model.description": lambda cfg, marker: cfg["model"].update({"description": "${oc.env:HOME}"}),
}


CASES = [("resume", key) for key in CRAFTED] + [("apply", "search._target_"), ("sync", "hardware.backend._target_")]


@pytest.mark.parametrize("command,key", CASES)
def test_a_crafted_run_folder_runs_nothing(tmp_path, small_run, command, key):
    run_dir, marker = copy_of(small_run, tmp_path), tmp_path / "executed"
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    CRAFTED[key](cfg, marker)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    if command == "resume":
        _, err = run(tmp_path, f"resume={run_dir}", "budget.trials=32", f"hydra.run.dir={tmp_path / 'job'}", code=2)
        assert not (tmp_path / "job").exists()
    else:
        _, err = module(tmp_path, f"tuning.tools.{command}", str(run_dir), code=2)
    assert key in err and "Traceback" not in err
    assert not marker.exists()
    assert len(rows(run_dir)) == 16


# ---- durable tracking ---------------------------------------------------------------------------
def test_unreachable_tracking_uri_fails_in_seconds_before_any_work(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    _, err = run(tmp_path, f"hydra.run.dir={tmp_path / 'run'}", uri=f"http://127.0.0.1:{port}", code=2)
    assert time.monotonic() - started < 30
    assert "tracking.uri" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "records.jsonl").exists()


def interrupt_and_resume(tmp: Path, sig: int, at: int, trials: int = 256) -> None:
    """Signal the run after `at` records; then what survives is checked and the run resumed to `trials`."""
    run_dir, uri = tmp / "run", f"sqlite:///{tmp / 'mlflow.db'}"
    proc = start(tmp, *SA, f"budget.trials={trials}", f"hydra.run.dir={run_dir}")
    wait_for_records(run_dir / "records.jsonl", at, proc)
    proc.send_signal(sig)
    proc.communicate(timeout=120)
    intact = (run_dir / "records.jsonl").read_bytes()
    intact = intact[: intact.rfind(b"\n") + 1]
    _, found = mlflow_run(run_dir, uri)
    if sig == signal.SIGKILL:
        assert found.info.status == "RUNNING"  # nothing can catch kill -9: sync or resume repair it
        module(tmp, "tuning.tools.sync", str(run_dir))
        assert mlflow_run(run_dir, uri)[1].info.status == "KILLED"
    else:
        assert proc.returncode == 128 + sig and found.info.status == "KILLED"
        assert (run_dir / "status").read_text().strip() == "KILLED"
    assert_curve_complete(run_dir, uri)
    run(tmp, f"resume={run_dir}", f"budget.trials={trials}")
    check_resumed(run_dir / "records.jsonl", intact, trials)
    assert mlflow_run(run_dir, uri)[1].info.status == "FINISHED"
    assert_curve_complete(run_dir, uri)


@pytest.mark.parametrize("sig,at", [(signal.SIGTERM, 70),
                                    pytest.param(signal.SIGKILL, 150, marks=pytest.mark.slow)])
def test_signal_then_resume_keeps_records_exact_and_the_curve_complete(tmp_path, sig, at):
    interrupt_and_resume(tmp_path, sig, at)


@pytest.mark.slow
def test_twenty_seeded_kills_then_resume(tmp_path):
    rng = random.Random(15)
    for i in range(20):
        sig = (signal.SIGKILL, signal.SIGTERM)[i % 2]
        interrupt_and_resume(tmp_path / str(i), sig, rng.randrange(1, 250))


def hold_sqlite_lock(db: Path, seconds: float, locked: threading.Event) -> threading.Thread:
    def hold():
        connection = sqlite3.connect(db, timeout=60)
        connection.execute("BEGIN EXCLUSIVE")
        locked.set()
        time.sleep(seconds)
        connection.rollback()
        connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    return thread


def store_outage_then_sync(tmp: Path, lock_s: float, trials: int) -> None:
    run_dir, db = tmp / "run", tmp / "mlflow.db"
    uri = f"sqlite:///{db}"
    proc = start(tmp, *SA, f"budget.trials={trials}", f"hydra.run.dir={run_dir}", delay=0.02)
    wait_for_records(run_dir / "records.jsonl", 20, proc)
    locked = threading.Event()
    holder = hold_sqlite_lock(db, lock_s, locked)
    locked.wait(30)
    _, err = done(proc)
    holder.join()
    assert "tunelab sync" in err and len(rows(run_dir)) == trials
    assert (run_dir / "status").read_text().strip() == "FINISHED"
    out, _ = module(tmp, "tuning.tools.sync", str(run_dir))
    assert "status FINISHED" in out
    client, found = mlflow_run(run_dir, uri)
    assert found.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(found.info.run_id)} >= {"records.jsonl", "config.yaml", "summary.txt"}
    assert "best/final_gflops" in found.data.metrics
    assert_curve_complete(run_dir, uri)
    assert_round_metrics_complete(run_dir, uri)


@pytest.mark.slow
def test_a_locked_store_never_fails_a_run_and_sync_restores_it(tmp_path):
    store_outage_then_sync(tmp_path, lock_s=24, trials=192)  # MLflow waits 20 s on a lock itself


@pytest.mark.slow
def test_a_sixty_second_store_lock(tmp_path):
    store_outage_then_sync(tmp_path, lock_s=60, trials=640)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mlflow_server(tmp: Path, port: int) -> subprocess.Popen:
    server = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1",
                               "--port", str(port), "--backend-store-uri", f"sqlite:///{tmp / 'server.db'}",
                               "--default-artifact-root", str(tmp / "artifacts"), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    import requests

    stop = time.monotonic() + 120
    while time.monotonic() < stop:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                return server
        except requests.RequestException:
            time.sleep(0.5)
    os.killpg(server.pid, signal.SIGKILL)
    raise AssertionError("mlflow server did not start")


@pytest.mark.slow
def test_a_dead_mlflow_server_loses_no_metric_after_sync(tmp_path):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = mlflow_server(tmp_path, port)
    run_dir = tmp_path / "run"
    proc = start(tmp_path, *SA, "budget.trials=256", f"hydra.run.dir={run_dir}", uri=uri, delay=0.02)
    try:
        wait_for_records(run_dir / "records.jsonl", 70, proc)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    _, err = done(proc)
    assert f"tunelab sync {run_dir} --tracking-uri {uri}" in err and len(rows(run_dir)) == 256
    server = mlflow_server(tmp_path, port)
    try:  # as the run's last line says: sync names the server (a folder alone never sends to one)
        module(tmp_path, "tuning.tools.sync", str(run_dir), "--tracking-uri", uri)
        assert mlflow_run(run_dir, uri)[1].info.status == "FINISHED"
        assert_curve_complete(run_dir, uri)
        assert_round_metrics_complete(run_dir, uri)
        assert "best/final_gflops" in mlflow_run(run_dir, uri)[1].data.metrics
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_sync_refuses_a_run_that_is_still_going(tmp_path, small_run):
    run_dir = copy_of(small_run, tmp_path)
    with open(run_dir / ".tunelab.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        _, err = module(tmp_path, "tuning.tools.sync", str(run_dir), code=2)
    assert "being written by another tunelab process" in err


@pytest.mark.slow
def test_sync_copies_a_run_into_another_store(tmp_path):
    run_dir = finished_run(tmp_path)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    module(tmp_path, "tuning.tools.sync", str(run_dir), "--tracking-uri", other)
    client = MlflowClient(tracking_uri=other)
    [copied] = client.search_runs([client.get_experiment_by_name("faults").experiment_id])
    assert copied.info.status == "FINISHED"
    assert_curve_complete(run_dir, other, copied.info.run_id)
    own = f"sqlite:///{tmp_path / 'mlflow.db'}"
    original = mlflow_run(run_dir, own)[1]
    assert original.info.status == "FINISHED", "the folder still names its own store's run"
    hardware = json.loads((run_dir / "hardware.json").read_text())
    assert "hardware" in hardware  # the copy names what measured it, as the original does (compare's host note)
    for key in (*hardware, "experiment", "model", "seed", "choice.search", "mlflow.source.git.commit"):
        assert copied.data.tags[key] == original.data.tags[key], key


def test_a_corrupt_records_line_is_named_before_any_work(tmp_path, small_run):
    run_dir = copy_of(small_run, tmp_path)
    lines = (run_dir / "records.jsonl").read_text().splitlines(keepends=True)
    lines[5] = '{"task": "gemm_64", "broken\n'
    (run_dir / "records.jsonl").write_text("".join(lines))
    _, err = run(tmp_path, f"resume={run_dir}", "budget.trials=64", code=2)
    assert f"{run_dir / 'records.jsonl'}:6" in err and "Traceback" not in err
    assert (run_dir / "records.jsonl").read_text() == "".join(lines)


# ---- the parts, without a run ------------------------------------------------------------------
def test_a_tracker_whose_store_fails_goes_offline_once_and_never_raises(tmp_path, capsys):
    from tuning.tracking.mlflow_tracker import MlflowTracker

    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "offline", retry_s=0.3)
    assert tracker.start("run", {"a": 1}, {"t": "x"})
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise sqlite3.OperationalError("database is locked")

    tracker._client.log_batch = broken
    tracker.log_metrics({"tuning/best_gflops": 1.0}, step=1)
    tracker.flush()
    assert tracker.offline and "database is locked" in tracker.offline and len(calls) >= 2
    tried = len(calls)
    tracker.log_metrics({"tuning/best_gflops": 2.0}, step=2)
    tracker.flush()
    tracker.set_tags({"b": "c"})
    tracker.end("FINISHED")  # nothing raised, nothing more tried
    assert len(calls) == tried
    assert capsys.readouterr().err.count("tunelab sync") == 1


def test_only_registered_classes_may_be_named_by_a_saved_config(tmp_path):
    from tuning.config import ConfigError
    from tuning.engine.run_folder import is_registered_target, load_config

    assert is_registered_target("tuning.search.sa.SimulatedAnnealing") or is_registered_target(
        "tuning.hardware.synthetic.SyntheticHardware")
    assert not is_registered_target("os.system") and not is_registered_target("tuning.core.records.RecordLog")
    assert not is_registered_target("antigravity.geohash") and "antigravity" not in sys.modules
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump({"hardware": {"_target_": "tuning.hardware.replay.ReplayHardware",
                                                  "backend": {"_target_": "tuning.hardware.synthetic.SyntheticHardware"}}}))
    assert load_config(saved, "resume").hardware.backend._target_.endswith("SyntheticHardware")
    saved.write_text("- not\n- a mapping\n")
    with pytest.raises(ConfigError, match=r"resume: .* \(expected a mapping\)"):
        load_config(saved, "resume")


@pytest.mark.parametrize("text, says", [
    ("seed: !!timestamp 'x'\n", "a value its tag cannot construct"),  # PyYAML's constructor fails with AttributeError
    ("seed: !!float 'x'\n", "a value its tag cannot construct"),
    ("hardware:\n  store:\n" + "".join(f"    k{i}: {i}\n" for i in range(10_001)), "more than 10000 values"),
])
def test_a_saved_config_yaml_cannot_construct_or_that_is_too_wide_is_refused_naming_the_file(tmp_path, text, says):
    from tuning.config import ConfigError
    from tuning.engine.run_folder import load_config

    saved = tmp_path / "config.yaml"
    saved.write_text(text)
    with pytest.raises(ConfigError, match=f"resume: cannot read {saved} .*{says}"):
        load_config(saved, "resume")
