"""The measurement store (tuning/store/) and hardware=replay (tuning/hardware/replay.py).

Concurrency and kill-safety of the sqlite file, untrusted rows, replay determinism, on_miss both
ways, store-restricted spaces under every search, truth scoring and the simulated clock, on tiny
stores the tests build themselves from the synthetic backend."""
from __future__ import annotations

import json
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from configs import options
from helpers import components, run_py, tune_job
from test_loop import finish
from tuning.core.measure import CVStop, MeasureSpec
from tuning.core.records import MeasureResult
from tuning.core.task import gemm_task
from tuning.engine.loop import RunInfo, tune_task
from tuning.hardware.replay import ReplayHardware
from tuning.hardware.synthetic import SyntheticHardware
from tuning.store import MeasurementStore, StoreError, TaskRows, connect_store, fingerprint
from value_models import shared_value_model

REPO = Path(__file__).resolve().parents[1]
TASK = gemm_task("gemm_64", 64, 64, 64)
SPEC = MeasureSpec(repeat=5)
SYNTHETIC_BACKEND = ("~hardware.backend", "+hardware.backend={_target_:tuning.hardware.synthetic.SyntheticHardware,"
                     "noise:0.2}")


def sample(space, count, seed=0) -> list[tuple]:
    rng = np.random.default_rng(seed)
    chosen: dict = {}
    while len(chosen) < count:
        chosen.setdefault(space.canonical(space.sample(rng)), None)
    return list(chosen)


def filled(path, count=120, seed=0, backend=None, spec=SPEC) -> tuple[MeasurementStore, TaskRows]:
    """A store holding `count` random configs of TASK measured on the (noisy) synthetic backend."""
    backend = backend or SyntheticHardware(noise=0.2)
    store = connect_store(path)
    table = TaskRows(store, backend, spec, TASK, backend.space(TASK))
    configs = sample(table.space, count, seed)
    for config, result in zip(configs, backend.measure(TASK, configs, spec)):
        table.add(config, result, "dataset")
    return store, table


def replay(path, backend=None, **kwargs) -> ReplayHardware:
    return ReplayHardware(backend or SyntheticHardware(noise=0.2), str(path), **kwargs)


def tune(out_dir, hardware, trials, search="sa", sampler="greedy", cost_model="xgb", seed=0, evaluator="fixed",
         **search_overrides):
    """tune_task of TASK on `hardware` at plan size 16: its outcome and its RunInfo (the simulated clock).
    test_loop.tune is the same loop at the search's own plan size, returning the outcome alone."""
    parts = components(search, sampler, cost_model, seed, search_overrides, evaluator=evaluator, hardware=hardware)
    run = RunInfo(seed=seed, out_dir=out_dir, method="test", trials=trials, plan_size=16)
    return tune_task(TASK, parts, run), run


def result(costs, error=None, build_s=0.1, run_s=0.2, gauge_s=None) -> MeasureResult:
    return MeasureResult(costs=costs, error=error, build_s=build_s, run_s=run_s, gauge_s=gauge_s)


# ---- the file --------------------------------------------------------------------------------
ROWS_WRITER = """
import sys, time
from pathlib import Path
from tuning.core.records import MeasureResult
from tuning.store import connect_store
path, writer, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = connect_store(path)
Path(f"{path}.ready{writer}").touch()
deadline = time.monotonic() + 60
while len(list(Path(path).parent.glob("*.ready*"))) < 4 and time.monotonic() < deadline:  # start writing together
    time.sleep(0.001)
for i in range(rows):
    store.add("hw", "task", "space", (writer, i), {}, MeasureResult(costs=[1e-3 + i * 1e-6], build_s=0.1, run_s=0.2),
              "run")
"""


