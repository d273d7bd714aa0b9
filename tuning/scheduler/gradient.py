"""scheduler=gradient: MetaSchedule's gradient-based task scheduler (Ansor, Zheng et al.
OSDI 2020, §6.2; tvm/src/s_tir/meta_schedule/task_scheduler/gradient_based.cc).

Ansor's objective for one network is its end-to-end latency, f = sum_i w_i g_i: w_i the calls of
kernel i per inference (the task's weight), g_i its best latency after t_i rounds. The next round goes
to the task whose f is expected to fall most, the largest |df/dt_i|, with df/dg_i = w_i and

    df/dt_i ~ w_i (alpha (g_i(t_i) - g_i(t_i - dt)) / dt + (1 - alpha) min(-g_i(t_i) / t_i, ...))

a backward term (the improvement over the last dt rounds) and an optimistic forward one (the
latency keeps falling like 1/t_i). MetaSchedule writes it with the signs turned, per task:

    backward = (best[n-1-window] - best[n-1]) / window    recent improvement per round
    forward  = best[n-1] / n                              if latency keeps falling like 1/n
    gradient = weight * (alpha * backward + (1 - alpha) * forward)

so a kernel with a large share of the model's latency (weight x best) or a fast recent
improvement gets the rounds. Ansor's forward term also takes the min with beta C_i / max_k V_k -
g_i (the throughput similar tasks reached); MetaSchedule leaves it out, and so does this. Where
MetaSchedule breaks a tie at random, this takes the first task (picks are a function of the
records: resume relies on it).
"""
from __future__ import annotations

import math

from tuning.scheduler.base import Scheduler


class Gradient(Scheduler):
    """Hyperparameters (MetaSchedule's defaults, TVM GradientBased(alpha=0.2, window_size=3); Ansor's
    alpha = 0.2 and dt = 3):
    alpha   weight of the backward (observed) term against the forward (optimistic) one
    window  rounds over which the backward improvement is measured
    """

    ranges = {"alpha": (0.0, 1.0), "window": (1, None)}
    score_metric = "gradient_ms"  # milliseconds of the model's latency one more round is expected to save

    def __init__(self, alpha: float = 0.2, window: int = 3):
        self.alpha = alpha
        self.window = window

    def gradient(self, task) -> float:
        """Seconds of the model's latency one more round of `task` is expected to save."""
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

    def scores(self, tasks) -> list[float]:
        return [self.gradient(t) * 1e3 for t in tasks]
