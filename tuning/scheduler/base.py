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
    @abstractmethod
    def pick(self, tasks: Sequence[TaskProgress]) -> int:
        """Index of the task that gets the next round."""
