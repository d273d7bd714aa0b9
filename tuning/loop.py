"""The tuning loop (DESIGN.md §The loop).

    until the run's budget is spent, the time is up, every task stopped, or after_round abandons it:
        task       = the next task without its minimum yet, else scheduler.pick(tasks)
        candidates = task's search.propose(...)   # no measuring here
        batch      = task's sampler.select(...)
        results    = evaluator.measure(...)       # each record appended + flushed as it arrives
        task's cost_model.fit(all its records)
        task's search.observe(batch, results)
        save its search/rng state; log step metrics; after_round (an Optuna sweep's pruning)
    re-measure each task's best few (not when abandoned)

A single-operator model is the one-task case. Resuming reads the records file
(visited sets, cost models) and each task's saved search and rng state; the
scheduler decides from the records alone, so a killed run finishes with
exactly `trials` records and never measures a config twice.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from scipy.stats import spearmanr
from tqdm import tqdm

from tuning.records import Record, RecordLog
from tuning.sampler.base import take_unvisited
from tuning.scheduler.round_robin import RoundRobin


@dataclass
class Components:
    search: object
    sampler: object
    evaluator: object
    cost_model: object
    hardware: object
    tracker: object


@dataclass
class RunInfo:
    seed: int
    out_dir: Path
    method: str
    trials: int  # measurements of the whole run, all tasks together (reused records count)
    plan_size: int
    deadline: float | None = None  # time.monotonic() value
    early_stop: int | None = None
    min_trials_per_task: int = 0  # every task gets this many (or its whole space) before scheduling
    rounds_per_task: int | None = None  # a task stops after this many rounds (Chameleon's "iterations")
    # after_round(measured, outcomes) -> a reason to abandon the run (e.g. "pruned" by an Optuna
    # sweep), or None; an abandoned run skips the final re-measurement: nobody wants its result.
    after_round: Callable[[int, list], str | None] | None = None
    abandoned: str | None = None
    measured: int = 0  # measurements so far, all tasks: the x axis of every metric

    @property
    def log(self) -> RecordLog:
        return RecordLog(self.out_dir / "records.jsonl")


@dataclass
class TaskOutcome:
    task: object
    records: list
    best_config: tuple | None = None
    best_cost: float = math.inf  # seconds, from the final re-measurement
    tuning_best_cost: float = math.inf  # seconds, the best reading during tuning
    final_costs: list = field(default_factory=list)
    times: dict = field(default_factory=dict)
    stopped_because: str = "budget"
    reused: int = 0  # records taken from tuning.database, not measured by this run

    @property
    def invalid(self) -> int:
        return sum(not r.result.ok for r in self.records)

    @property
    def best_gflops(self) -> float:
        return self.task.flops / self.best_cost / 1e9 if math.isfinite(self.best_cost) else 0.0

    def curve(self) -> list[tuple[int, float]]:
        best, points = 0.0, []
        for i, record in enumerate(self.records, start=1):
            best = max(best, record.result.gflops(self.task.flops))
            points.append((i, best))
        return points


def tune_task(task, parts: Components, run: RunInfo, prior=()) -> TaskOutcome:
    """Tune one task until the run's budget (or a stop) and re-measure its best."""
    return tune_tasks([task], lambda _: parts, run, RoundRobin(), {task.key: list(prior)})[0]


def tune_tasks(tasks, components_for, run: RunInfo, scheduler, prior=None) -> list[TaskOutcome]:
    """Tune a model's tasks under one budget: first every task gets `min_trials_per_task`
    measurements (or its whole space), fewest-measured first; then `scheduler` picks the
    task of each round. `components_for(index)` gives a task its own search, sampler and
    cost model; `prior[key]` are records from tuning.database."""
    prior = prior or {}
    run.log.repair()  # a kill can leave a torn last line; appending after it would corrupt the file
    own: dict = {}
    for record in run.log.load():
        own.setdefault(record.workload_key, []).append(record)
    tuners = [TaskTuner(task, i, components_for(i), run, prior.get(task.key, ()), own.get(task.key, ()))
              for i, task in enumerate(tasks)]
    with _progress(run) as progress:
        while run.measured < run.trials:
            if _out_of_time(run):
                for tuner in tuners:
                    if not tuner.done:
                        tuner.outcome.stopped_because = "time limit"
                break
            live = [t for t in tuners if not t.done]
            if not live:
                break
            # one task has nobody to share with: its rounds are never cut to reach the minimum
            warming = [t for t in live if t.measured < run.min_trials_per_task] if len(tuners) > 1 else []
            if warming:
                tuner = min(warming, key=lambda t: t.measured)  # min() keeps the first of equals
                n = run.min_trials_per_task - tuner.measured
            else:
                tuner, n = live[scheduler.pick(live)], run.plan_size
            tuner.tune_round(min(n, run.plan_size, run.trials - run.measured), progress)
            run.abandoned = run.after_round(run.measured, [t.outcome for t in tuners]) if run.after_round else None
            if run.abandoned:
                for tuner in live:
                    tuner._stop(run.abandoned)
                break
    for tuner in tuners:
        tuner.finish()
    return [t.outcome for t in tuners]


