"""A sweep job's side of Optuna: pruning, trial tags, the sweep's summary on its parent run (and
the sweeper's way to end that run KILLED).

What a sweep optimises is tuning/objective.py. Pruning (single-objective studies): after every
round the job reports the best-so-far of the metric to the Optuna trial at each multiple of
objective.report_every measurements, and stops when the trial's pruner says so. The
`*_to_target` and `tuning_s` metrics have no best-so-far curve to compare, so they are never pruned.
"""
from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tuning.trial import RESULTS_FILE
from tuning.callbacks import MeasureCallback, RoundReport
from tuning.objective import CURVES, tuning_curve


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


class SweepSummary(Callback):
    """Hydra callback: after a multirun whose sweeper wrote optimization_results.yaml (the
    Optuna sweeper), log the best trial's params and value (or the Pareto front) on the
    sweep's parent run, with the results files as artifacts."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        results_file = sweep_dir / RESULTS_FILE
        if not results_file.exists():
            return
        results = OmegaConf.to_container(OmegaConf.load(results_file))
        names = results["objectives"]
        tags = {"optuna.study": results["study_name"], "optuna.storage": str(results["storage"]),
                "optuna.directions": ",".join(results["directions"]),
                **{f"optuna.trials.{state}": str(n) for state, n in results["trials"].items()}}
        params, metrics = {}, {}
        if "best_params" in results:
            params = {f"best.{k}": v for k, v in results["best_params"].items()}
            metrics = {f"best.{names[0]}": results["best_value"]}
            tags["optuna.best_trial"] = str(results["best_trial"])
        if "pareto_front" in results:
            tags["optuna.pareto_trials"] = ",".join(str(t["trial"]) for t in results["pareto_front"])
        files = [sweep_dir / name for name in (RESULTS_FILE, "trials.csv", "pareto_front.csv")]
        _tracker(config).log_to_parent(str(sweep_dir), params, metrics, tags, [str(f) for f in files if f.exists()])


def end_parent(config, status: str) -> None:
    """The sweeper's side: close the multirun's parent run with `status` (KILLED: interrupted)."""
    _tracker(config).end_parent(str(Path(config.hydra.sweep.dir).resolve()), status)


def _tracker(config):
    """The job config's tracker, built in the sweeper's process; its parent key is the absolute sweep dir."""
    if not HydraConfig.initialized():  # the tracking URI may read ${hydra:runtime.cwd}
        HydraConfig.instance().set_config(config)
    return instantiate(config.tracking)
