"""A sweep's MLflow parent run: opened before any job, the sweep's summary printed and on its parent
run, the parent run's link printed (and the sweeper's way to end that run KILLED). A grid's parent run
(the basic sweeper's) summarises its jobs, best per method, beside the command that compares them, and
that command is the grid's last printed line (tuning/sweep/grid_summary.py). A job's side of the sweep
(pruning, trial tags) is tuning/engine/trial.py.

The parent run is opened by the launching process before any job (SweepParent, a Hydra callback),
and its id handed to the jobs in the environment (mlflow_tracker.PARENT_RUN_ENV); a job on a launcher
that does not carry the environment finds it by its tag. The parent's key is the absolute sweep folder.

What a sweep optimises is tuning/config/objective.py. Pruning (single-objective studies): after every
round the job reports the best-so-far of the metric to the Optuna trial at each multiple of
objective.report_every measurements, and stops when the trial's pruner says so. The
`*_to_target` and `tuning_s` metrics have no best-so-far curve to compare, so they are never pruned.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from hydra import utils as hydra_utils
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tuning.engine.trial import RESULTS_FILE
from tuning.sweep.grid_summary import SUMMARY_FILE, summarise


class SweepParent(Callback):
    """Hydra callback: before a multirun's first job, its MLflow parent run, created in the launching
    process; the jobs get its id through the environment (launchers that start them from this
    process's environment: basic, joblib) or find it by its tag (any other). After the last job, the
    parent run's link is printed."""

    def __init__(self):
        self._handed = False
        self._before: str | None = None  # the environment's value before this multirun set it
        self._link = ""
        self._run_id = ""

    def on_multirun_start(self, config, **kwargs) -> None:
        from tuning.tracking.mlflow_tracker import PARENT_RUN_ENV

        if _tracking_problems(config):
            return  # every job refuses its config, before any work
        tracker = _tracker(config)
        if tracker.unreachable():
            return
        _save_sweep_config(config)
        run_id = tracker.open_parent(_parent_key(config))
        if run_id:
            self._handed, self._before, self._run_id = True, os.environ.get(PARENT_RUN_ENV), run_id
            os.environ[PARENT_RUN_ENV] = run_id
            self._link = tracker.run_page(run_id)

    def on_multirun_end(self, config, **kwargs) -> None:
        from tuning.tracking.mlflow_tracker import PARENT_RUN_ENV

        if not self._handed:
            return
        command = None if (Path(config.hydra.sweep.dir) / RESULTS_FILE).exists() else _summarise_grid(config, self._run_id)
        if self._link:
            print(f"tunelab: the sweep's MLflow parent run (its jobs are its children): {self._link}")
        if command:  # the last line: the command itself, to copy
            print(f"tunelab: the grid's summary is on its parent run and in {Path(config.hydra.sweep.dir) / SUMMARY_FILE}"
                  f"; compare its runs with:\n{command}")
        if self._before is None:
            os.environ.pop(PARENT_RUN_ENV, None)
        else:
            os.environ[PARENT_RUN_ENV] = self._before
        self._handed = False


def _summarise_grid(config, parent_id: str) -> str | None:
    """A grid's summary on its parent run (tuning/sweep/grid_summary.py); the compare command, or None. A view of
    the grid, never a reason to fail it."""
    try:
        return summarise(_tracker(config), _parent_key(config), parent_id, Path(config.hydra.sweep.dir))
    except Exception as error:  # noqa: BLE001 - the jobs' runs and folders stand whatever happens here
        print(f"tunelab: no grid summary ({type(error).__name__}: {error})", file=sys.stderr)
        return None


def _tracking_problems(config) -> list[str]:
    """What the jobs' config check would say of the tracking group (a bad URI would otherwise be
    retried here for tracking.retry_s)."""
    _with_hydra(config)
    try:
        node = OmegaConf.to_container(config.tracking, resolve=True)
        cls = hydra_utils.get_class(node.pop("_target_"))
        return cls.check_params(node, "tracking")
    except Exception as error:  # noqa: BLE001 - an unresolvable or unimportable group: the jobs say which
        return [f"tracking: {type(error).__name__}: {error}"]


def _save_sweep_config(config) -> None:
    """multirun.yaml in the sweep folder now, which names the parent run (tuning.config.naming.sweep_name);
    Hydra's basic sweeper writes the same file again when it starts."""
    sweep_dir = Path(config.hydra.sweep.dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if not (sweep_dir / "multirun.yaml").exists():
        OmegaConf.save(config, sweep_dir / "multirun.yaml")


class SweepSummary(Callback):
    """Hydra callback: after a multirun whose sweeper wrote optimization_results.yaml (the
    Optuna sweeper), print its best trial (or Pareto front) in one line and log it on the sweep's
    parent run: the best params, value and that line (the run's description), the results files as
    artifacts."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        results_file = sweep_dir / RESULTS_FILE
        if not results_file.exists():
            return
        results = OmegaConf.to_container(OmegaConf.load(results_file))
        line = best_line(results)
        print(f"tunelab: {line}")
        names = results["objectives"]
        tags = {"optuna.study": results["study_name"], "optuna.storage": str(results["storage"]),
                "optuna.directions": ",".join(results["directions"]), "mlflow.note.content": line,
                **{f"optuna.trials.{state}": str(n) for state, n in results["trials"].items()}}
        params, metrics = {}, {}
        if "best_params" in results:
            params = {f"best.{k}": v for k, v in results["best_params"].items()}
            metrics = {f"best.{names[0]}": results["best_value"]}
            tags["optuna.best_trial"] = str(results["best_trial"])
        if "pareto_front" in results:
            tags["optuna.pareto_trials"] = ",".join(str(t["trial"]) for t in results["pareto_front"])
        files = [sweep_dir / name for name in (RESULTS_FILE, "trials.csv", "pareto_front.csv")]
        artifacts = [str(f) for f in files if f.exists()]
        _tracker(config).log_to_parent(_parent_key(config), params, metrics, tags, artifacts)


def best_line(results: dict) -> str:
    """A finished study in one line, from its optimization_results.yaml: the best trial's value and
    params (a Pareto front's trials for several objectives), then its trials by state."""
    counts = ", ".join(f"{n} {state}" for state, n in sorted(results["trials"].items()))
    study = f"sweep {results['study_name']} ({counts})"
    if "best_params" in results:
        params = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in results["best_params"].items())
        return (f"{study}: best trial {results['best_trial']}, {results['objectives'][0]}={results['best_value']:.6g} "
                f"({results['directions'][0]}) with {params or 'no swept params'}")
    if "pareto_front" in results:
        trials = ", ".join(str(t["trial"]) for t in results["pareto_front"])
        return f"{study}: Pareto front of {' and '.join(results['objectives'])}: trials {trials} (pareto_front.csv)"
    return f"{study}: no trial completed"


def end_parent(config, status: str) -> None:
    """The sweeper's side: close the multirun's parent run with `status` (KILLED: interrupted)."""
    _tracker(config).end_parent(_parent_key(config), status)


def _parent_key(config) -> str:
    """The multirun's key, as tuning/engine/run.py passes it to a job's tracker: the absolute sweep folder."""
    return str(Path(config.hydra.sweep.dir).resolve())


def _tracker(config):
    """The job config's tracker, built in the launching process."""
    _with_hydra(config)
    return instantiate(config.tracking)


def _with_hydra(config) -> None:
    if not HydraConfig.initialized():  # the tracking URI may read ${hydra:runtime.cwd}
        HydraConfig.instance().set_config(config)
