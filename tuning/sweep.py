"""What a sweep optimises (`cfg.objective`), and the job's side of pruning.

run.py returns `objective_values(...)`: one number per name in
`objective.metrics`, which the Optuna sweeper minimises or maximises
(`objective.directions`). The metrics:

    final_gflops            GFLOP/s of the re-measured best config, summed over tasks  (maximize)
    final_latency_us        weight x re-measured best latency, summed over tasks        (minimize)
    tuning_s                wall-clock seconds of tuning and the final re-measurement   (minimize)
    measurements_to_target  measurements until the best-so-far latency (weighted sum
                            over tasks) first reaches objective.target_latency_us      (minimize)
    seconds_to_target       seconds from the start of tuning until then                 (minimize)

A run that never reaches the target scores its whole spend scaled by how far it
stayed, measurements (or seconds) x best / target, so misses still rank (x 1000
when nothing valid was measured).

Pruning (single-objective studies): after every round the job reports the
best-so-far of the metric to the Optuna trial at each multiple of
objective.report_every measurements, and stops when the trial's pruner says
so. The `*_to_target` and `tuning_s` metrics have no best-so-far curve to
compare, so they are never pruned.
"""
from __future__ import annotations

import math
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import OmegaConf

from hydra_plugins.tunelab_optuna_sweeper.trial import RESULTS_FILE
from tuning.apply import in_measured_order, model_curve, weighted_latency_ms


DIRECTIONS = {"final_gflops": "maximize", "final_latency_us": "minimize", "tuning_s": "minimize",
              "measurements_to_target": "minimize", "seconds_to_target": "minimize"}
NEEDS_TARGET = ("measurements_to_target", "seconds_to_target")


def objective_values(objective, outcomes, tuning_s: float, started_at: float) -> float | list[float]:
    """The sweep objective of a finished run: a float, or a list for a multi-objective study.
    `started_at`: time.time() when tuning began (records carry time.time() stamps)."""
    values = [_metric(name, objective, outcomes, tuning_s, started_at) for name in objective.metrics]
    return values[0] if len(values) == 1 else values


def _metric(name: str, objective, outcomes, tuning_s: float, started_at: float) -> float:
    if name == "final_gflops":
        return sum(o.best_gflops for o in outcomes)
    if name == "final_latency_us":
        return weighted_latency_ms(outcomes) * 1e3
    if name == "tuning_s":
        return tuning_s
    return _to_target(name, objective.target_latency_us, outcomes, tuning_s, started_at)


def _to_target(name: str, target_us: float, outcomes, tuning_s: float, started_at: float) -> float:
    curve = model_curve(outcomes)  # (measurements, ms) once every task has a valid record
    ordered = in_measured_order(outcomes)  # the curve's order
    for measured, latency_ms in curve:
        if latency_ms * 1e3 <= target_us:
            if name == "measurements_to_target":
                return float(measured)
            _, record, reused = ordered[measured - 1]
            return 0.0 if reused else max(0.0, record.time - started_at)
    spent = float(sum(len(o.records) for o in outcomes)) if name == "measurements_to_target" else tuning_s
    best_us = curve[-1][1] * 1e3 if curve else math.inf
    return spent * best_us / target_us if math.isfinite(best_us) else spent * 1e3


class Pruning:
    """The loop's `after_round` hook in a sweep: report best-so-far, stop when the trial is pruned.

    Values are reported at every multiple of objective.report_every measurements, so
    trials whose rounds differ in size (k-means batches) still meet at the same steps,
    which is where Optuna's pruners compare them."""

    def __init__(self, trial, objective, budget: int):
        self.trial, self.budget = trial, budget
        self.metric = objective.metrics[0]
        self.every = objective.report_every
        self.enabled = len(objective.metrics) == 1 and self.metric in ("final_gflops", "final_latency_us")
        self.reported = 0
        self.pruned_at: int | None = None

    def __call__(self, measured: int, outcomes) -> str | None:
        if not self.enabled or measured < self.reported + self.every:
            return None
        curve = dict(self._curve(outcomes))
        while self.reported + self.every <= measured:
            self.reported += self.every
            if self.reported in curve:  # a latency curve starts once every task has a valid record
                self.trial.report(curve[self.reported], step=self.reported)
        if measured < self.budget and self.trial.should_prune():  # at the budget there is nothing to save
            self.pruned_at = measured
            return "pruned"
        return None

    def _curve(self, outcomes) -> list[tuple[int, float]]:
        """(measurements, best-so-far of the metric), in the order measured."""
        if self.metric == "final_latency_us":
            return [(count, ms * 1e3) for count, ms in model_curve(outcomes)]
        best: dict = {}
        points = []
        for count, (task, record, _) in enumerate(in_measured_order(outcomes), start=1):
            if record.result.ok:
                best[task.key] = max(best.get(task.key, 0.0), record.result.gflops(task.flops))
            points.append((count, sum(best.values())))
        return points


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
        if not HydraConfig.initialized():  # the tracking URI may read ${hydra:runtime.cwd}
            HydraConfig.instance().set_config(config)
        instantiate(config.tracking).log_to_parent(str(sweep_dir), params, metrics, tags,
                                                   [str(f) for f in files if f.exists()])
