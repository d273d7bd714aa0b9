"""evaluator=fixed: a fixed number of timed runs per candidate (AutoTVM/MetaSchedule style).

Every repeat is kept in the record. The incumbent best is re-measured at the
end with `final_repeat` repeats, so the reported best is not a lucky sample.
"""
from __future__ import annotations

import math
from dataclasses import replace

from tuning.core.measure import SLOW_KERNELS, MeasureSpec
from tuning.evaluator.base import Evaluator


class FixedEvaluator(Evaluator):
    """Hyperparameters (TVM time_evaluator semantics):
    number          runs averaged into one cost
    repeat          costs recorded per candidate
    min_repeat_ms   a repeat lasts at least this long (number grows to fit)
    cache_flush     flush the CPU cache before each run (needs number == 1)
    timeout_s       per-candidate cap on measuring (a bad config can run for seconds)
    slow_kernels    fewer_runs: a kernel too slow for timeout_s is timed with fewer runs (noted in
                    the record's message); timeout: it is a `timeout` error
    build_timeout_s per-candidate cap on building
    check_correctness  compare each candidate's output with the untuned kernel's
    final_repeat    repeats when re-measuring the best configs at the end
    final_candidates  how many of the best configs are re-measured (the best
                    re-measured one is reported)
    screen          null (off), or a factor: during tuning a candidate whose first call and then a
                    short warm reading (by the device's own clock) both take longer than this x the
                    task's best so far is not timed further, that reading its one cost (`screened` in
                    its record); the final re-measurement is never screened
    """

    ranges = {"number": (0, None), "repeat": (1, None), "min_repeat_ms": (0, None), "timeout_s": (0.001, None),
              "build_timeout_s": (0.001, None), "final_repeat": (1, None), "final_candidates": (1, None),
              "screen": (1.0, None)}

    options = {"slow_kernels": SLOW_KERNELS}

    def __init__(self, number=1, repeat=3, min_repeat_ms=50, cache_flush=False, timeout_s=10.0,
                 build_timeout_s=60.0, check_correctness=True, final_repeat=10, final_candidates=3,
                 slow_kernels="fewer_runs", screen: float | None = None):
        self.spec = MeasureSpec(number, repeat, min_repeat_ms, cache_flush, timeout_s, build_timeout_s,
                                check_correctness, slow_kernels)
        self.final_repeat = final_repeat
        self.final_candidates = final_candidates
        self.screen = screen

    @classmethod
    def check(cls, params, group):
        if params["cache_flush"] and (params["number"] != 1 or params["min_repeat_ms"] > 0):
            return [f"{group}.cache_flush: needs {group}.number=1 and {group}.min_repeat_ms=0 (got "
                    f"number={params['number']}, min_repeat_ms={params['min_repeat_ms']}); "
                    "the flush runs once per repeat, so it would only cool the first of many runs"]
        return []

    def measure(self, hardware, task, configs, on_result=None):
        return hardware.measure(task, list(configs), self.spec, on_result)

    def measure_against(self, hardware, task, configs, incumbent_s, on_result=None):
        if self.screen is None or incumbent_s is None or not math.isfinite(incumbent_s):
            return self.measure(hardware, task, configs, on_result)
        return hardware.measure(task, list(configs), replace(self.spec, screen_above_s=self.screen * incumbent_s),
                                on_result)

    def remeasure(self, hardware, task, configs):
        return hardware.measure(task, list(configs), replace(self.spec, repeat=self.final_repeat))
