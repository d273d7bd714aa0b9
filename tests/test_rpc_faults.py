"""Faults of remote devices, on real TVM RPC: a tracker and two lab servers, each in its own network
namespace (tuning/hardware/rpc_hosts.py; loopback with SIGSTOP for the cut where namespaces cannot be
made).

Mid-run one server is killed and the other's link is cut for 10 s: the run still measures its whole
budget, the candidates in flight are `device_lost` records, no config is measured twice, every
record names its device, and the cut device rejoins once its link is back. Killing the host process
mid-run and `resume=` continue as for local runs, on the same servers.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest

from helpers import wait_for_records
from tuning.hardware.rpc_hosts import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.tvm]
REPO = Path(__file__).resolve().parents[1]
KEY = "board"
FAST = ["evaluator.repeat=3", "evaluator.min_repeat_ms=20", "evaluator.final_repeat=3", "tracking=none",
        "hardware.num_threads=1", "hardware/runner=rpc", f"hardware.runner.key={KEY}", "model=gemm_64"]


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def runs():
    """Run processes a test started: killed with their workers when it ends, passed or not."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def start_run(run_dir: Path, cluster: Cluster, *overrides: str, runs: list | None = None) -> subprocess.Popen:
    command = [sys.executable, "run.py", *FAST, f"hardware.runner.tracker={cluster.tracker}",
               f"hydra.run.dir={run_dir}", *overrides]
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    if runs is not None:
        runs.append(proc)
    return proc


def output(run_dir: Path) -> str:
    return (run_dir.parent / f"{run_dir.name}.log").read_text()


def resume(run_dir: Path) -> list[dict]:
    """`resume=` run to its end; the records then."""
    done = subprocess.run([sys.executable, "run.py", f"resume={run_dir}"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return records(run_dir)


def wait_for_run(run_dir: Path, count: int, proc: subprocess.Popen) -> None:
    """wait_for_records with the patience RPC rounds need (300 s), the run's log in the message if it ends first."""
    wait_for_records(run_dir / "records.jsonl", count, proc, timeout=300, poll_s=0.1,
                     output=lambda: output(run_dir)[-3000:])


def test_a_killed_server_and_a_cut_link_cost_only_the_candidates_in_flight(tmp_path, runs):
    budget = 48
    with Cluster(KEY, servers=2, namespaces=True, log_dir=tmp_path) as cluster:
        if cluster.fallback:
            warnings.warn(f"RPC fault test: {cluster.fallback}; the link cut is a SIGSTOP of the server")
        run_dir = tmp_path / "run"
        proc = start_run(run_dir, cluster, f"budget.trials={budget}", "budget.plan_size=8",
                         "hardware.runner.devices=2", "evaluator.timeout_s=4", "hardware.runner.upload_timeout_s=2",
                         "hardware.runner.wait_for_devices_s=120", runs=runs)  # silent for 6 s: lost, then back
        wait_for_run(run_dir, 10, proc)
        cluster.kill(0)
        cluster.cut(1)
        cut_at = time.time()
        time.sleep(10)
        cluster.restore(1)
        proc.wait(timeout=600)
    assert proc.returncode == 0, output(run_dir)[-3000:]
    written = records(run_dir)
    results = [r["result"] for r in written]
    assert len(written) == budget  # the whole budget, on the devices left
    configs = [tuple(r["config"]) for r in written]
    assert len(set(configs)) == len(configs), "a config was measured twice"
    assert all(r.get("device", "").startswith(f"{KEY}@") for r in results), "a record names no device"
    errors = Counter(r["error"] for r in results if r["error"])
    assert set(errors) <= {"device_lost"}, errors  # nothing a device did is blamed on a kernel
    assert errors["device_lost"] >= 2  # one candidate in flight on each
    lost = {r["device"] for r in results if r["error"]}
    assert len(lost) == 2, lost
    rejoined = {r["result"]["device"] for r in written if r["time"] > cut_at + 10 and r["result"]["error"] is None}
    assert len(rejoined) == 1, "the cut device did not come back (or the killed one did)"
    assert "lost device" in output(run_dir)


def test_killing_the_host_mid_run_then_resume_measures_the_rest_on_the_servers(tmp_path, runs):
    budget = 24
    with Cluster(KEY, servers=2, log_dir=tmp_path) as cluster:
        run_dir = tmp_path / "run"
        proc = start_run(run_dir, cluster, f"budget.trials={budget}", "budget.plan_size=8", "hardware.runner.devices=2",
                         runs=runs)
        wait_for_run(run_dir, 10, proc)
        os.killpg(proc.pid, signal.SIGKILL)  # the host process and its workers, as a power cut would
        proc.wait(timeout=30)
        before = records(run_dir)
        assert 10 <= len(before) < budget
        cluster.wait_registered(2, timeout_s=60)  # the dead client's sessions end; the servers are free again
        after = resume(run_dir)
    assert len(after) == budget and after[:len(before)] == before
    configs = [tuple(r["config"]) for r in after]
    assert len(set(configs)) == len(configs)
    assert all(r["result"]["error"] is None and r["result"]["device"].startswith(f"{KEY}@") for r in after)


def test_a_tracker_restart_mid_run_is_survived_and_restarted_servers_rejoin(tmp_path, runs):
    budget = 32
    with Cluster(KEY, servers=2, log_dir=tmp_path) as cluster:
        run_dir = tmp_path / "run"
        proc = start_run(run_dir, cluster, f"budget.trials={budget}", "budget.plan_size=8", "hardware.runner.devices=2",
                         runs=runs)
        wait_for_run(run_dir, 4, proc)
        cluster.stop_tracker()
        cluster.kill(0)
        cluster.kill(1)  # no device left, and no tracker to ask for one: the run waits and asks again
        time.sleep(3)
        cluster.start_tracker()
        cluster.restart(0)
        cluster.restart(1)
        back_at = time.time()
        proc.wait(timeout=600)
    assert proc.returncode == 0, output(run_dir)[-3000:]
    written = records(run_dir)
    assert len(written) == budget and {r["result"]["error"] for r in written} <= {None, "device_lost"}
    later = {r["result"]["device"] for r in written if r["time"] > back_at and r["result"]["error"] is None}
    assert len(later) == 2, later  # both servers, back through the new tracker


def test_with_every_device_gone_the_run_stops_saying_how_to_resume_and_resume_finishes(tmp_path, runs):
    budget = 24
    with Cluster(KEY, servers=1, log_dir=tmp_path) as cluster:
        run_dir = tmp_path / "run"
        proc = start_run(run_dir, cluster, f"budget.trials={budget}", "budget.plan_size=8",
                         "hardware.runner.wait_for_devices_s=3", runs=runs)
        wait_for_run(run_dir, 4, proc)
        cluster.kill(0)
        assert proc.wait(timeout=120) == 1
        said = output(run_dir)
        assert "hardware.runner.key=board: no device of the key" in said and f"tunelab run resume={run_dir}" in said, said[-2000:]
        before = records(run_dir)
        assert 4 <= len(before) < budget
        assert all(r["result"]["error"] in (None, "device_lost") for r in before)
        cluster.restart(0)
        cluster.wait_registered(1)
        after = resume(run_dir)
    assert len(after) == budget and after[:len(before)] == before
    assert len({tuple(r["config"]) for r in after}) == budget
