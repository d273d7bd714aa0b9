"""Hydra sweep overrides -> Optuna distributions; a trial's params -> overrides again."""
from __future__ import annotations

import math

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution


class SearchSpaceError(ValueError):
    pass


def parse(arguments: list[str]) -> tuple[dict[str, BaseDistribution], dict[str, str]]:
    """(search space, fixed overrides) from `key=value` strings; a later key replaces an earlier one."""
    space: dict[str, BaseDistribution] = {}
    fixed: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(arguments):
        key = override.get_key_element()
        space.pop(key, None)
        fixed.pop(key, None)
        if override.is_sweep_override():
            space[key] = _distribution(key, override)
        else:
            fixed[key] = override.get_value_element_as_str()
    return space, fixed


def _distribution(key: str, override: Override) -> BaseDistribution:
    sweep = override.value()
    if isinstance(sweep, IntervalSweep):
        log = "log" in sweep.tags
        if isinstance(sweep.start, int) and isinstance(sweep.end, int):
            return IntDistribution(sweep.start, sweep.end, log=log)
        return FloatDistribution(float(sweep.start), float(sweep.end), log=log)
    if isinstance(sweep, RangeSweep) and not sweep.shuffle:
        count = math.ceil((sweep.stop - sweep.start) / sweep.step)
        if count < 1:
            raise SearchSpaceError(f"{key}: {sweep} is empty")
        high = sweep.start + sweep.step * (count - 1)  # range() excludes stop; Optuna's high is inclusive
        if all(isinstance(v, int) for v in (sweep.start, sweep.stop, sweep.step)):
            return IntDistribution(sweep.start, high, step=sweep.step)
        return FloatDistribution(float(sweep.start), float(high), step=float(sweep.step))
    if isinstance(sweep, (ChoiceSweep, RangeSweep)):
        choices = list(override.sweep_iterator())
        odd = [c for c in choices if not isinstance(c, (str, int, float, bool))]
        if odd:
            raise SearchSpaceError(f"{key}: choice values must be str, int, float or bool, got {odd[0]!r}")
        return CategoricalDistribution(choices)
    raise SearchSpaceError(f"{key}: {override.input_line} is not a sweep Optuna can sample")


def grid(space: dict[str, BaseDistribution]) -> dict[str, list]:
    """The grid sampler's values: choice() as they are, range() stepped out."""
    values = {}
    for key, distribution in space.items():
        if isinstance(distribution, CategoricalDistribution):
            values[key] = list(distribution.choices)
        elif isinstance(distribution, IntDistribution) and not distribution.log:
            values[key] = list(range(distribution.low, distribution.high + 1, distribution.step))
        elif isinstance(distribution, FloatDistribution) and distribution.step is not None:
            count = round((distribution.high - distribution.low) / distribution.step) + 1
            values[key] = [distribution.low + i * distribution.step for i in range(count)]
        else:
            raise SearchSpaceError(f"hydra.sweeper.params.{key}: the grid sampler needs choice() or range(), "
                                   "not an interval")
    return values


def override(key: str, value) -> str:
    """`key=value` that Hydra parses back to `value` (strings quoted where they would not)."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (int, float)):
        text = repr(value)
    else:
        text = str(value)
        if _parses_to(f"{key}={text}") != value:
            text = "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return f"{key}={text}"


def _parses_to(line: str):
    try:
        return OverridesParser.create().parse_override(line).value()
    except Exception:  # noqa: BLE001 - anything unparsable gets quoted
        return object()
