"""The lab from Python: `tune` runs one job and returns its Outcome, `compare` compares tracked runs.

    import tunelab
    outcome = tunelab.tune(["hardware=synthetic", "model=gemm_64", "budget.trials=64"])
    outcome.best            # {task: Best(config, latency_us, gflops)}
    outcome.records_frame() # every measurement, as a pandas DataFrame

Both work in a notebook: no Hydra command line is needed. `tune` composes the same config `tunelab run`
does (the same defaults, checks and run folder under outputs/runs/), and leaves the same MLflow run.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

JOB_NAME = "run"  # run.py's: the log file is <folder>/run.log either way


@dataclass(frozen=True)
class Best:
    """A task's best schedule: its config (the space's knob indices) and its re-measured latency."""
    config: tuple | None
    latency_us: float
    gflops: float


@dataclass(frozen=True)
class Outcome:
    """What `tune` found, per task (keyed by task name), and where the run is kept."""
    best: dict[str, Best]
    records: dict[str, list]  # tuning.core.records.Record of each task, in the order measured
    run_id: str | None  # the MLflow run (None with tracking=none)
    folder: Path  # the run folder: config.yaml, records.jsonl, summary.txt, the best schedules
    objective: object  # what a sweep would minimise (cfg.objective)
    e2e: dict | None = None  # a whole model's tuned / untuned / torch latencies
    config: DictConfig | None = field(default=None, repr=False)

    def records_frame(self):
        """Every measurement as a pandas DataFrame: task, index, round, config, latency_us, error."""
        import pandas as pd

        rows = [{"task": task, "index": r.index, "round": r.round, "config": tuple(r.config),
                 "latency_us": r.result.cost * 1e6 if r.result.ok else math.nan, "error": r.result.error,
                 "reused": r.result.reused}
                for task, records in self.records.items() for r in records]
        return pd.DataFrame(rows, columns=["task", "index", "round", "config", "latency_us", "error", "reused"])


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """The job config `tunelab run OVERRIDES` would run (with its `hydra` node), for inspection or edits."""
    from hydra import compose as hydra_compose, initialize_config_dir

    from tunelab.run import job_overrides
    from tuning.conf_dir import CONF_DIR
    from tuning.config import register

    argv = job_overrides(_as_overrides(overrides))
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name=JOB_NAME):
        return hydra_compose("config", overrides=argv, return_hydra_config=True)


def tune(config: Sequence[str] | Mapping | DictConfig = ()) -> Outcome:
    """Run one tuning job. `config`: Hydra overrides (a list of "key=value"), a mapping of them
    ({"model": "gemm_64"}), or a config from `compose`. Bad input raises tuning.config.ConfigError
    (a ValueError naming the key) before any work."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import configure_log

    from tuning.run import run_job

    cfg = config.copy() if isinstance(config, DictConfig) else compose(_as_overrides(config))
    if "hydra" not in cfg:
        raise ValueError("tunelab.tune: a config from tunelab.compose(...) (it has the `hydra` node)")
    out_dir = _output_dir(cfg)
    with read_write(cfg), open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(out_dir)
        cfg.output_dir = str(out_dir)
    HydraConfig.instance().set_config(cfg)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        configure_log(cfg.hydra.job_logging, cfg.hydra.verbose)
        with read_write(cfg), open_dict(cfg):
            del cfg["hydra"]
        result = run_job(cfg)
    finally:
        HydraConfig.instance().cfg = None
        _end_job_logging(root, handlers, level)
    return _outcome(result, cfg)


def _end_job_logging(root: logging.Logger, handlers: list, level: int) -> None:
    """The job's log handlers (its console and its run.log) end with it, as they do when run.py exits:
    a later job, or any later log line of the caller, goes nowhere near this run's files."""
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)


def _as_overrides(config) -> list[str]:
    if isinstance(config, str):
        raise TypeError("tunelab: overrides are a list of strings, e.g. ['model=gemm_64', 'budget.trials=64']")
    if isinstance(config, Mapping):
        return [f"{key}={_override_value(value)}" for key, value in config.items()]
    return list(config)


def _override_value(value) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _output_dir(cfg: DictConfig) -> Path:
    """`output_dir=` when the caller set it, else Hydra's run.dir pattern (outputs/runs/DATE/TIME)."""
    if OmegaConf.is_interpolation(cfg, "output_dir"):
        return Path(str(cfg.hydra.run.dir)).resolve()
    return Path(str(cfg.output_dir)).resolve()


def _outcome(result, cfg: DictConfig) -> Outcome:
    from tuning.tracking.job_run import RUN_ID_FILE

    best = {o.task.name: Best(o.best_config, o.best_cost * 1e6, o.best_gflops) for o in result.outcomes}
    records = {o.task.name: list(o.records) for o in result.outcomes}
    run_id_file = result.out_dir / RUN_ID_FILE
    run_id = run_id_file.read_text().strip() if run_id_file.is_file() else None
    return Outcome(best, records, run_id, result.out_dir, result.objective, result.e2e, cfg)
