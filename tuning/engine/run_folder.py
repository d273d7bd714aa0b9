"""A run folder: one run, one writer, and a saved config that is read back as untrusted input.

    claim(out_dir, resuming)      the folder's OS lock, held for the process's life: a second process
                                  on the same folder fails at once; a new run in a folder that already
                                  holds one is refused (continue it with resume=)
    save_identity(out_dir, ...)   the run's group choices and commit (run.yaml), written once at its
                                  start: resume names the run from them, never from Hydra's `.hydra/`,
                                  which a `resume=DIR hydra.run.dir=DIR` rewrites before the job starts
    load_config(path, key)        a saved config.yaml, checked before anything is instantiated from it
    mark_status(out_dir, status)  RUNNING / FINISHED / KILLED / FAILED, for `python -m tuning.tools.sync`
    terminated_by_signals()       SIGTERM and SIGHUP end the run like Ctrl-C: its records are kept,
                                  its MLflow run ends KILLED (kill -9 cannot be caught: resume or
                                  `python -m tuning.tools.sync` repair what it leaves)
    inside(run_dir, path)         a path about to be written: refused if any part of it below run_dir
                                  is a symlink or it leaves run_dir (write_inside also writes it)

A folder's config.yaml is also an MLflow artifact, so whoever shares a run delivers it: a `_target_`
naming any importable callable would run on `instantiate()` (Hydra's blocklist is not a security
boundary). Only the classes the lab registers may be named: a `_target_` of a YAML under conf/ or
under a config directory the command now running declares (`declared_conf_dirs`: TUNELAB_CONF_DIRS,
and its own `hydra.searchpath`), or a tunelab component class (tuning/core/component.py). Nothing read
from a run folder declares a directory, so a crafted folder registers nothing. Interpolations are
refused too (a saved config is written resolved).
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import signal
import stat
import sys
import threading
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig

from tuning.config import ConfigError
from tuning.config.files import inside, take_lock, write_holder, write_inside, write_private  # noqa: F401 - also its own names
from tuning.config.untrusted import (  # noqa: F401
    CONF_DIRS_VARIABLE,
    conf_targets,
    declared_conf_dirs,
    env_conf_dirs,
    is_registered_target,
    refusal,
    unnamed_servers,
    unregistered,
    user_named_servers,
)

LOCK_FILE = ".tunelab.lock"
IDENTITY_FILE = "run.yaml"
HARDWARE_FILE = "hardware.json"  # what measured the run (its describe() tags), for a copy logged elsewhere
STATUS_FILE = "status"
RUN_FILES = ("config.yaml", "records.jsonl")  # either one means the folder holds a run
_held: dict[Path, Any] = {}  # out_dir -> its open lock file, for the life of the process


def holds_run(out_dir: Path) -> bool:
    return any((out_dir / name).exists() for name in RUN_FILES)


def claim(out_dir: Path, resuming: bool, key: str = "output_dir") -> None:
    """Take the folder's lock (non-blocking) and check it may be written by this run."""
    with unwritable_refused(out_dir, resuming, key):
        out_dir.mkdir(parents=True, exist_ok=True)
        if out_dir in _held:
            return
        refuse_links(out_dir, key)  # a new run's folder too: it may hold a planted summary.txt link
        lock = inside(out_dir, LOCK_FILE, key)
        if lock.is_file() and lock.stat().st_nlink > 1:  # a copy made with `cp -l`: its own lock, not the original's
            lock.unlink()
        handle, owner = take_lock(lock)
    if owner is not None:
        raise ConfigError(f"{key}: {out_dir} is being written by another tunelab process (pid {owner}); "
                          "wait for it to end, or use another folder")
    if not resuming and holds_run(out_dir):
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
        raise ConfigError(f"{key}: {out_dir} already holds a run; continue it with resume={out_dir}, "
                          "or give this run another folder (hydra.run.dir=...)")
    write_holder(handle)
    _held[out_dir] = handle


UNWRITABLE = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
              errno.EPERM: "permission denied"}


@contextmanager
def unwritable_refused(out_dir: Path, resuming: bool, key: str):
    """A folder this process may not write (read-only media, another user's) refused as a ConfigError
    saying what to do: every command on a run folder writes to it, its lock first."""
    try:
        yield
    except OSError as error:
        if error.errno not in UNWRITABLE:
            raise
        instead = (f"copy it somewhere writable (cp -a {out_dir} NEWDIR) and use NEWDIR" if resuming
                   else "give this run another folder (hydra.run.dir=...)")
        raise ConfigError(f"{key}: {out_dir} cannot be written ({UNWRITABLE[error.errno]}); {instead}") from None


def release(out_dir: Path) -> None:
    handle = _held.pop(out_dir, None)
    if handle is not None:
        handle.close()  # closing the file drops the flock


