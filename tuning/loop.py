"""The tuning loop for one task (DESIGN.md §The loop).

    until the budget is spent, the time is up, early stopping, or the space is exhausted:
        candidates = search.propose(...)          # no measuring here
        batch      = sampler.select(...)
        results    = evaluator.measure(...)       # each record appended + flushed as it arrives
        cost_model.fit(all measured so far)
        search.observe(batch, results)
        save search/rng state; log step metrics

Resuming reads the records file (visited set, cost model) and the saved
search and rng state, so a killed run finishes with exactly `trials` records
and never measures a config twice.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr
from tqdm import tqdm

from tuning.records import Record, RecordLog


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
    trials: int
    plan_size: int
    deadline: float | None = None  # time.monotonic() value
    early_stop: int | None = None
    step_offset: int = 0  # measurements of earlier tasks, so metric steps keep rising

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


def tune_task(task, task_index: int, parts: Components, run: RunInfo) -> TaskOutcome:
    space = parts.hardware.space(task)
    run.log.repair()  # a kill can leave a torn last line; appending after it would corrupt the file
    records = [r for r in run.log.load() if r.workload_key == task.key]
    visited = {tuple(r.config) for r in records}
    rng, round_index = _restore_state(run, task, parts.search, task_index)
    times = {"search_s": 0.0, "model_s": 0.0, "build_s": 0.0, "run_s": 0.0}
    _fit(parts.cost_model, space, task, records, times)
    outcome = TaskOutcome(task, records, times=times)
    progress = tqdm(total=run.trials, initial=len(records), desc=task.name, unit="trial", dynamic_ncols=True)

    while len(records) < run.trials:
        stop = _stop_reason(run, task, records)
        if stop:
            outcome.stopped_because = stop
            break
        started = time.perf_counter()
        wanted = min(run.plan_size, run.trials - len(records))
        candidates = parts.search.propose(space, parts.cost_model, run.plan_size, visited, rng)
        batch = parts.sampler.select(candidates, space, visited, wanted, rng)
        times["search_s"] += time.perf_counter() - started
        if not batch:
            outcome.stopped_because = "space exhausted"
            break
        predicted = parts.cost_model.predict(space.features(batch)) if records else None

        def write(i, result, _batch=batch, _round=round_index):
            config = tuple(_batch[i])
            record = Record(task.name, task.key, list(config), _jsonable(space.decisions(config)), result,
                            _round, run.method, run.seed, len(records), time.time())
            run.log.append(record)
            records.append(record)
            visited.add(config)
            progress.update(1)

        progress.set_description(f"{task.name} round {round_index}: building+timing {len(batch)}")
        results = parts.evaluator.measure(parts.hardware, task, batch, on_result=write)
        progress.set_description(f"{task.name} round {round_index}: searching")
        times["build_s"] += sum(r.build_s for r in results)
        times["run_s"] += sum(r.run_s for r in results)
        _fit(parts.cost_model, space, task, records, times)
        parts.search.observe(batch, results)
        round_index += 1
        _save_state(run, task, parts.search, rng, round_index)
        _log_step(parts.tracker, run, task, outcome, predicted, results)
        progress.set_postfix(best_gflops=f"{max(p[1] for p in outcome.curve()):.1f}")
    progress.close()
    _finish(parts, task, outcome)
    return outcome


# ---- pieces of the loop ------------------------------------------------------------------
def _stop_reason(run: RunInfo, task, records) -> str | None:
    if run.deadline is not None and time.monotonic() >= run.deadline:
        return "time limit"
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


def _rank_correlation(predicted, results, flops) -> float | None:
    measured = [r.gflops(flops) for r in results]
    if predicted is None or len(measured) < 3 or np.ptp(predicted) == 0 or np.ptp(measured) == 0:
        return None
    return float(spearmanr(predicted, measured).statistic)


def _log_step(tracker, run, task, outcome, predicted, results) -> None:
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
    tracker.log_metrics(metrics, step=run.step_offset + len(outcome.records))


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
