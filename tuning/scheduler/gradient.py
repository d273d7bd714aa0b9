"""scheduler=gradient: MetaSchedule's gradient-based task scheduler (Ansor, Zheng et al.
OSDI 2020, §6.2; tvm/src/s_tir/meta_schedule/task_scheduler/gradient_based.cc).

The objective is the network's latency, sum_i weight_i * latency_i. Each task's
gradient estimates how much one more round would reduce it:

    backward = (best[n-1-window] - best[n-1]) / window    recent improvement per round
    forward  = best[n-1] / n                              if latency keeps falling like 1/n
    gradient = weight * (alpha * backward + (1 - alpha) * forward)

and the task with the largest gradient gets the next round. (Ansor's forward term
also uses similar tasks' throughput; MetaSchedule leaves it out, and so does this.)
"""
from __future__ import annotations

import math

from tuning.scheduler.base import Scheduler


class Gradient(Scheduler):
    """Hyperparameters (MetaSchedule's defaults):
    alpha   weight of the backward (observed) term against the forward (optimistic) one
    window  rounds over which the backward improvement is measured
    """

    ranges = {"alpha": (0.0, 1.0), "window": (1, None)}

    def __init__(self, alpha: float = 0.2, window: int = 3):
        self.alpha = alpha
        self.window = window

    def gradient(self, task) -> float:
        history = task.best_history()
        if not history or not math.isfinite(history[-1]):
            return math.inf  # nothing valid yet: this task's latency is unknown, not small
        n, best = len(history), history[-1]
        backward = (history[n - 1 - self.window] - best) / self.window if n > self.window else 0.0
        if not math.isfinite(backward):
            backward = 0.0
        forward = best / n
        return task.weight * (self.alpha * backward + (1 - self.alpha) * forward)

    def pick(self, tasks) -> int:
        gradients = [self.gradient(t) for t in tasks]
        return max(range(len(tasks)), key=lambda i: (gradients[i], -i))
