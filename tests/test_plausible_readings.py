"""Readings outside physical bounds (tuning/core/plausible.py): skipped and counted in a store, refused in
a records file naming file and line, an `implausible` error when a backend hands one back."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from test_store import SPEC, TASK, filled, replay, sample, tune
from tuning.core.plausible import bounds_of
from tuning.core.records import MeasureResult, Record, RecordError, RecordLog
from tuning.hardware.synthetic import SyntheticHardware

# gemm_64 (524,288 FLOPs) on synthetic hardware at 100 GFLOP/s with noise 0.2: the floor is
# 524288 / (4 x 125e9) = 1.05 us; 2e-7 s is over 1 ns yet faster than the device can compute it
ABSURD = ([1e-12], [5e-324], [1e300], [-1e-3], [2e-7])


def absurd_store(path, good=24):
    """A store of `good` synthetic configs of TASK, then one config per ABSURD cost list, each its
    config's first (and only) row."""
    store, table = filled(path, count=good)
    stored = set(table.configs())
    fresh = [c for c in sample(table.space, good + 40, seed=1) if c not in stored][:len(ABSURD)]
    for config, costs in zip(fresh, ABSURD):
        store.conn.execute("INSERT INTO readings(hardware, task, space, config, decisions, costs, build_s, run_s,"
                           " measured_at, source) VALUES (?, ?, ?, ?, '{}', ?, 0, 0, 0, 'run')",
                           (*table.key, json.dumps(list(config)), json.dumps(costs)))
    return store, table, fresh


def test_absurd_store_readings_are_skipped_and_counted(tmp_path):
    store, table, absurd = absurd_store(tmp_path / "store.sqlite")
    readable = {row.config for row in store.rows(*table.key)}
    assert readable.isdisjoint(absurd) and len(readable) == 24
    assert all(table.first(config) is None for config in absurd)
    assert set(store.truths(*table.key, min_readings=1)) == {r.config for r in store.rows(*table.key) if r.ok}
    assert store.unreadable() == len(ABSURD)


def test_dataset_stats_counts_absurd_rows_as_unreadable(tmp_path, capsys):
    from tuning.tools import dataset

    store, _, _ = absurd_store(tmp_path / "store.sqlite")
    dataset.main(["stats", "--store", str(store.path)])
    assert f"{len(ABSURD)} unreadable rows skipped" in capsys.readouterr().out


def test_a_replay_of_a_store_with_absurd_rows_reports_plausible_speeds(tmp_path):
    store, table, absurd = absurd_store(tmp_path / "store.sqlite")
    hardware = replay(store.path, on_miss="error")
    hardware.restrict_to_store(SPEC)
    outcome, _ = tune(tmp_path / "run", hardware, trials=24 + len(ABSURD))
    limits = store.bounds(table.key[0], table.key[1])
    assert {tuple(r.config) for r in outcome.records if r.result.error == "not_in_store"} == set(absurd)
    assert all(limits.accepts(c) for r in outcome.records for c in r.result.costs)
    peak_gflops = 100 / (1 - 0.2)
    assert 0 < outcome.best_cost and TASK.flops / outcome.best_cost / 1e9 <= peak_gflops


def _records_file(path: Path, costs_per_line) -> Path:
    lines = []
    for index, costs in enumerate(costs_per_line):
        record = Record(TASK.name, TASK.key, [index], {}, MeasureResult(costs=[1e-3]), 0, "test", 0, index, 1.0)
        data = json.loads(record.to_json())
        data["result"]["costs"] = costs
        lines.append(json.dumps(data) + "\n")
    path.write_text("".join(lines))
    return path


@pytest.mark.parametrize("bad", [[-1e-3], [0.0], [1e-3, 1e-12], [5e-324], [1e300]])
def test_a_records_file_with_an_absurd_cost_is_refused_naming_file_and_line(tmp_path, bad):
    path = _records_file(tmp_path / "records.jsonl", [[1e-3], bad, [2e-3]])
    with pytest.raises(RecordError, match=rf"^{path}:2: not a tunelab record \(result\.costs: .*cost"):
        RecordLog(path).load()


