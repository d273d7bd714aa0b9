"""The run's budget, resolved once from the job's BudgetSpec (budget.*, tuning/engine/spec.py) and the
model's tasks into a frozen BudgetPlan.

    budget.minutes        the whole job's wall-clock minutes, the checks after tuning included: tuning
                          stops at the job's start + minutes - the checks' estimate (checks_estimate_s).
                          null: DEFAULT_MODEL_MINUTES for a whole model whose budget names no count or
                          time (trials, trials_per_task, time_limit_s), none otherwise
    budget.trials         null: DEFAULT_TRIALS for a single operator, DEFAULT_TRIALS_PER_KERNEL per
                          kernel for a whole model, TIMED_TRIALS_PER_KERNEL per kernel under minutes (a
                          cap the time reaches first); budget.trials_per_task=N: N x the number of tasks
    min_trials_per_task   null: DEFAULT_FIRST, or under a whole model's minutes one round (the plan
                          size), so the scheduler decides early: the gradient scheduler's forward term
                          needs one round, and 15 minutes measure about two rounds of 16 per kernel
                          of ResNet-18 on a 2-core host, so a second round each first would leave it
                          nothing (the Xeon's headline run of 2026-12-07 measured 643 of 704);
                          lowered to an even share (trials // tasks) when the budget cannot give
                          every task its minimum, with a notice (docs/usage.md §Whole models)
    plan_size             null: the search's default_plan_size, at most TIMED_PLAN_SIZE under a whole
                          model's minutes (rounds small enough that each kernel gets several); a single
                          operator's is cut to its whole space, with a notice

Resolution never edits the config: `applied(cfg)` is a copy holding the resolved numbers, the one
written to config.yaml and tracked as params (so both say what the run used).
"""
from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, replace

from omegaconf import open_dict

from tuning.config import ConfigError
from tuning.engine.callbacks import _minutes
from tuning.engine.spec import BudgetSpec, E2ESpec, ModelSpec

log = logging.getLogger("tunelab")

DEFAULT_TRIALS = 256  # budget.trials left null: a single operator's budget...
DEFAULT_TRIALS_PER_KERNEL = 32  # ...and a whole model's with budget.minutes=none, per distinct kernel
DEFAULT_FIRST = 64  # min_trials_per_task left null: MetaSchedule's first round-robin pass, one 64-candidate round
DEFAULT_MODEL_MINUTES = 15.0  # a whole model's budget left unset: the job's wall-clock, checks included
TIMED_PLAN_SIZE = 16  # under a whole model's minutes: the most a round measures...
TIMED_TRIALS_PER_KERNEL = 1000  # ...and the count cap, the papers' per-task budget (AutoTVM, Chameleon)
MIN_TUNING_S = 60.0  # a minutes budget leaving less than this for tuning is refused

# The checks after a whole model's tuning, estimated before it starts (checks_estimate_s), from what
# they do: each task's finalists re-measured; the in-model choice's one build (the model imported,
# its tasks extracted, compiled with the database; each candidate built) and its reading processes
# (each started and loading the builds, then rounds x candidates passes of runs + 1 model runs);
# the end-to-end check's build and timing. A model run's seconds are guessed from the model's FLOPs
# at MODEL_GFLOPS (ResNet-18 tuned on a 2-core Xeon: 3.6 GFLOP in about 30 ms). The seconds are that
# Xeon's (Rocket Lake), rounded up: 34 finalists at the default evaluator (20 repeats of >= 50 ms)
# took 57 s; the in-model choice 77 s (the model imported 7.3 s, compiled 8.1 s, exported 3.1 s, 40
# candidates built 14.2 s, each reading process 3.7 s before its first reading) and the end-to-end
# check 38 s, 2.9 min in all where these constants say 3.1 (before, with 40 / 0.5 / 8: 4.0).
REMEASURE_S = 1.7  # one finalist re-measured: its build and readings
MODEL_BUILD_S = 15.0  # a model's import, task extraction and compilation with the database
CANDIDATE_BUILD_S = 0.4  # one candidate kernel built
PROCESS_S = 7.5  # a worker process started, TVM imported, the builds loaded
MODEL_GFLOPS = 120.0
UNTUNED_GFLOPS = 1.8  # the untuned build's pace (ResNet-18's on that Xeon: 2.0 s a run), timed min_runs + 1 times


