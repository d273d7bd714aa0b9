"""What one run contributes to a comparison: per task, the incumbent's true latency after each
measurement and the seconds at which it was measured, and what such a curve says at a budget or
about a target. Runs pair by seed (`paired_by_seed`)."""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Curve:
    """One run's curve for one task: index n-1 holds the value after n measurements of the task."""

    task: str
    method: str
    seed: int
    run_id: str
    true_s: np.ndarray  # the incumbent's true latency (inf before the first valid measurement)
    elapsed_s: np.ndarray  # seconds since the run started (simulated under hardware=replay)
    scored_by: str  # "store" or "readings"
    init_random: int = 0
    errors: dict = field(default_factory=dict)  # error kind -> count, and "fewer_runs": slow kernels timed shorter
    final_config: tuple | None = None  # the config the run returns at its end (its lowest reading)

    @property
    def length(self) -> int:
        return len(self.true_s)


@dataclass
class TaskTruth:
    """A task's scores: each config's truth (store) and the best config known."""

    by_config: dict
    best_s: float
    source: str  # "store <path>" or "readings of the compared runs"
    readings: dict = field(default_factory=dict)  # config -> the store's readings (by_config holds their medians)


def incumbent_curve(records, truth: dict | None) -> np.ndarray:
    """The true latency of the run's incumbent after each measurement: the config with the lowest
    reading so far (what the run would return), scored by `truth` (config -> seconds), or by its
    own reading when the store has no truth for it."""
    best_reading, incumbent, values = math.inf, math.inf, []
    for record in records:
        if record.result.ok and record.result.cost < best_reading:
            best_reading = record.result.cost
            incumbent = (truth or {}).get(tuple(record.config), best_reading)
        values.append(incumbent)
    return np.asarray(values, dtype=np.float64)


def run_curves(records, tasks: list[dict], truths: dict, method: str, seed: int, run_id: str,
               start_s: float, init_random: int) -> list[Curve]:
    """One Curve per task of a run; `truths[task name]` is the task's TaskTruth (or None)."""
    by_key = defaultdict(list)
    for record in records:
        by_key[record.workload_key].append(record)
    curves = []
    for task in tasks:
        own = by_key.get(task["key"], [])
        if not own:
            continue
        truth = truths.get(task["name"])
        scored = truth is not None and truth.source.startswith("store")
        curves.append(Curve(task["name"], method, seed, run_id,
                            incumbent_curve(own, truth.by_config if scored else None),
                            np.asarray([r.time - start_s for r in own], dtype=np.float64),
                            "store" if scored else "readings", init_random, error_counts(own),
                            final_incumbent(own)))
    return curves


def final_incumbent(records) -> tuple | None:
    """The config with the lowest valid reading (what the run returns), None without one."""
    valid = [r for r in records if r.result.ok]
    return tuple(min(valid, key=lambda r: r.result.cost).config) if valid else None


def error_counts(records) -> dict:
    """Failed measurements by kind, and the valid ones a slow kernel got with fewer runs (the run
    worker notes those in the message)."""
    counts = Counter(r.result.error for r in records if r.result.error)
    counts["fewer_runs"] = sum(1 for r in records if r.result.ok and r.result.message.startswith("fewer_runs"))
    return {kind: n for kind, n in counts.items() if n}


# ---- what a curve says ----------------------------------------------------------------------
def value_at(curve: Curve, n: int) -> float:
    """The incumbent after n measurements (a run that stopped sooner keeps its last incumbent)."""
    return float(curve.true_s[min(n, curve.length) - 1])


def value_at_seconds(curve: Curve, seconds: float) -> float:
    """The incumbent after the last measurement that finished within `seconds` of the run's start
    (inf when none had; a run that ended sooner keeps its last incumbent)."""
    done = int(np.searchsorted(curve.elapsed_s, seconds, side="right"))
    return float(curve.true_s[done - 1]) if done else math.inf


def time_to_target(curve: Curve, target_s: float, axis: str) -> tuple[float, bool]:
    """(time, reached): measurements or seconds until the incumbent is within the target, else the
    run's end, censored."""
    hits = np.flatnonzero(curve.true_s <= target_s)
    if axis == "measurements":
        return (float(hits[0] + 1), True) if len(hits) else (float(curve.length), False)
    return (float(curve.elapsed_s[hits[0]]), True) if len(hits) else (float(curve.elapsed_s[-1]), False)


def paired_by_seed(curves: list[Curve], baseline: list[Curve]) -> list[tuple[Curve, Curve]]:
    base = {c.seed: c for c in baseline}
    return [(c, base[c.seed]) for c in sorted(curves, key=lambda c: c.seed) if c.seed in base]