def test_compare_leaves_out_a_run_whose_records_hold_a_negative_cost(tmp_path):
    from tuning.tools.compare import load_run

    path = _records_file(tmp_path / "records.jsonl", [[1e-3], [-1e-3]])

    def download_artifacts(run_id, name, folder):
        if name != "records.jsonl":
            raise FileNotFoundError(name)
        return shutil.copy(path, Path(folder) / name)

    client = SimpleNamespace(download_artifacts=download_artifacts)
    run = SimpleNamespace(info=SimpleNamespace(run_id="r1", run_name="r1", start_time=0),
                          data=SimpleNamespace(params={"seed": "0"}, tags={}, metrics={}))
    reason = load_run(client, run, tmp_path / "scratch", ("search",))
    assert isinstance(reason, str) and "records.jsonl:2:" in reason and "not positive" in reason


def test_resume_and_tuning_database_refuse_a_negative_cost(tmp_path):
    from tuning.config import ConfigError
    from tuning.engine.resume import check_records, prior_records

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = _records_file(run_dir / "records.jsonl", [[1e-3], [1e-3], [-2e-3]])
    with pytest.raises(ConfigError, match=rf"^resume: {path}:3: .*not positive"):
        check_records(run_dir)
    cfg = OmegaConf.create({"tuning": {"database": str(run_dir)}})
    with pytest.raises(ConfigError, match=rf"^tuning.database: {path}:3: .*not positive"):
        prior_records(cfg, [TASK], tmp_path / "new", tracker=None)


def test_a_records_reading_faster_than_the_device_allows_is_refused_once_the_task_is_known(tmp_path):
    from tuning.config import ConfigError
    from tuning.engine.resume import check_plausible, check_records, prior_records

    hardware = SyntheticHardware()
    floor = bounds_of(TASK, hardware).floor_s
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = _records_file(run_dir / "records.jsonl", [[1e-3], [floor / 2]])  # above 1 ns, below the floor
    records = check_records(run_dir)  # the absolute bounds hold
    with pytest.raises(ConfigError, match=rf"^resume: {path}:2: not a plausible reading .*faster than the hardware"):
        check_plausible(path, records, [TASK], hardware)
    cfg = OmegaConf.create({"tuning": {"database": str(run_dir)}})
    with pytest.raises(ConfigError, match=rf"^tuning.database: {path}:2: not a plausible reading"):
        prior_records(cfg, [TASK], tmp_path / "new", tracker=None, hardware=hardware)


class GlitchingClock(SyntheticHardware):
    """Synthetic hardware whose clock glitches on every third config: a reading of 1e-12 s."""

    def _measure_one(self, task, config, spec):
        result = super()._measure_one(task, config, spec)
        if result.ok and sum(config) % 3 == 0:
            return MeasureResult(costs=[1e-12] * len(result.costs), config=config)
        return result


def test_a_glitched_reading_from_the_backend_becomes_an_implausible_error(tmp_path):
    outcome, _ = tune(tmp_path / "run", GlitchingClock(), trials=24, search="random", cost_model="none")
    glitched = [r for r in outcome.records if r.result.error == "implausible"]
    assert glitched and all("1e-12" in r.result.message and not r.result.costs for r in glitched)
    assert all(c > 1e-9 for r in outcome.records for c in r.result.costs)
    assert len(RecordLog(tmp_path / "run" / "records.jsonl").load()) == 24  # the run's own file stays readable
    assert TASK.flops / outcome.best_cost / 1e9 <= 100


def test_the_peak_comes_from_the_device_description():
    from tuning.core import plausible

    cpu = {"hardware": "cpu", "device": "cpu", "target": "{'kind': 'llvm', 'mcpu': 'znver3', 'num-cores': 4}",
           "num_threads": 4}
    assert plausible.peak_flops(cpu) == 4 * 16 * 2 * 2 * 6.2e9
    assert plausible.peak_flops({"hardware": "synthetic", "peak_gflops": 50.0, "noise": 0.5}) == 100e9
    assert plausible.peak_flops({"hardware": "elsewhere"}) == plausible.FALLBACK_PEAK_FLOPS
    assert plausible.bounds(0.0, cpu) == plausible.ABSOLUTE
    assert plausible.bounds(2 * 512**3, cpu).floor_s == pytest.approx(2 * 512**3 / (4 * 4 * 16 * 2 * 2 * 6.2e9))
