"""One rule for what the lab reads from files it did not write: run folders, GPU pack manifests,
MLflow artifacts, registry entries (docs/runs.md §Trust).

    override_problems(overrides, where, groups)   overrides a file carries: each a `key=value` of the
                                                  groups that kind of file may set; no hydra.*, no
                                                  _target_ or other _key_, no +/~/@, no ${...},
                                                  no server URL the user has not named
    is_registered_target(target)                  a `_target_` the lab registers: a YAML's under conf/
                                                  or a declared config directory, or a tunelab
                                                  component; decided before anything is imported
    unnamed_servers(node, named)                  (key, URL) of every database or tracking server a
                                                  file names that the user has not named too
    foreign_host(url, named)                      a URL (an artifact's) on a host the user has not named
    user_named_servers(*more)                     what the user names: $TUNELAB_SERVERS, the MLflow and
                                                  Optuna variables, and the command's own flags/config
    without_secrets(text)                         the passwords of URLs in a text left out

A server named by a file is never connected to with the user's credentials (PGPASSWORD, ~/.pgpass,
MLFLOW_TRACKING_TOKEN, ...): the file's URL is used only when the user names the same location,
compared without passwords. A file (sqlite://, a path) names no server.
"""
from __future__ import annotations

import importlib
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator
from urllib.parse import parse_qsl, urlsplit

from tuning.config.conf_dir import CONF_DIR

CONF_DIRS_VARIABLE = "TUNELAB_CONF_DIRS"  # the user's own config directories, each laid out like conf/
SERVERS_VARIABLE = "TUNELAB_SERVERS"  # database and tracking servers the user names, comma or space separated
NAMING_VARIABLES = ("MLFLOW_TRACKING_URI", "TUNELAB_MLFLOW_URI", "TUNELAB_OPTUNA_URI")
LOCAL_SCHEMES = ("sqlite", "file")
URL = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.-]*)://")
GROUP_OPTION = re.compile(r"[A-Za-z0-9_]+")  # a config group's option: a file name under conf/<group>/
KEY_PART = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # no leading `_`: no _target_, _partial_, _args_ ...


# ---- overrides from a file ------------------------------------------------------------------------
def override_problems(overrides: Iterable, where: str, groups: tuple[str, ...], named=()) -> list[str]:
    """Each override `where` carries that it may not set, named: only `group=option` and
    `group.key=value` of `groups` (nested keys too), where no key part starts with `_`; no
    hydra.*, no `+`/`~` (adding or removing keys), no `@` (repackaging), no server URL the user
    has not named (`named`)."""
    problems = []
    for index, override in enumerate(overrides):
        problem = _override_problem(override, groups, named)
        if problem:
            problems.append(f"{where}: overrides[{index}] {str(override)[:120]!r}: {problem}")
    return problems


def _override_problem(override, groups: tuple[str, ...], named) -> str | None:
    if not isinstance(override, str):
        return "not a key=value string"
    key, equals, value = override.partition("=")
    if key[:1] in ("+", "~") or "@" in key:
        return "adds, removes or moves a key (+, ~, @), which a file may not"
    if not equals:
        return "not a key=value override"
    parts = key.replace("/", ".").split(".")
    if parts[0] not in groups:
        return f"sets {parts[0]}; such a file may set only {', '.join(groups)}"
    if not all(KEY_PART.fullmatch(part) for part in parts):
        return "names a Hydra instantiation key (_target_ and the like) or a key that is not a plain name"
    if "${" in value:  # a resolver runs, or reads the environment into what the lab stores
        return "holds an interpolation, which a file may not"
    if len(parts) == 1 or "/" in key:
        return None if GROUP_OPTION.fullmatch(value) else f"{value!r} is not an option name of {key}"
    if is_server(value.strip("'\"")) and not _named(value.strip("'\""), named):
        return f"names the server {without_secrets(value)}, which you have not named (${SERVERS_VARIABLE})"
    return None


# ---- _target_s ------------------------------------------------------------------------------------
def is_registered_target(target) -> bool:
    """Whether `target` is a class the lab registers, found without importing anything else: a
    `_target_` of a YAML under conf/ or a declared config directory, or a class of the lab's own
    `tuning` package that is a tunelab component."""
    if not isinstance(target, str):
        return False
    if target in conf_targets((CONF_DIR, *declared_conf_dirs())):
        return True
    if not re.fullmatch(r"tuning(\.[A-Za-z_]\w*)+", target):
        return False  # nothing outside the lab's own package is even imported
    from tuning.core.component import Component

    module, _, name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    return isinstance(cls, type) and issubclass(cls, Component)


def unregistered(target, key: str) -> str:
    return (f"{key}: {target!r} is not a class tunelab registers (a _target_ of a YAML under conf/ or a declared "
            f"config directory, or a tunelab component); if it is your own method, declare its config directory "
            f"in {CONF_DIRS_VARIABLE}")


@lru_cache(maxsize=8)
def conf_targets(conf_dirs: tuple[Path, ...]) -> frozenset:
    """The `_target_`s of every YAML under these directories, nested groups (hardware/runner/) included."""
    found = set()
    for path in (p for conf_dir in conf_dirs for p in conf_dir.rglob("*.yaml")):
        found.update(re.findall(r"^\s*_target_:\s*([\w.]+)\s*$", path.read_text(errors="replace"), flags=re.M))
    return frozenset(found)


