"""The evaluator contract: the one door to hardware.

    measure(hardware, task, configs, on_result=None) -> list[MeasureResult]
        One result per config, in order; errors are results, never raised.
        `on_result(i, result)` is passed on to the hardware (records are
        written as each result arrives).
        The evaluator decides the repeat policy (a MeasureSpec handed to the
        hardware, which applies it inside its isolated run worker) and
        accounts the seconds spent.
    remeasure(hardware, task, configs) -> list[MeasureResult]
        A longer measurement of the best few configs at the end of a run
        (`final_candidates` of them, measured together), so the reported best
        is not a lucky sample: the minimum of many noisy readings is biased low.
    metrics() -> dict
        Numbers about the latest measure (e.g. how early the adaptive evaluator
        stopped), logged per round as evaluator/<name>.

__init__ stores hyperparameters only.
"""
from __future__ import annotations

from dataclasses import dataclass


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
    # An early-stop rule (evaluator.adaptive.CVStop) the run worker applies between repeats: it may
    # stop before `repeat` costs. None: every repeat is timed.
    cv_stop: object = None


class Evaluator:
    def measure(self, hardware, task, configs, on_result=None):
        raise NotImplementedError

    final_candidates = 1

    def remeasure(self, hardware, task, configs):
        raise NotImplementedError

    def metrics(self) -> dict:
        return {}
