"""tunelab entry point: `python run.py search=sa sampler=greedy model=conv_l8 budget.trials=64`."""
import hydra
from omegaconf import DictConfig

from tuning.config import register

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    from tuning.run import main as run_job

    return run_job(cfg)


if __name__ == "__main__":
    main()
