"""Typed schema of the top-level config, and checks that run before any work.

Hydra already rejects an unknown group option (listing the available ones),
an override of a key that is not there (without `+`), and OmegaConf a wrong
type for the structured keys below. `schema_problems` adds what they let through:
keys added with `+` that nothing reads (top level, the schema groups, the
model), NaN and infinities anywhere, the ranges of the top-level keys, the
model (its name, which names files, and its dtype) and the storage settings.
The components' own checks are tuning/engine/validate.py's. Every message names the key.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue, OmegaConfBaseException

from tuning.config.objective import DIRECTIONS, NEEDS_TARGET
from tuning.config.storage import StorageSchema, register_resolver
from tuning.config.storage import problems as storage_problems
from tuning.config.storage import unresolved as unresolved_storage
from tuning.core.component import MAX_SEED, check_range, did_you_mean
from tuning.core.task import conv2d_output_shape

COMPONENT_GROUPS = ("search", "sampler", "evaluator", "cost_model", "hardware", "tracking", "scheduler")


@dataclass
class BudgetSchema:
    trials: Optional[int] = None  # measurements of the whole run (all of a model's tasks together); null:
                                  # 256 for a single operator, 32 per kernel for a whole model (tuning/engine/run.py)
    trials_per_task: Optional[int] = None  # when set, trials = this x the model's number of tasks
    rounds_per_task: Optional[int] = None  # stop a task after this many propose/measure rounds
    time_limit_s: Optional[float] = None  # wall-clock cap for the whole run
    minutes: Optional[float] = None  # the whole job's wall clock, checks included; null: 15 for a whole
                                     # model whose budget names no count or time (tuning/engine/budget.py)
    early_stop: Optional[int] = None  # stop a task after this many measurements without a new best
    min_trials_per_task: Optional[int] = None  # every task gets this many (or its whole space) before
                                               # scheduling; null: 64, or one round under minutes
    plan_size: Optional[int] = None  # configs per round; null: the search's default_plan_size (its paper's)
    init_random: int = 0  # common random numbers: each task's first N measurements are random configs drawn
                          # from the seed alone, the same for every method (paired comparisons pair something)


@dataclass
class TuningSchema:
    database: Optional[str] = None  # an earlier run's folder or records.jsonl: matching tasks start from it
    prior: Optional[str] = None  # a pre-trained booster choosing each task's first round: auto (conf/config.yaml's:
                                 # the hardware's shipped one), package:NAME, models:/NAME/VERSION; null: none


@dataclass
class E2ESchema:
    enabled: bool = True  # whole models: apply the best schedules and time tuned / untuned / torch
    runs: int = 50  # timed calls per variant (after one warm-up)...
    min_runs: int = 3  # ...but at least this many (the untuned build gets only these)...
    max_seconds: float = 10.0  # ...and no more calls once this long was spent on a variant
    timeout_s: float = 3600.0  # compile + run of everything
    fresh_input: bool = True  # the input written (untimed) before each call, as a caller's new input is
    in_model_kernels: int = 10  # the heaviest tasks re-chosen by their candidates' time inside the model (0: off)
    in_model_candidates: int = 4  # configs timed there per task (its chosen one and the next fastest)
    in_model_processes: int = 4  # fresh processes reading them (each lays the model's buffers out anew): the
                                 # even-numbered ones choose, the odd-numbered ones predict
    in_model_rounds: int = 3  # readings of every candidate per process, in an order rotated each round
    in_model_runs: int = 20  # model runs per reading (its median)


@dataclass
class ObjectiveSchema:
    """What run.py returns to a sweep (tuning/sweep/multirun.py lists the metrics)."""
    metrics: list = field(default_factory=lambda: ["final_gflops"])
    directions: list = field(default_factory=lambda: ["maximize"])
    target_latency_us: Optional[float] = None  # for measurements_to_target / seconds_to_target
    report_every: int = 16  # pruning: best-so-far goes to the Optuna trial every this many measurements


@dataclass
class TopLevelSchema:
    seed: int = 0
    resume: Optional[str] = None  # output dir of a run to continue
    reset_state: bool = False  # with resume: tasks whose saved search state is lost restart their search
    output_dir: str = MISSING
    budget: BudgetSchema = field(default_factory=BudgetSchema)
    tuning: TuningSchema = field(default_factory=TuningSchema)
    e2e: E2ESchema = field(default_factory=E2ESchema)
    objective: ObjectiveSchema = field(default_factory=ObjectiveSchema)
    storage: StorageSchema = field(default_factory=StorageSchema)  # where runs, studies, stores live
    model: Any = MISSING
    search: Any = MISSING
    sampler: Any = MISSING
    evaluator: Any = MISSING
    cost_model: Any = MISSING
    hardware: Any = MISSING
    tracking: Any = MISSING
    scheduler: Any = MISSING


SCHEMA_GROUPS = {"budget": BudgetSchema, "tuning": TuningSchema, "e2e": E2ESchema, "objective": ObjectiveSchema,
                 "storage": StorageSchema}


def register() -> None:
    ConfigStore.instance().store(name="base_config", node=TopLevelSchema)


register_resolver()  # before any config that names ${tunelab_outputs:} is resolved


class ConfigError(ValueError):
    pass


# store: only the configs the measurement store holds (docs/store.md); tiling: the GEMM-tiling paper's
# space, gemm models only (docs/tvm.md §The tiling space); wide: MetaSchedule's sketches and more
# multi-level tilings, single operators on hardware that builds it (docs/tvm.md §The wide space)
MODEL_SPACES = ("full", "store", "tiling", "wide")
MODEL_COMMON_KEYS = ("name", "kind", "description", "space", "dtype")
# the correctness check's inputs (uniform in [-1, 1]) and tolerance (1e-3) are float32's
MODEL_DTYPES = ("float32",)
MODEL_DEFAULTS = {"conv2d": {"groups": 1, "dilation": 1}}  # optional keys: absent means this
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")  # it names files and runs: no '/', no leading '.'
SIZE = "int or [height, width]"  # a conv2d size: square, or per axis
MODEL_KEYS: dict[str, dict[str, Any]] = {
    "gemm": {"M": int, "N": int, "K": int},
    "batch_matmul": {"batch": int, "M": int, "N": int, "K": int},
    "conv2d": {"batch": int, "in_channels": int, "height": int, "width": int, "out_channels": int,
               "kernel": SIZE, "stride": SIZE, "padding": SIZE, "groups": int, "dilation": SIZE},
    "network": {"network": str},
    "onnx": {"path": str, "input_shape": list},
}


def _shape_problems(cfg) -> list[str]:
    """A config read back from a run folder may lack a key, or hold a value of another kind than the
    schema's (a list where a number goes, a bool for a group): said here, by key, before any check
    reads it. Unknown keys are left to _unknown_keys, which lists what is allowed."""
    names = [f.name for f in fields(TopLevelSchema)]
    problems = [f"{name}: missing" for name in names if name not in cfg]
    problems += [f"{group}: expected a mapping, got {str(cfg[group])[:60]!r}"
                 for group in ("model", *COMPONENT_GROUPS) if group in cfg and not isinstance(cfg[group], DictConfig)]
    if problems or _unknown_keys(cfg):
        return problems
    try:
        on_schema(OmegaConf.masked_copy(cfg, names))
    except ConfigError as error:
        return [str(error)]
    return []


def on_schema(data) -> DictConfig:
    """`data` (top-level keys) on the typed schema, as a plain config: a key it lacks takes the
    schema's default; a value of another type is a ConfigError naming its key."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TopLevelSchema), data)
    except OmegaConfBaseException as error:
        reason = str(getattr(error, "msg", None) or type(error).__name__).splitlines()[0]
        raise ConfigError(f"{getattr(error, 'full_key', None) or 'config'}: {reason}") from None
    return OmegaConf.create(OmegaConf.to_container(merged))  # plain again: resume merges overrides in


