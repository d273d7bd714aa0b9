"""hardware=replay (tuning/hardware/replay.py) forwards the whole Hardware contract to its backend.

Every public member the Hardware class declares reaches the backend, except what a replay answers
itself (its measurements and its simulated clock); so whole models tune on a replay, and on the
memoised real run (hardware.store + hardware.reuse), with their end-to-end timing measured on the
backend. Fast tests use a synthetic backend that also tunes "whole models" (two GEMM kernels); the
slow one runs the real commands on tiny_cnn.
"""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from abc import update_abstractmethods
from pathlib import Path

import pytest

from configs import as_job
from tuning.core.task import gemm_task
from tuning.engine.whole_model import e2e_line
from tuning.hardware.base import Hardware
from tuning.hardware.replay import ReplayHardware, with_store
from tuning.hardware.synthetic import SyntheticHardware

REPO = Path(__file__).resolve().parents[1]
REPLAYED = {"measure", "simulated_clock"}  # a replay's own answers, not its backend's


def contract() -> dict:
    """The Hardware contract's public members (its class-level config checks aside)."""
    return {name: value for name, value in vars(Hardware).items()
            if not name.startswith("_") and not isinstance(value, (classmethod, staticmethod))}


class Recording(Hardware):
    """A backend that writes down each contract call it gets and has a value of its own for each
    contract attribute."""

    def __init__(self):
        self.calls = []


def _recorded(name):
    def method(self, *args):
        self.calls.append((name, args))
        return {"answered_by": "backend"}
    return method


for _name, _value in contract().items():
    setattr(Recording, _name, _recorded(_name) if callable(_value) else ("the backend's", _name))
update_abstractmethods(Recording)


def required_args(name) -> tuple:
    parameters = list(inspect.signature(getattr(Hardware, name)).parameters.values())[1:]  # self
    return tuple(f"{name}.{p.name}" for p in parameters if p.default is inspect.Parameter.empty)


def test_the_replay_answers_only_measurements_itself():
    assert REPLAYED <= set(contract()), "a name the replay answers itself left the contract: update REPLAYED"


@pytest.mark.parametrize("name", sorted(set(contract()) - REPLAYED))
def test_every_other_contract_member_reaches_the_backend(tmp_path, name):
    backend = Recording()
    replay = ReplayHardware(backend, str(tmp_path / "store.sqlite"))
    if not callable(contract()[name]):
        assert getattr(replay, name) == ("the backend's", name)
        return
    args = required_args(name)
    answer = getattr(replay, name)(*args)
    assert any(called == name and got[:len(args)] == args for called, got in backend.calls), \
        f"ReplayHardware.{name} never reached its backend"
    assert answer is None or answer["answered_by"] == "backend"  # describe adds the replay's own keys


def test_the_class_claims_every_kind_so_validation_reads_the_backend():
    assert {"network", "onnx"} <= set(ReplayHardware.model_kinds)
    assert ReplayHardware.schedules_programs  # tuning/config.py then looks at hardware.backend
    replay = ReplayHardware(SyntheticHardware(), "store.sqlite")
    assert replay.model_kinds == SyntheticHardware.model_kinds
    assert replay.schedules_programs is False
    assert replay.simulated_clock is True and not with_store(SyntheticHardware(store="s", reuse=True)).simulated_clock


# ---- a whole model, in process --------------------------------------------------------------------
KERNELS = (gemm_task("dense_a", 16, 16, 32), gemm_task("dense_b", 32, 16, 16))
E2E = {"latency_ms": {"tuned": 1.25, "untuned": 5.0, "torch": 2.5}, "match": True, "reference": "torch eager",
       "max_abs_diff": 1e-6, "num_threads": 1}
EVALUATED: list = []


class WholeModels(SyntheticHardware):
    """The synthetic backend, tuning a 'whole model' of two GEMM kernels and timing it at E2E."""

    model_kinds = (*SyntheticHardware.model_kinds, "network")

    def model_tasks(self, model_cfg, seed):
        return list(KERNELS)

    def evaluate_model(self, model_cfg, seed, database_dir, out_dir, timing):
        EVALUATED.append((model_cfg["name"], Path(database_dir)))
        return E2E


BACKEND = f"{{_target_:{WholeModels.__module__}.WholeModels}}"
QUICK = ("model=tiny_cnn", "tracking=none", "search=random", "cost_model=none", "budget.trials=16",
         "budget.plan_size=8")


def run_whole_model(compose_cfg, monkeypatch, *overrides) -> Path:
    from tuning.engine import run

    EVALUATED.clear()
    cfg = compose_cfg(*QUICK, *overrides)
    out_dir = Path(cfg.output_dir)
    declare_whole_models(monkeypatch, out_dir.parent / "own_conf")
    run.main(as_job(cfg, monkeypatch))
    return out_dir


def declare_whole_models(monkeypatch, conf_dir: Path) -> None:
    """WholeModels registered as a user registers a method of their own: a config directory naming it."""
    (conf_dir / "hardware").mkdir(parents=True, exist_ok=True)
    (conf_dir / "hardware" / "whole_models.yaml").write_text(f"_target_: {WholeModels.__module__}.WholeModels\n")
    monkeypatch.setenv("TUNELAB_CONF_DIRS", str(conf_dir))


def assert_timed_on_the_backend(out_dir: Path, capsys) -> None:
    assert EVALUATED == [("tiny_cnn", out_dir / "database")]
    assert e2e_line(E2E) in (out_dir / "summary.txt").read_text()
    assert e2e_line(E2E) in capsys.readouterr().out
    assert json.loads((out_dir / "e2e.json").read_text()) == E2E
    records = [json.loads(line) for line in (out_dir / "records.jsonl").read_text().splitlines()]
    assert {r["task"] for r in records} == {"dense_a", "dense_b"}


def test_a_whole_model_tunes_on_replay(compose_cfg, monkeypatch, tmp_path, capsys):
    out_dir = run_whole_model(compose_cfg, monkeypatch, "hardware=replay", f"hardware.store={tmp_path / 'S.sqlite'}",
                              "hardware.create=true", "~hardware.backend", f"+hardware.backend={BACKEND}")
    assert_timed_on_the_backend(out_dir, capsys)


def test_a_whole_model_tunes_on_the_memoised_real_run(compose_cfg, monkeypatch, tmp_path, capsys):
    out_dir = run_whole_model(compose_cfg, monkeypatch, "hardware=synthetic",
                              f"hardware._target_={WholeModels.__module__}.WholeModels",
                              f"hardware.store={tmp_path / 'S.sqlite'}", "hardware.reuse=true")
    assert_timed_on_the_backend(out_dir, capsys)


# ---- the real commands --------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.tvm
@pytest.mark.parametrize("overrides", [("hardware=replay", "hardware.create=true"), ("hardware.reuse=true",)],
                         ids=["replay", "reuse"])
def test_run_py_tunes_tiny_cnn_on_a_store(tmp_path, overrides):
    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp_path / "outputs")}
    command = [sys.executable, "run.py", "model=tiny_cnn", f"hardware.store={tmp_path / 'S.sqlite'}",
               "budget.trials=24", f"output_dir={tmp_path / 'run'}", *overrides]
    done = subprocess.run(command, cwd=REPO, env=env, text=True, capture_output=True, timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "end to end: tuned" in done.stdout
