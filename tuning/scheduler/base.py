"""The task scheduler contract: which task gets the next tuning round.

A network has many tasks and one budget. The loop first gives every task
`budget.min_trials_per_task` measurements (or its whole space), fewest first,
so no kernel is left untuned; after that it asks the scheduler.

    pick(tasks) -> index into tasks
        `tasks` are the tasks still being tuned, each with
            weight          how often the network runs the kernel
            measured        measurements so far
            best_history()  best latency (seconds) after each of its rounds
        Deterministic: the same histories give the same pick (resume relies on it).
    scores(tasks) -> list of floats, or None
        what pick ranks the tasks by, one number per task (the gradient's expected gain), for the
        record: the loop logs them each round as scheduler/<score_metric>/<task> beside each task's
        measurements so far. None (the default) for a rule that ranks by nothing worth logging.

__init__ stores hyperparameters only.
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Protocol

from tuning.core.component import Component


class TaskProgress(Protocol):
    """What a scheduler reads of each task still being tuned (the loop's per-task state)."""

    @property
    def weight(self) -> int: ...

    @property
    def measured(self) -> int: ...

    def best_history(self) -> list[float]: ...


class Scheduler(Component):
    score_metric: str = "score"  # the name of what `scores` returns, in its metric's key

    @abstractmethod
    def pick(self, tasks: Sequence[TaskProgress]) -> int:
        """Index of the task that gets the next round."""

    def scores(self, tasks: Sequence[TaskProgress]) -> list[float] | None:
        """What `pick` ranks the tasks by, one number per task; None where it ranks by nothing to log."""
        return None
