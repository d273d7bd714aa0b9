"""The launcher class Hydra instantiates for hydra/launcher=ray (Hydra takes launchers only from the
hydra_plugins package); the work is _launch.py's, imported with Ray when a multirun starts (Hydra's
plugin scan skips modules whose names start with an underscore)."""
from __future__ import annotations

from typing import Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class RayLauncher(Launcher):
    def __init__(self, ray: DictConfig, pin_cpus: bool = True) -> None:
        self.ray_cfg, self.pin_cpus = ray, pin_cpus
        self.config = self.hydra_context = self.task_function = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from ._launch import launch

        return launch(self, job_overrides, initial_job_idx)
