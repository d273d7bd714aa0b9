"""hardware/runner=rpc against real TVM RPC: a tracker and two lab servers on loopback.

A real tuning run spreads gemm_64's candidates over both servers and every record names the server
that timed it; the store keys the readings by the remote device's identity; bad settings (no
tracker, an unknown key, a target the device cannot run) fail before any work, in seconds, naming
the key; TVM's stock server (which says nothing of itself) works too, under a name the runner gives
it (slow, as are a whole model and session renewal). Faults (a server killed, a link cut, the host process killed) are tests/test_rpc_faults.py's.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import tunelab
from tuning.config import ConfigError
from tuning.hardware.rpc_hosts import Cluster
from tuning.hardware.runners.rpc import RPCRunner, free_servers, missing_extensions, registered_keys, same_device_kind

pytestmark = pytest.mark.tvm
KEY = "loopback"
FAST = ["evaluator.repeat=3", "evaluator.min_repeat_ms=10", "evaluator.final_repeat=3", "tracking=none",
        "hardware.num_threads=1", "hardware/runner=rpc", f"hardware.runner.key={KEY}"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(KEY, servers=2, log_dir=tmp_path_factory.mktemp("rpc-logs")) as started:
        yield started


def job(tmp_path: Path, cluster, *overrides: str, model: str = "gemm_64") -> list[str]:
    return [f"model={model}", f"output_dir={tmp_path / 'run'}", f"hardware.runner.tracker={cluster.tracker}",
            *FAST, *overrides]


def test_a_remote_run_spreads_a_batch_over_both_servers_and_names_them(tmp_path, cluster):
    store = tmp_path / "store.sqlite"
    outcome = tunelab.tune(job(tmp_path, cluster, "budget.trials=4", "budget.plan_size=4",
                               "hardware.runner.devices=2", f"hardware.store={store}"))
    results = [record.result for record in outcome.records["gemm_64"]]
    assert len(results) == 4 and all(r.ok for r in results), [r.message for r in results if not r.ok]
    servers = {f"{KEY}@127.0.0.1:{server['addr'][1]}" for server in cluster.summary()["server_info"]}
    assert {r.device for r in results} == servers  # both timed, each record names its server
    assert all(r.gauge_s and r.gauge_s > 0 for r in results)  # the drift gauge, read on each device
    assert all(r.run_s < 10 for r in results)
    import sqlite3

    with sqlite3.connect(store) as opened:  # keyed by the remote device, not this host
        descriptions = [json.loads(row[0]) for row in opened.execute("SELECT description FROM hardware")]
    assert [(d["runner"], d["rpc_key"], d["device_threads"]) for d in descriptions] == [("rpc", KEY, "1")]
    assert "unknown" not in descriptions[0]["cpu_model"]


@pytest.mark.slow
def test_a_whole_model_is_tuned_then_applied_and_timed_on_a_server(tmp_path, cluster):
    outcome = tunelab.tune(job(tmp_path, cluster, "budget.trials=32", "e2e.runs=5", model="tiny_cnn"))
    servers = {f"{KEY}@127.0.0.1:{server['addr'][1]}" for server in cluster.summary()["server_info"]}
    assert outcome.e2e["match"] and outcome.e2e["remote_device"] in servers
    assert set(outcome.e2e["latency_ms"]) == {"tuned", "untuned"}  # torch does not run there: not timed
    assert all(r.result.device in servers for records in outcome.records.values() for r in records)


def host_lacks_some_extension() -> str:
    """An LLVM cpu name whose extensions this host's CPU does not all have."""
    from tuning.hardware.rpc_server import _isa

    for mcpu in ("sapphirerapids", "znver4", "graniterapids"):
        if missing_extensions({"kind": "llvm", "mcpu": mcpu}, _isa()):
            return mcpu
    pytest.skip("this host's CPU has every extension the candidate targets switch on")


