"""The run's budget, resolved once from the job's BudgetSpec (budget.*, tuning/engine/spec.py) and the
model's tasks into a frozen BudgetPlan.

    budget.trials         null: DEFAULT_TRIALS for a single operator, DEFAULT_TRIALS_PER_KERNEL per
                          kernel for a whole model; budget.trials_per_task=N: N x the number of tasks
    min_trials_per_task   lowered to an even share (trials // tasks) when the budget cannot give
                          every task its minimum, with a notice (docs/usage.md §Whole models)
    plan_size             null: the search's default_plan_size; a single operator's is cut to its
                          whole space, with a notice

Resolution never edits the config: `applied(cfg)` is a copy holding the resolved numbers, the one
written to config.yaml and tracked as params (so both say what the run used).
"""
from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, replace

from tuning.config import ConfigError
from tuning.engine.spec import BudgetSpec, ModelSpec

log = logging.getLogger("tunelab")

DEFAULT_TRIALS = 256  # budget.trials left null: a single operator's budget...
DEFAULT_TRIALS_PER_KERNEL = 32  # ...and a whole model's, per distinct kernel (704 for ResNet-18's 22)


@dataclass(frozen=True)
class BudgetPlan:
    trials: int  # measurements of the whole run, all tasks together (reused records count)
    plan_size: int | None  # None until `with_plan_size`: candidates per round, and the most measured
    min_trials_per_task: int
    rounds_per_task: int | None = None
    early_stop: int | None = None
    time_limit_s: float | None = None
    init_random: int = 0

    def deadline(self) -> float | None:
        """The time.monotonic() value at which the run stops, counted from now."""
        return time.monotonic() + self.time_limit_s if self.time_limit_s else None

    def applied(self, cfg):
        """A copy of `cfg` whose budget holds the resolved numbers; `cfg` itself is left as it is."""
        resolved = copy.deepcopy(cfg)
        resolved.budget.trials = self.trials
        resolved.budget.min_trials_per_task = self.min_trials_per_task
        if self.plan_size is not None:
            resolved.budget.plan_size = self.plan_size
        return resolved

    def line(self, tasks) -> str:
        """The budget as the run logs it before the first measurement."""
        if self.trials == 0:
            return (f"budget: 0 measurements: the search chooses each of {len(tasks)} kernel schedules without "
                    f"measuring; each chosen kernel is then timed once")
        per_round = f"up to {self.plan_size} per round"
        if len(tasks) == 1:
            return f"budget: {self.trials} measurements of {tasks[0].name}, {per_round} (budget.trials=N to change)"
        return (f"budget: {self.trials} measurements over {len(tasks)} kernels, {self.min_trials_per_task} "
                f"each first, {per_round} (budget.trials=N or budget.trials_per_task=N to change)")

    def no_feedback(self, tasks, measured_per_round: tuple[int, int] | None = None) -> str | None:
        """A warning when no task can get a second round: the search never sees a measurement, so
        methods differ only in their first guesses. None when the budget feeds the search.
        `measured_per_round` is the sampler's (fewest, most) measurements of a plan (Sampler.
        measured_per_round): a sampler that measures part of each plan gets a second round where a
        whole-plan one would not, so only a budget within its fewest is surely one round."""
        if self.trials == 0 or self.plan_size is None or self.trials > self.plan_size * len(tasks):
            return None
        fewest, most = measured_per_round or (self.plan_size, self.plan_size)
        per_kernel = '' if len(tasks) == 1 else 'per kernel '
        if self.trials > fewest * len(tasks):
            return None if self.trials > most * len(tasks) else (
                f"budget.trials={self.trials} is at most one plan of budget.plan_size={self.plan_size} "
                f"{per_kernel}; the sampler measures {fewest} to {most} configs of a plan, so a second round "
                "comes where it measures fewer than that in the first")
        return (f"warning: budget.trials={self.trials} is one round of budget.plan_size={self.plan_size} "
                f"{per_kernel}or less, so no measurement is fed back to the "
                f"search; above {self.plan_size * len(tasks)} it gets a second round (or lower budget.plan_size)")


def resolve_budget(budget: BudgetSpec, model: ModelSpec, tasks) -> BudgetPlan:
    """budget.trials and min_trials_per_task for these tasks (module docstring); plan_size as given."""
    plan = BudgetPlan(trials=_trials(budget, model, len(tasks)), plan_size=budget.plan_size,
                      min_trials_per_task=budget.min_trials_per_task, rounds_per_task=budget.rounds_per_task,
                      early_stop=budget.early_stop, time_limit_s=budget.time_limit_s,
                      init_random=budget.init_random or 0)
    if plan.trials == 0:  # a search that schedules without measuring (validated)
        return plan
    if plan.trials < len(tasks):
        raise ConfigError(f"budget.trials: {model.name} has {len(tasks)} tasks and every one needs at "
                          f"least one measurement; got {plan.trials}")
    share = even_share(plan.trials, len(tasks), plan.min_trials_per_task)
    if share < plan.min_trials_per_task:
        log.info(f"{plan.trials} measurements cannot give each of {len(tasks)} kernels "
                 f"budget.min_trials_per_task={plan.min_trials_per_task}: each gets {share} first, the "
                 f"scheduler places the other {plan.trials - share * len(tasks)}")
        plan = replace(plan, min_trials_per_task=share)
    return plan


def with_plan_size(plan: BudgetPlan, default_plan_size: int, tasks, hardware) -> BudgetPlan:
    """budget.plan_size, null meaning the search's default. A single operator's rounds cannot measure
    more than its whole space: the size is cut to it, with a notice. (A whole model's plan size is
    shared by kernels of every size; the loop measures a small one's space config by config.)"""
    plan_size = default_plan_size if plan.plan_size is None else plan.plan_size
    if len(tasks) == 1:
        size = hardware.space(tasks[0]).size
        if 0 < size < plan_size:
            log.info(f"budget.plan_size={plan_size} is more than {tasks[0].name}'s whole space "
                     f"({size} configs); rounds measure at most {size}")
            plan_size = size
    return replace(plan, plan_size=plan_size)


def even_share(trials: int, tasks: int, minimum: int) -> int:
    """Each task's first measurements: the minimum if the budget covers every task's, else an even share."""
    if tasks <= 1 or trials >= tasks * minimum:
        return minimum
    return trials // tasks


def _trials(budget: BudgetSpec, model: ModelSpec, tasks: int) -> int:
    if budget.trials_per_task is not None:
        return budget.trials_per_task * tasks
    if budget.trials is None:
        return DEFAULT_TRIALS_PER_KERNEL * tasks if model.whole else DEFAULT_TRIALS
    return budget.trials
