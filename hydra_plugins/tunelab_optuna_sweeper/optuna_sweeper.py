"""The sweeper Hydra finds: `hydra/sweeper=optuna` instantiates it, and it hands every call to
`_sweeper.OptunaSweeperImpl`, which it imports only then.

Hydra imports each plugin module at every start, sweep or not, and skips those whose names begin
with "_" (the published hydra-optuna-sweeper's layout). Optuna and the implementation live in such
modules, so a single run does not pay for importing them.
"""
from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class OptunaSweeper(Sweeper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from ._sweeper import OptunaSweeperImpl

        self.sweeper = OptunaSweeperImpl(*args, **kwargs)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        return self.sweeper.sweep(arguments)
