"""evaluator=adaptive: AdaTune's early-terminated measurement (Li et al. 2020, NeurIPS, §4.1 and
Algorithm 1 lines 10-14).

A candidate is timed in micro-batches of `micro_batch` runs, at most `runs` runs in all. After the
i-th micro-batch the throughput so far is Perf_i = i x B x FLOP / Time(i), Time(i) being the seconds
since the measurement began; the measurement stops once i >= `min_batches` and the coefficient of
variation std / mean of {Perf_1, ..., Perf_i} is below `cv_threshold`. A candidate that never
settles gets all `runs`, which is exactly the deterministic evaluator it replaces (evaluator=
adatune_de). Each micro-batch's mean run time is one cost of the record, so a record shows how many
micro-batches its measurement took.

The reference code differs (docs/methods.md §AdaTune): it takes each batch's own throughput rather than
the running one, and drops the fastest and slowest batch once there are more than 4;
`statistic: per_batch` and `drop_extremes: true` (evaluator=adaptive_code).

The rule runs inside the hardware's isolated run worker, which asks `CVStop.finished` after every
micro-batch: no kernel is re-launched from this process. The seconds spent measuring are the
results' run_s (time/run_s, round/measure_s, run/run_s), comparable with any fixed evaluator's.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from tuning.core.measure import SLOW_KERNELS, STATISTICS, CVStop, MeasureSpec
from tuning.evaluator.base import Evaluator


class AdaptiveEvaluator(Evaluator):
    """Hyperparameters (AdaTune §5.1: n = 500, B = 50, threshold 10%; the code's >= 3 batches):
    runs            most runs a candidate gets (n)
    micro_batch     runs per micro-batch (B); each micro-batch's mean is one recorded cost
    cv_threshold    stop when std / mean of the throughputs falls below this
    min_batches     micro-batches before the rule may stop
    statistic       cumulative (paper: Perf_i = i x B x FLOP / Time(i)) or per_batch (code)
    drop_extremes   drop the fastest and slowest batch when more than 4 (code)
    timeout_s, build_timeout_s, check_correctness, slow_kernels   as evaluator=fixed (a slow kernel's
                    micro-batches get fewer runs)
    final_repeat    micro-batches when re-measuring the best configs at the end (no early stop,
                    so the reported best is measured as a fixed evaluator's would be)
    final_candidates  how many of the best configs are re-measured
    """

    ranges = {"runs": (1, None), "micro_batch": (1, None), "cv_threshold": (0.0, None), "min_batches": (1, None),
              "timeout_s": (0.001, None), "build_timeout_s": (0.001, None), "final_repeat": (1, None),
              "final_candidates": (1, None)}
    options = {"statistic": STATISTICS, "slow_kernels": SLOW_KERNELS}

    def __init__(self, runs: int = 500, micro_batch: int = 50, cv_threshold: float = 0.1, min_batches: int = 3,
                 statistic: str = "cumulative", drop_extremes: bool = False, timeout_s: float = 10.0,
                 build_timeout_s: float = 60.0, check_correctness: bool = True, final_repeat: int = 10,
                 final_candidates: int = 3, slow_kernels: str = "fewer_runs"):
        self.runs = runs
        self.micro_batch = micro_batch
        self.cv_threshold = cv_threshold
        self.min_batches = min_batches
        self.statistic = statistic
        self.drop_extremes = drop_extremes
        self.timeout_s = timeout_s
        self.build_timeout_s = build_timeout_s
        self.check_correctness = check_correctness
        self.final_repeat = final_repeat
        self.final_candidates = final_candidates
        self.slow_kernels = slow_kernels
        self.latest: list = []

    @classmethod
    def check(cls, params, group):
        runs, micro_batch = params["runs"], params["micro_batch"]
        if micro_batch > runs:
            return [f"{group}.micro_batch: must be at most {group}.runs (got micro_batch={micro_batch}, runs={runs})"]
        if params["min_batches"] > runs // micro_batch:
            return [f"{group}.min_batches: {params['min_batches']} micro-batches of {micro_batch} exceed "
                    f"{group}.runs={runs}; the rule could never stop early"]
        return []

    @property
    def rule(self) -> CVStop:
        return CVStop(self.micro_batch, max(1, self.runs // self.micro_batch), self.min_batches, self.cv_threshold,
                      self.statistic, self.drop_extremes)

    @property
    def spec(self) -> MeasureSpec:
        """Up to max_batches costs of micro_batch runs each; a backend that ignored `cv_stop`
        would measure all of them, the deterministic evaluator."""
        rule = self.rule
        return MeasureSpec(number=rule.micro_batch, repeat=rule.max_batches, min_repeat_ms=0, cache_flush=False,
                           timeout_s=self.timeout_s, build_timeout_s=self.build_timeout_s,
                           check_correctness=self.check_correctness, slow_kernels=self.slow_kernels,
                           cv_stop=rule)

    def measure(self, hardware, task, configs, on_result=None):
        self.latest = hardware.measure(task, list(configs), self.spec, on_result)
        return self.latest

    def remeasure(self, hardware, task, configs):
        return hardware.measure(task, list(configs), replace(self.spec, repeat=self.final_repeat, cv_stop=None))

    def metrics(self) -> dict:
        """How much of the run budget the latest round's measurements used."""
        batches = [len(r.costs) for r in self.latest if r.ok]
        if not batches:
            return {}
        max_batches = self.rule.max_batches
        return {"batches": float(np.mean(batches)), "stopped_early": float(np.mean([b < max_batches for b in batches]))}