def test_four_concurrent_writer_processes_lose_nothing(tmp_path):
    path = str(tmp_path / "store.sqlite")
    connect_store(path).count()
    writers = [subprocess.Popen([sys.executable, "-c", ROWS_WRITER, path, str(w), "150"], cwd=REPO) for w in range(4)]
    for process in writers:
        assert process.wait(120) == 0
    rows = connect_store(path).rows("hw", "task", "space")
    assert len(rows) == 600
    assert {row.config for row in rows} == {(w, i) for w in range(4) for i in range(150)}
    assert connect_store(path).unreadable() == 0


WRITER = """
import sys
from tuning.core.records import MeasureResult
from tuning.store import connect_store
store = connect_store(sys.argv[1])
i = 0
while True:
    store.add("hw", "task", "space", (i,), {}, MeasureResult(costs=[1e-3] * 50, message="x" * 4000), "run")
    i += 1
"""


def test_a_writer_killed_mid_write_leaves_the_store_readable(tmp_path):
    path = tmp_path / "store.sqlite"
    connect_store(path).count()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=REPO)
    deadline = time.monotonic() + 60
    while connect_store(path).count() < 300:
        assert writer.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    writer.send_signal(signal.SIGKILL)
    writer.wait(30)
    store = connect_store(path)
    rows = store.rows("hw", "task", "space")
    assert len(rows) >= 300 and store.unreadable() == 0
    assert [row.config for row in rows] == [(i,) for i in range(len(rows))], "a row lost or torn"
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone() == ("ok",)
    store.add("hw", "task", "space", (10**6,), {}, result([1e-3]), "run")  # still writable
    assert store.count() == len(rows) + 1


def test_rows_read_back_are_untrusted(tmp_path):
    store = connect_store(tmp_path / "store.sqlite")
    store.add("hw", "task", "space", (1,), {}, result([1e-3]), "run")
    for costs, config in (("[NaN]", "[2]"), ("[-1.0]", "[3]"), ("not json", "[4]"), ("[1e-3]", "[-5]"),
                          ("[1e-3]", '["a"]')):
        store.conn.execute("INSERT INTO readings(hardware, task, space, config, decisions, costs, build_s, run_s,"
                           " measured_at, source) VALUES ('hw','task','space',?, '{}', ?, 0, 0, 0, 'run')",
                           (config, costs))
    assert [row.config for row in store.rows("hw", "task", "space")] == [(1,)]
    assert store.unreadable() == 5


