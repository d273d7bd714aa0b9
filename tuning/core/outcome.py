"""What a run found, per task and for the whole model: outcomes, best-so-far curves, the task table.

Plain arithmetic on records (no TVM, no MLflow): the loop fills a TaskOutcome per task, and the
objective, pruning, plots, summaries and `python -m tuning.tools.apply` all read them through this module.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tuning.core.host_load import HostLoad, disagreement

if TYPE_CHECKING:
    from tuning.core.records import Record
    from tuning.core.space import Config
    from tuning.core.task import Task

CURVE_METRICS = ("gflops", "latency_ms")


@dataclass
class TaskOutcome:
    task: Task
    records: list[Record]
    best_config: Config | None = None
    best_cost: float = math.inf  # seconds, from the final re-measurement
    tuning_best_cost: float = math.inf  # seconds, the best reading during tuning
    final_costs: list[float] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    stopped_because: str = "budget"
    reused: int = 0  # records taken from tuning.database, not measured by this run
    true_cost: float | None = None  # seconds: the store's median over every reading of best_config
    predicted_cost: float | None = None  # seconds the search predicted for a best_config it chose unmeasured
    chosen_in_model: bool = False  # best_config and final_costs read inside the model (tuning/engine/model_choice.py)
    remeasure_load: HostLoad | None = None  # the host's load when the best few were re-measured
    # left to the whole model's in-model choice, which reads its finalists there; still holding the
    # tuning's fastest reading until that choice (or, where it does not take the task, a re-measure)
    remeasure_deferred: bool = False

    @property
    def invalid(self) -> int:
        return sum(not r.result.ok for r in self.records)

    @property
    def best_gflops(self) -> float:
        return self.task.flops / self.best_cost / 1e9 if math.isfinite(self.best_cost) else 0.0

    @property
    def tuning_best_gflops(self) -> float:
        """The best GFLOP/s read so far (0 while nothing valid): the curve's last point, without the curve."""
        return max((r.result.gflops(self.task.flops) for r in self.records if r.result.ok), default=0.0)

    def curve(self) -> list[tuple[int, float]]:
        """(measurements, best GFLOP/s so far) of this task."""
        return best_so_far([self], "gflops")


def fastest_by_config(records: Iterable[Record]) -> dict[Config, float]:
    """{config: its fastest valid reading} over the records, each config once."""
    fastest: dict[Config, float] = {}
    for record in records:
        if record.result.ok:
            config = tuple(record.config)
            fastest[config] = min(fastest.get(config, math.inf), record.result.cost)
    return fastest


def best_from_records(outcome: TaskOutcome) -> None:
    """The best valid record as the outcome's result, without re-measuring it."""
    ok = [r for r in outcome.records if r.result.ok]
    if ok:
        best = min(ok, key=lambda r: r.result.cost)
        outcome.best_config, outcome.final_costs = tuple(best.config), list(best.result.costs)
        outcome.best_cost = outcome.tuning_best_cost = best.result.cost


def take_chosen(outcome: TaskOutcome, config: Config, seconds: float) -> None:
    """The run's reported best (the config its end chose by re-measuring, with those seconds) as the
    result of an outcome best_from_records has filled, in place of the records' fastest reading
    (tuning_best_cost stays that reading); ValueError unless the run measured that config validly."""
    if not any(r.result.ok and tuple(r.config) == config for r in outcome.records):
        raise ValueError(f"{outcome.task.name}'s chosen config {list(config)} has no valid record in the run")
    outcome.best_config, outcome.best_cost, outcome.final_costs = config, seconds, [seconds]


def chosen_bests(outcomes: Iterable[TaskOutcome]) -> dict[str, tuple[Config, float]]:
    """{task name: (best config, its seconds)}: what a run reports, which its database ranks first."""
    return {o.task.name: (o.best_config, o.best_cost) for o in outcomes
            if o.best_config is not None and math.isfinite(o.best_cost)}


def in_measured_order(outcomes: Iterable[TaskOutcome]) -> list[tuple[Task, Record, bool]]:
    """(task, record, reused) over all tasks: reused records first, then in the order measured."""
    merged = sorted(((i >= o.reused, r.time, o.task, r) for o in outcomes for i, r in enumerate(o.records)),
                    key=lambda item: item[:2])
    return [(task, record, not own) for own, _, task, record in merged]


def best_so_far(outcomes: Sequence[TaskOutcome], metric: str) -> list[tuple[int, float]]:
    """(measurements, best so far) over all tasks' records in the order they were measured.

    gflops:     the sum over tasks of each task's best GFLOP/s (0 for a task with nothing valid yet)
    latency_ms: the sum over tasks of weight x best latency, the model's latency if kernels were all
                it ran; it starts once every task has a valid record."""
    if metric not in CURVE_METRICS:
        raise ValueError(f"metric: expected one of {CURVE_METRICS}, got {metric!r}")
    best: dict[str, float] = {}
    points = []
    for count, (task, record, _) in enumerate(in_measured_order(outcomes), start=1):
        if record.result.ok:
            if metric == "gflops":
                best[task.key] = max(best.get(task.key, 0.0), record.result.gflops(task.flops))
            else:
                best[task.key] = min(best.get(task.key, math.inf), task.weight * record.result.cost)
        if metric == "gflops":
            points.append((count, sum(best.values())))
        elif len(best) == len(outcomes):
            points.append((count, sum(best.values()) * 1e3))
    return points


