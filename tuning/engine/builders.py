"""The job's components built by Hydra's `instantiate` from their config nodes.

After tuning/engine/run.py makes the JobSpec (tuning/engine/spec.py), `Builders` is the one holder of
the raw config: `instantiate` needs the component groups' nodes (search, sampler, evaluator, cost
model, hardware, tracking, scheduler), which no frozen spec stands in for; config.yaml is its text.
"""
from __future__ import annotations

from dataclasses import dataclass

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from tuning.config.untrusted import without_secrets
from tuning.engine.loop import Components

GROUPS = ("search", "sampler", "evaluator", "cost_model", "hardware", "tracking")  # Components' order


@dataclass(frozen=True)
class Builders:
    cfg: DictConfig

    def components(self) -> Components:
        return Components(*(instantiate(self.cfg[g]) for g in GROUPS))

    def task_parts(self) -> dict:
        """A task's own search, sampler and cost model (a model of several tasks)."""
        return {g: instantiate(self.cfg[g]) for g in ("search", "sampler", "cost_model")}

    def scheduler(self):
        return instantiate(self.cfg.scheduler)

    def config_yaml(self) -> str:
        """config.yaml's text: the config resolved, its secrets left out."""
        return without_secrets(OmegaConf.to_yaml(self.cfg, resolve=True))

    def fresh_state(self, _index: int) -> tuple:
        """The (search, cost model) a resumed task whose saved state is lost restarts with."""
        return instantiate(self.cfg.search), instantiate(self.cfg.cost_model)
