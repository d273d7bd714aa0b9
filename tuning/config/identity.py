"""What a run ran under, apart from its seed: its settings, the one rule behind comparing runs and resuming studies.

A method's identity is its overrides: the search, sampler, cost model and evaluator with their
hyperparameters, the budget, the hardware, the space and the measurement store (and a scheduler,
a `tuning.database` start). Runs of one method whose settings differ are different rows of a
comparison (`tunelab compare`, tuning/tools/compare/), and an Optuna study only takes trials run under
its own settings, the swept hyperparameters aside (hydra_plugins/tunelab_optuna_sweeper).

Not settings: the seed and every `*.seed` (a component's seed is `${seed}`), where the run wrote and
tracked (`output_dir`, `resume`, `reset_state`, `tracking.*`, `storage.*`), the end-to-end timing of a
whole model after tuning (`e2e.*`), Hydra's own keys, and `method` (a label derived from the groups).
A key only one of two runs holds (one added to the config since the older run) is no difference.

    run_settings(params, tags)      a tracked run's settings from its MLflow params and path tags, the
                                    workload aside (a comparison pairs each task on its own)
    config_settings(config, swept)  a composed config's settings, the swept keys aside (a study's)
    differing(a, b)                 the keys two settings disagree on
    method_rows(runs, ...)          a comparison's row names: the method's name, and where runs of one
                                    name did not run alike the settings that tell them apart, sa[budget.trials=32]
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from tuning.config.untrusted import without_secrets

NOT_SETTINGS = frozenset({"seed", "output_dir", "resume", "reset_state", "method"})  # top-level keys
NOT_SETTINGS_GROUPS = frozenset({"tracking", "storage", "e2e", "hydra"})
# settings a run's MLflow run keeps as tags (tunelab.<key>: tuning/tracking/base.py PATH_KEYS), not params
SETTING_PATHS = ("hardware.store", "tuning.database")
METHOD_GROUPS = ("search", "sampler", "cost_model", "evaluator")
# settings every compared method should share: a method's own hyperparameters and round size may differ
SHARED_SETTINGS = ("hardware.", "model.space", "budget.trials", "budget.trials_per_task", "budget.rounds_per_task",
                   "budget.time_limit_s", "budget.minutes", "budget.early_stop", "budget.min_trials_per_task",
                   "budget.init_random",
                   "tuning.database", "tuning.prior", "scheduler.")


def is_setting(key: str) -> bool:
    top, last = key.split(".", 1)[0], key.rsplit(".", 1)[-1]
    return top not in NOT_SETTINGS and top not in NOT_SETTINGS_GROUPS and last != "seed"


def is_workload(key: str) -> bool:
    """The model's shape and name (a comparison's tasks) and what a sweep reads of a run (`objective.*`);
    `model.space` is a setting of the method's run."""
    return (key.startswith("model.") and key != "model.space") or key.startswith("objective.")


def run_settings(params: Mapping[str, Any], tags: Mapping[str, Any]) -> dict[str, str]:
    """A tracked run's settings: its MLflow params and SETTING_PATHS tags (a run tags only the paths it set),
    less the workload."""
    found = {key: str(value) for key, value in params.items() if is_setting(key) and not is_workload(key)}
    found.update({key: str(tags.get(f"tunelab.{key}", "null")) for key in SETTING_PATHS})  # no tag: none set
    return found


def config_settings(config: Mapping[str, Any], swept: Iterable[str] = ()) -> dict[str, str]:
    """A composed config's settings (lists by element: `search.temp.0`), less the `swept` keys and what
    lies under them (a swept group choice `sampler` takes every `sampler.*`)."""
    swept = {key.lstrip("+~") for key in swept}
    return {key: value for key, value in _flat(config).items()
            if is_setting(key) and not any(key == s or key.startswith(f"{s}.") for s in swept)}


def _flat(node: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(node, Mapping):
        items: Iterable = node.items()
    elif isinstance(node, (list, tuple)):
        items = enumerate(node)
    else:
        return {prefix[:-1]: "null" if node is None else without_secrets(str(node))}  # a database URL's password
    flat: dict[str, str] = {}
    for key, value in items:
        flat.update(_flat(value, f"{prefix}{key}."))
    return flat or {prefix[:-1]: json.dumps(node)}


def differing(first: Mapping[str, str], second: Mapping[str, str]) -> list[str]:
    """The keys both hold with different values."""
    return sorted(key for key in first.keys() & second.keys() if first[key] != second[key])


def varying(settings: list[Mapping[str, str]], keys: Iterable[str] | None = None) -> dict[str, list[str]]:
    """Among several runs' settings: each key every run holds (of `keys`, when given) with more than one
    value -> its values, numbers in order of size."""
    common = set.intersection(*(set(s) for s in settings)) if settings else set()
    if keys is not None:
        common &= set(keys)
    values = {key: sorted({s[key] for s in settings}, key=_in_order) for key in sorted(common)}
    return {key: found for key, found in values.items() if len(found) > 1}


def _in_order(value: str) -> tuple:
    """Numbers by value, before any other text (32 before 256 before null)."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def method_value(params: Mapping[str, Any], tags: Mapping[str, Any], key: str) -> str:
    """What a run's method is by `key`: a group's option (its `choice.<group>` tag, else its class), any
    other key's param or tag."""
    if key in METHOD_GROUPS or key == "hardware":
        choice, target = tags.get(f"choice.{key}"), str(params.get(f"{key}._target_", "?"))
        return str(choice) if choice else target.rsplit(".", 1)[-1]
    return str(params.get(key, tags.get(key, "?")))


def method_rows(keys: list[Mapping[str, str]], settings: list[Mapping[str, str]], by_settings: bool = True,
                rename: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, dict[str, list[str]]]]:
    """Each run's row name, and per method name the settings its runs differ in ({} where they ran alike).

    `keys[i]`: run i's method keys (--method-by -> value); its name joins the values that differ between
    the runs with '+' (every value when none differ), renamed through `rename`. With `by_settings`, runs
    of one name that differ in a setting are rows of their own, named by those settings:
    sa[budget.trials=32,search.parallel_size=256]; without it they share the name's row."""
    varying_keys = [k for k in (keys[0] if keys else {}) if len({run[k] for run in keys}) > 1] or list(keys[0] if keys else {})
    names = [(rename or {}).get(label, label) for label in ("+".join(run[k] for k in varying_keys) for run in keys)]
    unlike = {}
    rows = list(names)
    for name in dict.fromkeys(names):
        members = [i for i, n in enumerate(names) if n == name]
        differ = varying([settings[i] for i in members])
        unlike[name] = differ
        if by_settings and differ:
            for i in members:
                rows[i] = f"{name}[{','.join(f'{k}={_compact(settings[i][k])}' for k in differ)}]"
    return rows, unlike


def _compact(value: str) -> str:
    return "".join(value.split())


def shared_differences(rows: list[str], settings: list[Mapping[str, str]]) -> dict[str, dict[str, list[str]]]:
    """The SHARED_SETTINGS the rows do not share: key -> value -> the rows that ran with it."""
    keys = [k for k in set.intersection(*(set(s) for s in settings)) if k.startswith(SHARED_SETTINGS)] if settings else []
    found: dict[str, dict[str, list[str]]] = {}
    for key, values in varying(settings, keys).items():
        found[key] = {value: sorted({row for row, s in zip(rows, settings) if s[key] == value}) for value in values}
    return found
