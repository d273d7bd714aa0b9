"""What a tuning job is asked to do, read once from its validated config into frozen specs.

`JobSpec.from_cfg(cfg)` is made in tuning/engine/run.py right after the config is claimed, resolved
(resume) and validated; the engine's steps take the spec, or the part of it they need, instead of the
raw Hydra config:

    JobSpec       the folder, seed, resume switches, tuning.database and the chosen group names
    ModelSpec     model.*: name, kind, space, whether it is a whole model, its resolved settings
    BudgetSpec    budget.* as given (tuning/engine/budget.py resolves it into a BudgetPlan)
    ObjectiveSpec objective.*: what a sweep is told, and how often a trial reports
    E2ESpec       e2e.*: a whole model's end-to-end check and its in-model choice

Only the component-building step keeps the raw config after this (Hydra's `instantiate` needs its
nodes; config.yaml and the MLflow run's params are written from it, its budget resolved).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from omegaconf import OmegaConf

from tuning.core.task import is_whole_model


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: str
    space: str  # model.space: "full" unless given ("store": the configs a measurement store holds)
    whole: bool  # a whole model (network / onnx): its tasks come from the backend
    path: str | None  # an ONNX model's file
    config: Mapping[str, Any]  # model.* resolved (read-only; `resolved()` gives the hardware its own copy)
    # the config node itself, for the task builders that read it as before (build_tasks, hardware.model_tasks)
    node: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, node) -> ModelSpec:
        """From the `model` node of a validated config."""
        return cls(name=node.get("name"), kind=node["kind"], space=node.get("space", "full"),
                   whole=is_whole_model(node), path=node.get("path"),
                   config=MappingProxyType(OmegaConf.to_container(node, resolve=True)), node=node)

    def resolved(self) -> dict:
        """model.* as a plain dict of its own: what the hardware compiles and times (evaluate_model,
        time_in_model)."""
        return copy.deepcopy(dict(self.config))


@dataclass(frozen=True)
class BudgetSpec:
    trials: int | None
    trials_per_task: int | None
    plan_size: int | None
    min_trials_per_task: int | None
    rounds_per_task: int | None
    early_stop: int | None
    time_limit_s: float | None
    init_random: int | None
    minutes: float | None = None

    @classmethod
    def of(cls, node) -> BudgetSpec:
        return cls(trials=node.trials, trials_per_task=node.trials_per_task, plan_size=node.plan_size,
                   min_trials_per_task=node.min_trials_per_task, rounds_per_task=node.rounds_per_task,
                   early_stop=node.early_stop, time_limit_s=node.time_limit_s, init_random=node.get("init_random"),
                   minutes=node.get("minutes"))


@dataclass(frozen=True)
class ObjectiveSpec:
    metrics: tuple[str, ...]
    target_latency_us: float | None
    report_every: int

    @classmethod
    def of(cls, node) -> ObjectiveSpec:
        return cls(metrics=tuple(node.metrics), target_latency_us=node.target_latency_us,
                   report_every=node.report_every)


@dataclass(frozen=True)
class E2ESpec:
    enabled: bool
    runs: int
    min_runs: int
    max_seconds: float
    timeout_s: float
    fresh_input: bool
    in_model_kernels: int
    in_model_candidates: int
    in_model_processes: int
    in_model_rounds: int
    in_model_runs: int

    @classmethod
    def of(cls, node) -> E2ESpec:
        return cls(enabled=node.enabled, runs=node.runs, min_runs=node.min_runs, max_seconds=node.max_seconds,
                   timeout_s=node.timeout_s, fresh_input=node.fresh_input, in_model_kernels=node.in_model_kernels,
                   in_model_candidates=node.in_model_candidates, in_model_processes=node.in_model_processes,
                   in_model_rounds=node.in_model_rounds, in_model_runs=node.in_model_runs)

    def timing(self) -> dict:
        """What hardware.evaluate_model is given."""
        return {"runs": self.runs, "min_runs": self.min_runs, "max_seconds": self.max_seconds,
                "timeout_s": self.timeout_s, "fresh_input": self.fresh_input}

    def chosen_in_model(self, tasks: int) -> int:
        """How many of a whole model's `tasks` its end re-chooses inside the model
        (tuning/engine/model_choice.py), whose finalists are read there instead of re-measured alone."""
        return min(self.in_model_kernels, tasks) if self.enabled and tasks > 1 else 0


@dataclass(frozen=True)
class JobSpec:
    out_dir: Path  # the run folder (a resumed run's own)
    seed: int
    resume: str | None  # the folder a resumed run continues, else None
    reset_state: bool
    database: str | None  # tuning.database: an earlier run whose records are reused
    prior: str | None  # tuning.prior: the pre-trained booster that chooses each task's first round
    model: ModelSpec
    budget: BudgetSpec
    objective: ObjectiveSpec
    e2e: E2ESpec
    choices: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))  # group -> option chosen

    @classmethod
    def from_cfg(cls, cfg, out_dir: Path | None = None, choices: Mapping[str, Any] | None = None) -> JobSpec:
        """The spec of a validated config; `out_dir` defaults to output_dir resolved, `choices` (Hydra's
        runtime choices, or a resumed run's saved ones) to none."""
        return cls(out_dir=Path(cfg.output_dir).resolve() if out_dir is None else out_dir, seed=cfg.seed,
                   resume=cfg.get("resume"), reset_state=bool(cfg.get("reset_state", False)),
                   database=cfg.tuning.database, prior=cfg.tuning.get("prior"), model=ModelSpec.of(cfg.model),
                   budget=BudgetSpec.of(cfg.budget),
                   objective=ObjectiveSpec.of(cfg.objective), e2e=E2ESpec.of(cfg.e2e),
                   choices=MappingProxyType(dict(choices or {})))

    def chosen_in_model(self, tasks: int) -> int:
        """How many of the job's `tasks` its end re-chooses inside the model: none for a single operator."""
        return self.e2e.chosen_in_model(tasks) if self.model.whole else 0