def test_a_file_that_is_not_a_store_is_a_clear_error(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello " * 1000)
    with pytest.raises(StoreError, match="not a tunelab measurement store"):
        connect_store(text).count()
    other = connect_store(tmp_path / "future.sqlite")
    other.conn.execute("UPDATE meta SET value = '99' WHERE key = 'format'")
    other.close()
    with pytest.raises(StoreError, match="format 99"):
        connect_store(tmp_path / "future.sqlite").count()


def test_the_fingerprint_holds_what_changes_a_reading_and_not_the_repeat_count():
    backend = SyntheticHardware()
    assert fingerprint(backend, MeasureSpec(repeat=3))[0] == fingerprint(backend, MeasureSpec(repeat=20))[0]
    assert fingerprint(backend, MeasureSpec(min_repeat_ms=0))[0] != fingerprint(backend, MeasureSpec())[0]
    assert fingerprint(SyntheticHardware(noise=0.1), SPEC)[0] != fingerprint(backend, SPEC)[0]


# ---- truth scoring -------------------------------------------------------------------------
def test_truth_is_the_median_of_every_reading_of_a_config(tmp_path):
    store = connect_store(tmp_path / "store.sqlite")
    add = lambda config, r: store.add("hw", "t", "s", config, {}, r, "run")  # noqa: E731
    add((1,), result([3e-3, 1e-3, 2e-3]))
    add((1,), result([5e-3, 4e-3]))
    add((1,), MeasureResult.failed("run", "crashed"))
    add((2,), result([1e-3, 2e-3]))
    add((3,), MeasureResult.failed("invalid", "too big"))
    assert store.truth("hw", "t", "s", (1,)) == pytest.approx(3e-3)  # median of 1,2,3,4,5 ms; errors ignored
    assert store.truth("hw", "t", "s", (2,)) is None  # 2 readings < 3
    assert store.truth("hw", "t", "s", (3,)) is None
    assert store.truth("hw", "t", "s", (9,)) is None
    assert store.truths("hw", "t", "s") == {(1,): pytest.approx(3e-3)}


def test_a_run_scores_its_incumbent_by_the_store(tmp_path):
    store, table = filled(tmp_path / "store.sqlite", count=60)
    outcome, _ = tune(tmp_path / "run", replay(store.path, on_miss="error"), trials=40)
    best = outcome.best_config
    readings = [c for row in store.rows(*table.key, best) for c in row.costs]
    assert len(readings) >= 3
    from tuning.engine.callbacks import StoreWriter
    assert StoreWriter(store, replay(store.path), SPEC).truth(TASK, table.space, best) == statistics.median(readings)


# ---- replay ----------------------------------------------------------------------------------
def test_replay_answers_with_the_first_row_truncated_to_the_repeat(tmp_path):
    store, table = filled(tmp_path / "store.sqlite", count=10)
    config = table.configs()[0]
    stored = table.first(config)
    table.add(config, result([9.0] * 5), "run")  # added later: never changes a replay
    [answer] = replay(store.path).measure(TASK, [config], MeasureSpec(repeat=3))
    assert answer.reused and answer.costs == stored.costs[:3]
    assert answer.build_s == stored.build_s
    assert answer.run_s == pytest.approx(stored.run_s * 3 / 5)


def test_replay_applies_an_early_stop_rule_by_truncation(tmp_path):
    rule = CVStop(micro_batch=10, max_batches=10, min_batches=3, cv_threshold=0.05)
    spec = MeasureSpec(number=10, repeat=10, min_repeat_ms=0, cv_stop=rule)
    store = connect_store(tmp_path / "store.sqlite")
    backend = SyntheticHardware(noise=0.2)
    table = TaskRows(store, backend, spec, TASK, backend.space(TASK))
    configs = sample(table.space, 20)
    for config in configs:
        table.add(config, backend.measure(TASK, [config], MeasureSpec(number=10, repeat=10, min_repeat_ms=0))[0],
                  "dataset")
    live = backend.measure(TASK, configs, spec)
    replayed = replay(store.path).measure(TASK, configs, spec)
    assert [r.costs for r in replayed] == [r.costs for r in live]
    assert any(len(r.costs) < 10 for r in replayed if r.ok), "the rule never stopped early: a weak test"


def test_normalise_scales_readings_by_the_drift_gauge(tmp_path):
    store = connect_store(tmp_path / "store.sqlite")
    backend = SyntheticHardware()
    table = TaskRows(store, backend, SPEC, TASK, backend.space(TASK))
    a, b, c = sample(table.space, 3)
    table.add(a, result([1e-3] * 3, gauge_s=1e-4), "dataset")
    table.add(b, result([1e-3] * 3, gauge_s=2e-4), "dataset")  # the host ran at half speed
    table.add(c, result([1e-3] * 3, gauge_s=3e-4), "dataset")
    answers = replay(store.path, backend=backend, normalise=True).measure(TASK, [a, b, c], SPEC)
    assert [r.costs[0] for r in answers] == pytest.approx([2e-3, 1e-3, 2e-3 / 3])  # median gauge 2e-4
    plain = replay(store.path, backend=backend).measure(TASK, [a, b, c], SPEC)
    assert [r.costs[0] for r in plain] == [1e-3] * 3


def test_on_miss_error_records_not_in_store_and_goes_on(tmp_path):
    store, table = filled(tmp_path / "store.sqlite", count=40)
    rows_before = store.count()
    outcome, _ = tune(tmp_path / "run", replay(store.path, on_miss="error"), trials=64)
    missing = [r for r in outcome.records if r.result.error == "not_in_store"]
    stored = set(table.configs())
    assert len(outcome.records) == 64 and missing
    assert all(tuple(r.config) not in stored for r in missing)
    assert all(tuple(r.config) in stored for r in outcome.records if r.result.error != "not_in_store")
    assert outcome.best_config in stored
    assert store.count() == rows_before, "on_miss=error must not measure"


def test_on_miss_measure_measures_adds_and_replays_the_same(tmp_path):
    store, table = filled(tmp_path / "store.sqlite", count=40)
    first, _ = tune(tmp_path / "a", replay(store.path), trials=64)
    added = store.count() - 40
    assert added > 0 and not any(r.result.error == "not_in_store" for r in first.records)
    assert all(r.result.reused for r in first.records), "replay answers every candidate from its row"
    again, _ = tune(tmp_path / "b", replay(store.path), trials=64)
    assert store.count() - 40 == added, "the second replay found every config stored"
    assert (tmp_path / "a" / "records.jsonl").read_bytes() == (tmp_path / "b" / "records.jsonl").read_bytes()


def test_memoised_real_run_measures_each_config_once(tmp_path):
    store = connect_store(tmp_path / "store.sqlite")
    store.count()
    backend = SyntheticHardware(noise=0.2, store=str(store.path), reuse=True)
    from tuning.engine.callbacks import StoreWriter, default_callbacks
    from tuning.hardware.replay import with_store

    def run(out, seed):
        hardware = with_store(backend)
        parts = components("random", "greedy", "none", seed, hardware=hardware)
        callbacks = default_callbacks(parts.tracker) + [StoreWriter(store, hardware, parts.evaluator.spec)]
        return tune_task(TASK, parts, RunInfo(seed=seed, out_dir=out, method="t", trials=30, plan_size=10,
                                              callbacks=callbacks))

    first = run(tmp_path / "a", 0)
    assert not any(r.result.reused for r in first.records)
    rows = store.count()
    second = run(tmp_path / "b", 0)
    assert all(r.result.reused for r in second.records)
    assert store.count() == rows, "nothing measured twice (the finalists' re-measurement included)"
    assert [r.result.costs for r in second.records] == [r.result.costs[:5] for r in first.records]


def test_the_simulated_clock_adds_up_to_the_stored_seconds(tmp_path):
    store, table = filled(tmp_path / "store.sqlite", count=80)
    outcome, run = tune(tmp_path / "run", replay(store.path, on_miss="error"), trials=50)
    spent = 0.0
    for record in outcome.records:
        row = table.first(tuple(record.config))
        if row is not None:
            used = min(len(row.costs), SPEC.repeat) if row.ok else 1
            spent += row.build_s + (row.run_s * used / len(row.costs) if row.ok else row.run_s)
        assert record.time == pytest.approx(spent, rel=1e-12, abs=1e-15)
    assert run.progress.simulated_s == pytest.approx(spent)


def test_a_replay_keeps_the_slow_kernel_note(tmp_path):
    """A store row timed with fewer runs answers a replay with its note, so the replayed runs'
    compare tables count it."""
    backend = replay(tmp_path / "s.sqlite").backend
    table = TaskRows(connect_store(tmp_path / "s.sqlite"), backend, SPEC, TASK, backend.space(TASK))
    config = table.space.canonical(table.space.sample(np.random.default_rng(0)))
    table.add(config, MeasureResult(costs=[1e-3] * 5, message="fewer_runs: 2 run(s) x 5 cost(s)"), "dataset")
    [answer] = replay(tmp_path / "s.sqlite", backend, on_miss="error").measure(TASK, [config], SPEC)
    assert answer.ok and answer.reused and answer.message.startswith("fewer_runs")


# ---- store-restricted spaces -----------------------------------------------------------------
SEARCH_COMBOS = {"csa": ("csa", "greedy", "rf"), "ppo": ("ppo", "kmeans", "xgb"), "random": ("random", "greedy", "none"),
                 "sa": ("sa", "greedy", "xgb")}
SHORTER = {"ppo": {"episodes": 16, "max_steps": 40}}  # the same moves, fewer of them


@pytest.mark.parametrize("search", options("search"))
def test_every_search_stays_inside_a_store_restricted_space(tmp_path, search):
    search, sampler, cost_model = SEARCH_COMBOS.get(search, (search, "greedy", "xgb"))
    store, table = filled(tmp_path / "store.sqlite", count=50)
    hardware = replay(store.path, on_miss="error")
    hardware.restrict_to_store(SPEC)
    if search == "value":  # a registered value function to search with
        SHORTER["value"] = dict(zip(("model", "registry"), shared_value_model()))
    outcome, _ = tune(tmp_path / "run", hardware, trials=50, search=search, sampler=sampler, cost_model=cost_model,
                      **SHORTER.get(search, {}))
    stored = set(table.configs())
    assert {tuple(r.config) for r in outcome.records} == stored  # every stored config, none outside
    assert not any(r.result.error == "not_in_store" for r in outcome.records)


def test_a_store_without_the_task_gives_an_empty_restricted_space(tmp_path):
    store, _ = filled(tmp_path / "store.sqlite", count=5)
    hardware = replay(store.path)
    hardware.restrict_to_store(MeasureSpec(min_repeat_ms=0))  # other settings: other readings
    assert hardware.space(TASK).size == 0


# ---- through run.py's job ---------------------------------------------------------------------
REPLAY_JOB = ("model=gemm_64", "hardware=replay", *SYNTHETIC_BACKEND, "tracking=none")


def _run(tmp_path, name, *overrides):
    out = tmp_path / name
    finish(run_py(*REPLAY_JOB, f"hydra.run.dir={out}", *overrides, tmp=tmp_path))
    return out / "records.jsonl"


def _tune_job(tmp_path, monkeypatch, name, *overrides):
    """_run's job in this process (tunelab.tune)."""
    out = tmp_path / name
    tune_job(tmp_path, monkeypatch, *REPLAY_JOB, f"output_dir={out}", *overrides)
    return out / "records.jsonl"


def test_run_py_replay_same_seed_gives_identical_records(tmp_path, monkeypatch):
    store, table = filled(tmp_path / "store.sqlite", count=200)
    args = (f"hardware.store={store.path}", "search=sa", "budget.trials=48", "seed=3")
    first = _run(tmp_path, "a", *args)  # two fresh processes
    second = _run(tmp_path, "b", *args)
    assert first.read_bytes() == second.read_bytes()
    restricted = _tune_job(tmp_path, monkeypatch, "c", *args, "model.space=store", "hardware.on_miss=error")
    stored = set(table.configs())
    assert all(tuple(json.loads(line)["config"]) in stored for line in restricted.read_text().splitlines())


def test_replay_with_create_starts_a_store_and_a_rerun_measures_nothing(tmp_path, monkeypatch):
    store = tmp_path / "new" / "store.sqlite"
    first = _tune_job(tmp_path, monkeypatch, "a", f"hardware.store={store}", "hardware.create=true", "budget.trials=20")
    assert store.is_file() and connect_store(store).count() == 20
    second = _tune_job(tmp_path, monkeypatch, "b", f"hardware.store={store}", "hardware.create=true",
                       "budget.trials=20")
    assert connect_store(store).count() == 20  # every config answered from the rows the first run added
    assert first.read_text().splitlines()[0] == second.read_text().splitlines()[0]


@pytest.mark.parametrize("overrides, message", [
    (("hardware=replay",), "hardware.store"),
    (("hardware=replay", "hardware.store={tmp}/none.sqlite"), "no such file"),
    (("hardware=replay", "hardware.store={tmp}/none.sqlite", "hardware.create=true", "hardware.on_miss=error"),
     "hardware.create"),
    (("model.space=everything",), "model.space"),
])
def test_replay_without_a_store_is_refused_before_any_work(compose_cfg, tmp_path, overrides, message):
    from tuning.config import ConfigError
    from tuning.engine.validate import validate

    cfg = compose_cfg("model=gemm_64", "tracking=none", *(o.format(tmp=tmp_path) for o in overrides))
    with pytest.raises(ConfigError, match=message):
        validate(cfg)  # run.py's check before any work


def test_a_run_whose_store_stayed_on_its_machine_is_still_re_logged(compose_cfg, tmp_path):
    """`tuning.tools.sync` validates under local_checks_only and opens no store: a restored run (an
    archive viewed on another machine) whose store path does not exist here still validates."""
    from tuning.config import ConfigError
    from tuning.core.component import local_checks_only
    from tuning.engine.validate import validate

    cfg = compose_cfg("model=gemm_64", "tracking=none", "hardware=replay", f"hardware.store={tmp_path}/gone.sqlite")
    with pytest.raises(ConfigError, match="no such file"):
        validate(cfg)
    with local_checks_only():
        validate(cfg)
    cfg.hardware.create, cfg.hardware.on_miss = True, "error"  # the config's own rules still hold
    with local_checks_only(), pytest.raises(ConfigError, match="hardware.create"):
        validate(cfg)


def test_run_py_rejects_a_store_space_without_a_store(tmp_path):
    proc = run_py("model=gemm_64", "tracking=none", f"hydra.run.dir={tmp_path}/x", "model.space=store",
                  "hardware=synthetic", tmp=tmp_path)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "model.space" in output, output[-2000:]
    assert not (tmp_path / "x" / "records.jsonl").exists()


# ---- the dataset tool ------------------------------------------------------------------------
def test_dataset_build_resumes_and_stats_and_export_read_it(tmp_path, capsys, monkeypatch):
    from tuning.tools import dataset

    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "outputs"))
    path = str(tmp_path / "store.sqlite")
    build = ["build", "--store", path, "--model", "gemm_64", "--configs", "30", "hardware=synthetic",
             "hardware.noise=0.2"]
    dataset.main(build)
    assert connect_store(path).count() == 30
    dataset.main(build[:6] + ["50"] + build[7:])  # resume: only the 20 new configs
    assert connect_store(path).count() == 50
    assert "0 stored, 30 to measure" in capsys.readouterr().out
    dataset.main(build)
    assert "30 to measure" not in capsys.readouterr().out and connect_store(path).count() == 50

    dataset.main(["stats", "--store", path])
    line = next(l for l in capsys.readouterr().out.splitlines() if l.strip().startswith("gemm_64"))
    assert line.split()[1:3] == ["50", "50"]  # configs, rows
    out = tmp_path / "cache.json"
    dataset.main(["export", "--store", path, "--task", "gemm_64", "--out", str(out)])
    document = json.loads(out.read_text())
    assert {"schema_version", "device_name", "kernel_name", "problem_size", "tune_params_keys", "tune_params",
            "objective", "cache"} <= set(document)
    assert len(document["cache"]) == 50
    for key, entry in document["cache"].items():
        assert [entry[k] for k in document["tune_params_keys"]] == [int(v) for v in key.split(",")]
        assert {"time", "compile_time", "verification_time", "benchmark_time", "strategy_time", "framework_time",
                "timestamp"} <= set(entry)
        assert entry["time"] == "InvalidConfig" or entry["time"] == pytest.approx(statistics.median(entry["times"]))