def _unknown_keys(cfg) -> list[str]:
    """Keys that nothing reads: a typo added with `+` (`+budget.trails=100`) would otherwise be
    accepted and ignored. Component groups check their own keys (Component.check_params)."""
    allowed = [f.name for f in fields(TopLevelSchema)] + (["hydra"] if "hydra" in cfg else [])
    problems = _extra_keys("", cfg, allowed, "a top-level key")
    for group, schema in SCHEMA_GROUPS.items():
        problems += _extra_keys(f"{group}.", cfg[group], [f.name for f in fields(schema)], f"a key of {group}")
    return problems


def _extra_keys(prefix: str, node, allowed: list[str], what: str) -> list[str]:
    return [f"{prefix}{key}: not {what}{did_you_mean(key, allowed, prefix)} (allowed: {', '.join(allowed)})"
            for key in node if key not in allowed]


def _non_finite_floats(node, path: str = "") -> list[str]:
    """Every NaN or infinite float in the config, lists included, by dotted key."""
    problems = []
    for key, value in _children(node, path):
        if isinstance(value, (DictConfig, ListConfig)):
            problems += _non_finite_floats(value, key)
        elif isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{key}: expected a finite number, got {value}")
    return problems


def _children(node, path: str):
    """(dotted key, resolved value) of a node's children; the top level's `hydra` is Hydra's own."""
    if isinstance(node, ListConfig):
        named = [(f"{path}[{i}]", i) for i in range(len(node))]
    else:
        named = [(f"{path}.{key}" if path else str(key), key) for key in node if path or key != "hydra"]
    for name, key in named:
        try:
            value = node[key]
        except (MissingMandatoryValue, InterpolationResolutionError):
            continue  # not a number; whatever reads the key reports it
        yield name, value


