"""The tuning loop (docs/architecture.md §The loop).

    until the run's budget is spent, the time is up, every task stopped, or a callback abandons it:
        task       = the next task without its minimum yet, else scheduler.pick(tasks)
        batch      = the task's common random configs not yet measured (budget.init_random), then
                     in its first round, with tuning.prior, the prior's best of a random pool
                     (tuning/engine/first_round.py), then
        candidates = task's search.propose(...)   # no measuring here
        batch     += task's sampler.select(...)   # up to the round's size
        results    = evaluator.measure_against(..., the task's best so far)   # on_result per record as it arrives
        task's cost_model.fit(all its records)
        task's search.observe(batch, results)
        save its search/rng state; callbacks' after_round (step metrics, an Optuna sweep's pruning)
    re-measure each task's best few (not when abandoned; not the heaviest `in_model_kernels`, whose
    finalists the whole model's end reads inside the model: tuning/engine/model_choice.py)

The loop talks to components only through their contracts (tuning/*/base.py) and to everything
else through measure callbacks (tuning/engine/callbacks.py). A single-operator model is the one-task case.
Resuming reads the records file (visited sets, cost models) and each task's saved search and rng
state (tuning/engine/resume.py); the scheduler decides from the records alone, so a killed run finishes
with exactly `trials` records and never measures a config twice.
"""
from __future__ import annotations

import hashlib
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tuning.core.host_load import host_load
from tuning.core.outcome import TaskOutcome, best_from_records
from tuning.core.plausible import bounds_of
from tuning.core.records import Record, RecordLog
from tuning.cost_model.base import CostModel, model_input
from tuning.engine.callbacks import Choice, MeasureCallback, RoundReport, default_callbacks
from tuning.engine.first_round import Prior, guided_round
from tuning.engine.resume import restore_state, save_state
from tuning.evaluator.base import Evaluator
from tuning.hardware.base import Hardware
from tuning.sampler.base import Sampler, random_unvisited, take_unvisited
from tuning.scheduler.round_robin import RoundRobin
from tuning.search.base import Search
from tuning.store import jsonable
from tuning.tracking.base import Tracker

log = logging.getLogger("tunelab")

# Where a task's wall seconds go, summed over its rounds (TaskOutcome.times, logged as time/*):
#   search_s    the search's propose and observe and the sampler's select
#   model_s     the cost model's fits
#   measure_s   the evaluator's measure: builds and runs (pipelined in the workers), the store, the
#               workers' messages (its callbacks' seconds excluded)
#   build_s, run_s   the results' own build and run seconds (stored ones under replay)
#   tracking_s  the measure callbacks: MLflow's metrics, the progress bar, an Optuna trial's pruning
#   state_s     saving the search's and rng's state for resume
#   wall_s      the rounds' wall seconds; wall_s - search - model - measure - tracking - state is
#               the loop's own Python
ROUND_TIMES = ("search_s", "model_s", "measure_s", "build_s", "run_s", "tracking_s", "state_s", "wall_s")


@dataclass
class Components:
    search: Search
    sampler: Sampler
    evaluator: Evaluator
    cost_model: CostModel
    hardware: Hardware
    tracker: Tracker


@dataclass
class Progress:
    """What a run has done so far; the loop and its callbacks update it as measurements arrive."""
    measured: int = 0  # measurements so far, all tasks: the x axis of every metric
    # hardware with a simulated clock (replay): the stored build + run seconds of every record so far,
    # which stamp the records instead of the wall clock
    simulated_s: float = 0.0
    abandoned: str | None = None  # a callback's reason to stop the run (e.g. "pruned")