def test_dataset_import_adds_an_earlier_runs_records(tmp_path, monkeypatch):
    from tuning.tools import dataset

    tune_job(tmp_path, monkeypatch, "model=gemm_64", "hardware=synthetic", "hardware.noise=0.2", "search=random",
             "cost_model=none", "budget.trials=24", "tracking=none", f"output_dir={tmp_path}/run")
    path = tmp_path / "store.sqlite"
    dataset.main(["import", "--store", str(path), str(tmp_path / "run")])
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    store = connect_store(path)
    [(hardware, task, space)] = store.keys()
    assert sorted(row.config for row in store.rows(hardware, task, space)) == sorted(tuple(r["config"]) for r in records)
    assert fingerprint(SyntheticHardware(noise=0.2), SPEC)[0] == hardware  # the key a replay of that run looks up
    dataset.main(["import", "--store", str(path), str(tmp_path / "run")])  # again: nothing counts twice
    assert connect_store(path).count() == len(records)


def test_dataset_import_of_a_run_that_wrote_the_store_adds_nothing(tmp_path, monkeypatch):
    from tuning.tools import dataset

    path = tmp_path / "store.sqlite"
    tune_job(tmp_path, monkeypatch, "model=gemm_64", "hardware=synthetic", "hardware.noise=0.2", "search=random",
             "cost_model=none", "budget.trials=16", "tracking=none", f"hardware.store={path}",
             f"output_dir={tmp_path}/run")
    before = connect_store(path).count()
    dataset.main(["import", "--store", str(path), str(tmp_path / "run")])
    assert connect_store(path).count() == before


