"""Structured configs: `hydra/sweeper=optuna`, `hydra/sweeper/sampler=...`, `hydra/sweeper/pruner=...`.

Only arguments Optuna 5 takes without a deprecation or experimental warning are
exposed; any other constructor argument can still be added with `+hydra.sweeper.sampler.X=...`.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class TPESamplerConf:
    _target_: str = "optuna.samplers.TPESampler"
    seed: Optional[int] = 0  # offset by the study's trial count, so a resumed study draws new points
    n_startup_trials: int = 10
    n_ei_candidates: int = 24
    constant_liar: bool = True  # parallel trials (n_jobs > 1) avoid proposing the same point


@dataclass
class RandomSamplerConf:
    _target_: str = "optuna.samplers.RandomSampler"
    seed: Optional[int] = 0


@dataclass
class CmaEsSamplerConf:
    _target_: str = "optuna.samplers.CmaEsSampler"
    seed: Optional[int] = 0
    n_startup_trials: int = 1
    sigma0: Optional[float] = None
    warn_independent_sampling: bool = True  # categorical params are sampled independently of CMA-ES


@dataclass
class GridSamplerConf:
    """Every combination of the params once; only choice() and range() params (the grid comes from them)."""
    _target_: str = "optuna.samplers.GridSampler"
    seed: Optional[int] = 0  # the order the grid is walked in


@dataclass
class NSGAIISamplerConf:
    _target_: str = "optuna.samplers.NSGAIISampler"
    seed: Optional[int] = 0
    population_size: int = 50
    crossover_prob: float = 0.9
    swapping_prob: float = 0.5


@dataclass
class NopPrunerConf:
    _target_: str = "optuna.pruners.NopPruner"


@dataclass
class MedianPrunerConf:
    """Stop a trial whose best-so-far at a step is worse than the median of earlier trials' at that step.
    Steps are measurements."""
    _target_: str = "optuna.pruners.MedianPruner"
    n_startup_trials: int = 4
    n_warmup_steps: int = 0
    interval_steps: int = 1
    n_min_trials: int = 1


@dataclass
class PercentilePrunerConf(MedianPrunerConf):
    """The median pruner at another percentile: below the 25th of earlier trials is pruned."""
    _target_: str = "optuna.pruners.PercentilePruner"
    percentile: float = 25.0


@dataclass
class SuccessiveHalvingPrunerConf:
    _target_: str = "optuna.pruners.SuccessiveHalvingPruner"
    min_resource: Any = "auto"
    reduction_factor: int = 4
    min_early_stopping_rate: int = 0


@dataclass
class HyperbandPrunerConf:
    _target_: str = "optuna.pruners.HyperbandPruner"
    min_resource: int = 1
    max_resource: Any = "auto"
    reduction_factor: int = 3


@dataclass
class OptunaSweeperConf:
    """`hydra.sweeper.*`.

    params: override key -> search space, in Hydra's sweep syntax:
        choice(a, b, c)                     categorical
        range(start, stop, step=s)          int (or float) steps, stop exclusive
        interval(low, high)                 float
        int(interval(low, high))            int
        tag(log, interval(low, high))       log scale (also around int(...))
        a plain value                       fixed for every trial
      Sweeps given on the command line (`key=choice(...)`, `key=a,b`) join them.
    direction: minimize | maximize, or a list for a multi-objective study. null: the
      task config's `objective.directions` (tunelab's objective group), else minimize.
    storage: an Optuna storage URL (the hparams_search presets: ${storage.optuna_uri}, the storage group's);
        null keeps the study in memory.
    study_name: a named study in a storage resumes: n_trials counts the trials it already has.
    n_trials: total trials of the study: finished ones (from earlier invocations too) and those
      running in another sweep process count.
    n_jobs: trials per batch handed to the launcher (hydra/launcher=joblib runs them in parallel).
    max_failure_rate: the sweep stops (raising the failure) when a batch's share of FAILED
      trials exceeds this; pruned trials are not failures.
    retry_interrupted: a trial whose sweep was interrupted (Ctrl-C, SIGTERM) or killed (a dead
      trial, see heartbeat_interval) is marked FAIL and run again: its params are enqueued as a
      new trial. false: it only stays FAIL, and counts toward n_trials.
    heartbeat_interval: with a storage, the sweeper records every running trial's heartbeat
      this often (seconds), so several sweep processes can share a study: a trial is dead when
      its heartbeat is older than grace_period (its sweep was killed), and the next sweep of
      the study to look marks it FAIL; a sweep waits for other processes' running trials before
      it ends, until they finish or die. null: no heartbeats, no dead trial is ever detected.
    grace_period: seconds without a heartbeat after which a RUNNING trial is dead (null: twice
      heartbeat_interval). It must cover a few beats: a sweep running a job in its own process
      beats from a thread, which one long call that holds the GIL delays. A RUNNING trial that
      never beat (left by a sweep without heartbeats) is dead once it started this long ago.
    """
    _target_: str = "hydra_plugins.tunelab_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    _recursive_: bool = False  # the sweeper builds the sampler and pruner itself (seed offset, grid)
    defaults: List[Any] = field(default_factory=lambda: ["_self_", {"sampler": "tpe"}, {"pruner": "none"}])
    sampler: Any = None
    pruner: Any = None
    direction: Any = None
    storage: Optional[str] = None
    study_name: Optional[str] = None
    n_trials: int = 20
    n_jobs: int = 1
    max_failure_rate: float = 0.0
    retry_interrupted: bool = True
    heartbeat_interval: Optional[int] = 10
    grace_period: Optional[int] = 60
    params: Optional[Dict[str, Any]] = None


def register() -> None:
    store = ConfigStore.instance()
    store.store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConf, provider="tunelab")
    for name, node in {"tpe": TPESamplerConf, "random": RandomSamplerConf, "cmaes": CmaEsSamplerConf,
                       "grid": GridSamplerConf, "nsgaii": NSGAIISamplerConf}.items():
        store.store(group="hydra/sweeper/sampler", name=name, node=node, provider="tunelab")
    for name, node in {"none": NopPrunerConf, "median": MedianPrunerConf, "percentile": PercentilePrunerConf,
                       "successive_halving": SuccessiveHalvingPrunerConf, "hyperband": HyperbandPrunerConf}.items():
        store.store(group="hydra/sweeper/pruner", name=name, node=node, provider="tunelab")


register()
