"""`tunelab run OVERRIDES...` (and `python run.py OVERRIDES...`): one tuning job, or a grid with -m.

Hydra composes the job from the lab's configs (tuning.conf, the checkout's conf/) plus the user's own
(TUNELAB_CONF_DIRS); tuning.engine.run does the work.
"""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from tuning.config import ConfigError, register
from tuning.config.conf_dir import CONF_DIR
from tuning.config.overrides import command_line_problems
from tuning.engine.validate import moved_overrides

register()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_main(cfg: DictConfig) -> float:
    from tuning.engine.run import main as run_job

    return run_job(cfg)


def experiments_added(argv: list[str]) -> list[str]:
    """`experiment=NAME` as `+experiment=NAME`: an experiment is added to the defaults list, which
    Hydra spells with a plus; without one it fails with "Could not override 'experiment'"."""
    return [f"+{a}" if a.split("=", 1)[0].split("/")[0] == "experiment" and "=" in a else a for a in argv]


def job_overrides(argv: list[str]) -> list[str]:
    """The overrides as Hydra takes them (experiments_added); a key that moved is a ConfigError."""
    argv = experiments_added(argv)
    moved = moved_overrides(argv)
    if moved:
        raise ConfigError("invalid config:\n  " + "\n  ".join(moved))
    return argv


def checked_command_line(argv: list[str]) -> list[str]:
    """job_overrides, then what Hydra would refuse as the lab's ConfigError (tuning/config/overrides.py):
    an unknown key or option, with the nearest known name, before Hydra's advice."""
    argv = job_overrides(argv)
    problems = command_line_problems(argv)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return argv


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    """Run Hydra on `argv` (default: the command line) as the program `prog`; exits like a command."""
    try:
        argv = checked_command_line(sys.argv[1:] if argv is None else list(argv))
    except ConfigError as error:
        print(f"tunelab: {error}", file=sys.stderr)
        sys.exit(2)
    sys.argv = [prog or sys.argv[0], *argv]  # Hydra reads its arguments from sys.argv
    try:
        hydra_main()
    except KeyboardInterrupt as interrupt:  # Ctrl-C, SIGTERM, SIGHUP: the job said what it kept
        sys.exit(128 + getattr(interrupt, "signum", 2))
