"""tunelab entry point: `python run.py search=sa sampler=greedy model=conv_l8 budget.trials=64`."""
import sys

import hydra
from omegaconf import DictConfig

from tuning.config import moved_overrides, register

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    from tuning.run import main as run_job

    return run_job(cfg)


def _experiments_added(argv: list[str]) -> list[str]:
    """`experiment=NAME` as `+experiment=NAME`: an experiment is added to the defaults list, which
    Hydra spells with a plus; without one it fails with "Could not override 'experiment'"."""
    return [f"+{a}" if a.split("=", 1)[0].split("/")[0] == "experiment" and "=" in a else a for a in argv]


if __name__ == "__main__":
    sys.argv[1:] = _experiments_added(sys.argv[1:])
    moved = moved_overrides(sys.argv[1:])
    if moved:
        print("tunelab: invalid config:\n  " + "\n  ".join(moved), file=sys.stderr)
        sys.exit(2)
    try:
        main()
    except KeyboardInterrupt as interrupt:  # Ctrl-C, SIGTERM, SIGHUP: the job said what it kept
        sys.exit(128 + getattr(interrupt, "signum", 2))