def declared_conf_dirs() -> list[Path]:
    """The config directories the command now running declares: TUNELAB_CONF_DIRS, then its own
    `hydra.searchpath` (file:// entries; a run.py job only)."""
    return env_conf_dirs() + _searchpath_dirs()


def env_conf_dirs() -> list[Path]:
    """TUNELAB_CONF_DIRS: os.pathsep-separated directories, each laid out like conf/ (search/,
    cost_model/, hardware/, ...); Hydra's search path gains them (hydra_plugins/tunelab_searchpath)."""
    return [Path(d).expanduser().resolve() for d in os.environ.get(CONF_DIRS_VARIABLE, "").split(os.pathsep) if d]


def _searchpath_dirs() -> list[Path]:
    """The `hydra.searchpath` of this process's own Hydra job (its command line or conf/config.yaml,
    never the resumed folder's saved .hydra/), as directories; pkg:// entries name no directory."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    entries = [str(e) for e in HydraConfig.get().searchpath or []]
    return [Path(e.removeprefix("file://")).expanduser().resolve() for e in entries
            if e.startswith("file://") or "://" not in e]


# ---- servers --------------------------------------------------------------------------------------
def is_server(value) -> bool:
    match = URL.match(value) if isinstance(value, str) else None
    return match is not None and match[1].split("+", 1)[0].lower() not in LOCAL_SCHEMES


def location(url: str) -> tuple:
    """What a server URL reaches, its password left out: scheme (postgres, postgresql+psycopg and
    postgresql are one), user, hosts, path, and the parameters other than the password."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower().split("+", 1)[0]
    scheme = "postgresql" if scheme == "postgres" else scheme
    userinfo, at, hosts = parts.netloc.rpartition("@")
    query = sorted((k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "password")
    return scheme, userinfo.partition(":")[0] if at else "", hosts.lower(), parts.path.rstrip("/"), tuple(query)


def _named(url: str, named) -> bool:
    wanted = location(url)
    return any(location(other) == wanted for other in named if is_server(other))


def foreign_host(url: str, named) -> bool:
    """Whether `url` is on a server none of `named` is on (the same host and port, any path)."""
    return is_server(url) and all(location(url)[2] != location(other)[2] for other in named if is_server(other))


def user_named_servers(*more) -> list[str]:
    """The servers the user names for this command: $TUNELAB_SERVERS, $MLFLOW_TRACKING_URI,
    $TUNELAB_MLFLOW_URI, $TUNELAB_OPTUNA_URI, and `more` (the command's flags; a config composed
    from the user's own command line, whose server URLs count too)."""
    named = re.split(r"[\s,]+", os.environ.get(SERVERS_VARIABLE, ""))
    named += [os.environ.get(variable, "") for variable in NAMING_VARIABLES]
    for item in more:
        named += list(_strings(item)) if not isinstance(item, str) else [item]
    return [url for url in named if is_server(url)]


def unnamed_servers(node, named, skip: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(dotted key, URL without secrets) of every server URL in `node` that `named` does not name;
    keys in `skip` (the command replaces them) are not looked at."""
    return [(key, without_secrets(value)) for key, value in _strings(node)
            if key not in skip and is_server(value) and not _named(value, named)]


def _strings(node, path: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, value) of every string in a (plain or OmegaConf) mapping; an interpolation that
    does not resolve is skipped."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, (DictConfig, ListConfig)):
        try:
            node = OmegaConf.to_container(node, resolve=True)
        except Exception:  # noqa: BLE001 - an unset variable: read it unresolved, key by key
            node = OmegaConf.to_container(node, resolve=False)
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        here = f"{path}.{key}" if path else str(key)
        if isinstance(value, str):
            yield here, value
        else:
            yield from _strings(value, here)


def refusal(where: str, found: list[tuple[str, str]], how: str) -> str:
    """The message of a file whose servers the user has not named."""
    listed = "; ".join(f"{key}={url}" for key, url in found)
    return (f"{where} names a server you have not named ({listed}); tunelab connects with your credentials only "
            f"to servers you name: {how}, or list it in ${SERVERS_VARIABLE}. Nothing was connected to.")


# ---- secrets --------------------------------------------------------------------------------------
USER_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^:/@\s'\"]*):[^@\s'\"]*@")  # scheme://user:password@
PASSWORD_PARAMETERS = ((re.compile(r"\?password=[^&\s'\"]*&", re.I), "?"),  # first of several parameters
                       (re.compile(r"&password=[^&\s'\"]*", re.I), ""),
                       (re.compile(r"\?password=[^&\s'\"]*", re.I), ""))  # the only one


def without_secrets(text: str) -> str:
    """`text` with every URL's password left out (user:password@ -> user@, password=... dropped)."""
    return without_password_parameters(USER_PASSWORD.sub(r"\1@", str(text)))


def without_password_parameters(text: str) -> str:
    for pattern, replacement in PASSWORD_PARAMETERS:
        text = pattern.sub(replacement, text)
    return text


def has_secrets(text: str) -> bool:
    return without_secrets(text) != str(text)


def scrub_file(path: Path) -> None:
    """A file that may name locations: its URLs' passwords left out, readable by its owner only."""
    if not path.is_file() or path.is_symlink():
        return
    text = path.read_text(errors="replace")
    if has_secrets(text):
        path.write_text(without_secrets(text))
    path.chmod(0o600)
