"""A job's config checked before any work: the schema's checks (tuning/config/schema.py), then every
chosen component class checks its own hyperparameters and what it requires of the others
(tuning/core/component.py). Nothing here knows a component's keys: adding a method never edits this
module. Every message names the key."""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from tuning.config.schema import COMPONENT_GROUPS, ConfigError, schema_problems
from tuning.config.untrusted import is_registered_target, unregistered
from tuning.core.component import Component, check_requirements, import_class
from tuning.engine.first_round import prior_problems

# each group's contract, for the keys its options no longer take (Component.moved)
GROUP_BASES = {"search": "tuning.search.base.Search", "sampler": "tuning.sampler.base.Sampler",
               "evaluator": "tuning.evaluator.base.Evaluator", "cost_model": "tuning.cost_model.base.CostModel",
               "hardware": "tuning.hardware.base.Hardware", "tracking": "tuning.tracking.base.Tracker",
               "scheduler": "tuning.scheduler.base.Scheduler"}


def moved_overrides(overrides) -> list[str]:
    """Command-line overrides of a key that moved (a group base class's `moved`), each naming where
    it went. Hydra rejects such an override before any job runs, as "not in struct", without saying
    where the key went; run.py asks this first."""
    problems = []
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        group, _, name = key.partition(".")
        if group in GROUP_BASES and name:
            moved = import_class(GROUP_BASES[group]).moved
            if name in moved:
                problems.append(f"{key}: no longer a {group} key; use {moved[name]}")
    return problems


def validate(cfg: DictConfig, choices: dict | None = None, runs_here: bool = False) -> None:
    """Raise ConfigError listing every problem (each naming its key) before any work.

    `choices` maps group -> chosen option name (Hydra's runtime choices), for messages. `runs_here`:
    the job runs on this host, so what the host lacks for it (no GPU) is said first, before the keys'
    problems (a missing arch cannot help); tools that only read a run (sync, import) leave it off."""
    problems = schema_problems(cfg)
    classes: dict[str, Any] = {}  # group -> its component class
    for group in COMPONENT_GROUPS:
        cls, group_problems = _check_component(group, cfg[group])
        classes[group] = cls
        problems += group_problems
    if not problems:
        names = {group: (choices or {}).get(group) or cls.__name__ for group, cls in classes.items()}
        problems += check_requirements(classes, names)
        problems += _check_features(cfg, classes, names)
        if cfg.budget.trials == 0 and not classes["search"].schedules_without_measuring:
            problems.append(f"budget.trials: 0 measurements needs a search that schedules without measuring "
                            f"(search=value, random), not search={names['search']}")
        if cfg.search.get("best_of", 1) > 1 and not classes["cost_model"].can_rank:
            problems.append(f"search.best_of: {cfg.search.best_of} random configs ranked by a cost model that ranks "
                            f"nothing (cost_model={names['cost_model']}): set cost_model=xgb_ms with "
                            "cost_model.pretrained, or best_of=1")
        if cfg.tuning.get("prior"):
            problems += prior_problems(cfg.tuning.prior)
        if cfg.model.kind not in classes["hardware"].model_kinds:
            problems.append(f"hardware: hardware={names['hardware']} tunes model.kind "
                            f"{', '.join(classes['hardware'].model_kinds)}, not model.kind={cfg.model.kind}")
        space = cfg.model.get("space", "full")
        if space not in ("full", "store") and space not in classes["hardware"].model_spaces:
            problems.append(f"model.space: hardware={names['hardware']} builds no `{space}` space (it builds "
                            f"{', '.join(classes['hardware'].model_spaces)})")
    if runs_here:
        problems = _missing_here(cfg, classes) + problems
    if problems:  # a NaN in a ranged key is found by the walk and by its range check: say it once
        raise ConfigError("invalid config:\n  " + "\n  ".join(dict.fromkeys(problems)))


def _missing_here(cfg, classes) -> list[str]:
    """What this host lacks for each chosen component (Component.missing_here), in group order."""
    facts = []
    for group, cls in classes.items():
        if cls is not None:
            facts += cls.missing_here(_params(cfg[group]), group)
    return facts


def _params(node) -> dict:
    return {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if not k.startswith("_")}


def _check_features(cfg, classes, names) -> list[str]:
    """cost_model.features other than knobs: TVM schedules each scored candidate (tuning/core/space.py)."""
    features = cfg.cost_model.get("features", "knobs")
    if features == "knobs":
        return []
    problems = []
    hardware, backend = classes["hardware"], cfg.hardware.get("backend")
    if hardware.schedules_programs and isinstance(backend, DictConfig) and backend.get("_target_"):
        backend_class, _ = _check_component("hardware.backend", backend)
        hardware = backend_class or hardware
    if not hardware.schedules_programs:
        problems.append(f"cost_model.features: {features} describes the program TVM schedules for each "
                        f"config; hardware={names['hardware']} does not schedule with TVM (use hardware=cpu "
                        f"or replay, or cost_model.features=knobs)")
    if not classes["search"].affords_program_features:
        problems.append(f"cost_model.features: {features} costs a TVM schedule per scored candidate (~3 ms "
                        f"on 2 cores); search={names['search']} scores too many a round (use "
                        f"search=evolutionary or random, or cost_model.features=knobs)")
    return problems


def _check_component(group: str, node) -> tuple[type | None, list[str]]:
    """Import the `_target_` class and let it check its hyperparameters."""
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    if not target:
        return None, [f"{group}._target_: missing"]
    if not is_registered_target(target):  # asked before the import: importing a module runs it
        return None, [unregistered(target, f"{group}._target_")]
    try:
        cls = import_class(target)
    except (ImportError, AttributeError, ValueError) as error:
        return None, [f"{group}._target_: cannot import {target!r} ({error})"]
    if not (isinstance(cls, type) and issubclass(cls, Component)):
        return None, [f"{group}._target_: {target} is not a tunelab component (tuning/core/component.py)"]
    return cls, cls.check_params(_params(node), group)
