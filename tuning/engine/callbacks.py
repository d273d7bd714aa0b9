"""Measure callbacks: what happens around each measurement and round, MetaSchedule's way.

The loop measures; everything it does with a result beyond its own bookkeeping (visited set,
records in memory, the count) is a callback in `RunInfo.callbacks`, called in list order:

    on_start(run)                      once, after every task's records are loaded (resume included)
    before_measure(tuner, batch)       a round's batch is chosen and not yet measured
    on_result(tuner, record)           one measurement came back (its Record, in measured order)
    after_round(report) -> str | None  a round is over (model refit, search observed, state saved);
                                       a string abandons the run with that reason (e.g. "pruned")
    after_remeasure(tuner, configs, results)  the task's best few were measured again at the end
    on_end(outcomes)                   every task finished (its best re-measured, unless abandoned)

`tuner` is the loop's TaskTuner (task, parts, space, records, outcome); `report` a RoundReport.
A callback must not change what is measured: the records of a seed do not depend on callbacks.
The default list is `default_callbacks(tracker)`: append each record to records.jsonl, show the
progress bar, log the step metrics. A sweep adds its pruner (tuning/sweep/multirun.py); a run with a
measurement store (hardware.store) adds its StoreWriter; a whole model adds NetworkTime (its estimate over
wall time and each round's choice, tuning/engine/network_time.py).
"""
from __future__ import annotations

import json
import logging
import math
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from tuning.config.naming import BEST_SO_FAR
from tuning.cost_model.base import model_input
from tuning.engine.spec import JobSpec
from tuning.store import TaskRows

ROUND_TIMES_FILE = "round_times.jsonl"  # each round's time/* points, {key, value, step} a line

log = logging.getLogger("tunelab")


@dataclass(frozen=True)
class Choice:
    """Why a round went to its task: `by` "minimum" (every task first gets budget.min_trials_per_task,
    fewest measured first) or "scheduler"; `scores`, by task name, what the scheduler ranked the live
    tasks by (Scheduler.scores, named `metric`: gradient_ms), empty for the minimum and for a rule that
    ranks by none."""
    by: str
    scores: dict[str, float] = field(default_factory=dict)
    metric: str = ""


@dataclass
class RoundReport:
    tuner: Any  # the task's TaskTuner (tuning/engine/loop.py)
    batch: list  # the configs measured this round
    results: list  # their MeasureResults, in order
    round_index: int
    search_s: float  # seconds spent proposing and selecting
    measured: int  # measurements of the whole run so far
    outcomes: list  # every task's TaskOutcome
    choice: Choice | None = None  # why the round went to this task (None: a round run outside tune_tasks)


class MeasureCallback:
    """Base class; every hook does nothing unless overridden."""

    def on_start(self, run) -> None:
        pass

    def before_measure(self, tuner, batch) -> None:
        pass

    def on_result(self, tuner, record) -> None:
        pass

    def after_round(self, report: RoundReport) -> str | None:
        return None

    def after_remeasure(self, tuner, configs, results) -> None:
        pass

    def on_end(self, outcomes) -> None:
        pass


class AppendRecords(MeasureCallback):
    """Each record to the run's records.jsonl, flushed as it arrives (a kill loses no
    measurement), the file synced to disk after every round and at the end."""

    def on_start(self, run) -> None:
        self.writer = run.log.writer()

    def on_result(self, tuner, record) -> None:
        self.writer.write(record)

    def after_round(self, report: RoundReport) -> None:
        self.writer.sync()

    def on_end(self, outcomes) -> None:
        self.writer.close()


class ProgressBar(MeasureCallback):
    def on_start(self, run) -> None:
        # a terminal that reports 0 columns (some CI consoles, `script`) would get an empty bar
        columns = shutil.get_terminal_size(fallback=(100, 24)).columns
        self.bar = tqdm(total=run.trials, initial=run.progress.measured, unit="trial", dynamic_ncols=columns > 0,
                        ncols=None if columns > 0 else 100, disable=None)  # None: off unless a terminal

    def before_measure(self, tuner, batch) -> None:
        self.bar.set_description(f"{tuner.task.name} round {tuner.round_index}: building+timing {len(batch)}")

    def on_result(self, tuner, record) -> None:
        self.bar.update(1)

    def after_round(self, report: RoundReport) -> None:
        self.bar.set_description(f"{report.tuner.task.name} round {report.round_index}: searching")
        self.bar.set_postfix(best_gflops=f"{report.tuner.outcome.tuning_best_gflops:.1f}")

    def on_end(self, outcomes) -> None:
        self.bar.set_description("done (best re-measured)", refresh=False)
        self.bar.close()