@dataclass(frozen=True)
class RunInfo:
    """What a run is asked to do, fixed before its first round; `progress` is what it has done."""
    seed: int
    out_dir: Path
    method: str
    trials: int  # measurements of the whole run, all tasks together (reused records count)
    plan_size: int  # candidates a search proposes per round, and the most measured per round
    deadline: float | None = None  # time.monotonic() value
    early_stop: int | None = None
    min_trials_per_task: int = 0  # every task gets this many (or its whole space) before scheduling
    rounds_per_task: int | None = None  # a task stops after this many rounds (Chameleon's "iterations")
    # None: default_callbacks(the tracker). An abandoned run (a callback's after_round returned a
    # reason, e.g. "pruned") skips the final re-measurement: nobody wants its result.
    callbacks: list[MeasureCallback] | None = None
    init_random: int = 0  # common random numbers: each task's first N measurements (common_random_configs)
    first_round_prior: Prior | None = None  # tuning.prior: chooses each task's first round (first_round.py)
    # a whole model's end re-chooses this many heaviest tasks inside the model (e2e.in_model_kernels):
    # their finalists are read there, so the loop leaves them un-re-measured (remeasure_deferred)
    in_model_kernels: int = 0
    progress: Progress = field(default_factory=Progress, compare=False)

    @property
    def log(self) -> RecordLog:
        return RecordLog(self.out_dir / "records.jsonl")


def tune_task(task, parts: Components, run: RunInfo, prior=()) -> TaskOutcome:
    """Tune one task until the run's budget (or a stop) and re-measure its best."""
    return tune_tasks([task], lambda _: parts, run, RoundRobin(), {task.key: list(prior)})[0]


def tune_tasks(tasks, components_for, run: RunInfo, scheduler, prior=None) -> list[TaskOutcome]:
    """Tune a model's tasks under one budget: first every task gets `min_trials_per_task`
    measurements (or its whole space), fewest-measured first; then `scheduler` picks the
    task of each round. `components_for(index)` gives a task its own search, sampler and
    cost model; `prior[key]` are records from tuning.database."""
    prior, progress = prior or {}, run.progress
    run.log.repair()  # a kill can leave a torn last line; appending after it would corrupt the file
    own: dict = {}
    for record in run.log.load():
        own.setdefault(record.workload_key, []).append(record)
    parts = [components_for(i) for i in range(len(tasks))]
    if parts[0].hardware.simulated_clock:
        run.progress.simulated_s = max((r.time for records in own.values() for r in records), default=0.0)
    callbacks = run.callbacks if run.callbacks is not None else default_callbacks(parts[0].tracker)
    tuners = [TaskTuner(task, i, parts[i], run, callbacks, prior.get(task.key, ()), own.get(task.key, ()))
              for i, task in enumerate(tasks)]
    outcomes = [t.outcome for t in tuners]
    for callback in callbacks:
        callback.on_start(run)
    last_round_s = 0.0  # a round is not begun where one as long as the last would end past the deadline
    try:
        while progress.measured < run.trials:
            if _out_of_time(run, last_round_s):
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
                n, choice = run.min_trials_per_task - tuner.measured, Choice("minimum")
            else:
                (tuner, choice), n = scheduled(scheduler, live), run.plan_size
            begun = time.monotonic()
            progress.abandoned = tuner.tune_round(min(n, run.plan_size, run.trials - progress.measured), outcomes,
                                                  choice)
            last_round_s = time.monotonic() - begun
            if progress.abandoned:
                for tuner in live:
                    tuner._stop(progress.abandoned)
                break
        left_to_model = heaviest_tuners(tuners, 0 if progress.abandoned else run.in_model_kernels)
        for tuner in tuners:
            tuner.finish(defer=tuner in left_to_model)
    finally:
        for callback in callbacks:
            callback.on_end(outcomes)
    return outcomes


def scheduled(scheduler, live: list) -> tuple[TaskTuner, Choice]:
    """(the live task the scheduler picks, the Choice saying why: what it ranked the tasks by)."""
    scores = scheduler.scores(live)
    ranked = {} if scores is None else {t.task.name: float(score) for t, score in zip(live, scores)}
    return live[scheduler.pick(live)], Choice("scheduler", ranked, scheduler.score_metric)


