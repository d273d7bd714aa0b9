"""Command-line overrides checked as Hydra will compose them, before Hydra runs (`tunelab run`).

Hydra answers a typo with its own advice: `budget.trails=10` gets "use +budget.trails=10", which the
lab's schema then refuses, and `search=ppo2` a list of options and exit status 1. Here the same
composition is tried first (Hydra's compose API, the same search path) and what it refuses is said
the lab's way, one line per override, naming the key, with the closest known name:

    budget.trails: not a key of budget; did you mean budget.trials=10? (its keys: trials, ...)
    search: no option 'ppo2'; did you mean search=ppo? (options: a2c, csa, ...)

With -m, every value of a sweep over a group's options is checked; for keys, the composition takes
each choice or range sweep's first value (an interval or a glob is left to the sweeper).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from tuning.core.component import did_you_mean, nearest

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

Job = tuple[str, "Override"]  # an override's line as one job composes it, and the override

CONFIG_NAME = "config"
# Hydra's own flags after which the composition is not the job's (help, another config, a rerun)
NOT_A_JOB = ("help", "hydra_help", "info", "shell_completion", "experimental_rerun", "config_path", "config_dir")


def command_line_problems(argv: Sequence[str]) -> list[str]:
    """What Hydra would refuse in `argv` (a `tunelab run` command line), one message per override;
    [] when it composes, or when the command line is not a job's (`--help`, `--config-dir`)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tuning.config.conf_dir import CONF_DIR

    args = _hydra_args(argv)
    if args is None:
        return []
    parsed, problems = _parsed(args.overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        bad_options = {id(o): _option_problem(loader, o) for o in parsed}
        problems += [problem for problem in bad_options.values() if problem]
        lines = [(_one_job(o, args.multirun), o) for o in parsed if not bad_options[id(o)]]
        jobs = [(line, o) for line, o in lines if line is not None]
        problems += _composition_problems(args.config_name or CONFIG_NAME, jobs)
    return problems


def _hydra_args(argv: Sequence[str]):
    """Hydra's reading of the command line (its own parser), or None when it is not a job's."""
    import contextlib
    import io

    from hydra._internal.utils import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # a bad flag: Hydra says so itself
            args = get_args_parser().parse_args(list(argv))
    except SystemExit:
        return None
    return None if any(getattr(args, name, None) for name in NOT_A_JOB) else args


def _parsed(lines: Sequence[str]) -> tuple[list[Override], list[str]]:
    """(the overrides Hydra reads, a message for each it cannot read)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser, parsed, problems = OverridesParser.create(), [], []
    for line in lines:
        try:
            parsed.append(parser.parse_override(line))
        except HydraException as error:
            problems.append(f"{line}: not an override (key=value, +key=value or ~key): {_first_line(error)}")
    return parsed, problems


def _option_problem(loader, override: Override) -> str | None:
    """An override of a config group naming an option the group lacks (each value of a sweep)."""
    group = override.key_or_group
    options = loader.get_group_options(group) if not override.is_delete() else []
    if not options:
        return None  # not a group: a key, checked by composing
    for value in _values(override):
        if value is not None and value not in options:
            hint = did_you_mean(value, options, prefix=f"{group}=")
            return f"{group}: no option {value!r}{hint} (options: {', '.join(options)})"
    return None


def _values(override: Override) -> list:
    """The option names an override of a group asks for (every value of a choice sweep)."""
    if not override.is_sweep_override():
        return [override.value()]
    try:
        return list(override.sweep_string_iterator())
    except Exception:  # noqa: BLE001 - a glob or interval over options: the sweep expands it
        return []


def _one_job(override: Override, multirun: bool) -> str | None:
    """The override as one job of a sweep composes it: a choice or range sweep's first value (with -m
    only: without it a sweep is Hydra's error, said as it is); None for a sweep the sweeper reads its
    own way (interval, glob): left to it, never refused here."""
    if not (multirun and override.is_sweep_override()):
        return override.input_line
    try:
        first = next(iter(override.sweep_string_iterator()))
    except Exception:  # noqa: BLE001 - Hydra enumerates choice and range sweeps only
        return None
    return f"{override.get_key_element()}={first}"


def _composition_problems(config_name: str, jobs: list[Job]) -> list[str]:
    """Compose the (line, override) pairs as Hydra will; each override it refuses is taken out and the
    rest composed again, so every refused override is named at once, explained against the config the
    rest make."""
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    refused: list[tuple[Override | None, Exception]] = []
    remaining, cfg = list(jobs), None
    while True:
        try:
            cfg = compose(config_name, overrides=[line for line, _ in remaining], return_hydra_config=True)
            break
        except (HydraException, OmegaConfBaseException) as error:
            culprit = _culprit(error, remaining)
            refused.append((culprit[1] if culprit else None, error))
            if culprit is None:
                break
            remaining.remove(culprit)
    return [_explained(override, error, cfg) for override, error in refused]


def _culprit(error: Exception, jobs: list[Job]) -> Job | None:
    """The (line, override) pair `error` is about: the key its cause names, else the line or key its
    text quotes; None when it names none."""
    key = getattr(error.__cause__, "full_key", None)
    text = str(error)
    named = [job for job in jobs if key and job[1].key_or_group == key]
    quoted = [job for job in jobs if job[0] in text or f"'{job[1].key_or_group}'" in text]
    found = named or quoted
    return found[0] if found else None


def _explained(override: Override | None, error: Exception, cfg: DictConfig | None) -> str:
    """One line naming the key: an unknown key with the nearest one, a value of the wrong type."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause = error.__cause__
    if override is None:
        return " ".join(str(error).split())
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cfg is not None:
        return _unknown_key(override, cfg)
    if isinstance(cause, ValidationError):
        return f"{override.key_or_group}: {_first_line(getattr(cause, 'msg', None) or cause)}"
    return f"{override.input_line}: {' '.join(str(error).split())}"


def _unknown_key(override: Override, cfg: DictConfig) -> str:
    """`a.b.c` where `a.b` lacks `c` (or `a` lacks `b`): the first part that is missing, the keys
    beside it, and the override respelled with the nearest of them."""
    parts = override.key_or_group.split(".")
    node, depth = cfg, 0
    while depth < len(parts) and isinstance(node, DictConfig) and parts[depth] in node:
        node, depth = node[parts[depth]], depth + 1
    parent = ".".join(parts[:depth])
    if depth == len(parts):  # a later override adds it: Hydra applies them in order
        return f"{override.key_or_group}: not a key until the override that adds it with + (put that one first)"
    if not isinstance(node, DictConfig):
        return f"{override.key_or_group}: {parent} is a value, not a mapping with keys"
    keys = [str(k) for k in node.keys() if not str(k).startswith("_")]  # _target_: not the user's
    near = nearest(parts[depth], keys)
    hint = ""
    if near:
        wrong, right = ".".join(parts[:depth + 1]), ".".join([*parts[:depth], near])
        hint = f"; did you mean {override.input_line.replace(wrong, right, 1)}?"
    where = f"a key of {parent}" if parent else "a top-level key"
    return f"{override.key_or_group}: not {where}{hint} (its keys: {', '.join(keys)})"


def _first_line(error) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
