"""The sweeper: ask Optuna for a batch of trials, launch them as Hydra jobs, tell the results.

    study  = the named study in `storage` (created, or resumed: n_trials is its total)
    until the study has n_trials finished trials:
        trials  = n_jobs x study.ask(search space)
        returns = launcher.launch(each trial's params as overrides)   # in-process or joblib
        tell each: COMPLETE with the job's return value(s), PRUNED when the job raised
                   optuna.TrialPruned, FAIL when it raised anything else
        write optimization_results.yaml, trials.csv (and pareto_front.csv) to the sweep folder
"""
from __future__ import annotations

import csv
import logging
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import optuna
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

from . import config as _config  # noqa: F401 - registers hydra/sweeper=optuna and its sampler/pruner groups
from . import search_space, trial as trial_side

log = logging.getLogger(__name__)
RESULTS_FILE = trial_side.RESULTS_FILE


class OptunaSweeper(Sweeper):
    def __init__(self, sampler, pruner, direction, storage, study_name, n_trials: int, n_jobs: int,
                 max_failure_rate: float, retry_interrupted: bool, params):
        self.sampler_conf = sampler
        self.pruner_conf = pruner
        self.direction = direction
        self.storage = _absolute_sqlite(storage)
        self.study_name = study_name
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.max_failure_rate = max_failure_rate
        self.retry_interrupted = retry_interrupted
        self.params = params
        self.config = self.launcher = self.hydra_context = None
        self.job_idx = 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(config=config, hydra_context=hydra_context,
                                                                task_function=task_function)

    def sweep(self, arguments: list[str]) -> optuna.Study:
        space, fixed = search_space.parse([f"{k}={v}" for k, v in (self.params or {}).items()] + list(arguments))
        directions = self._directions()
        _check_settings(self.n_trials, self.n_jobs, self.max_failure_rate)
        study, n_trials = self._study(directions, space)
        log.info(f"Optuna study {study.study_name!r} in {self.storage or 'memory'}: {type(study.sampler).__name__}, "
                 f"{type(study.pruner).__name__}, directions {directions}, {n_trials} trials in all")
        if self.retry_interrupted:
            _retry_interrupted(study)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        while (left := n_trials - len(_finished(study))) > 0:
            trials = [study.ask(space) for _ in range(min(self.n_jobs, left))]
            returns = self._launch(study, trials, fixed)
            failures = [error for trial, ret in zip(trials, returns)
                        if (error := _tell(study, trial, ret, len(directions))) is not None]
            write_results(study, sweep_dir, self._objective_names(len(directions)), self.storage)
            if len(failures) / len(trials) > self.max_failure_rate:
                raise failures[0]
        write_results(study, sweep_dir, self._objective_names(len(directions)), self.storage)
        return study

    # -- pieces ------------------------------------------------------------------------------

    def _directions(self) -> list[str]:
        declared = OmegaConf.select(self.config, "objective.directions")
        declared = [str(d) for d in declared] if declared else None
        if self.direction is None:
            return declared or ["minimize"]
        given = [self.direction] if isinstance(self.direction, str) else [str(d) for d in self.direction]
        bad = [d for d in given if d not in ("minimize", "maximize")]
        if bad:
            raise ValueError(f"hydra.sweeper.direction: expected minimize or maximize, got {bad[0]!r}")
        if declared and declared != given:
            raise ValueError(f"hydra.sweeper.direction: {given} contradicts objective.directions {declared} "
                             "(the job returns the objective's values); set only one of them")
        return given

    def _objective_names(self, count: int) -> list[str]:
        names = OmegaConf.select(self.config, "objective.metrics")
        return [str(n) for n in names] if names and len(names) == count else [f"value_{i}" for i in range(count)]

    def _study(self, directions, space) -> tuple[optuna.Study, int]:
        study = optuna.create_study(storage=self.storage, study_name=self.study_name, directions=directions,
                                    pruner=instantiate(self.pruner_conf) if self.pruner_conf else None,
                                    load_if_exists=True)
        existing = [d.name.lower() for d in study.directions]
        if existing != directions:
            raise ValueError(f"hydra.sweeper.study_name: study {study.study_name!r} in {self.storage} optimises "
                             f"{existing}, not {directions}; pick another study name")
        study.sampler, n_trials = self._sampler(len(study.trials), space)
        return study, n_trials

    def _sampler(self, trials_so_far: int, space) -> tuple[optuna.samplers.BaseSampler, int]:
        """The sampler, its seed offset by the study's trials (a resumed study draws new points)."""
        conf = OmegaConf.to_container(self.sampler_conf, resolve=True) if self.sampler_conf else {
            "_target_": "optuna.samplers.TPESampler", "seed": None}
        if conf.get("seed") is not None:
            conf["seed"] += trials_so_far
        if not conf["_target_"].endswith("GridSampler"):
            return instantiate(conf), self.n_trials
        grid = search_space.grid(space)
        size = 1
        for values in grid.values():
            size *= len(values)
        return instantiate(conf, search_space=grid), min(self.n_trials, size)

    def _launch(self, study, trials, fixed) -> Sequence[JobReturn]:
        overrides = [tuple(search_space.override(k, v) for k, v in trial.params.items())
                     + tuple(f"{k}={v}" for k, v in fixed.items())
                     + (f"++hydra.job.env_set.{trial_side.TRIAL_ID_ENV}={trial._trial_id}",
                        search_space.override("hydra.sweeper.study_name", study.study_name),
                        search_space.override("hydra.sweeper.storage", self.storage))
                     for trial in trials]
        self.validate_batch_is_legal(overrides)
        trial_side.hand_over(trials)
        try:
            returns = self.launcher.launch(overrides, initial_job_idx=self.job_idx)
        except BaseException as error:  # no trial stays RUNNING; interrupted ones run again on resume
            for trial in trials:
                _fail(study, trial.number, retry=isinstance(error, KeyboardInterrupt))
            raise
        finally:
            trial_side.hand_over([])
        self.job_idx += len(returns)
        return returns


