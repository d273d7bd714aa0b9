"""The tuning loop (tuning/engine/loop.py) on the synthetic hardware: budget, determinism, resume, stops, errors.

In-process tests build the components from the YAMLs in conf/ and call `tune_task`
directly, or run a whole job with `tunelab.tune`; the fresh-process and kill + resume tests run
`run.py` in a subprocess.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers import (
    complete_lines,
    components,
    run_py,
    tune_job,
    wait_for_records,
)
from tuning.core.records import RecordLog
from tuning.core.task import build_tasks, gemm_task
from tuning.engine.loop import Components, RunInfo, tune_task

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
COMPARED = ("config", "costs", "error", "round", "index")


# ---- helpers (tests/helpers.py holds those several modules share) -----------------------------
def model_task(name: str):
    return build_tasks(OmegaConf.load(CONF / "model" / f"{name}.yaml"))[0]


def tune(out_dir: Path, task, trials: int, seed: int = 0, parts: Components | None = None,
         deadline=None, early_stop=None, **kwargs):
    """tune_task of `task` on `parts` (default: helpers.components(**kwargs)) at the search's own plan size:
    its outcome. test_store.tune is the same loop on a given hardware at plan size 16."""
    parts = parts or components(seed=seed, **kwargs)
    run = RunInfo(seed=seed, out_dir=out_dir, method="test", trials=trials,
                  plan_size=parts.search.default_plan_size, deadline=deadline, early_stop=early_stop)
    return tune_task(task, parts, run)


def key(record: dict) -> tuple:
    """The fields that must be identical across runs with the same seed (not times)."""
    return (tuple(record["config"]), tuple(record["result"]["costs"]), record["result"]["error"],
            record["round"], record["index"])


def outcome_keys(outcome) -> list[tuple]:
    return [(tuple(r.config), tuple(r.result.costs), r.result.error, r.round, r.index) for r in outcome.records]


def file_keys(path: Path) -> list[tuple]:
    return [key(json.loads(line)) for line in path.read_text().splitlines()]


def finish(proc: subprocess.Popen, timeout=120) -> str:
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, output[-3000:]
    return output


def kill_after(proc: subprocess.Popen, records: Path, lines: int, timeout=60.0) -> None:
    """SIGKILL the run once `records` holds at least `lines` complete lines."""
    wait_for_records(records, lines, proc, timeout, poll_s=0.002)
    proc.kill()
    proc.communicate(timeout=30)


def tear_last_line(records: Path) -> bytes:
    """Make sure the file ends in a torn line (as a kill mid-write leaves it); return the intact part."""
    data = records.read_bytes()
    intact = data[: data.rfind(b"\n") + 1]
    if data == intact:  # the kill fell between two writes: simulate one that did not
        with records.open("ab") as f:
            f.write(intact.splitlines()[-1][:57])
    return intact


def check_resumed(records: Path, intact: bytes, trials: int) -> list[dict]:
    rows = [json.loads(line) for line in records.read_text().splitlines()]  # every line parses
    assert len(rows) == trials
    assert records.read_bytes().startswith(intact), "records measured before the kill were changed"
    assert records.read_bytes().endswith(b"\n")
    assert len({tuple(r["config"]) for r in rows}) == trials, "a config was measured twice"
    assert [r["index"] for r in rows] == list(range(trials))
    assert len({r["method"] for r in rows}) == 1, "the resumed run must keep the run's method name"
    return rows


# ---- budget ------------------------------------------------------------------------------
@pytest.mark.parametrize("search,cost_model", [("sa", "xgb"), ("random", "none")])
def test_budget_respected_exactly(tmp_path, search, cost_model):
    task = model_task("gemm_64")
    outcome = tune(tmp_path, task, trials=100, search=search, cost_model=cost_model,
                   search_overrides={"n_iter": 100} if search == "sa" else None)
    assert outcome.stopped_because == "budget"
    assert len(outcome.records) == 100  # 64 + 36: the last round is cut to what is left
    assert [r.round for r in outcome.records] == [0] * 64 + [1] * 36
    assert len({tuple(r.config) for r in outcome.records}) == 100
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert len(lines) == 100
    assert file_keys(tmp_path / "records.jsonl") == outcome_keys(outcome)
    assert outcome.best_config is not None and outcome.best_gflops > 0


# ---- determinism -------------------------------------------------------------------------
def test_same_seed_same_records_in_process(tmp_path):
    task = model_task("gemm_64")
    first = tune(tmp_path / "a", task, trials=96, seed=3)
    second = tune(tmp_path / "b", task, trials=96, seed=3)
    other = tune(tmp_path / "c", task, trials=96, seed=4)
    assert outcome_keys(first) == outcome_keys(second)
    assert file_keys(tmp_path / "a" / "records.jsonl") == file_keys(tmp_path / "b" / "records.jsonl")
    assert [k[0] for k in outcome_keys(first)] != [k[0] for k in outcome_keys(other)]


def test_same_seed_same_records_in_fresh_processes(tmp_path):
    args = ("hardware=synthetic", "tracking=none", "model=gemm_64", "budget.trials=96", "seed=3")
    procs = [run_py(*args, f"hydra.run.dir={tmp_path / name}", tmp=tmp_path) for name in ("a", "b")]
    for proc in procs:
        finish(proc)
    first, second = (file_keys(tmp_path / name / "records.jsonl") for name in ("a", "b"))
    assert len(first) == 96
    assert first == second
    # and the same as the loop called in this process with the same components
    in_process = tune(tmp_path / "c", model_task("gemm_64"), trials=96, seed=3)
    assert outcome_keys(in_process) == first


# ---- kill + resume -----------------------------------------------------------------------
def test_kill_and_resume_random(tmp_path):
    run_dir, records = tmp_path / "run", tmp_path / "run" / "records.jsonl"
    proc = run_py("hardware=synthetic", "tracking=none", "model=gemm_1024", "search=random",
                  "budget.trials=3000", f"hydra.run.dir={run_dir}", tmp=tmp_path)
    kill_after(proc, records, 100)
    intact = tear_last_line(records)
    measured = intact.count(b"\n")
    assert 100 <= measured < 400

    output = finish(run_py(f"resume={run_dir}", "budget.trials=400", f"hydra.run.dir={tmp_path / 'resume'}",
                           tmp=tmp_path))
    assert "measurements 400" in output
    rows = check_resumed(records, intact, 400)
    assert rows[0]["method"] == "random+greedy"
    assert OmegaConf.load(run_dir / "config.yaml").budget.trials == 400


def test_kill_and_resume_sa_restores_search_state(tmp_path):
    run_dir, records = tmp_path / "run", tmp_path / "run" / "records.jsonl"
    proc = run_py("hardware=synthetic", "tracking=none", "model=gemm_64", "search=sa", "search.n_iter=100",
                  "budget.trials=3000", f"hydra.run.dir={run_dir}", tmp=tmp_path)
    kill_after(proc, records, 70)  # into round 1, after round 0's search state was saved
    intact = tear_last_line(records)
    assert (run_dir / "state").is_dir()
    saved = json.loads(next((run_dir / "state").glob("*.json")).read_text())
    assert saved["round"] >= 1 and len(saved["search"]["points"]) == 128

    finish(run_py(f"resume={run_dir}", "budget.trials=200", f"hydra.run.dir={tmp_path / 'resume'}",
                  tmp=tmp_path))
    rows = check_resumed(records, intact, 200)
    assert rows[0]["method"] == "sa+greedy"


def test_resume_at_a_round_boundary_continues_as_if_never_stopped(tmp_path):
    """Search walkers, rng and round are restored: 128 then +64 equals 192 straight."""
    task = model_task("gemm_64")
    overrides = {"n_iter": 100}
    straight = tune(tmp_path / "straight", task, trials=192, search_overrides=overrides)
    tune(tmp_path / "resumed", task, trials=128, search_overrides=overrides)
    resumed = tune(tmp_path / "resumed", task, trials=192, search_overrides=overrides)  # fresh components
    assert outcome_keys(resumed) == outcome_keys(straight)
    assert file_keys(tmp_path / "resumed" / "records.jsonl") == outcome_keys(straight)


def test_ppo_kmeans_resume_continues_as_if_never_stopped(tmp_path):
    """The agent's weights and Adam state, its best configs and the rng come back: stopping at a
    round boundary of adaptive-size rounds and resuming gives the straight run's records."""
    task = model_task("conv_tiny")
    overrides = {"episodes": 32, "max_steps": 50}
    straight = tune(tmp_path / "straight", task, trials=90, search="ppo", sampler="kmeans",
                    search_overrides=overrides)
    rounds = [r.round for r in straight.records]
    boundary = rounds.index(rounds[40]) + rounds.count(rounds[40])  # the end of the round holding record 40
    tune(tmp_path / "resumed", task, trials=boundary, search="ppo", sampler="kmeans", search_overrides=overrides)
    saved = json.loads(next((tmp_path / "resumed" / "state").glob("*.json")).read_text())
    assert saved["search"]["agent"] and saved["search"]["best"]
    resumed = tune(tmp_path / "resumed", task, trials=90, search="ppo", sampler="kmeans", search_overrides=overrides)
    assert outcome_keys(resumed) == outcome_keys(straight)
    assert len(set(rounds)) > 90 / 64 + 1  # kmeans measured fewer than a plan per round