def schedule_without_measuring(tasks, components_for, seed: int) -> list[TaskOutcome]:
    """budget.trials=0 (search=value, random): each task's schedule is its search's `best`, chosen with
    no measurement (its randomness drawn from the seed and the task); then timed once by the
    evaluator's re-measurement, as a tuned task's best is at the end (the result, not a record:
    nothing was measured to choose it). A choice that fails to build,
    run or answer correctly is dropped: the task stays untuned, and says why."""
    outcomes = []
    for index, task in enumerate(tasks):
        parts = components_for(index)
        started = time.perf_counter()
        rng = np.random.default_rng([seed, _task_stream(task)])
        chosen = parts.search.best(parts.hardware.space(task), parts.cost_model, rng)
        outcome = TaskOutcome(task, [], stopped_because="unmeasured")
        outcome.times["search_s"] = time.perf_counter() - started
        if chosen is not None:
            [again] = parts.evaluator.remeasure(parts.hardware, task, [tuple(chosen[0])])
            if again.ok:
                outcome.best_config = tuple(chosen[0])
                outcome.predicted_cost = None if chosen[1] is None else float(chosen[1])
                outcome.final_costs, outcome.best_cost = list(again.costs), float(np.median(again.costs))
            else:
                outcome.stopped_because = f"unmeasured; its choice failed ({again.error})"
        outcomes.append(outcome)
    log.info(f"scheduled {len(tasks)} kernel{'s' * (len(tasks) != 1)} without measuring in "
             f"{sum(o.times['search_s'] for o in outcomes):.1f} s of search")
    return outcomes


