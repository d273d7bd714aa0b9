"""A run's config composed for a tool, and what the tools read from it (no TVM import)."""
from __future__ import annotations

from dataclasses import replace

from tuning.config.conf_dir import CONF_DIR


def compose(overrides: list[str]):
    """The run config these overrides give (the same defaults and validation as run.py)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from tuning.config import ConfigError, register
    from tuning.engine.validate import validate

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = hydra_compose("config", overrides=[*overrides, "tracking=none"], return_hydra_config=False)
    try:
        validate(cfg)
    except ConfigError as error:
        raise SystemExit(f"tunelab: {error}") from error
    return cfg


def model_tasks(cfg, hardware) -> list:
    """A single operator's task, or every distinct kernel of a whole model (the backend extracts them)."""
    from tuning.core.task import build_tasks, is_whole_model

    return hardware.model_tasks(cfg.model, cfg.seed) if is_whole_model(cfg.model) else build_tasks(cfg.model)


def full_readings(spec):
    """A build takes every micro-batch of an early-stop evaluator (a replay truncates by its rule)."""
    return replace(spec, cv_stop=None) if spec.cv_stop is not None else spec