class StepMetrics(MeasureCallback):
    """Per round, at step = measurements so far: best/gflops_so_far, tuning/* (best latency so far,
    invalid), time/* (under a simulated clock also time/simulated_s), hardware/gauge_us (the drift
    gauge), task/<name>/* (a run of several tasks),
    round/*, search/*, sampler/*, evaluator/* and model/rank_corr, the Spearman correlation of the
    cost model's throughput estimate (taken before the round was measured) with the measured one.
    Flushed every round; the curve part (`curve_metrics`) can be rebuilt from records.jsonl, and
    the time/* points are also appended to the run folder's round_times.jsonl, so a run re-logged
    from its folder on another machine keeps its per-round search and model seconds (the seconds
    axis of `compare --with-overhead`)."""

    def __init__(self, tracker):
        self.tracker = tracker
        self.predicted = None

    def on_start(self, run) -> None:
        self.times_file = run.log.path.parent / ROUND_TIMES_FILE

    def before_measure(self, tuner, batch) -> None:
        self.predicted = None
        if tuner.records:
            self.predicted = tuner.parts.cost_model.predict_throughput(
                model_input(tuner.space, tuner.parts.cost_model, batch))

    def after_round(self, report: RoundReport) -> None:
        tuner = report.tuner
        task, outcome, parts = tuner.task, tuner.outcome, tuner.parts
        new = len(report.results)
        before = best_and_invalid(task, tuner.records[:len(tuner.records) - new])
        for step, point in curve_points(task, tuner.records[len(tuner.records) - new:], report.measured - new, *before,
                                        per_task=len(report.outcomes) > 1):
            self.tracker.log_metrics(point, step=step)  # buffered: one write per round
        metrics = {f"time/{k}": v for k, v in outcome.times.items()}
        if parts.hardware.simulated_clock:
            metrics["time/simulated_s"] = tuner.run.progress.simulated_s  # the stored seconds so far, all tasks
        self._keep_times(metrics, report.measured)
        gauges = [r.gauge_s for r in report.results if r.gauge_s and not r.reused]
        if gauges:  # the host's drift: the fixed reference kernel, timed with this round's batch
            metrics["hardware/gauge_us"] = float(np.median(gauges)) * 1e6
        correlation = rank_correlation(self.predicted, report.results, task.flops)
        if correlation is not None:
            metrics["model/rank_corr"] = correlation
        metrics.update({"round/search_s": report.search_s, "round/batch": len(report.batch),
                        "round/measure_s": sum(r.build_s + r.run_s for r in report.results),
                        **{f"search/{k}": v for k, v in parts.search.metrics().items()},
                        **{f"sampler/{k}": v for k, v in parts.sampler.metrics().items()},
                        **{f"evaluator/{k}": v for k, v in parts.evaluator.metrics().items()}})
        self.tracker.log_metrics(metrics, step=report.measured)
        self.tracker.flush()  # every round: a kill loses at most the round being measured

    def _keep_times(self, metrics: dict, step: int) -> None:
        with open(self.times_file, "a") as out:
            out.writelines(json.dumps({"key": k, "value": v, "step": step}) + "\n" for k, v in metrics.items())


def curve_points(task, records, step: int, best: float = 0.0, invalid: int = 0,
                 per_task: bool = False) -> list[tuple[int, dict]]:
    """The tuning curve's points at each of `records` (one per measurement, steps step+1, ...), from
    the task's best GFLOP/s and invalid count before them: what `python -m tuning.tools.sync` rebuilds."""
    points = []
    for record in records:
        step += 1
        if record.result.ok:
            best = max(best, record.result.gflops(task.flops))
        invalid += not record.result.ok
        points.append((step, curve_metrics(task, best, invalid, per_task)))
    return points


def best_and_invalid(task, records) -> tuple[float, int]:
    return (max((r.result.gflops(task.flops) for r in records if r.result.ok), default=0.0),
            sum(not r.result.ok for r in records))


def curve_metrics(task, best_gflops: float, invalid: int, per_task: bool = False) -> dict:
    """The tuning curve's point after a round of `task`: what `python -m tuning.tools.sync` rebuilds from
    records; `per_task` (a run of several tasks) also under task/<name>/, which one task's run would repeat."""
    latency_us = task.flops / best_gflops / 1e3 if best_gflops > 0 else math.inf
    metrics = {BEST_SO_FAR: best_gflops, "tuning/best_latency_us": latency_us, "tuning/invalid": invalid}
    if per_task:
        metrics.update({f"task/{task.name}/best_gflops": best_gflops, f"task/{task.name}/best_latency_us": latency_us,
                        f"task/{task.name}/invalid": invalid})
    return metrics


class StoreWriter(MeasureCallback):
    """Every reading this run takes, tuning and final re-measurement alike, as a row of the measurement
    store (tuning/store/). Answers that came from the store (`reused`) and `not_in_store` misses are
    not readings and are not written, nor are screened ones (one run, not the spec's reading). `truth(task, space, config)` is the store's median over every
    reading of a config: the score comparisons use (docs/store.md, Truth scoring)."""

    def __init__(self, store, hardware, spec):
        self.store, self.hardware, self.spec = store, hardware, spec
        self._tables: dict = {}

    def table(self, task, space) -> TaskRows:
        if task.key not in self._tables:
            self._tables[task.key] = TaskRows(self.store, self.hardware, self.spec, task, space)
        return self._tables[task.key]

    def _write(self, tuner, config, result, source: str) -> None:
        if result.reused or result.error == "not_in_store" or result.screened:  # one run is not the spec's reading
            return
        self.table(tuner.task, tuner.space).add(config, result, source)  # the requested config: what a lookup asks

    def on_result(self, tuner, record) -> None:
        self._write(tuner, record.config, record.result, "run")

    def after_remeasure(self, tuner, configs, results) -> None:
        for config, result in zip(configs, results):
            self._write(tuner, config, result, "remeasure")

    def truth(self, task, space, config) -> float | None:
        return self.table(task, space).truth(tuple(config))