def _check_objective(objective) -> list[str]:
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
    subset = ("kernels",) if kind in ("network", "onnx") else ()
    problems = _extra_keys("model.", model, [*MODEL_COMMON_KEYS, *MODEL_KEYS[kind], *subset], f"a key of a {kind} model")
    problems += _check_kernels(model.get("kernels")) if subset else []
    problems += _check_model_name(model.get("name"))
    if model.get("dtype", "float32") not in MODEL_DTYPES:
        problems.append(f"model.dtype: expected one of {', '.join(MODEL_DTYPES)}, got {model.get('dtype')!r}")
    if model.get("space", "full") not in MODEL_SPACES:
        problems.append(f"model.space: expected one of {', '.join(MODEL_SPACES)}, got {model.get('space')!r}")
    elif model.get("space") == "tiling" and kind != "gemm":
        problems.append(f"model.space: `tiling` is the GEMM-tiling paper's space, for gemm models only; "
                        f"{model.get('name')} is a {kind} model")
    elif model.get("space") == "wide" and kind not in ("gemm", "batch_matmul", "conv2d"):
        problems.append(f"model.space: `wide` widens a single operator's space (gemm, batch_matmul, conv2d); "
                        f"{model.get('name')} is a {kind} model")
    for key, typ in MODEL_KEYS[kind].items():
        value = model.get(key, MODEL_DEFAULTS.get(kind, {}).get(key))
        if isinstance(value, ListConfig):
            value = list(value)
        if value is None:
            problems.append(f"model.{key}: required for a {kind} model (e.g. model.{key}=...)")
        elif typ is SIZE:
            problems += _check_size(f"model.{key}", value, 0 if key == "padding" else 1)
        elif not isinstance(value, typ) or isinstance(value, bool):
            problems.append(f"model.{key}: expected {typ.__name__} for a {kind} model, got {value!r}")
        elif typ is int:
            problems += check_range(f"model.{key}", value, 0 if key == "padding" else 1, None)
    if problems:
        return problems
    if kind == "network":
        from tuning.core.networks import NETWORKS

        if model.network not in NETWORKS:
            problems.append(f"model.network: unknown network {model.network!r} (allowed: {', '.join(NETWORKS)})")
    if kind == "onnx":
        if not model.input_shape or not all(isinstance(d, int) and d >= 1 for d in model.input_shape):
            problems.append(f"model.input_shape: expected a list of positive ints, got {list(model.input_shape)}")
    if kind == "conv2d":
        problems += _check_conv2d(model)
    return problems


def _check_kernels(kernels) -> list[str]:
    """model.kernels: null (every kernel of the model) or a non-empty list of kernel names; the names
    themselves are checked against the model's kernels once they are extracted (job_tasks)."""
    if kernels is None:
        return []
    names = list(kernels) if isinstance(kernels, (list, ListConfig)) else None
    if not names or not all(isinstance(n, str) and n for n in names):
        return [f"model.kernels: expected null or a list of kernel names (model.kernels=[NAME,...]), got {kernels!r}"]
    return []


