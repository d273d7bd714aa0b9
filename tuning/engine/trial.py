"""The job's side of an Optuna sweep: `current_trial()` is the Optuna trial this Hydra job runs, or None;
`Pruning` reports its best-so-far and abandons the run when the trial is pruned; `trial_tags` are its
MLflow tags.

Pruning (single-objective studies): after every round the job reports the best-so-far of the metric
to the Optuna trial at each multiple of objective.report_every measurements, and stops when the
trial's pruner says so. The `*_to_target` and `tuning_s` metrics have no best-so-far curve to
compare, so they are never pruned.

The sweeper plugin (hydra_plugins/tunelab_optuna_sweeper) depends on this module, never the reverse.

The sweeper puts the trial's id in each job's environment (hydra.job.env_set) and
the study's name in its `hydra.sweeper.study_name`. A job launched in the sweeper's
process (the basic launcher) gets the live trial, so it can report and be pruned
even when the study lives in memory; a job in another process (joblib) opens the
study from `hydra.sweeper.storage`, with the sweep's pruner.
"""
from __future__ import annotations

import os

from tuning.config.objective import CURVES, tuning_curve
from tuning.engine.callbacks import MeasureCallback, RoundReport

TRIAL_ID_ENV = "TUNELAB_OPTUNA_TRIAL_ID"
RESULTS_FILE = "optimization_results.yaml"  # the sweeper's summary in the sweep folder
_live: dict = {}  # trial id -> optuna.Trial, while the sweeper's own process runs it


def current_trial():
    trial_id = os.environ.get(TRIAL_ID_ENV)
    if trial_id is None:
        return None
    if int(trial_id) in _live:
        return _live[int(trial_id)]
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import instantiate

    sweeper = HydraConfig.get().sweeper
    if not sweeper.get("storage"):
        return None  # an in-memory study cannot be reached from another process
    import optuna

    study = optuna.load_study(study_name=sweeper.study_name, storage=sweeper.storage,
                              pruner=instantiate(sweeper.pruner))
    return optuna.trial.Trial(study, int(trial_id))


def hand_over(trials) -> None:
    """The sweeper's side: these live trials are the next jobs run in this process."""
    _live.clear()
    _live.update({trial._trial_id: trial for trial in trials})  # Optuna has no public trial id


class Pruning(MeasureCallback):
    """A measure callback in a sweep: report best-so-far, abandon the run when the trial is pruned.

    Values are reported at every multiple of objective.report_every measurements, so
    trials whose rounds differ in size (k-means batches) still meet at the same steps,
    which is where Optuna's pruners compare them."""

    def __init__(self, trial, objective, budget: int):
        self.trial, self.budget = trial, budget
        self.metric = objective.metrics[0]
        self.every = objective.report_every
        self.enabled = len(objective.metrics) == 1 and self.metric in CURVES
        self.reported = 0
        self.pruned_at: int | None = None

    def after_round(self, report: RoundReport) -> str | None:
        measured = report.measured
        if not self.enabled or measured < self.reported + self.every:
            return None
        curve = dict(tuning_curve(self.metric, report.outcomes))
        while self.reported + self.every <= measured:
            self.reported += self.every
            if self.reported in curve:  # a latency curve starts once every task has a valid record
                self.trial.report(curve[self.reported], step=self.reported)
        if measured < self.budget and self.trial.should_prune():  # at the budget there is nothing to save
            self.pruned_at = measured
            return "pruned"
        return None


def trial_tags(trial) -> dict:
    return {"optuna.study": trial.study.study_name, "optuna.trial": str(trial.number),
            **{f"optuna.param.{k}": str(v) for k, v in trial.params.items()}}