def test_rounds_per_task_stops_a_task(tmp_path):
    task = model_task("gemm_64")
    parts = components(search="random", cost_model="none")
    run = RunInfo(seed=0, out_dir=tmp_path, method="test", trials=10_000, plan_size=16, rounds_per_task=3)
    outcome = tune_task(task, parts, run)
    assert outcome.stopped_because == "rounds"
    assert [r.round for r in outcome.records] == [0] * 16 + [1] * 16 + [2] * 16


def test_trials_per_task_sets_the_run_budget(tmp_path, monkeypatch):
    tune_job(tmp_path, monkeypatch, "hardware=synthetic", "tracking=none", "model=gemm_64", "budget.trials=1",
             "budget.trials_per_task=40", f"output_dir={tmp_path / 'run'}")
    assert complete_lines(tmp_path / "run" / "records.jsonl") == 40


def test_torn_last_line_is_dropped_before_appending(tmp_path):
    task = model_task("gemm_64")
    tune(tmp_path, task, trials=64, search="random", cost_model="none")
    path = tmp_path / "records.jsonl"
    intact = tear_last_line(path)
    assert len(RecordLog(path).load()) == 64  # the torn line is not a record
    outcome = tune(tmp_path, task, trials=100, search="random", cost_model="none")
    assert len(outcome.records) == 100
    assert path.read_bytes().startswith(intact)
    assert len(RecordLog(path).load()) == len(path.read_text().splitlines()) == 100