def missing_model_file(model) -> list[str]:
    """An ONNX model whose file is not there: the fact that stops it, said before its other keys."""
    path = model.get("path") if model.get("kind") == "onnx" else None
    if isinstance(path, str) and not Path(path).expanduser().is_file():
        return [f"model.path: no such file {path!r}"]
    return []


def _check_size(key: str, value, low: int) -> list[str]:
    ok = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                             for v in value))
    if not ok:
        return [f"{key}: expected an int or [height, width] (two ints), got {value!r}"]
    return [problem for v in ([value] if isinstance(value, int) else value) for problem in check_range(key, v, low, None)]


def _check_conv2d(model) -> list[str]:
    groups = model.get("groups", 1)
    problems = [f"model.groups: must divide model.{key}={model[key]}, got {groups}"
                for key in ("in_channels", "out_channels") if model[key] % groups]
    workload = {k: (list(v) if isinstance(v, ListConfig) else v) for k, v in model.items()
                if k in MODEL_KEYS["conv2d"]}
    for side, out in zip(("height", "width"), conv2d_output_shape(workload)):
        if out < 1:
            problems.append(f"model.kernel: kernel {model.kernel} (dilation {model.get('dilation', 1)}) with "
                            f"padding {model.padding} does not fit model.{side}={model[side]}")
    return problems


def _check_model_name(name) -> list[str]:
    if isinstance(name, str) and MODEL_NAME.fullmatch(name):
        return []
    return [f"model.name: names the run's files and runs, so it must match {MODEL_NAME.pattern} "
            f"(no '/', not starting with '.'), got {name!r}"]


def schema_problems(cfg: DictConfig) -> list[str]:
    """Every problem of the keys the schema types (each naming its key); raises ConfigError at once
    where the checks after it could not read the config."""
    problems = _shape_problems(cfg)
    if problems:  # the checks below read these keys as the schema types them
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    problems = missing_model_file(cfg.model) + _unknown_keys(cfg) + _non_finite_floats(cfg)
    problems += check_range("seed", cfg.seed, 0, MAX_SEED)
    if cfg.budget.trials is not None:
        problems += check_range("budget.trials", cfg.budget.trials, 0, None)
    if cfg.budget.time_limit_s is not None:
        problems += check_range("budget.time_limit_s", cfg.budget.time_limit_s, 0, None, inclusive_low=False)
    if cfg.budget.get("minutes") is not None:
        problems += check_range("budget.minutes", cfg.budget.minutes, 0, None, inclusive_low=False)
        if cfg.budget.time_limit_s is not None:
            problems.append("budget.minutes and budget.time_limit_s: both cap the time; give one "
                            "(minutes: the whole job, checks included; time_limit_s: the tuning alone)")
    for key in ("trials_per_task", "rounds_per_task", "early_stop", "plan_size"):
        if cfg.budget[key] is not None:
            problems += check_range(f"budget.{key}", cfg.budget[key], 1, None)
    if cfg.budget.min_trials_per_task is not None:
        problems += check_range("budget.min_trials_per_task", cfg.budget.min_trials_per_task, 0, None)
    problems += check_range("budget.init_random", cfg.budget.init_random, 0, None)
    for key in ("runs", "min_runs", "in_model_candidates", "in_model_processes", "in_model_rounds", "in_model_runs"):
        problems += check_range(f"e2e.{key}", cfg.e2e[key], 1, None)
    problems += check_range("e2e.in_model_kernels", cfg.e2e.in_model_kernels, 0, None)
    problems += check_range("e2e.max_seconds", cfg.e2e.max_seconds, 0, None)
    problems += check_range("e2e.timeout_s", cfg.e2e.timeout_s, 0, None, inclusive_low=False)
    problems += _check_model(cfg.model)
    problems += _check_objective(cfg.objective)
    problems += check_range("objective.report_every", cfg.objective.report_every, 1, None)
    problems += storage_problems(cfg.storage)
    if unresolved_storage(cfg.storage):  # the components' settings read these keys
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return problems
