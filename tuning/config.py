"""Typed schema of the top-level config, and checks that run before any work.

Hydra already rejects an unknown group option (listing the available ones)
and OmegaConf rejects a wrong type for the structured keys below. `validate`
adds ranges, the hyperparameters of every `_target_` component (checked
against the constructor's signature, the class's `ranges` and `options`), and the
impossible combinations. Every message names the key.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from tuning.task import conv2d_output_size

COMPONENT_GROUPS = ("search", "sampler", "evaluator", "cost_model", "hardware", "tracking", "scheduler")


@dataclass
class BudgetSchema:
    trials: int = 256  # measurements of the whole run (all of a model's tasks together)
    trials_per_task: Optional[int] = None  # when set, trials = this x the model's number of tasks
    rounds_per_task: Optional[int] = None  # stop a task after this many propose/measure rounds
    time_limit_s: Optional[float] = None  # wall-clock cap for the whole run
    early_stop: Optional[int] = None  # stop a task after this many measurements without a new best
    min_trials_per_task: int = 64  # every task gets this many (or its whole space) before scheduling


@dataclass
class TuningSchema:
    database: Optional[str] = None  # an earlier run's folder or records.jsonl: matching tasks start from it


@dataclass
class E2ESchema:
    enabled: bool = True  # whole models: apply the best schedules and time tuned / untuned / torch
    runs: int = 50  # timed calls per variant (after one warm-up)...
    min_runs: int = 3  # ...but at least this many (the untuned build gets only these)...
    max_seconds: float = 10.0  # ...and no more calls once this long was spent on a variant
    timeout_s: float = 3600.0  # compile + run of everything


@dataclass
class ObjectiveSchema:
    """What run.py returns to a sweep (tuning/sweep.py lists the metrics)."""
    metrics: list = field(default_factory=lambda: ["final_gflops"])
    directions: list = field(default_factory=lambda: ["maximize"])
    target_latency_us: Optional[float] = None  # for measurements_to_target / seconds_to_target
    report_every: int = 16  # pruning: best-so-far goes to the Optuna trial every this many measurements


@dataclass
class TopLevelSchema:
    seed: int = 0
    resume: Optional[str] = None  # output dir of a run to continue
    output_dir: str = MISSING
    budget: BudgetSchema = field(default_factory=BudgetSchema)
    tuning: TuningSchema = field(default_factory=TuningSchema)
    e2e: E2ESchema = field(default_factory=E2ESchema)
    objective: ObjectiveSchema = field(default_factory=ObjectiveSchema)
    model: Any = MISSING
    search: Any = MISSING
    sampler: Any = MISSING
    evaluator: Any = MISSING
    cost_model: Any = MISSING
    hardware: Any = MISSING
    tracking: Any = MISSING
    scheduler: Any = MISSING


def register() -> None:
    ConfigStore.instance().store(name="base_config", node=TopLevelSchema)


class ConfigError(ValueError):
    pass


MODEL_KEYS = {
    "gemm": {"M": int, "N": int, "K": int},
    "conv2d": {"batch": int, "in_channels": int, "height": int, "width": int, "out_channels": int,
               "kernel": int, "stride": int, "padding": int},
    "network": {"network": str},
    "onnx": {"path": str, "input_shape": list},
}


def validate(cfg: DictConfig, choices: dict | None = None) -> None:
    """Raise ConfigError listing every problem (each naming its key) before any work.

    `choices` maps group -> chosen option name (Hydra's runtime choices), for messages."""
    problems = []
    problems += _check_range("seed", cfg.seed, 0, None)
    problems += _check_range("budget.trials", cfg.budget.trials, 1, None)
    if cfg.budget.time_limit_s is not None:
        problems += _check_range("budget.time_limit_s", cfg.budget.time_limit_s, 0, None, inclusive_low=False)
    if cfg.budget.early_stop is not None:
        problems += _check_range("budget.early_stop", cfg.budget.early_stop, 1, None)
    for key in ("trials_per_task", "rounds_per_task"):
        if cfg.budget[key] is not None:
            problems += _check_range(f"budget.{key}", cfg.budget[key], 1, None)
    problems += _check_range("budget.min_trials_per_task", cfg.budget.min_trials_per_task, 0, None)
    for key in ("runs", "min_runs"):
        problems += _check_range(f"e2e.{key}", cfg.e2e[key], 1, None)
    problems += _check_range("e2e.max_seconds", cfg.e2e.max_seconds, 0, None)
    problems += _check_model(cfg.model)
    problems += _check_objective(cfg.objective)
    problems += _check_range("objective.report_every", cfg.objective.report_every, 1, None)
    classes = {}
    for group in COMPONENT_GROUPS:
        cls, group_problems = _check_component(group, cfg[group])
        classes[group] = cls
        problems += group_problems
    if not problems:
        problems += _check_combinations(cfg, classes, choices or {})
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def _check_range(key, value, low, high, inclusive_low=True) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return [f"{key}: expected a number, got {value!r}"]
    too_low = low is not None and (value < low if inclusive_low else value <= low)
    if too_low or (high is not None and value > high):
        bounds = f"{'>=' if inclusive_low else '>'} {low}" + (f" and <= {high}" if high is not None else "")
        return [f"{key}: must be {bounds}, got {value}"]
    return []


def _check_objective(objective) -> list[str]:
    from tuning.sweep import DIRECTIONS, NEEDS_TARGET

    metrics, directions = list(objective.metrics), list(objective.directions)
    unknown = [m for m in metrics if m not in DIRECTIONS]
    if not metrics or unknown:
        return [f"objective.metrics: expected names from {', '.join(DIRECTIONS)}, got {metrics}"]
    expected = [DIRECTIONS[m] for m in metrics]
    if directions != expected:
        return [f"objective.directions: {metrics} are optimised as {expected}, got {directions}"]
    target = objective.target_latency_us
    if any(m in NEEDS_TARGET for m in metrics) and (target is None or target <= 0):
        return [f"objective.target_latency_us: {', '.join(m for m in metrics if m in NEEDS_TARGET)} needs a "
                f"positive target latency (us), got {target}"]
    return []


def _check_model(model) -> list[str]:
    kind = model.get("kind")
    if kind not in MODEL_KEYS:
        return [f"model.kind: must be one of {sorted(MODEL_KEYS)}, got {kind!r}"]
    problems = []
    for key, typ in MODEL_KEYS[kind].items():
        value = model.get(key)
        if isinstance(value, ListConfig):
            value = list(value)
        if value is None:
            problems.append(f"model.{key}: required for a {kind} model (e.g. model.{key}=...)")
        elif not isinstance(value, typ) or isinstance(value, bool):
            problems.append(f"model.{key}: expected {typ.__name__} for a {kind} model, got {value!r}")
        elif typ is int:
            problems += _check_range(f"model.{key}", value, 0 if key == "padding" else 1, None)
    if problems:
        return problems
    if kind == "network":
        from tuning.networks import NETWORKS

        if model.network not in NETWORKS:
            problems.append(f"model.network: unknown network {model.network!r} (allowed: {', '.join(NETWORKS)})")
    if kind == "onnx":
        if not Path(model.path).expanduser().is_file():
            problems.append(f"model.path: no such file {model.path!r}")
        if not model.input_shape or not all(isinstance(d, int) and d >= 1 for d in model.input_shape):
            problems.append(f"model.input_shape: expected a list of positive ints, got {list(model.input_shape)}")
    if kind == "conv2d":
        for side in ("height", "width"):
            if conv2d_output_size(model[side], model.kernel, model.stride, model.padding) < 1:
                problems.append(f"model.kernel: a {model.kernel}x{model.kernel} kernel with padding "
                                f"{model.padding} does not fit model.{side}={model[side]}")
    return problems


def _check_component(group: str, node) -> tuple[type | None, list[str]]:
    """Hyperparameters vs the class's signature (name and type of each) and its `ranges`."""
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    if not target:
        return None, [f"{group}._target_: missing"]
    module, _, name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        return None, [f"{group}._target_: cannot import {target!r} ({error})"]
    parameters = inspect.signature(cls.__init__).parameters
    problems = []
    values = OmegaConf.to_container(node, resolve=True)
    for key, value in values.items():
        if key.startswith("_"):
            continue
        if key not in parameters:
            allowed = ", ".join(p for p in parameters if p != "self")
            problems.append(f"{group}.{key}: not a hyperparameter of {name} (allowed: {allowed})")
            continue
        problems += _check_type(f"{group}.{key}", value, _expected_type(parameters[key]))
    for key, (low, high) in getattr(cls, "ranges", {}).items():
        if key in values and values[key] is not None:
            problems += _check_range(f"{group}.{key}", values[key], low, high)
    for key, allowed in getattr(cls, "options", {}).items():
        if key in values and values[key] not in allowed:
            problems.append(f"{group}.{key}: expected one of {', '.join(map(str, allowed))}, got {values[key]!r}")
    return cls, problems


_PLAIN_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def _expected_type(parameter) -> type | None:
    """The annotation when it is a plain bool/int/float/str, else the default's type.

    The annotation wins because a default can be narrower than the parameter
    (xgb's `min_child_weight: float = 1` takes 0.5)."""
    annotation = parameter.annotation
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", None)
    if name in _PLAIN_TYPES:
        return _PLAIN_TYPES[name]
    if parameter.default is inspect.Parameter.empty or parameter.default is None:
        return None
    return type(parameter.default)


def _check_type(key, value, expected: type | None) -> list[str]:
    if expected is None or value is None:
        return []
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is bool:
        ok = isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif expected is float:
        ok = number
    elif issubclass(expected, (list, tuple)):
        ok = isinstance(value, (list, tuple)) or number  # a sequence, or one number (sa's temp: fixed)
    else:
        ok = isinstance(value, expected)
    return [] if ok else [f"{key}: expected {expected.__name__}, got {value!r}"]


def _check_combinations(cfg, classes, choices) -> list[str]:
    problems = []
    search, cost_model = classes["search"], classes["cost_model"]
    if getattr(search, "needs_cost_model", False) and not getattr(cost_model, "can_rank", True):
        problems.append(f"cost_model: search={choices.get('search', search.__name__)} needs a cost model that "
                        f"ranks configs, but cost_model={choices.get('cost_model', cost_model.__name__)} "
                        "cannot (use cost_model=xgb)")
    if getattr(search, "needs_uncertainty", False) and not getattr(cost_model, "has_uncertainty", False):
        problems.append(f"cost_model: search={choices.get('search', search.__name__)} needs a cost model with a "
                        f"predictive uncertainty, but cost_model={choices.get('cost_model', cost_model.__name__)} "
                        "has none (use cost_model=rf)")
    evaluator = cfg.evaluator
    runs, micro_batch = evaluator.get("runs"), evaluator.get("micro_batch")
    if isinstance(runs, int) and isinstance(micro_batch, int):
        if micro_batch > runs:
            problems.append(f"evaluator.micro_batch: must be at most evaluator.runs (got micro_batch={micro_batch}, "
                            f"runs={runs})")
        elif evaluator.get("min_batches", 1) > runs // micro_batch:
            problems.append(f"evaluator.min_batches: {evaluator.get('min_batches')} micro-batches of {micro_batch} "
                            f"exceed evaluator.runs={runs}; the rule could never stop early")
    if evaluator.get("cache_flush") and (evaluator.get("number", 1) != 1 or evaluator.get("min_repeat_ms", 0) > 0):
        problems.append(f"evaluator.cache_flush: needs evaluator.number=1 and evaluator.min_repeat_ms=0 (got "
                        f"number={evaluator.get('number')}, min_repeat_ms={evaluator.get('min_repeat_ms')}); "
                        "the flush runs once per repeat, so it would only cool the first of many runs")
    if cfg.hardware.get("_target_", "").endswith("SyntheticHardware") and cfg.model.kind not in ("gemm", "conv2d"):
        problems.append(f"hardware: synthetic hardware models only gemm/conv2d, not model.kind={cfg.model.kind}")
    k_min, k_max = cfg.sampler.get("k_min"), cfg.sampler.get("k_max")
    if isinstance(k_min, int) and isinstance(k_max, int) and k_min >= k_max:
        problems.append(f"sampler.k_min: must be below sampler.k_max (got k_min={k_min}, k_max={k_max}): "
                        "k runs over range(k_min, k_max)")
    plan = cfg.search.get("plan_size")
    if plan is not None:
        problems += _check_range("search.plan_size", plan, 1, None)
    return problems