def on_run_folder(path: Path, work, claim_folder: bool = True):
    """A command on a run folder (python -m tuning.tools.apply / export / sync): the folder checked, claimed
    while `work(run_dir)` runs; bad input is one "tunelab: ..." line and exit status 2."""
    from tuning.core.records import RecordError

    run_dir = path.expanduser().resolve()
    try:
        if not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"run: {run_dir} holds no config.yaml (not a tunelab run folder)")
        if claim_folder:
            claim(run_dir, resuming=True, key="run")  # checks the folder's links too
        else:
            refuse_links(run_dir)
        return work(run_dir)
    except (ConfigError, RecordError) as error:
        print(f"tunelab: {error}", file=sys.stderr)
        sys.exit(2)
    finally:
        if claim_folder:
            release(run_dir)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP: handled wherever Ctrl-C is (the sweeper retries the trial, the run ends KILLED)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def terminated_by_signals():
    def raise_terminated(signum, frame):
        raise Terminated(signum)

    with signals_handled_by(raise_terminated, (signal.SIGTERM, signal.SIGHUP)):
        yield


@contextmanager
def signals_handled_by(handler, signals: tuple):
    """`handler` for `signals` inside the block, the previous handlers after it. Only the main thread
    can set handlers; elsewhere the block runs with those it has."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, handler_before in previous.items():
            signal.signal(sig, handler_before)


# ---- what the run is --------------------------------------------------------------------------
def save_identity(out_dir: Path, choices: dict, commit: str | None = None) -> None:
    """The run's choices and the commit it started at: a copy of the run on another machine (a run
    folder carried over, `tuning.tools.sync`) still names the code that made it."""
    path = out_dir / IDENTITY_FILE
    if not path.exists():
        identity = {"choices": {k: v for k, v in choices.items() if not k.startswith("hydra/") and isinstance(v, str)}}
        path.write_text(yaml.safe_dump({**identity, **({"commit": commit} if commit else {})}))


def save_hardware(out_dir: Path, description: dict) -> dict:
    """The hardware's tags saved beside the run (and returned, for its MLflow run)."""
    (out_dir / HARDWARE_FILE).write_text(json.dumps({str(k): str(v) for k, v in description.items()}))
    return description