def test_records_reach_the_file_as_measured_and_disk_once_a_round(tmp_path, monkeypatch):
    """A killed process loses no record (each is in the file when the next is measured); the file
    is fsynced after every round and at the end, not once a record."""
    import tuning.core.records as records_module
    from tuning.engine.callbacks import AppendRecords, MeasureCallback

    path, seen, synced = tmp_path / "records.jsonl", [], []

    class ReadBack(MeasureCallback):
        def on_result(self, tuner, record) -> None:
            seen.append(len(path.read_text().splitlines()))

    real_fsync = records_module.os.fsync
    monkeypatch.setattr(records_module.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    parts = components(search="random", cost_model="none")
    run = RunInfo(seed=0, out_dir=tmp_path, method="test", trials=100, plan_size=64,
                  callbacks=[AppendRecords(), ReadBack()])
    outcome = tune_task(model_task("gemm_64"), parts, run)
    assert seen == list(range(1, 101))
    assert len(synced) == 2 + 1  # two rounds (64 + 36), then closing
    assert file_keys(path) == outcome_keys(outcome)


# ---- stopping ----------------------------------------------------------------------------
def test_early_stop(tmp_path):
    task = model_task("gemm_64")
    outcome = tune(tmp_path, task, trials=5000, early_stop=40, search="random", cost_model="none")
    assert outcome.stopped_because == "early stop"
    records = outcome.records
    assert 64 <= len(records) < 5000
    speeds = [r.result.gflops(task.flops) for r in records]
    best_at = speeds.index(max(speeds))
    assert len(records) - 1 - best_at >= 40  # no new best in the last early_stop measurements
    assert "early stop" not in tune(tmp_path / "none", task, trials=128, search="random",
                                    cost_model="none").stopped_because


def test_time_limit(tmp_path):
    task = model_task("gemm_1024")
    started = time.monotonic()
    outcome = tune(tmp_path, task, trials=10**6, deadline=started + 1.0, search="random", cost_model="none")
    assert outcome.stopped_because == "time limit"
    assert 0 < len(outcome.records) < 10**6
    assert time.monotonic() - started < 15  # stops at the first round boundary past the deadline
    assert complete_lines(tmp_path / "records.jsonl") == len(outcome.records)

    expired = tune(tmp_path / "expired", task, trials=64, deadline=time.monotonic() - 1)
    assert expired.stopped_because == "time limit" and expired.records == []
    assert expired.best_config is None and expired.best_gflops == 0.0


def test_no_round_is_begun_that_would_end_past_the_deadline(tmp_path):
    task = model_task("gemm_64")
    parts = components(search="random", cost_model="none", hardware_overrides={"delay_s": 0.02})
    started = time.monotonic()  # a round of 64 takes about 1.3 s here; the deadline leaves room for three
    outcome = tune(tmp_path, task, trials=10**6, deadline=started + 4.5, parts=parts)
    assert outcome.stopped_because == "time limit" and 64 <= len(outcome.records) <= 3 * 64
    assert time.monotonic() - started < 4.5 + 1.0  # the last round ended by the deadline, give or take its spread


def test_space_exhausted(tmp_path):
    task = gemm_task("tiny", 2, 2, 2)
    parts = components(search="random", cost_model="none")
    size = parts.hardware.space(task).size
    outcome = tune(tmp_path, task, trials=10 * size, parts=parts)
    assert outcome.stopped_because == "space exhausted"
    assert 0.9 * size <= len(outcome.records) <= size
    assert len({tuple(r.config) for r in outcome.records}) == len(outcome.records)


# ---- errors are records ------------------------------------------------------------------
def test_invalid_configs_are_records(tmp_path):
    task = model_task("gemm_1024")
    outcome = tune(tmp_path, task, trials=200, hardware_overrides={"invalid_register_tile": 256},
                   search_overrides={"n_iter": 50})
    assert len(outcome.records) == 200 and outcome.stopped_because == "budget"
    invalid = [r for r in outcome.records if not r.result.ok]
    assert invalid and outcome.invalid == len(invalid) < 200
    for record in invalid:
        assert record.result.error == "invalid" and record.result.costs == []
        assert record.result.message
        assert record.result.gflops(task.flops) == 0.0
    assert outcome.best_config not in {tuple(r.config) for r in invalid}
    on_disk = RecordLog(tmp_path / "records.jsonl").load()
    assert sum(r.result.error == "invalid" for r in on_disk) == outcome.invalid


class _ShiftingHardware:
    """Synthetic hardware whose readings of one config are lucky while tuning."""

    def __init__(self, inner, lucky):
        self.inner, self.lucky, self.tuning = inner, lucky, True

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def measure(self, task, configs, spec, on_result=None):
        results = self.inner.measure(task, configs, spec)
        for i, (config, result) in enumerate(zip(configs, results)):
            if self.tuning and tuple(config) == self.lucky and result.ok:
                result.costs = [c / 10 for c in result.costs]  # a 10x lucky first reading
            if on_result:
                on_result(i, result)
        return results


def test_final_best_is_the_best_re_measured_finalist(tmp_path):
    """The reported best comes from re-measuring the top few, not from the luckiest reading."""
    task = model_task("gemm_64")
    parts = components(search="random", cost_model="none")
    space = parts.hardware.space(task)
    import numpy as np

    lucky = space.canonical(space.sample(np.random.default_rng(123)))
    hardware = _ShiftingHardware(parts.hardware, lucky)
    parts.search.propose = lambda space, model, n, visited, rng, _orig=parts.search.propose: (
        ([lucky] if lucky not in visited else []) + _orig(space, model, n, visited, rng))
    parts.hardware = hardware
    original_remeasure = parts.evaluator.remeasure

    def remeasure(hw, task, configs):
        hardware.tuning = False  # the lucky streak is over
        return original_remeasure(hw, task, configs)

    parts.evaluator.remeasure = remeasure
    outcome = tune(tmp_path, task, trials=64, parts=parts)
    assert outcome.tuning_best_cost == min(r.result.cost for r in outcome.records)
    assert outcome.best_cost > outcome.tuning_best_cost  # the lucky reading is not reported
    assert len(outcome.final_costs) == parts.evaluator.final_repeat
    top3 = [tuple(r.config) for r in sorted((r for r in outcome.records if r.result.ok),
                                             key=lambda r: r.result.cost)[:3]]
    assert top3[0] == lucky
    honest = {c: r.cost for c, r in zip(top3, original_remeasure(hardware, task, top3))}
    assert outcome.best_config == min(honest, key=honest.get)
    assert outcome.best_cost == pytest.approx(honest[outcome.best_config])


# ---- common random numbers (budget.init_random) -------------------------------------------
def crn_records(tmp_path, name, search, sampler, cost_model, init_random, seed=3, trials=48):
    parts = components(search=search, sampler=sampler, cost_model=cost_model, seed=seed)
    run = RunInfo(seed=seed, out_dir=tmp_path / name, method=name, trials=trials, plan_size=parts.search.default_plan_size,
                  init_random=init_random)
    (tmp_path / name).mkdir()
    return [tuple(r.config) for r in tune_task(model_task("gemm_512"), parts, run).records]


def test_init_random_gives_two_methods_the_same_first_configs(tmp_path):
    sa = crn_records(tmp_path, "sa", "sa", "greedy", "xgb", init_random=20)
    ppo = crn_records(tmp_path, "ppo", "ppo", "kmeans", "xgb", init_random=20)
    assert sa[:20] == ppo[:20]
    assert sa[20:] != ppo[20:]  # after them each method chooses its own
    assert len(set(sa)) == len(sa) == 48
    other_seed = crn_records(tmp_path, "seed4", "sa", "greedy", "xgb", init_random=20, seed=4)
    assert other_seed[:20] != sa[:20]


def test_without_init_random_methods_start_apart(tmp_path):
    sa = crn_records(tmp_path, "sa", "sa", "greedy", "xgb", init_random=0)
    ppo = crn_records(tmp_path, "ppo", "ppo", "kmeans", "xgb", init_random=0)
    assert sa[:20] != ppo[:20]


def test_init_random_survives_a_resume(tmp_path):
    whole = crn_records(tmp_path, "whole", "sa", "greedy", "xgb", init_random=40, trials=48)
    parts = components(search="sa", seed=3)
    out = tmp_path / "resumed"
    out.mkdir()
    task = model_task("gemm_512")
    tune_task(task, parts, RunInfo(seed=3, out_dir=out, method="r", trials=10, plan_size=parts.search.default_plan_size,
                                   init_random=40))
    parts = components(search="sa", seed=3)
    resumed = tune_task(task, parts, RunInfo(seed=3, out_dir=out, method="r", trials=48,
                                             plan_size=parts.search.default_plan_size, init_random=40))
    assert [tuple(r.config) for r in resumed.records][:40] == whole[:40]


def test_round_times_account_for_the_wall_and_keep_tracking_apart(tmp_path):
    """Every second of a round lands in one share: a callback that sleeps in on_result is
    tracking, not measuring; the shares never add up to more than the rounds' wall."""
    from tuning.engine.callbacks import MeasureCallback
    from tuning.engine.loop import ROUND_TIMES

    class Slow(MeasureCallback):
        def on_result(self, tuner, record):
            time.sleep(0.01)

    parts = components(seed=0)
    run = RunInfo(seed=0, out_dir=tmp_path, method="test", trials=24, plan_size=8, callbacks=[Slow()])
    times = tune_task(gemm_task("g", 64, 64, 64), parts, run).times
    assert set(times) == set(ROUND_TIMES) and all(v >= 0 for v in times.values())
    assert times["tracking_s"] >= 24 * 0.01
    parts_sum = sum(times[k] for k in ("search_s", "model_s", "measure_s", "tracking_s", "state_s"))
    assert parts_sum <= times["wall_s"] + 1e-6
    assert times["measure_s"] < times["tracking_s"]  # synthetic measuring is instant; the sleeps are tracking
