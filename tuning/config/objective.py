"""What a sweep optimises (`cfg.objective`): one number per name in `objective.metrics`.

run.py returns `objective_values(...)`, which the Optuna sweeper minimises or
maximises (`objective.directions`). The metrics:

    final_gflops            GFLOP/s of the re-measured best config, summed over tasks  (maximize)
    final_latency_us        weight x re-measured best latency, summed over tasks        (minimize)
    tuning_s                wall-clock seconds of tuning and the final re-measurement   (minimize)
    measurements_to_target  measurements until the best-so-far latency (weighted sum
                            over tasks) first reaches objective.target_latency_us      (minimize)
    seconds_to_target       seconds from the start of tuning until then                 (minimize)

A run that never reaches the target scores its whole spend scaled by how far it
stayed, measurements (or seconds) x best / target, so misses still rank (x 1000
when nothing valid was measured).
"""
from __future__ import annotations

import math

from tuning.core.outcome import best_so_far, in_measured_order, weighted_latency_ms

DIRECTIONS = {"final_gflops": "maximize", "final_latency_us": "minimize", "tuning_s": "minimize",
              "measurements_to_target": "minimize", "seconds_to_target": "minimize"}
NEEDS_TARGET = ("measurements_to_target", "seconds_to_target")
# the metrics with a best-so-far curve during tuning (what pruning compares), and that curve
CURVES = {"final_gflops": "gflops", "final_latency_us": "latency_ms"}


def objective_values(objective, outcomes, tuning_s: float, started_at: float) -> float | list[float]:
    """The sweep objective of a finished run: a float, or a list for a multi-objective study.
    `started_at`: time.time() when tuning began (records carry time.time() stamps)."""
    values = [_metric(name, objective, outcomes, tuning_s, started_at) for name in objective.metrics]
    return values[0] if len(values) == 1 else values


def tuning_curve(metric: str, outcomes) -> list[tuple[int, float]]:
    """(measurements, best so far) of a metric in CURVES, on the metric's own scale."""
    points = best_so_far(outcomes, CURVES[metric])
    return [(count, ms * 1e3) for count, ms in points] if metric == "final_latency_us" else points


def _metric(name: str, objective, outcomes, tuning_s: float, started_at: float) -> float:
    if name == "final_gflops":
        return sum(o.best_gflops for o in outcomes)
    if name == "final_latency_us":
        return weighted_latency_ms(outcomes) * 1e3
    if name == "tuning_s":
        return tuning_s
    return _to_target(name, objective.target_latency_us, outcomes, tuning_s, started_at)


def _to_target(name: str, target_us: float, outcomes, tuning_s: float, started_at: float) -> float:
    curve = best_so_far(outcomes, "latency_ms")  # from the point every task has a valid record
    ordered = in_measured_order(outcomes)  # the curve's order
    for measured, latency_ms in curve:
        if latency_ms * 1e3 <= target_us:
            if name == "measurements_to_target":
                return float(measured)
            _, record, reused = ordered[measured - 1]
            return 0.0 if reused else max(0.0, record.time - started_at)
    spent = float(sum(len(o.records) for o in outcomes)) if name == "measurements_to_target" else tuning_s
    best_us = curve[-1][1] * 1e3 if curve else math.inf
    return spent * best_us / target_us if math.isfinite(best_us) else spent * 1e3