class TaskTuner:
    """One task's tuning state (space, records, rng, its own search/sampler/cost model);
    `tune_round` runs one propose -> select -> measure -> fit round.

    A space that fits in one round (or in the per-task minimum) is measured config by
    config, in a seeded order, instead of searched: an elementwise kernel has a handful of schedules."""

    def __init__(self, task, task_index: int, parts: Components, run: RunInfo, callbacks=(), prior=(), own=()):
        """`prior`: records reused from tuning.database; `own`: this run's records of the task (resume)."""
        self.task, self.parts, self.run, self.callbacks = task, parts, run, list(callbacks)
        self.space = parts.hardware.space(task)
        self.records = [*prior, *own]
        run.progress.measured += len(self.records)
        self.visited = {tuple(r.config) for r in self.records}
        self.rng, self.round_index = restore_state(run.out_dir, task, parts.search, run.seed, task_index,
                                                      parts.cost_model)
        self.times = {name: 0.0 for name in ROUND_TIMES}
        self.outcome = TaskOutcome(task, self.records, times=self.times, reused=len(prior))
        self.enumerated = (enumeration_order(self.space, task, run.seed)
                           if self.space.size <= max(run.plan_size, run.min_trials_per_task) else None)
        self.common = (common_random_configs(self.space, task, run.seed, run.init_random)
                       if run.init_random and self.enumerated is None else [])
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
        best, previous = float("inf"), None
        history: list[float] = []
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
        return take_unvisited(self.enumerated or [], self.space, self.visited, [], n)

    def tune_round(self, n: int, outcomes=(), choice: Choice | None = None) -> str | None:
        """Measure up to n new configs; returns a callback's reason to abandon the run, or None.
        `choice`: why this round came to the task, handed to the callbacks in the RoundReport."""
        task, parts, run = self.task, self.parts, self.run
        stop = _early_stop(run, self.records)
        if run.rounds_per_task is not None and self.round_index >= run.rounds_per_task:
            stop = "rounds"
        if stop:
            self._stop(stop)
            return None
        started = time.perf_counter()
        if self.enumerated is not None:
            batch = self._next_enumerated(n)
        else:
            batch = [c for c in self.common if c not in self.visited][:n]
            prior = self._first_round_prior()
            if len(batch) < n and prior is not None:
                batch += guided_round(prior, self.space, self.visited, batch, n - len(batch), self.rng)
            if len(batch) < n:
                taken = self.visited | set(batch)
                wanted = parts.sampler.candidates_wanted(run.plan_size)
                candidates = parts.search.propose(self.space, parts.cost_model, wanted, taken, self.rng)
                batch += parts.sampler.select(candidates, self.space, taken, n - len(batch), self.rng,
                                              exploration=parts.search.exploration())
        search_s = time.perf_counter() - started
        self.times["search_s"] += search_s
        if not batch:
            self._stop("space enumerated" if self.enumerated is not None else "space exhausted")
            return None
        with _seconds(self.times, "tracking_s"):
            for callback in self.callbacks:
                callback.before_measure(self, batch)
        round_index, first_index = self.round_index, len(self.records) - self.outcome.reused
        limits = bounds_of(task, parts.hardware)

        def write(i, result):
            result = result.within(limits)
            config = tuple(batch[i])
            stamp = time.time()
            if parts.hardware.simulated_clock:
                run.progress.simulated_s += result.build_s + result.run_s
                stamp = run.progress.simulated_s
            record = Record(task.name, task.key, list(config), jsonable(self.space.decisions(config)), result,
                            round_index, run.method, run.seed, first_index + i, stamp)
            self.records.append(record)
            self.visited.add(config)
            run.progress.measured += 1
            with _seconds(self.times, "tracking_s"):
                for callback in self.callbacks:
                    callback.on_result(self, record)

        measuring, tracked = time.perf_counter(), self.times["tracking_s"]
        incumbent = min((r.result.cost for r in self.records if r.result.ok), default=None)
        results = [r.within(limits) for r in
                   parts.evaluator.measure_against(parts.hardware, task, batch, incumbent, on_result=write)]
        self.times["measure_s"] += time.perf_counter() - measuring - (self.times["tracking_s"] - tracked)
        self.times["build_s"] += sum(r.build_s for r in results)
        self.times["run_s"] += sum(r.run_s for r in results)
        _fit(parts.cost_model, self.space, task, self.records, self.times)
        with _seconds(self.times, "search_s"):
            parts.search.observe(batch, results)
        self.round_index += 1
        with _seconds(self.times, "state_s"):
            save_state(run.out_dir, task, parts.search, self.rng, self.round_index, parts.cost_model)
        self.times["wall_s"] += time.perf_counter() - started  # real seconds, beside the (maybe stored) build/run
        report = RoundReport(self, batch, results, round_index, search_s, run.progress.measured,
                             list(outcomes), choice)
        with _seconds(self.times, "tracking_s", "wall_s"):
            reasons = [callback.after_round(report) for callback in self.callbacks]
        if self.enumerated is not None and not self._next_enumerated(1):
            self._stop("space enumerated")
        return next((reason for reason in reasons if reason), None)

    def _first_round_prior(self) -> Prior | None:
        """The run's prior where this round is the task's first (a resumed one too) with nothing reused,
        and the prior applies to its space (else said, once)."""
        prior = self.run.first_round_prior
        if prior is None or self.round_index != 0 or self.outcome.reused:
            return None
        if not prior.applies(self.space):
            log.info(f"tuning.prior: {self.task.name}'s space has no per-store features here (TVM does not "
                     "schedule it): its first round is the method's own")
            return None
        return prior

    def finish(self, defer: bool = False) -> None:
        """Re-measure the best few (`defer`: leave that to the in-model choice or remeasure_deferred)."""
        if self.run.progress.abandoned:
            best_from_records(self.outcome)
        elif self.outcome.reused and self.measured == self.outcome.reused:
            best_from_records(self.outcome)  # nothing new measured: re-measuring would spend time for nothing
            self.outcome.stopped_because = "reused"
        elif defer:
            best_from_records(self.outcome)
            self.outcome.remeasure_deferred = True
        else:
            configs, again = remeasure_finalists(self.outcome, self.parts.evaluator, self.parts.hardware)
            for callback in self.callbacks:
                callback.after_remeasure(self, configs, again)


