"""scheduler=round_robin: the task with the fewest measurements next (ties: the bigger task,
which comes first). Every task ends with about the same number of measurements."""
from __future__ import annotations

from tuning.scheduler.base import Scheduler


class RoundRobin(Scheduler):
    def pick(self, tasks) -> int:
        return min(range(len(tasks)), key=lambda i: (tasks[i].measured, i))