class Pace(MeasureCallback):
    """One line, once the first round of new measurements is done: how long the rest of the run will
    take on this host at the pace so far (wall seconds per measurement, search and fitting included),
    plus the final re-measurement (`finalists` configs, at the first round's mean build + run seconds)
    and, for a whole model, the end-to-end check: two model builds of `kernels` kernels at the first
    round's mean compile seconds, and `e2e_timing_s` of timing; `in_model_builds` more kernel builds
    when the heaviest kernels are re-chosen inside the model (tuning/engine/model_choice.py; its readings,
    model runs, are not counted). Under a deadline (budget.minutes, time_limit_s) that comes before the
    count: how many more measurements the time left allows, with a warning when that is less than
    every one of `tasks` tasks' first measurements (the scheduler would never decide)."""

    def __init__(self, kernels: int = 0, e2e_timing_s: float = 0.0, finalists: int = 0, in_model_builds: int = 0,
                 tasks: int = 1):
        self.kernels, self.e2e_timing_s, self.finalists = kernels, e2e_timing_s, finalists
        self.in_model_builds, self.tasks = in_model_builds, tasks
        self.said = False

    @classmethod
    def of_job(cls, job: JobSpec, tasks, evaluator) -> Pace:
        """A tuning job's: each task's best few re-measured; a whole model's end-to-end check when enabled."""
        in_model = job.chosen_in_model(len(tasks))
        finalists = (len(tasks) - in_model) * evaluator.final_candidates  # the heaviest in_model are read in the model
        if job.model.whole and job.e2e.enabled:  # tuned, untuned and torch timed
            e2e = job.e2e
            builds = len(tasks) + in_model * e2e.in_model_candidates if in_model else 0  # once, for every process
            return cls(kernels=len(tasks), e2e_timing_s=3 * e2e.max_seconds, finalists=finalists,
                       in_model_builds=builds, tasks=len(tasks))
        return cls(finalists=finalists, tasks=len(tasks))

    def on_start(self, run) -> None:
        self.run, self.started, self.first = run, time.perf_counter(), run.progress.measured

    def after_round(self, report: RoundReport) -> None:
        new = [r for r in report.results if not r.reused]
        if self.said or not new or report.measured >= self.run.trials:
            return
        self.said = True
        done = report.measured - self.first
        per = (time.perf_counter() - self.started) / max(done, 1)
        if self.run.deadline is not None and self._by_the_clock(self.run.deadline, report.measured, per):
            return
        tuning_s = per * (self.run.trials - report.measured)
        build_s = sum(r.build_s for r in new) / len(new)
        final_s = self.finalists * (build_s + sum(r.run_s for r in new) / len(new))
        e2e_s = (2 * self.kernels + self.in_model_builds) * build_s + self.e2e_timing_s if self.kernels else 0.0
        log.info(f"estimate: {_minutes(tuning_s + final_s + e2e_s)} more at this pace ({per:.2g} s per measurement "
                 f"in the first round x {self.run.trials - report.measured} to go, + {_minutes(final_s)} "
                 f"re-measuring the best" + (f", + {_minutes(e2e_s)} for the end-to-end check" if e2e_s else "") + ")")

    def _by_the_clock(self, deadline: float, measured: int, per: float) -> bool:
        """The line for a deadline that comes before the count; False when the count comes first."""
        left_s = max(0.0, deadline - time.monotonic())
        more = int(left_s / per)
        if more >= self.run.trials - measured:
            return False
        log.info(f"estimate: about {more} more measurements in the {_minutes(left_s)} of tuning left, at this "
                 f"pace ({per:.2g} s per measurement in the first round), then the checks")
        first_pass = self.tasks * self.run.min_trials_per_task if self.tasks > 1 else 0
        if measured + more < first_pass:
            log.warning(f"warning: at this pace the time measures about {measured + more} in all, fewer than every "
                        f"kernel's first {self.run.min_trials_per_task} ({first_pass}): the scheduler will not "
                        f"decide, and some kernels get fewer; give more budget.minutes")
        return True


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def rank_correlation(predicted, results, flops) -> float | None:
    measured = [r.gflops(flops) for r in results]
    if predicted is None or len(measured) < 3 or np.ptp(predicted) == 0 or np.ptp(measured) == 0:
        return None
    from scipy.stats import spearmanr  # here: scipy.stats costs half a second at every job's start

    return float(spearmanr(predicted, measured).statistic)


def default_callbacks(tracker) -> list[MeasureCallback]:
    return [AppendRecords(), ProgressBar(), StepMetrics(tracker)]