@dataclass(frozen=True)
class BudgetPlan:
    trials: int  # measurements of the whole run, all tasks together (reused records count)
    plan_size: int | None  # None until `with_plan_size`: candidates per round, and the most measured
    min_trials_per_task: int | None  # None until `with_plan_size` under a whole model's minutes
    rounds_per_task: int | None = None
    early_stop: int | None = None
    time_limit_s: float | None = None
    init_random: int = 0
    minutes: float | None = None  # the whole job's wall clock, checks included (module docstring)
    started: float | None = None  # time.monotonic() at the job's start (`with_checks`)
    checks_s: float = 0.0  # the checks after tuning, estimated (`with_checks`): kept from the minutes

    def deadline(self) -> float | None:
        """The time.monotonic() value at which tuning stops: under minutes, the job's start + its
        minutes - the checks' estimate; else budget.time_limit_s counted from now; else None."""
        if self.minutes is not None and self.started is not None:
            return self.started + self.minutes * 60 - self.checks_s
        return time.monotonic() + self.time_limit_s if self.time_limit_s else None

    def applied(self, cfg):
        """A copy of `cfg` whose budget holds the resolved numbers; `cfg` itself is left as it is. Under
        minutes, a count and a minimum left null stay null: the count is only a cap the time reaches
        first, and the minimum follows the plan size, so runs of methods with other plan sizes still
        share their settings (tuning/config/identity.py) and a resume resolves them as the run did."""
        resolved = copy.deepcopy(cfg)
        timed = self.minutes is not None
        if not (timed and cfg.budget.trials is None and cfg.budget.trials_per_task is None):
            resolved.budget.trials = self.trials
        if not (timed and cfg.budget.min_trials_per_task is None):
            resolved.budget.min_trials_per_task = self.min_trials_per_task
        with open_dict(resolved.budget):  # a run folder saved before budget.minutes existed lacks the key
            resolved.budget.minutes = self.minutes
        if self.plan_size is not None:
            resolved.budget.plan_size = self.plan_size
        return resolved

    def line(self, tasks) -> str:
        """The budget as the run logs it before the first measurement."""
        if self.trials == 0:
            return (f"budget: 0 measurements: the search chooses each of {len(tasks)} kernel schedules without "
                    f"measuring; each chosen kernel is then timed once")
        per_round = f"up to {self.plan_size} per round"
        if self.minutes is not None:
            return self._minutes_line(self.minutes, tasks, per_round)
        if len(tasks) == 1:
            return f"budget: {self.trials} measurements of {tasks[0].name}, {per_round} (budget.trials=N to change)"
        return (f"budget: {self.trials} measurements over {len(tasks)} kernels, {self.min_trials_per_task} "
                f"each first, {per_round} (budget.trials=N or budget.trials_per_task=N to change)")

    def say(self, tasks, measured_per_round: tuple[int, int] | None = None) -> None:
        """The budget's line and, where a round gets no feedback, the notice (`no_feedback`), logged
        before the first measurement."""
        log.info(self.line(tasks))
        notice = self.no_feedback(tasks, measured_per_round)
        if notice:
            (log.warning if notice.startswith("warning:") else log.info)(notice)

    def wall_line(self) -> str | None:
        """The last line of a run under minutes, how long the whole job took; None without minutes."""
        if self.minutes is None:
            return None
        spent = time.monotonic() - self.started if self.started is not None else float("nan")
        return (f"wall: {spent / 60:.1f} min in all, against budget.minutes={self.minutes:g} (the checks after "
                f"tuning estimated at {self.checks_s / 60:.1f} min)")

    def _minutes_line(self, minutes: float, tasks, per_round: str) -> str:
        deadline = self.deadline()
        left_s = max(0.0, deadline - time.monotonic()) if deadline is not None else minutes * 60
        until = time.strftime("%H:%M:%S", time.localtime(time.time() + left_s))
        first = f", {self.min_trials_per_task} each first" if len(tasks) > 1 else ""
        checks = f", then about {_minutes(self.checks_s)} of checks" if self.checks_s else ""
        return (f"budget: {minutes:g} min in all (budget.minutes): tuning until {until} ({_minutes(left_s)} from "
                f"now; at most {self.trials} measurements over {len(tasks)} kernel{'s' * (len(tasks) != 1)}{first}, "
                f"{per_round}){checks} (budget.minutes=N to change; budget.trials=N for a count instead)")

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
    """budget.minutes, trials and min_trials_per_task for these tasks (module docstring); plan_size
    as given. Under a whole model's minutes with min_trials_per_task null, the minimum waits for the
    plan size (`with_plan_size`)."""
    minutes = _minutes_budget(budget, model)
    first = budget.min_trials_per_task
    if first is None and not (minutes is not None and len(tasks) > 1):
        first = DEFAULT_FIRST
    plan = BudgetPlan(trials=_trials(budget, model, len(tasks), minutes), plan_size=budget.plan_size,
                      min_trials_per_task=first, rounds_per_task=budget.rounds_per_task,
                      early_stop=budget.early_stop, time_limit_s=budget.time_limit_s,
                      init_random=budget.init_random or 0, minutes=minutes)
    if plan.trials == 0:  # a search that schedules without measuring (validated)
        return plan
    if plan.trials < len(tasks):
        raise ConfigError(f"budget.trials: {model.name} has {len(tasks)} tasks and every one needs at "
                          f"least one measurement; got {plan.trials}")
    return _with_even_share(plan, tasks)


