"""What a measurement worker needs to know about timing: imported by evaluators (which choose the
policy) and by the hardware's run workers (which apply it), so neither imports the other.

MeasureSpec   TVM time_evaluator semantics for one built kernel (number, repeat, min_repeat_ms,
              cache flush, timeouts, correctness check) plus an optional early-stop rule and an
              optional screening cut.
CVStop        AdaTune's coefficient-of-variation stop (docs/methods.md §AdaTune), asked by the run
              worker after every micro-batch.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

STATISTICS = ("cumulative", "per_batch")
SLOW_KERNELS = ("fewer_runs", "timeout")


@dataclass(frozen=True)
class MeasureSpec:
    """How the run worker times one built kernel (TVM time_evaluator semantics)."""

    number: int = 1  # runs averaged into one cost (0 lets min_repeat_ms decide)
    repeat: int = 3  # costs recorded
    min_repeat_ms: int = 50
    cache_flush: bool = False  # flush the CPU cache before each run (needs number == 1)
    timeout_s: float = 10.0  # per-candidate cap on running
    build_timeout_s: float = 60.0  # per-candidate cap on building
    check_correctness: bool = True  # compare the output to the untuned kernel's
    # A kernel too slow for `timeout_s`: "fewer_runs" times it with fewer runs per cost (then fewer
    # costs) and notes it in the result's message; "timeout" records a timeout error.
    slow_kernels: str = "fewer_runs"
    # An early-stop rule (CVStop, below) the run worker applies between repeats: it may
    # stop before `repeat` costs. None: every repeat is timed.
    cv_stop: CVStop | None = None
    # The screening cut (evaluator.screen x the task's best so far, set per round by the evaluator):
    # a candidate whose first call and then a short warm reading (the device's own clock) both take
    # longer is not timed further; that reading is its one cost and its result is `screened`. None: off.
    screen_above_s: float | None = None



@dataclass(frozen=True)
class CVStop:
    """The stopping rule, applied by the hardware's run worker between micro-batches."""

    micro_batch: int = 50  # runs per micro-batch (B)
    max_batches: int = 10  # runs // micro_batch: the measurement never exceeds `runs`
    min_batches: int = 3  # micro-batches before the rule may stop
    cv_threshold: float = 0.1
    statistic: str = "cumulative"  # Perf_i of the batches so far (paper) or of batch i alone (code)
    drop_extremes: bool = False  # drop the fastest and slowest batch when more than 4 (code)

    def throughputs(self, batch_costs: Sequence[float]) -> np.ndarray:
        """Perf_1..Perf_i up to the constant B x FLOP (the CV does not depend on it)."""
        costs = np.asarray(batch_costs, dtype=np.float64)
        if self.statistic == "cumulative":
            perf = np.arange(1, len(costs) + 1) / np.cumsum(costs)
        else:
            perf = 1.0 / costs
        if self.drop_extremes and len(perf) > 4:
            perf = np.sort(perf)[1:-1]
        return perf

    def coefficient_of_variation(self, batch_costs: Sequence[float]) -> float:
        perf = self.throughputs(batch_costs)
        return float(np.std(perf) / np.mean(perf))

    def finished(self, batch_costs: Sequence[float]) -> bool:
        """True once the runs are spent, or once enough micro-batches agree."""
        done = len(batch_costs)
        if done >= self.max_batches:
            return True
        return done >= self.min_batches and self.coefficient_of_variation(batch_costs) < self.cv_threshold
