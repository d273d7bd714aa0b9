"""The screening cut (evaluator=fixed's `screen`, MeasureSpec.screen_above_s): during tuning a candidate
whose one run takes longer than `screen` x the task's best so far is not timed further. On the synthetic
hardware, which screens as the run worker does (tuning/hardware/tvm_worker.py `screening`)."""
from __future__ import annotations

import json

import pytest

from helpers import components
from tuning.core.records import MeasureResult, Record
from tuning.core.task import gemm_task
from tuning.engine.callbacks import StoreWriter
from tuning.engine.loop import RunInfo, tune_task
from tuning.evaluator.fixed import FixedEvaluator
from tuning.hardware.synthetic import SyntheticHardware
from tuning.testing.evaluator_contract import configs

TASK = gemm_task("g", 128, 128, 128)


def test_only_the_candidates_slower_than_the_cut_are_screened_and_they_read_once():
    hardware = SyntheticHardware()
    batch = configs(hardware, 24)
    full = FixedEvaluator(repeat=5, min_repeat_ms=0).measure(hardware, TASK, batch)
    best = min(r.cost for r in full if r.ok)
    screened = FixedEvaluator(repeat=5, min_repeat_ms=0, screen=2.0).measure_against(hardware, TASK, batch, best)
    for before, after in zip(full, screened):
        if not before.ok:
            assert not after.ok
        elif before.cost > 2.0 * best:
            assert after.screened and after.costs == [pytest.approx(before.cost)] and after.message.startswith("screened:")
        else:
            assert not after.screened and after.costs == before.costs
    assert any(r.screened for r in screened) and any(r.ok and not r.screened for r in screened)
    off = FixedEvaluator(repeat=5, min_repeat_ms=0).measure_against(hardware, TASK, batch, best)
    assert [r.costs for r in off] == [r.costs for r in full]  # screen null: measure as ever
    first = FixedEvaluator(repeat=5, min_repeat_ms=0, screen=2.0).measure_against(hardware, TASK, batch, None)
    assert not any(r.screened for r in first)  # nothing to cut against before a first valid reading


def test_a_tuned_task_keeps_screened_records_and_reports_a_best_read_in_full(tmp_path):
    parts = components(search="random", sampler="all", cost_model="none")
    parts.evaluator = FixedEvaluator(repeat=5, min_repeat_ms=0, screen=1.5)
    outcome = tune_task(TASK, parts, RunInfo(seed=0, out_dir=tmp_path, method="test", trials=48, plan_size=8))
    screened = [r for r in outcome.records if r.result.screened]
    assert screened and all(len(r.result.costs) == 1 for r in screened)
    assert outcome.best_config not in {tuple(r.config) for r in screened}
    assert len(outcome.final_costs) == parts.evaluator.final_repeat  # the finalists are never screened
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert sum('"screened": true' in line for line in lines) == len(screened)
    assert all("screened" not in json.loads(line)["result"] for line in lines
               if '"screened": true' not in line)  # a full reading's record is written as before
    assert [Record.from_json(line).result.screened for line in lines] == [r.result.screened for r in outcome.records]


def test_a_screened_reading_never_enters_a_measurement_store(monkeypatch):
    added = []

    class Table:
        def add(self, config, result, source):
            added.append(result)

    writer = StoreWriter(store=None, hardware=None, spec=None)
    monkeypatch.setattr(writer, "table", lambda task, space: Table())
    tuner = type("Tuner", (), {"task": TASK, "space": None})()
    writer._write(tuner, (0,), MeasureResult(costs=[1e-3], screened=True), "run")
    writer._write(tuner, (1,), MeasureResult(costs=[1e-3, 1e-3]), "run")
    assert [r.screened for r in added] == [False]


def test_a_cut_below_the_best_itself_is_refused_naming_the_key(compose_cfg):
    from tuning.config import ConfigError
    from tuning.engine.validate import validate

    with pytest.raises(ConfigError, match=r"(?m)^  evaluator.screen: "):
        validate(compose_cfg("evaluator.screen=0.5"))
    validate(compose_cfg("evaluator.screen=3.0"))