def _with_even_share(plan: BudgetPlan, tasks) -> BudgetPlan:
    if plan.min_trials_per_task is None:
        return plan
    share = even_share(plan.trials, len(tasks), plan.min_trials_per_task)
    if share < plan.min_trials_per_task:
        log.info(f"{plan.trials} measurements cannot give each of {len(tasks)} kernels "
                 f"budget.min_trials_per_task={plan.min_trials_per_task}: each gets {share} first, the "
                 f"scheduler places the other {plan.trials - share * len(tasks)}")
        plan = replace(plan, min_trials_per_task=share)
    return plan


def with_plan_size(plan: BudgetPlan, default_plan_size: int, tasks, hardware) -> BudgetPlan:
    """budget.plan_size, null meaning the search's default (at most TIMED_PLAN_SIZE under a whole
    model's minutes), and the minimum that waited for it. A single operator's rounds cannot measure
    more than its whole space: the size is cut to it, with a notice. (A whole model's plan size is
    shared by kernels of every size; the loop measures a small one's space config by config.)"""
    timed_model = plan.minutes is not None and len(tasks) > 1
    plan_size = default_plan_size if plan.plan_size is None else plan.plan_size
    if plan.plan_size is None and timed_model:
        plan_size = min(plan_size, TIMED_PLAN_SIZE)
    if len(tasks) == 1:
        size = hardware.space(tasks[0]).size
        if 0 < size < plan_size:
            log.info(f"budget.plan_size={plan_size} is more than {tasks[0].name}'s whole space "
                     f"({size} configs); rounds measure at most {size}")
            plan_size = size
    plan = replace(plan, plan_size=plan_size)
    if plan.min_trials_per_task is None:
        plan = replace(plan, min_trials_per_task=plan_size)
        plan = _with_even_share(plan, tasks) if plan.trials else plan
    return plan


def with_checks(plan: BudgetPlan, started: float, checks_s: float) -> BudgetPlan:
    """Under minutes: the job's start (time.monotonic()) and the checks' estimate, from which the
    tuning's deadline follows; ConfigError when that leaves less than MIN_TUNING_S to tune."""
    if plan.minutes is None:
        return plan
    plan = replace(plan, started=started, checks_s=checks_s)
    deadline = plan.deadline()
    assert deadline is not None  # minutes and started are set
    left = deadline - time.monotonic()
    if left < MIN_TUNING_S:
        spent = time.monotonic() - started
        raise ConfigError(f"budget.minutes={plan.minutes:g} leaves {max(left, 0):.0f} s to tune after "
                          f"{spent:.0f} s of preparing (the model's import) and the checks' estimate of "
                          f"{checks_s:.0f} s; give more minutes")
    return plan


def checks_estimate_s(tasks, e2e: E2ESpec | None, final_candidates: int) -> float:
    """Seconds the checks after tuning are expected to take (the constants above): each task's
    finalists re-measured; for a whole model with e2e enabled, the in-model choice and the
    end-to-end check."""
    kernels = e2e.chosen_in_model(len(tasks)) if e2e is not None else 0
    seconds = (len(tasks) - kernels) * final_candidates * REMEASURE_S  # the heaviest `kernels` are read in the model
    if e2e is None or not e2e.enabled or len(tasks) <= 1:
        return seconds
    flops = sum(t.weight * t.flops for t in tasks)
    model_run_s = flops / (MODEL_GFLOPS * 1e9)  # tuned
    if kernels:
        passes = e2e.in_model_rounds * e2e.in_model_candidates * (e2e.in_model_runs + 1)
        seconds += (MODEL_BUILD_S + kernels * e2e.in_model_candidates * CANDIDATE_BUILD_S
                    + e2e.in_model_processes * (PROCESS_S + passes * model_run_s))
    timing = 2 * min(e2e.runs * model_run_s, e2e.max_seconds) + (e2e.min_runs + 1) * flops / (UNTUNED_GFLOPS * 1e9)
    return seconds + MODEL_BUILD_S + 2 * PROCESS_S + timing


def even_share(trials: int, tasks: int, minimum: int) -> int:
    """Each task's first measurements: the minimum if the budget covers every task's, else an even share."""
    if tasks <= 1 or trials >= tasks * minimum:
        return minimum
    return trials // tasks


def _minutes_budget(budget: BudgetSpec, model: ModelSpec) -> float | None:
    if budget.minutes is not None:
        return budget.minutes
    counted = (budget.trials, budget.trials_per_task, budget.time_limit_s) != (None, None, None)
    return DEFAULT_MODEL_MINUTES if model.whole and not counted else None


def _trials(budget: BudgetSpec, model: ModelSpec, tasks: int, minutes: float | None) -> int:
    if budget.trials_per_task is not None:
        return budget.trials_per_task * tasks
    if budget.trials is not None:
        return budget.trials
    if minutes is not None:
        return TIMED_TRIALS_PER_KERNEL * tasks
    return DEFAULT_TRIALS_PER_KERNEL * tasks if model.whole else DEFAULT_TRIALS