def fastest_reading(outcome: TaskOutcome) -> float:
    """The task's fastest valid reading so far, in seconds (inf while it has none)."""
    return min((r.result.cost for r in outcome.records if r.result.ok), default=math.inf)


def estimate_so_far_ms(outcomes: Iterable[TaskOutcome]) -> float | None:
    """The model's latency as the lab estimates it while tuning: the sum over tasks of weight x fastest
    valid reading so far, in ms (best_so_far's latency_ms at one moment); None until every task has a
    valid reading, since a task left out would raise the sum when it joins: from the first value on
    the estimate never rises."""
    weighted = [o.task.weight * fastest_reading(o) for o in outcomes]
    return sum(weighted) * 1e3 if weighted and all(map(math.isfinite, weighted)) else None


def weighted_latency_ms(outcomes: Iterable[TaskOutcome]) -> float:
    """Sum over tasks of weight x best latency: the model's latency if kernels were all it ran."""
    return sum(o.task.weight * o.best_cost for o in outcomes) * 1e3


def task_table(outcomes: Sequence[TaskOutcome]) -> str:
    """Where the time goes: one row per task, biggest share of weight x latency first; a task with no
    valid measurement says so ("untuned": the tuned model runs its unscheduled TIR, as the untuned build does)."""
    total = weighted_latency_ms(outcomes)
    header = (f"{'task':<44} {'weight':>6} {'MFLOP':>8} {'best us':>10} {'GFLOP/s':>8} "
              f"{'x weight ms':>11} {'share':>6} {'trials':>6} {'reused':>6} {'invalid':>7}  stopped")
    rows = [header, "-" * len(header)]
    for o in sorted(outcomes, key=lambda o: (math.isfinite(o.best_cost), -o.task.weight * o.best_cost)):
        weighted = o.task.weight * o.best_cost * 1e3
        share = f"{100 * weighted / total:5.1f}%" if math.isfinite(total) and total > 0 else "   n/a"
        best = f"{o.best_cost * 1e6:>10.1f}" if math.isfinite(o.best_cost) else f"{_untuned(o):>10}"
        rows.append(f"{o.task.name[:44]:<44} {o.task.weight:>6} {o.task.flops / 1e6:>8.1f} "
                    f"{best} {o.best_gflops:>8.1f} {_ms(weighted)} {share:>6} "
                    f"{len(o.records):>6} {o.reused:>6} {o.invalid:>7}  {o.stopped_because}")
    rows.append(f"{'all tasks':<44} {sum(o.task.weight for o in outcomes):>6} "
                f"{sum(o.task.weight * o.task.flops for o in outcomes) / 1e6:>8.1f} {'':>10} {'':>8} "
                f"{_ms(total)} {'':>6} {sum(len(o.records) for o in outcomes):>6} "
                f"{sum(o.reused for o in outcomes):>6} {sum(o.invalid for o in outcomes):>7}")
    untuned = [o.task.name for o in outcomes if not math.isfinite(o.best_cost)]
    if untuned:
        rows.append(f"{len(untuned)} of {len(outcomes)} kernels untuned (no valid measurement; the tuned model runs "
                    f"their unscheduled TIR): raise budget.trials")
    return "\n".join(rows)


def _ms(value: float) -> str:
    return f"{value:>11.3f}" if math.isfinite(value) else f"{'n/a':>11}"


def _untuned(outcome: TaskOutcome) -> str:
    return "untuned" if not outcome.records else "none valid"


def summary(outcomes: Sequence[TaskOutcome]) -> str:
    """The run's result as text: the task table for a model, one line for a single operator."""
    if len(outcomes) > 1:
        return task_table(outcomes) + "\n"
    lines = []
    for o in outcomes:
        if not math.isfinite(o.best_cost):
            latency = "none valid"
        elif o.predicted_cost is not None:
            latency = (f"{o.best_cost * 1e6:.1f} us (timed once; chosen without measuring, predicted "
                       f"{o.predicted_cost * 1e6:.1f} us)")
        elif not o.records and o.stopped_because == "unmeasured":
            latency = f"{o.best_cost * 1e6:.1f} us (timed once; chosen without measuring)"
        elif o.stopped_because == "pruned":
            latency = f"{o.best_cost * 1e6:.1f} us (while tuning; pruned, not re-measured)"
        else:
            latency = f"{o.best_cost * 1e6:.1f} us (re-measured; {o.tuning_best_cost * 1e6:.1f} us while tuning"
            latency += disagreement(o.best_cost, o.tuning_best_cost, o.remeasure_load)
            latency += f"; {o.true_cost * 1e6:.1f} us store median)" if o.true_cost else ")"
        lines.append(f"[{o.task.name}] best {latency}  {o.best_gflops:.2f} GFLOP/s  "
                     f"measurements {len(o.records)}  invalid {o.invalid}  (stopped: {o.stopped_because})")
    return "\n".join(lines) + "\n"
