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

from abc import abstractmethod

from tuning.core.component import Component


class Evaluator(Component):
    final_candidates = 1

    @abstractmethod
    def measure(self, hardware, task, configs, on_result=None):
        """One MeasureResult per config, in order; errors are results."""

    @abstractmethod
    def remeasure(self, hardware, task, configs):
        """A longer measurement of the best few configs."""

    def metrics(self) -> dict:
        return {}