def _absolute_sqlite(storage):
    """A relative sqlite path is taken from the launching folder, also for jobs that chdir;
    its folder is created."""
    prefix = "sqlite:///"
    if not storage or not storage.startswith(prefix) or storage == prefix + ":memory:":
        return storage
    path = Path(storage[len(prefix):]).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return prefix + str(path)


def _check_settings(n_trials, n_jobs, max_failure_rate) -> None:
    if n_trials < 1:
        raise ValueError(f"hydra.sweeper.n_trials: must be >= 1, got {n_trials}")
    if n_jobs < 1:
        raise ValueError(f"hydra.sweeper.n_jobs: must be >= 1, got {n_jobs}")
    if not 0.0 <= max_failure_rate <= 1.0:
        raise ValueError(f"hydra.sweeper.max_failure_rate: must be in [0, 1], got {max_failure_rate}")


def _finished(study) -> list:
    """Finished trials, not counting interrupted ones that were enqueued again."""
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get("retry_of") for t in trials}
    return [t for t in trials if t.state.is_finished() and t.number not in retried]


def _retry_interrupted(study) -> None:
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        log.warning(f"trial {trial.number} was left RUNNING by an interrupted sweep: marked FAIL, run again")
        _fail(study, trial.number, retry=True)


def _fail(study, number: int, retry: bool) -> None:
    """Tell FAIL (unless already told); with `retry`, enqueue the same params as a new trial."""
    try:
        _told(study, number, state=TrialState.FAIL)
    except ValueError:
        return  # already finished
    if retry:
        study.enqueue_trial(study.get_trials(deepcopy=False)[number].params, user_attrs={"retry_of": number})


def _tell(study, trial, ret: JobReturn, n_objectives: int) -> Exception | None:
    """Record one job's outcome; returns the failure, if it failed."""
    # The field itself: reading .return_value of a failed job prints "Error executing job" first.
    if ret.status == JobStatus.FAILED and isinstance(ret._return_value, optuna.TrialPruned):
        log.info(f"trial {trial.number} pruned: {ret._return_value}")
        _told(study, trial, state=TrialState.PRUNED)
        return None
    try:
        value = ret.return_value  # re-raises what the job raised
    except Exception as error:  # noqa: BLE001 - a crashed job is a FAIL trial, not a crashed sweep
        log.warning(f"trial {trial.number} failed: {type(error).__name__}: {error}")
        _told(study, trial, state=TrialState.FAIL)
        return error
    values = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value]
    try:
        values = [float(v) for v in values]
    except (TypeError, ValueError):
        values = []
    if len(values) != n_objectives or any(math.isnan(v) for v in values):
        _told(study, trial, state=TrialState.FAIL)
        return ValueError(f"trial {trial.number}: the job returned {value!r}; the study needs "
                          f"{n_objectives} number(s), not NaN")
    _told(study, trial, values=values)
    return None


def _told(study, trial, **outcome) -> None:
    """study.tell; the grid sampler calls Study.stop() once its grid is done, which raises
    outside study.optimize after the trial is recorded."""
    try:
        study.tell(trial, **outcome)
    except RuntimeError as error:
        if "Study.stop" not in str(error):
            raise


# ---- results in the sweep folder --------------------------------------------------------------
def write_results(study, sweep_dir: Path, names: list[str], storage) -> None:
    """optimization_results.yaml (the best trial, or the Pareto front), trials.csv, pareto_front.csv."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    trials = study.get_trials(deepcopy=False)
    results = {"study_name": study.study_name, "storage": storage,
               "directions": [d.name.lower() for d in study.directions], "objectives": names,
               "trials": dict(Counter(t.state.name for t in trials))}
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if complete and len(names) == 1:
        best = study.best_trial
        results.update(best_params=dict(best.params), best_value=best.value, best_trial=best.number)
    elif complete:
        front = sorted(study.best_trials, key=lambda t: t.values)
        results["pareto_front"] = [{"trial": t.number, "values": dict(zip(names, t.values)), "params": dict(t.params)}
                                   for t in front]
        _write_csv(sweep_dir / "pareto_front.csv", front, names)
    _write_csv(sweep_dir / "trials.csv", trials, names)
    (sweep_dir / RESULTS_FILE).write_text(OmegaConf.to_yaml(OmegaConf.create(results)))


def _write_csv(path: Path, trials, names: list[str]) -> None:
    """One row per trial; values only for COMPLETE ones (Optuna gives a pruned trial its last
    reported value), and the last reported step (where a pruned trial stopped)."""
    params = sorted({k for t in trials for k in t.params})
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["trial", "state", *names, "last_step", *params])
        for t in trials:
            values = t.values if t.state == TrialState.COMPLETE else [""] * len(names)
            last_step = max(t.intermediate_values, default="")
            writer.writerow([t.number, t.state.name, *values, last_step, *(t.params.get(p, "") for p in params)])
