"""The evaluator contract: the one door to hardware.

    measure(hardware, task, configs, on_result=None) -> list[MeasureResult]
        One result per config, in order; errors are results, never raised.
        `on_result(i, result)` is passed on to the hardware (records are
        written as each result arrives).
        The evaluator decides the repeat policy (a MeasureSpec handed to the
        hardware, which applies it inside its isolated run worker) and
        accounts the seconds spent.
    measure_against(hardware, task, configs, incumbent_s, on_result=None) -> list[MeasureResult]
        `measure`, told the task's best cost so far (None before its first valid reading): what the
        loop calls. An evaluator that screens (evaluator=fixed's `screen`) has the candidates far
        slower than that timed by one run only (MeasureSpec.screen_above_s); by default, `measure`.
    remeasure(hardware, task, configs) -> list[MeasureResult]
        A longer measurement of the best few configs at the end of a run
        (`final_candidates` of them, measured together), so the reported best
        is not a lucky sample: the minimum of many noisy readings is biased low.
    spec -> MeasureSpec
        How `measure` times a config (tuning/core/measure.py); with the hardware's fingerprint it
        keys the measurement store's readings.
    metrics() -> dict
        Numbers about the latest measure (e.g. how early the adaptive evaluator
        stopped), logged per round as evaluator/<name>.

__init__ stores hyperparameters only.
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tuning.core.component import Component

if TYPE_CHECKING:
    from tuning.core.measure import MeasureSpec
    from tuning.core.records import MeasureResult
    from tuning.core.space import Config
    from tuning.core.task import Task
    from tuning.hardware.base import Hardware


class Evaluator(Component):
    final_candidates = 1
    spec: MeasureSpec  # how `measure` times each config

    @abstractmethod
    def measure(self, hardware: Hardware, task: Task, configs: Sequence[Config],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """One MeasureResult per config, in order; errors are results."""

    def measure_against(self, hardware: Hardware, task: Task, configs: Sequence[Config], incumbent_s: float | None,
                        on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """`measure`, told the task's best cost so far (module docstring); this default ignores it."""
        return self.measure(hardware, task, configs, on_result)

    @abstractmethod
    def remeasure(self, hardware: Hardware, task: Task, configs: Sequence[Config]) -> list[MeasureResult]:
        """A longer measurement of the best few configs."""

    def metrics(self) -> dict[str, Any]:
        return {}