class TaskTuner:
    """One task's tuning state (space, records, rng, its own search/sampler/cost model);
    `tune_round` runs one propose -> select -> measure -> fit round.

    A space that fits in one round (or in the per-task minimum) is measured config by
    config instead of searched: an elementwise kernel has a handful of schedules."""

    def __init__(self, task, task_index: int, parts: Components, run: RunInfo, prior=(), own=()):
        """`prior`: records reused from tuning.database; `own`: this run's records of the task (resume)."""
        self.task, self.parts, self.run = task, parts, run
        self.space = parts.hardware.space(task)
        self.records = [*prior, *own]
        run.measured += len(self.records)
        self.visited = {tuple(r.config) for r in self.records}
        self.rng, self.round_index = _restore_state(run, task, parts.search, task_index)
        self.times = {"search_s": 0.0, "model_s": 0.0, "build_s": 0.0, "run_s": 0.0}
        self.outcome = TaskOutcome(task, self.records, times=self.times, reused=len(prior))
        self.enumerated = (list(self.space.enumerate())
                           if self.space.size <= max(run.plan_size, run.min_trials_per_task) else None)
        self.done = False
        _fit(parts.cost_model, self.space, task, self.records, self.times)
        if self.enumerated is not None and not self._next_enumerated(1):
            self._stop("space enumerated")

    @property
    def measured(self) -> int:
        return len(self.records)

    @property
    def weight(self) -> int:
        return self.task.weight

    def best_history(self) -> list[float]:
        """Best latency (seconds) after each round so far (reused records first)."""
        best, history, previous = math.inf, [], None
        for record in self.records:
            if history and (record.round, record.method) == previous:
                history.pop()
            best = min(best, record.result.cost)
            history.append(best)
            previous = (record.round, record.method)
        return history

    def _stop(self, reason: str) -> None:
        self.done = True
        self.outcome.stopped_because = reason

    def _next_enumerated(self, n: int) -> list:
        return take_unvisited(self.enumerated, self.space, self.visited, [], n)

    def tune_round(self, n: int, progress) -> int:
        """Measure up to n new configs; returns how many were measured."""
        task, parts, run = self.task, self.parts, self.run
        stop = _early_stop(run, self.records)
        if run.rounds_per_task is not None and self.round_index >= run.rounds_per_task:
            stop = "rounds"
        if stop:
            self._stop(stop)
            return 0
        started = time.perf_counter()
        if self.enumerated is not None:
            batch = self._next_enumerated(n)
        else:
            candidates = parts.search.propose(self.space, parts.cost_model, run.plan_size, self.visited, self.rng)
            batch = parts.sampler.select(candidates, self.space, self.visited, n, self.rng,
                                         exploration=parts.search.exploration())
        search_s = time.perf_counter() - started
        self.times["search_s"] += search_s
        if not batch:
            self._stop("space enumerated" if self.enumerated is not None else "space exhausted")
            return 0
        predicted = _predicted_throughput(parts.cost_model, self.space, batch) if self.records else None
        round_index, first_index = self.round_index, len(self.records) - self.outcome.reused

        def write(i, result):
            config = tuple(batch[i])
            record = Record(task.name, task.key, list(config), _jsonable(self.space.decisions(config)), result,
                            round_index, run.method, run.seed, first_index + i, time.time())
            run.log.append(record)
            self.records.append(record)
            self.visited.add(config)
            run.measured += 1
            progress.update(1)

        progress.set_description(f"{task.name} round {round_index}: building+timing {len(batch)}")
        results = parts.evaluator.measure(parts.hardware, task, batch, on_result=write)
        progress.set_description(f"{task.name} round {round_index}: searching")
        self.times["build_s"] += sum(r.build_s for r in results)
        self.times["run_s"] += sum(r.run_s for r in results)
        _fit(parts.cost_model, self.space, task, self.records, self.times)
        parts.search.observe(batch, results)
        self.round_index += 1
        _save_state(run, task, parts.search, self.rng, self.round_index)
        round_metrics = {"round/search_s": search_s, "round/batch": len(batch),
                         "round/measure_s": sum(r.build_s + r.run_s for r in results),
                         **{f"search/{k}": v for k, v in parts.search.metrics().items()},
                         **{f"sampler/{k}": v for k, v in parts.sampler.metrics().items()},
                         **{f"evaluator/{k}": v for k, v in parts.evaluator.metrics().items()}}
        _log_step(parts.tracker, run, task, self.outcome, predicted, results, round_metrics)
        progress.set_postfix(best_gflops=f"{max(p[1] for p in self.outcome.curve()):.1f}")
        if self.enumerated is not None and not self._next_enumerated(1):
            self._stop("space enumerated")
        return len(results)

    def finish(self) -> None:
        if self.run.abandoned:
            best_from_records(self.outcome)
        elif self.outcome.reused and self.measured == self.outcome.reused:
            best_from_records(self.outcome)  # nothing new measured: re-measuring would spend time for nothing
            self.outcome.stopped_because = "reused"
        else:
            _finish(self.parts, self.task, self.outcome)