def test_dataset_rejects_bad_arguments_before_work(tmp_path):
    from tuning.tools import dataset

    for argv, message in ((["stats", "--store", str(tmp_path / "none.sqlite")], "no such file"),
                          (["build", "--store", str(tmp_path / "s.sqlite"), "--model", "gemm_64", "--configs", "0"],
                           "--configs")):
        with pytest.raises(SystemExit):
            dataset.main(argv)
    assert not (tmp_path / "s.sqlite").exists()


def test_dataset_agree_sets_a_second_build_beside_the_first(tmp_path, capsys, monkeypatch):
    from tuning.tools import dataset

    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "outputs"))
    first, second = str(tmp_path / "a.sqlite"), str(tmp_path / "b.sqlite")
    for path in (first, second):  # one command and seed, two stores: the same 30 configs, noisy readings
        dataset.main(["build", "--store", path, "--model", "gemm_64", "--configs", "30", "hardware=synthetic",
                      "hardware.noise=0.05"])
    capsys.readouterr()
    dataset.main(["agree", "--store", first, "--against", second])
    out = capsys.readouterr().out
    assert "1 (hardware, task, space) in both" in out
    line = next(l for l in out.splitlines() if l.strip().startswith("gemm_64"))
    words = line.split()
    assert 20 <= int(words[1]) <= 30 and 0.9 < float(words[2]) < 1.1  # configs valid in both, median ratio
    assert float(words[-2]) > 0.8 and words[-1].endswith(f"/{words[1]}")  # rank correlation, where the best ranks
    with pytest.raises(SystemExit):
        dataset.main(["agree", "--store", first, "--against", str(tmp_path / "absent.sqlite")])
    assert "--against: no such file" in capsys.readouterr().err


def test_best_configs_are_each_tasks_lowest_distinct_readings():
    """What `dataset reread` measures again: each task's best distinct configs by their readings, failures left out."""
    from tuning.core.records import Record
    from tuning.tools.dataset import best_configs

    def record(task, config, cost, error=None):
        result = MeasureResult.failed(error, "x") if error else MeasureResult(costs=[cost])
        return Record(task, task, list(config), {}, result, 0, "m", 0, 0, 0.0)

    records = [record("a", (1,), 3.0), record("a", (2,), 1.0), record("a", (2,), 1.5), record("a", (3,), 0.5, "timeout"),
               record("a", (4,), 2.0), record("b", (9,), 7.0)]
    assert best_configs(records, 2) == {"a": [(2,), (4,)], "b": [(9,)]}
