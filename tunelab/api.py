"""The lab from Python: `tune` runs one job and returns its Outcome, `compare` compares tracked runs.

    import tunelab
    outcome = tunelab.tune(["hardware=synthetic", "model=gemm_64", "budget.trials=64", "budget.plan_size=16"])
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


def compose(overrides: Sequence[str] | Mapping | None = ()) -> DictConfig:
    """The job config `tunelab run OVERRIDES` would run (with its `hydra` node), for inspection or edits.
    An override Hydra refuses (an unknown key or option) is a ConfigError naming it, as `tunelab run` says it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from tunelab.run import job_overrides
    from tuning.config import ConfigError, register
    from tuning.config.conf_dir import CONF_DIR
    from tuning.config.overrides import command_line_problems

    argv = job_overrides(_as_overrides(overrides))
    register()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name=JOB_NAME):
            return hydra_compose("config", overrides=argv, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as error:  # as `tunelab run` says it: the key, the nearest name
        problems = command_line_problems(argv) or [" ".join(str(error).split())]
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems)) from None


def tune(config: Sequence[str] | Mapping | DictConfig | None = ()) -> Outcome:
    """Run one tuning job. `config`: Hydra overrides (a list of "key=value", "+key=value" or "~key";
    None or () for none), a mapping of them ({"model": "gemm_64"}), or a config from `compose`. Bad
    input raises, before any work, tuning.config.ConfigError (a ValueError naming the key, or the
    position of an item that is not an override), or TypeError for an item that is not a string."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import configure_log

    from tuning.engine.run import run_job

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


OVERRIDE_FORMS = "key=value, +key=value or ~key"


def _as_overrides(config) -> list[str]:
    if config is None:
        return []
    if isinstance(config, Mapping):
        return _checked([f"{key}={_override_value(value)}" for key, value in config.items()])
    if isinstance(config, str) or not isinstance(config, Sequence):
        raise TypeError("tunelab: overrides are a list of strings, e.g. ['model=gemm_64', 'budget.trials=64'] "
                        f"(got {type(config).__name__})")
    return _checked(list(config))


def _checked(overrides: list) -> list[str]:
    """Each item an override Hydra parses, named by its position if not."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for position, override in enumerate(overrides):
        _check_override(parser, f"overrides[{position}]", override)
    return overrides


def _check_override(parser, where: str, override) -> None:
    """A command-line flag or a sweep over several values is refused too: tune runs one job,
    `tunelab run -m` a grid of them."""
    from hydra.errors import HydraException

    from tuning.config import ConfigError

    if not isinstance(override, str):
        raise TypeError(f"tunelab: {where} is {override!r} ({type(override).__name__}), not a string such as "
                        "'model=gemm_64'")
    if override in ("-m", "--multirun"):
        raise ConfigError(f"{where}: {override!r}: tune runs one job; a grid of jobs (multirun) is "
                          "`tunelab run -m ...`")
    if override.startswith("-"):
        raise ConfigError(f"{where}: {override!r} is a command-line flag; tune takes overrides only ({OVERRIDE_FORMS})")
    try:
        parsed = parser.parse_override(override)
    except HydraException as error:
        reason = str(error).strip().splitlines()[0]
        raise ConfigError(f"{where}: {override!r} is not an override ({OVERRIDE_FORMS}): {reason}") from None
    if parsed.is_sweep_override():
        raise ConfigError(f"{where}: {override!r} sweeps over several values; tune runs one job, a sweep is "
                          "`tunelab run -m ...`")


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
    from tuning.engine.job_run import RUN_ID_FILE

    best = {o.task.name: Best(o.best_config, o.best_cost * 1e6, o.best_gflops) for o in result.outcomes}
    records = {o.task.name: list(o.records) for o in result.outcomes}
    run_id_file = result.out_dir / RUN_ID_FILE
    run_id = run_id_file.read_text().strip() if run_id_file.is_file() else None
    return Outcome(best, records, run_id, result.out_dir, result.objective, result.e2e, cfg)
