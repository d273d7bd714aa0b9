"""Whole-model tuning on the synthetic hardware: task schedulers, the shared budget, the
per-task minimum, enumeration of tiny spaces, resume and reuse (tuning/engine/loop.py `tune_tasks`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from helpers import component, components
from tuning.core.records import RecordLog
from tuning.core.task import gemm_task
from tuning.engine.loop import RunInfo, tune_tasks
from tuning.scheduler.gradient import Gradient
from tuning.scheduler.round_robin import RoundRobin


# ---- the rules on hand-made histories ----------------------------------------------------
@dataclass
class FakeTask:
    weight: int
    history: list
    measured: int = 0

    def best_history(self):
        return self.history


def test_gradient_formula_by_hand():
    rule = Gradient(alpha=0.2, window=3)
    # best latency per round 10, 8, 6, 5, 4 ms; weight 2
    task = FakeTask(2, [10e-3, 8e-3, 6e-3, 5e-3, 4e-3])
    backward = (8e-3 - 4e-3) / 3  # history[n-1-window] = history[1]
    forward = 4e-3 / 5
    assert rule.gradient(task) == pytest.approx(2 * (0.2 * backward + 0.8 * forward))
    # fewer rounds than the window: only the forward term
    assert rule.gradient(FakeTask(1, [6e-3, 3e-3])) == pytest.approx(0.8 * 3e-3 / 2)


def test_gradient_prefers_weight_times_latency():
    rule = Gradient()
    light = FakeTask(1, [1e-3, 1e-3])
    heavy = FakeTask(4, [1e-3, 1e-3])  # same kernel latency, runs four times per inference
    slow = FakeTask(1, [9e-3, 9e-3])
    assert rule.pick([light, heavy]) == 1
    assert rule.pick([light, heavy, slow]) == 2
    assert rule.pick([light, FakeTask(1, [math.inf])]) == 1  # nothing valid yet: try it again
    assert rule.pick([FakeTask(1, [1e-3]), FakeTask(1, [1e-3])]) == 0  # ties: the first (bigger) task


def test_the_gradient_is_what_the_scheduler_logs_it_ranks_by():
    rule, tasks = Gradient(), [FakeTask(1, [1e-3, 1e-3]), FakeTask(4, [1e-3, 1e-3])]
    assert rule.scores(tasks) == pytest.approx([rule.gradient(t) * 1e3 for t in tasks])  # ms per round
    assert max(range(2), key=rule.scores(tasks).__getitem__) == rule.pick(tasks)
    assert RoundRobin().scores(tasks) is None  # fewest measurements first: nothing more to log


def test_round_robin_fewest_first():
    tasks = [FakeTask(1, [], measured=10), FakeTask(1, [], measured=4), FakeTask(1, [], measured=4)]
    assert RoundRobin().pick(tasks) == 1


# ---- tune_tasks on synthetic hardware --------------------------------------------------------
TASKS = [gemm_task("big", 256, 256, 256, weight=1), gemm_task("twice", 64, 128, 64, weight=2),
         gemm_task("tiny", 1, 1, 1, weight=3)]  # tiny: 12 configs in all


def run_model(out_dir, trials, scheduler=None, min_trials=16, plan_size=16, tasks=TASKS, prior=None, seed=0):
    shared = components(search="sa", seed=seed, search_overrides={"n_iter": 50})

    def components_for(index):
        return replace(shared, search=component("search", "sa", seed, n_iter=50),
                       sampler=component("sampler", "greedy", seed), cost_model=component("cost_model", "xgb", seed))

    run = RunInfo(seed=seed, out_dir=out_dir, method="test", trials=trials, plan_size=plan_size,
                  min_trials_per_task=min_trials)
    outcomes = tune_tasks(tasks, components_for, run, scheduler or Gradient(), prior)
    return run, {o.task.name: o for o in outcomes}


def test_budget_shared_minimum_first_and_tiny_space_enumerated(tmp_path):
    run, outcomes = run_model(tmp_path, trials=200)
    rows = RecordLog(tmp_path / "records.jsonl").load()
    assert len(rows) == run.progress.measured == 200
    # the tiny task's whole space (12 configs, fewer once canonical) in its first round, then never again
    tiny = outcomes["tiny"]
    assert len(tiny.records) <= 12 and tiny.stopped_because == "space enumerated"
    assert len({tuple(r.config) for r in tiny.records}) == len(tiny.records)
    # the per-task minimum came before anything else: the first 16 + 16 + tiny records are one round each
    first = [r.task for r in rows[:32 + len(tiny.records)]]
    assert first.count("big") == 16 and first.count("twice") == 16
    for name in ("big", "twice"):
        assert len(outcomes[name].records) >= 16 and outcomes[name].best_config is not None
        assert len({tuple(r.config) for r in outcomes[name].records}) == len(outcomes[name].records)


def test_gradient_spends_on_the_task_that_dominates(tmp_path):
    """`big` is 8x the FLOPs of `twice` x2: after the minimum, most rounds go to it."""
    _, outcomes = run_model(tmp_path, trials=200)
    assert len(outcomes["big"].records) > 2 * len(outcomes["twice"].records)


def test_round_robin_spreads_evenly(tmp_path):
    _, outcomes = run_model(tmp_path, trials=140, scheduler=RoundRobin())
    assert abs(len(outcomes["big"].records) - len(outcomes["twice"].records)) <= 16


def test_same_seed_same_schedule(tmp_path):
    run_model(tmp_path / "a", trials=120)
    run_model(tmp_path / "b", trials=120)
    first, second = (RecordLog(tmp_path / n / "records.jsonl").load() for n in ("a", "b"))
    assert [(r.task, r.config, r.result.costs) for r in first] == [(r.task, r.config, r.result.costs) for r in second]


def test_resume_continues_the_same_schedule(tmp_path):
    """Stopped at a round boundary and continued gives the records of a straight run
    (scheduler decisions, every task's search state and rng restored)."""
    run_model(tmp_path / "straight", trials=160)
    straight = RecordLog(tmp_path / "straight" / "records.jsonl").load()
    boundaries = [i for i in range(1, len(straight))
                  if (straight[i].task, straight[i].round) != (straight[i - 1].task, straight[i - 1].round)]
    stop = next(b for b in boundaries if b >= 80)
    run_model(tmp_path / "resumed", trials=stop)
    run_model(tmp_path / "resumed", trials=160)
    resumed = RecordLog(tmp_path / "resumed" / "records.jsonl").load()
    assert [(r.task, r.config, r.index) for r in resumed] == [(r.task, r.config, r.index) for r in straight]


def test_reuse_measures_nothing_for_tasks_that_met_their_budget(tmp_path):
    first_run, _ = run_model(tmp_path / "first", trials=150)
    earlier = RecordLog(tmp_path / "first" / "records.jsonl").load()
    prior = {}
    for record in earlier:
        prior.setdefault(record.workload_key, []).append(record)
    # the same budget: everything is already measured
    run, outcomes = run_model(tmp_path / "again", trials=150, prior=prior)
    assert not (tmp_path / "again" / "records.jsonl").exists() or RecordLog(tmp_path / "again" / "records.jsonl").load() == []
    assert all(o.stopped_because in ("reused", "space enumerated") for o in outcomes.values())
    assert all(o.reused == len(o.records) for o in outcomes.values())
    best_before = {r.task: min(x.result.cost for x in earlier if x.task == r.task) for r in earlier}
    assert {n: o.best_cost for n, o in outcomes.items()} == best_before
    # a longer second run measures only the difference, never a config measured before
    run, outcomes = run_model(tmp_path / "longer", trials=200, prior=prior)
    new = RecordLog(tmp_path / "longer" / "records.jsonl").load()
    assert len(new) == 50
    assert not {(r.workload_key, tuple(r.config)) for r in new} & {(r.workload_key, tuple(r.config)) for r in earlier}


# ---- where the model pays ------------------------------------------------------------------
def one_kernel_twice(weights):
    """The same GEMM as two tasks called weights[0] and weights[1] times per inference: the float16 one
    is another task (its own key, search and random stream) on the same synthetic landscape, so both
    improve alike and only their share of the model's latency (weight x latency) differs."""
    return [gemm_task("first", 64, 64, 64, weight=weights[0]),
            gemm_task("second", 64, 64, 64, dtype="float16", weight=weights[1])]


@pytest.mark.parametrize("weights", [(8, 1), (1, 8)], ids=["heavy first", "heavy second"])
def test_gradient_spends_where_the_model_pays(tmp_path, weights):
    """Ansor's objective is sum_i weight_i x latency_i: of two kernels that improve alike, the one called
    8x as often (8/9 of the model's latency) gets most of the scheduled rounds, in either task order."""
    run, outcomes = run_model(tmp_path, trials=192, tasks=one_kernel_twice(weights))
    heavy, light = ("first", "second") if weights[0] > weights[1] else ("second", "first")
    scheduled = {name: len(o.records) - run.min_trials_per_task for name, o in outcomes.items()}
    assert scheduled[heavy] >= 4 * max(scheduled[light], 16), scheduled
