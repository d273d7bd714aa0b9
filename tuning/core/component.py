"""What every configurable part of a run shares: hyperparameters it checks itself, and what it needs.

A component is one option of a config group (search, sampler, evaluator, cost_model, hardware,
tracking, scheduler). Like a scikit-learn estimator it declares its constraints and checks them; the
config loader (tuning/config.py) only calls `check_params` on each chosen class and
`check_requirements` across them, so adding a method never edits the loader.

Declared on the class:

    hyperparameters = {"key": Hyper(default, low=..., high=..., choices=..., cite=..., help=...)}
                                         each hyperparameter once: its default, its bounds or choices,
                                         what it is and where its value comes from. `ranges` and
                                         `options` are derived from it, and the class docstring gets
                                         the rendered table (`hyper_table`); the `__init__` defaults
                                         and the option's YAML must equal the declared defaults
                                         (`declaration_problems`, tests/test_hyperparameters.py).
                                         A class that declares none writes `ranges`/`options` itself:
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
import difflib
import importlib
import inspect
import math
from abc import ABC
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

_EXTERNAL_CHECKS = contextvars.ContextVar("tunelab_external_checks", default=True)


def external_checks() -> bool:
    """Whether components' checks may read what the config names outside itself (see the module doc)."""
    return _EXTERNAL_CHECKS.get()


@contextmanager
def local_checks_only() -> Iterator[None]:
    token = _EXTERNAL_CHECKS.set(False)
    try:
        yield
    finally:
        _EXTERNAL_CHECKS.reset(token)


@dataclass(frozen=True)
class Hyper:
    """One hyperparameter of a component, declared once.

    default   the value `__init__` and the option's YAML give it (a tuple for a sequence)
    low, high finite numbers in [low, high] (None: unbounded on that side; both None: no range)
    choices   the values it may take (None: any of its type)
    cite      where the default comes from: the paper's table or section, the reference code, or
              "tunelab's" with the reason
    help      what it does, one line or two
    """
    default: Any
    low: float | None = None
    high: float | None = None
    choices: tuple | None = None
    cite: str = ""
    help: str = ""

    @property
    def bounds(self) -> str:
        """The accepted values in words: ">= 1", "in [0.0, 1.0]", "one of a, b", or ""."""
        if self.choices is not None:
            return "one of " + ", ".join(map(str, self.choices))
        if self.low is not None and self.high is not None:
            return f"in [{self.low}, {self.high}]"
        if self.low is not None:
            return f">= {self.low}"
        if self.high is not None:
            return f"<= {self.high}"
        return ""


def _shown(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(map(_shown, value)) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)


def hyper_table(cls: type, markdown: bool = False) -> str:
    """The hyperparameters a class declares, rendered: the text `Component` appends to the class
    docstring, or (markdown=True) a Markdown table for the docs."""
    declared = getattr(cls, "hyperparameters", {}) or {}
    if markdown:
        rows = ["| hyperparameter | default | accepted | what it is | source |", "|---|---|---|---|---|"]
        rows += [f"| `{key}` | `{_shown(h.default)}` | {h.bounds} | {h.help} | {h.cite} |" for key, h in declared.items()]
        return "\n".join(rows)
    lines = ["Hyperparameters (declared in `hyperparameters`; default, accepted values, source):", ""]
    for key, h in declared.items():
        lines.append(f"    {key} = {_shown(h.default)}" + (f"  ({h.bounds})" if h.bounds else ""))
        lines += [f"        {text}" for text in (h.help, f"Source: {h.cite}" if h.cite else "") if text]
    return "\n".join(lines)


def same_value(a: object, b: object) -> bool:
    """Equal as config values: a tuple equals the list a YAML gives for it; a bool never equals a number."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return a == b


def declaration_problems(cls: type[Component]) -> list[str]:
    """Where a class's `__init__` disagrees with its `hyperparameters` (names and defaults); [] when it
    declares none."""
    declared = getattr(cls, "hyperparameters", {}) or {}
    if not declared:
        return []
    parameters = {name: p for name, p in inspect.signature(cls.__init__).parameters.items()
                  if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    problems = [f"{cls.__name__}.{key}: declared, not an __init__ parameter" for key in declared if key not in parameters]
    problems += [f"{cls.__name__}.{key}: an __init__ parameter with no declaration" for key in parameters
                 if key not in declared]
    for key in declared.keys() & parameters.keys():
        default = parameters[key].default
        if default is inspect.Parameter.empty or not same_value(default, declared[key].default):
            problems.append(f"{cls.__name__}.{key}: __init__ default {default!r}, declared {declared[key].default!r}")
    return problems


class Component(ABC):
    hyperparameters: ClassVar[dict[str, Hyper]] = {}
    ranges: ClassVar[dict] = {}
    options: ClassVar[dict] = {}
    moved: ClassVar[dict] = {}
    requires: ClassVar[dict] = {}
    capabilities: ClassVar[dict] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A class that declares `hyperparameters` gets its `ranges` and `options` from them (entries
        inherited for keys it does not declare stay) and its docstring the rendered table."""
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("hyperparameters")
        if not declared:
            return
        for name in ("ranges", "options"):
            twice = set(cls.__dict__.get(name, {})) & set(declared)
            if twice:
                raise TypeError(f"{cls.__name__}: {', '.join(sorted(twice))} in both `hyperparameters` and `{name}`")
        ranges = {key: (h.low, h.high) for key, h in declared.items() if h.low is not None or h.high is not None}
        options = {key: tuple(h.choices) for key, h in declared.items() if h.choices is not None}
        cls.ranges = {**ranges, **{key: r for key, r in cls.ranges.items() if key not in declared}}
        cls.options = {**{key: o for key, o in cls.options.items() if key not in declared}, **options}
        if cls.__doc__ is not None:
            table = "\n".join(("    " + line) if line else "" for line in hyper_table(cls).splitlines())
            cls.__doc__ = cls.__doc__.rstrip() + "\n\n" + table + "\n"

    @classmethod
    def check(cls, params: dict, group: str) -> list[str]:
        """Rules between this component's own hyperparameters (params include the defaults)."""
        return []

    @classmethod
    def missing_here(cls, params: dict, group: str) -> list[str]:
        """What this host lacks to run the component whatever its keys say (no device of its kind),
        each naming its key: asked only of a job about to run here, and said before the keys' problems."""
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
                problems.append(f"{where} not a hyperparameter of {cls.__name__}"
                                f"{did_you_mean(key, parameters, f'{group}.')} (allowed: {', '.join(parameters)})")
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


def check_requirements(classes: Mapping[str, type[Component]], names: Mapping[str, str]) -> list[str]:
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


def nearest(name: object, known: Iterable[object]) -> str | None:
    """The known name nearest `name` (a typo of it: difflib's close match), or None when none is near."""
    found = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(name: object, known: Iterable[object], prefix: str = "") -> str:
    """"; did you mean PREFIX<nearest>?" for a typo of a known name, else ""."""
    near = nearest(name, known)
    return f"; did you mean {prefix}{near}?" if near else ""


def check_range(key: str, value: object, low: float | None, high: float | None,
                inclusive_low: bool = True) -> list[str]:
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


def _expected_type(parameter: inspect.Parameter) -> type | None:
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


def check_type(key: str, value: object, expected: type | None) -> list[str]:
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


def import_class(path: str) -> Any:
    """The object a dotted `module.Name` path names, imported. Ask first whether the path may be
    imported at all (tuning.config.untrusted.is_registered_target): importing a module runs it."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)