def _progress(run: RunInfo):
    return tqdm(total=run.trials, initial=run.measured, unit="trial", dynamic_ncols=True)


def _out_of_time(run: RunInfo) -> bool:
    return run.deadline is not None and time.monotonic() >= run.deadline


# ---- pieces of the loop ------------------------------------------------------------------
def _early_stop(run: RunInfo, records) -> str | None:
    if run.early_stop and records:
        costs = [r.result.cost for r in records]
        best_at = int(np.argmin(costs))
        if len(records) - 1 - best_at >= run.early_stop:
            return "early stop"
    return None


def _fit(cost_model, space, task, records, times) -> None:
    if not records:
        return
    started = time.perf_counter()
    X = space.features([tuple(r.config) for r in records])
    y = np.array([r.result.gflops(task.flops) for r in records], dtype=np.float64)
    cost_model.fit(X, y)
    times["model_s"] += time.perf_counter() - started


def _predicted_throughput(cost_model, space, batch):
    """The model's throughput estimate: its predictive mean where it has one (rf's `predict` is an
    acquisition, which ranks uncertain configs high on purpose)."""
    features = space.features(batch)
    return cost_model.predict_dist(features)[0] if cost_model.has_uncertainty else cost_model.predict(features)


def _rank_correlation(predicted, results, flops) -> float | None:
    measured = [r.gflops(flops) for r in results]
    if predicted is None or len(measured) < 3 or np.ptp(predicted) == 0 or np.ptp(measured) == 0:
        return None
    return float(spearmanr(predicted, measured).statistic)


def _log_step(tracker, run, task, outcome, predicted, results, round_metrics) -> None:
    best_gflops = outcome.curve()[-1][1]
    metrics = {
        "tuning/best_gflops": best_gflops,
        "tuning/best_latency_us": task.flops / best_gflops / 1e3 if best_gflops > 0 else math.inf,
        "tuning/invalid": outcome.invalid,
        **{f"time/{k}": v for k, v in outcome.times.items()},
    }
    correlation = _rank_correlation(predicted, results, task.flops)
    if correlation is not None:
        metrics["model/rank_corr"] = correlation
    metrics.update({f"task/{task.name}/{k.split('/')[-1]}": v for k, v in metrics.items() if k.startswith("tuning/")})
    metrics.update(round_metrics)
    tracker.log_metrics(metrics, step=run.measured)


def _finish(parts: Components, task, outcome: TaskOutcome) -> None:
    """Re-measure the best few together; report the best re-measured one.

    The minimum of many noisy readings is biased low, and this host's speed
    shifts by ~25% over seconds, so a config's first reading is not its latency."""
    ok = sorted((r for r in outcome.records if r.result.ok), key=lambda r: r.result.cost)
    if not ok:
        return
    outcome.tuning_best_cost = ok[0].result.cost
    finalists = ok[:parts.evaluator.final_candidates]
    again = parts.evaluator.remeasure(parts.hardware, task, [tuple(r.config) for r in finalists])
    measured = [(a.costs, r) for a, r in zip(again, finalists) if a.ok] or [(ok[0].result.costs, ok[0])]
    costs, record = min(measured, key=lambda pair: float(np.median(pair[0])))
    outcome.best_config = tuple(record.config)
    outcome.final_costs = costs
    outcome.best_cost = float(np.median(costs))


def best_from_records(outcome: TaskOutcome) -> None:
    ok = [r for r in outcome.records if r.result.ok]
    if ok:
        best = min(ok, key=lambda r: r.result.cost)
        outcome.best_config, outcome.final_costs = tuple(best.config), list(best.result.costs)
        outcome.best_cost = outcome.tuning_best_cost = best.result.cost


# ---- resume state ------------------------------------------------------------------------
def _state_path(run: RunInfo, task) -> Path:
    return run.out_dir / "state" / f"{task.key}.json"


def _restore_state(run: RunInfo, task, search, task_index: int):
    rng = np.random.default_rng([run.seed, task_index])
    path = _state_path(run, task)
    if not path.exists():
        return rng, 0
    state = json.loads(path.read_text())
    rng.bit_generator.state = state["rng"]
    search.load_state_dict(state["search"])
    return rng, state["round"]


def _save_state(run: RunInfo, task, search, rng, round_index: int) -> None:
    path = _state_path(run, task)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    state = {"round": round_index, "rng": rng.bit_generator.state, "search": search.state_dict()}
    temporary.write_text(json.dumps(state))
    os.replace(temporary, path)  # atomic: a kill leaves the old or the new state, never half


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