def saved_hardware(out_dir: Path) -> dict:
    """The hardware's tags as saved by the run; {} for a folder without them or with a file that is not
    a mapping of strings (untrusted)."""
    try:
        data = json.loads((out_dir / HARDWARE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(data, dict) else {}


def saved_choices(out_dir: Path) -> dict:
    """The run's group choices as saved at its start ({} for a folder from before run.yaml)."""
    path = out_dir / IDENTITY_FILE
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        data = None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, dict):
        raise ConfigError(f"resume: {path} is not a tunelab run identity (expected a `choices` mapping)")
    return {str(k): v for k, v in choices.items() if isinstance(v, str)}


def saved_commit(out_dir: Path) -> str | None:
    """The commit the run started at, as saved in run.yaml; None for a folder from before it was
    saved, or for a value that is not a git commit's hex name (the file is untrusted)."""
    try:
        data = yaml.safe_load((out_dir / IDENTITY_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return None
    commit = data.get("commit") if isinstance(data, dict) else None
    return commit if isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{7,40}", commit) else None


def mark_status(out_dir: Path, status: str) -> None:
    path = out_dir / STATUS_FILE
    try:
        write_inside(out_dir, STATUS_FILE, status + "\n")
    except ConfigError:
        pass  # a link: the error that stopped the run matters more than its status file
    except OSError:
        # A full disk has no room for the new file write_inside makes, but rewriting a few bytes in
        # the block the old status already holds needs none. Failing that the old status goes: a
        # stopped run is never left RUNNING (sync takes a folder without one as a run that ended).
        try:
            _overwrite(path, (status + "\n").encode())
        except OSError:
            with suppress(OSError):
                path.unlink(missing_ok=True)


def _overwrite(path: Path, data: bytes) -> None:
    """`data` over the start of the plain file at `path`, cut to its length: never a new file, never
    through a link or into a hard-linked file; a FIFO planted there fails (O_NONBLOCK) instead of hanging."""
    descriptor = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise OSError(errno.EPERM, f"{path} is not a plain file of its own")
        os.pwrite(descriptor, data, 0)
        os.ftruncate(descriptor, len(data))
    finally:
        os.close(descriptor)


def read_status(out_dir: Path) -> str | None:
    path = out_dir / STATUS_FILE
    status = path.read_text().strip() if path.exists() else None
    return status if status in ("RUNNING", "FINISHED", "KILLED", "FAILED") else None


# ---- a saved config, untrusted ----------------------------------------------------------------
def load_config(path: Path, key: str, named=(), replaced: tuple[str, ...] = (), how: str = "") -> DictConfig:
    """config.yaml of a run folder, refused (ConfigError naming `key`) unless every `_target_` is
    a class the lab registers, nothing in it is an interpolation, and every server it names
    (a database or tracking URL) the user names too: `named` (the command's flags and own config)
    or the variables tuning/config/untrusted.py lists. Keys in `replaced` the command sets itself; `how`
    says how the user names a server for this command."""
    try:
        data = _safe_yaml(path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as error:
        reason = str(error) if isinstance(error, UnsafeYaml) else type(error).__name__
        raise ConfigError(f"{key}: cannot read {path} as a tunelab config ({reason})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{key}: {path} is not a tunelab config (expected a mapping)")
    problems = list(_untrusted(data, ""))
    if problems:
        raise ConfigError(f"{key}: {path} is refused, nothing was run:\n  " + "\n  ".join(problems))
    servers = unnamed_servers(data, user_named_servers(*named), skip=replaced)
    if servers:
        raise ConfigError(refusal(f"{key}: {path}", servers, how or "name the same location yourself"))
    return _with_defaults(data, path, key)


def _with_defaults(data: dict, path: Path, key: str) -> DictConfig:
    """The saved config on the top-level schema: a key added to the schema after the run was saved
    takes its default, and a value of the wrong type is refused naming its key."""
    from tuning.config import on_schema

    try:
        return on_schema(data)
    except ConfigError as error:
        raise ConfigError(f"{key}: {path} is not a tunelab config ({error})") from None
    except RecursionError:
        raise ConfigError(f"{key}: {path} is not a tunelab config (nested too deeply)") from None


MAX_CONFIG_BYTES = 1 << 20  # a saved config is a few KiB and a few levels deep: more is not the lab's
MAX_CONFIG_DEPTH = 32
MAX_CONFIG_VALUES = 10_000  # a saved config holds about 200; OmegaConf takes seconds over tens of thousands


class UnsafeYaml(yaml.YAMLError):
    pass


def _safe_yaml(path: Path):
    """YAML without aliases, no deeper than MAX_CONFIG_DEPTH and of at most MAX_CONFIG_VALUES values:
    the lab writes none of these, an alias bomb expands a few hundred bytes into millions of nodes, a
    nesting bomb takes PyYAML's recursive loader seconds to fail, and a very wide node OmegaConf
    seconds to take, before any check could look at them."""
    with path.open("rb") as f:
        text = f.read(MAX_CONFIG_BYTES + 1).decode("utf-8")
    if len(text) > MAX_CONFIG_BYTES:
        raise UnsafeYaml(f"larger than {MAX_CONFIG_BYTES} bytes")
    depth = values = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise UnsafeYaml("YAML aliases are not accepted in a saved config")
        values += isinstance(event, yaml.ScalarEvent)
        if values > MAX_CONFIG_VALUES:
            raise UnsafeYaml(f"more than {MAX_CONFIG_VALUES} values")
        depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
        if depth > MAX_CONFIG_DEPTH:
            raise UnsafeYaml(f"nested more than {MAX_CONFIG_DEPTH} levels deep")
    try:
        return yaml.safe_load(text)
    except (AttributeError, ValueError, TypeError, OverflowError) as error:  # a tag's constructor on a bad value
        raise UnsafeYaml(f"a value its tag cannot construct ({type(error).__name__}: {error})") from None


def _untrusted(node, where: str):
    if isinstance(node, dict):
        for name, value in node.items():
            here = f"{where}.{name}" if where else str(name)
            if name == "_target_" and not is_registered_target(value):
                yield unregistered(value, here)
            elif str(name).startswith("_") and name != "_target_":
                yield f"{here}: Hydra instantiation keys other than _target_ are not accepted in a saved config"
            else:
                yield from _untrusted(value, here)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _untrusted(value, f"{where}[{index}]")
    elif isinstance(node, str) and "${" in node:
        yield f"{where}: interpolations are not accepted in a saved config (got {node!r})"


# ---- writing into a run folder, untrusted ------------------------------------------------------
# A shared run folder may hold links (best_schedules/gemm.py -> ~/.bashrc, summary.txt -> a secret
# that tuning.tools.sync would upload): a folder is checked whole before a command works on it
# (`refuse_links`), and whatever the lab writes into one goes through `inside`.
APPENDED_FILES = ("records.jsonl", "mlflow_pending.jsonl")  # written in place: a hard link would be written through


def refuse_links(run_dir: Path, key: str = "run") -> None:
    """Refused (ConfigError naming the path) when anything in the folder is a symlink or not a plain
    file or folder (a FIFO would hang a reader), or a file the lab appends to is a hard link."""
    for folder, folders, files in os.walk(run_dir):
        for name in folders + files:
            path = Path(folder) / name
            if path.is_symlink():
                raise ConfigError(f"{key}: {path} is a symlink (to {os.readlink(path)}); a run folder holds no "
                                  "links (the lab would read or write through it): remove it, then run again")
            if not (path.is_dir() or path.is_file()):
                raise ConfigError(f"{key}: {path} is neither a file nor a folder; remove it, then run again")
            if name in APPENDED_FILES and Path(folder) == run_dir and path.stat().st_nlink > 1:
                raise ConfigError(f"{key}: {path} is a hard link (its bytes are shared with another file, which "
                                  "appending would change too): copy the folder with `cp -a`, not `cp -l`")