@pytest.mark.parametrize("override,key,says", [
    ("hardware.runner.tracker=127.0.0.1:1", "hardware.runner.tracker=127.0.0.1:1", "no RPC tracker answers"),
    ("hardware.runner.key=no-such-board", "hardware.runner.key=no-such-board", f"registered keys: {KEY}"),
    ("hardware.mcpu=LACKING", f"hardware.runner.key={KEY}", "lack"),
])
def test_bad_settings_fail_before_any_work_within_seconds_naming_the_key(tmp_path, cluster, override, key, says):
    override = override.replace("LACKING", host_lacks_some_extension()) if "LACKING" in override else override
    started = time.monotonic()
    with pytest.raises(ConfigError) as error:
        tunelab.tune(job(tmp_path, cluster, "budget.trials=4", override))
    assert time.monotonic() - started < 10
    assert str(error.value).startswith(key) and says in str(error.value), str(error.value)
    assert not (tmp_path / "run" / "records.jsonl").exists()
    cluster.wait_registered(2, timeout_s=15)  # every session it opened was given back


@pytest.mark.slow  # its own tracker and server: 10-12 s
def test_a_stock_tvm_server_is_named_by_the_runner_and_its_cpu_is_unknown(tmp_path):
    from tuning.hardware.runners.base import Setup

    with Cluster("stock", servers=1, stock=True, log_dir=tmp_path) as stock:
        runner = RPCRunner(tracker=stock.tracker, key="stock", connect_timeout_s=30)
        try:
            assert runner.unreachable() is None
            assert runner.identity() == {} and runner.devices == ["stock#0"]  # a session, with no identity
            assert runner.describe()["cpu_model"] == "unknown (TVM's stock RPC server, key stock)"
            runner.attach(Setup(target={"kind": "llvm", "num-cores": 1}, device="cpu"))
            assert runner.unusable() is None  # the gauge kernel ran there
            assert runner.devices == ["stock#0"]
        finally:
            runner.close()


def test_the_runners_reading_of_the_tracker_and_of_devices():
    summary = {"queue_info": {"a": {"free": 2, "pending": 0}},
               "server_info": [{"key": "server:a", "addr": ["h", 1]}, {"key": "server:b", "addr": ["h", 2]}]}
    assert registered_keys(summary) == {"a", "b"} and free_servers(summary, "a") == 2
    assert free_servers(summary, "b") == 0 and free_servers({}, "a") == 0
    board = {"cpu_model": "X", "mcpu": "znver3", "triple": "x86_64", "num_threads": "1", "name": "one"}
    assert same_device_kind(board, {**board, "name": "two"})
    assert not same_device_kind(board, {**board, "num_threads": "2"})
    assert missing_extensions({"kind": "llvm", "mcpu": "znver3"}, None) == []  # a stock server: the gauge decides
    assert "avx2" in missing_extensions({"kind": "llvm", "mcpu": "znver3"}, ["sse3", "ssse3"])


@pytest.mark.parametrize("override,key", [
    ("hardware.runner.tracker=nohost", "hardware.runner.tracker"),
    ("hardware.runner.tracker=h:99999", "hardware.runner.tracker"),
    ("hardware.runner.key=' '", "hardware.runner.key"),
    ("hardware.runner.session_timeout_s=5", "hardware.runner.session_timeout_s"),
    ("hardware.runner.devices=0", "hardware.runner.devices"),
])
def test_bad_runner_values_are_rejected_by_validation_naming_the_key(compose_cfg, override, key):
    from tuning.engine.validate import validate

    cfg = compose_cfg("hardware/runner=rpc", override)
    with pytest.raises(ConfigError, match=rf"{key}:"):
        validate(cfg, dict(cfg.hydra.runtime.choices))


@pytest.mark.slow
def test_a_session_near_its_timeout_is_renewed_on_the_same_server(tmp_path):
    """The device process's own renewal, in this process: the old session (held open by the gauge's
    tensors too) must close, or the only server of the key could never be asked for again."""
    from tuning.hardware import rpc_worker

    with Cluster("renew", servers=1, log_dir=tmp_path) as one:
        identity = rpc_worker.connect(one.tracker, "renew", 1, 60)
        assert "seconds" in rpc_worker.gauge({"kind": "llvm", "num-cores": 1}, "cpu")
        rpc_worker._session["opened"] -= 55  # 5 s left: a 10 s candidate would outlast it
        started = time.monotonic()
        assert rpc_worker._renew_before_expiry(10) is None
        assert time.monotonic() - started < 10 and rpc_worker._session["identity"]["name"] == identity["name"]
        assert "seconds" in rpc_worker.gauge({"kind": "llvm", "num-cores": 1}, "cpu")
        rpc_worker._session.clear()
