"""What every configurable part of a run shares: hyperparameters it checks itself, and what it needs.

A component is one option of a config group (search, sampler, evaluator, cost_model, hardware,
tracking, scheduler). Like a scikit-learn estimator it declares its constraints and checks them; the
config loader (tuning/config.py) only calls `check_params` on each chosen class and
`check_requirements` across them, so adding a method never edits the loader.

Declared on the class:

    ranges = {"key": (low, high)}        finite numbers in [low, high]; None: unbounded
    options = {"key": ("a", "b")}        one of these values
    moved = {"key": "where it went"}     an old key that is rejected, naming its new place
    requires = {"group": ("capability", ...)}
                                         what the chosen option of another group must have, e.g.
                                         search=sa needs {"cost_model": ("can_rank",)}
    capabilities = {"name": ("what it means", "an option that has it")}
                                         on a group's base class: the boolean class attributes other
                                         components may require (CostModel.can_rank, ...)
    check(params, group) -> [message]    cross-field rules on its own hyperparameters; a check that
                                         reads outside the config (a registered model) does so only
                                         while `external_checks()`: a command that re-logs a run
                                         rather than runs it (`tuning.tools.sync`) validates under
                                         `local_checks_only()`, so a finished run whose model is gone
                                         is still re-logged

Each message starts with the key it is about ("evaluator.micro_batch: ..."). The constructor's
signature is the list of hyperparameters: an unknown key or a value of the wrong type is rejected.
`__init__` stores hyperparameters only: no TVM, no I/O, no threads, no processes.
"""
from __future__ import annotations

import contextvars
import importlib
import inspect
import math
from abc import ABC
from contextlib import contextmanager
from typing import ClassVar

_EXTERNAL_CHECKS = contextvars.ContextVar("tunelab_external_checks", default=True)


def external_checks() -> bool:
    """Whether components' checks may read what the config names outside itself (see the module doc)."""
    return _EXTERNAL_CHECKS.get()


@contextmanager
def local_checks_only():
    token = _EXTERNAL_CHECKS.set(False)
    try:
        yield
    finally:
        _EXTERNAL_CHECKS.reset(token)


class Component(ABC):
    ranges: ClassVar[dict] = {}
    options: ClassVar[dict] = {}
    moved: ClassVar[dict] = {}
    requires: ClassVar[dict] = {}
    capabilities: ClassVar[dict] = {}

    @classmethod
    def check(cls, params: dict, group: str) -> list[str]:
        """Rules between this component's own hyperparameters (params include the defaults)."""
        return []

    @classmethod
    def needs(cls, group: str, capability: str) -> bool:
        return capability in cls.requires.get(group, ())

    @classmethod
    def check_params(cls, params: dict, group: str) -> list[str]:
        """Every problem with `params` (the config node without `_target_`), each naming its key."""
        parameters = {name: p for name, p in inspect.signature(cls.__init__).parameters.items() if name != "self"}
        problems = []
        for key, value in params.items():
            if key in cls.moved:
                problems.append(f"{group}.{key}: no longer a {group} key; use {cls.moved[key]}")
            elif key not in parameters:
                # a key that is not a name (a stray quote from a hand edit) is shown quoted, under its group
                where = f"{group}.{key}:" if str(key).isidentifier() else f"{group}: {str(key)!r} is"
                problems.append(f"{where} not a hyperparameter of {cls.__name__} "
                                f"(allowed: {', '.join(parameters)})")
            else:
                problems += check_type(f"{group}.{key}", value, _expected_type(parameters[key]))
        for key, (low, high) in cls.ranges.items():
            if params.get(key) is not None:
                problems += check_range(f"{group}.{key}", params[key], low, high)
        for key, allowed in cls.options.items():
            if key in params and params[key] not in allowed:
                problems.append(f"{group}.{key}: expected one of {', '.join(map(str, allowed))}, got {params[key]!r}")
        if problems:
            return problems
        defaults = {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}
        return cls.check({**defaults, **params}, group)


def check_requirements(classes: dict[str, type], names: dict[str, str]) -> list[str]:
    """What each chosen component `requires` of the others; `names` are the chosen option names."""
    problems = []
    for group, cls in classes.items():
        for other, capabilities in getattr(cls, "requires", {}).items():
            provider = classes.get(other)
            for capability in capabilities:
                if provider is None or getattr(provider, capability, False):
                    continue
                meaning, example = provider.capabilities[capability]
                problems.append(f"{other}: {group}={names[group]} needs a {other} that {meaning}, but "
                                f"{other}={names[other]} does not (e.g. {other}={example})")
    return problems


# the largest seed every consumer takes: sklearn's random_state (32 bits, the narrowest), xgboost's
# seed (63), torch.manual_seed and xgb_ms's hashed warm-up (64), numpy (any)
MAX_SEED = 2**32 - 1


def check_range(key: str, value, low, high, inclusive_low: bool = True) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return [f"{key}: expected a number, got {value!r}"]
    if isinstance(value, float) and not math.isfinite(value):  # the same words as tuning/config.py's walk over every float
        return [f"{key}: expected a finite number, got {value!r}"]
    too_low = low is not None and (value < low if inclusive_low else value <= low)
    if too_low or (high is not None and value > high):
        bounds = f"{'>=' if inclusive_low else '>'} {low}" + (f" and <= {high}" if high is not None else "")
        return [f"{key}: must be {bounds}, got {value}"]
    return []


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


def check_type(key: str, value, expected: type | None) -> list[str]:
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


def import_class(path: str):
    """The object a dotted `module.Name` path names, imported. Ask first whether the path may be
    imported at all (tuning.config.untrusted.is_registered_target): importing a module runs it."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)