def heaviest_tuners(tuners: list[TaskTuner], count: int) -> set[TaskTuner]:
    """The `count` tasks with the largest weight x fastest valid reading, as the in-model choice
    ranks them (tuning/engine/model_choice.py heaviest_outcomes)."""
    fastest = {t: min((r.result.cost for r in t.records if r.result.ok), default=float("inf")) for t in tuners}
    measured = [t for t in tuners if np.isfinite(fastest[t])]
    return set(sorted(measured, key=lambda t: -t.task.weight * fastest[t])[:count])


def remeasure_deferred(outcomes, evaluator, hardware) -> list[TaskOutcome]:
    """Re-measure the finalists of every outcome still `remeasure_deferred` (the in-model choice did
    not take it: its timing failed, or the model does not call the kernel) as the loop would have;
    returns them. Their re-readings go to no measure callback: the loop's have ended."""
    left = [o for o in outcomes if o.remeasure_deferred]
    for outcome in left:
        remeasure_finalists(outcome, evaluator, hardware)
    return left


def common_random_configs(space, task, seed: int, n: int) -> list[tuple]:
    """budget.init_random: n distinct canonical configs drawn from the seed and the task alone, so
    every method measures the same ones first at that seed (fewer when the space runs out)."""
    rng = np.random.default_rng([seed, _task_stream(task)])
    configs: list = []
    while len(configs) < n:
        config = random_unvisited(space, set(), configs, rng)
        if config is None:
            break
        configs.append(config)
    return configs


def enumeration_order(space, task, seed: int) -> list[tuple]:
    """A space small enough to measure config by config, in an order drawn from the seed and the task
    alone (the same on resume): a budget that ends before the space does measures a uniform sample
    of it, not its lexicographically first configs (one sketch, the smallest tiles)."""
    configs = list(space.enumerate())
    order = np.random.default_rng([seed, _task_stream(task), len(configs)]).permutation(len(configs))
    return [configs[i] for i in order]


def _task_stream(task) -> int:
    """A task's own random stream key (its workload key hashed): the same in every process."""
    return int.from_bytes(hashlib.sha256(task.key.encode()).digest()[:8], "little")


def _out_of_time(run: RunInfo, next_round_s: float = 0.0) -> bool:
    """Past the deadline, or near enough that a round of `next_round_s` would end after it (the
    checks after tuning are timed to start at the deadline, so a whole model's minutes hold)."""
    return run.deadline is not None and time.monotonic() + next_round_s >= run.deadline


# ---- pieces of the loop ------------------------------------------------------------------
@contextmanager
def _seconds(times: dict, *names: str):
    """Adds the block's wall seconds to each of times[names]."""
    started = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - started
        for name in names:
            times[name] += elapsed


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
    X = model_input(space, cost_model, [tuple(r.config) for r in records])
    y = np.array([r.result.gflops(task.flops) for r in records], dtype=np.float64)
    cost_model.fit(X, y)
    times["model_s"] += time.perf_counter() - started


def remeasure_finalists(outcome: TaskOutcome, evaluator, hardware) -> tuple[list, list]:
    """Re-measure the best few together; report the best re-measured one. Returns (the configs,
    their re-readings).

    The minimum of many noisy readings is biased low, and this host's speed
    shifts by ~25% over seconds, so a config's first reading is not its latency."""
    task = outcome.task
    outcome.remeasure_deferred = False
    ok = sorted((r for r in outcome.records if r.result.ok), key=lambda r: r.result.cost)
    if not ok:
        return [], []
    outcome.tuning_best_cost = ok[0].result.cost
    finalists = ok[:evaluator.final_candidates]
    configs = [tuple(r.config) for r in finalists]
    limits = bounds_of(task, hardware)
    again = [a.within(limits) for a in evaluator.remeasure(hardware, task, configs)]
    outcome.remeasure_load = host_load()  # what explains a re-reading far from the tuning reading
    measured = [(a.costs, r) for a, r in zip(again, finalists) if a.ok] or [(ok[0].result.costs, ok[0])]
    costs, record = min(measured, key=lambda pair: float(np.median(pair[0])))
    outcome.best_config = tuple(record.config)
    outcome.final_costs = costs
    outcome.best_cost = float(np.median(costs))
    return configs, again


