"""Files written where the user pointed: a path checked inside its folder (no link, nothing outside),
a file readable by its owner only, a file replaced atomically, an OS lock taken without waiting.
The run folder (tuning/engine/run_folder.py), the sqlite store and the hardware's exports use them."""
from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

from tuning.config.schema import ConfigError


def take_lock(path: Path):
    """(open handle, None) with an exclusive OS lock on the file at `path` (made if missing, never
    opened through a link), taken without waiting; (None, the holder's pid as it wrote it) when
    another process holds it."""
    handle = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644), "r+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = handle.read().strip() or "unknown"
        handle.close()
        return None, owner
    return handle, None


def write_holder(handle) -> None:
    """This process's pid in the lock file it holds, for the message of whoever is refused."""
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()


def inside(run_dir: Path, relative, key: str = "run") -> Path:
    """run_dir/relative, checked before it is written: refused (ConfigError naming the path) when
    any existing part of it below run_dir is a symlink, a folder on the way is not a folder, the
    file is not a plain file, or it resolves outside run_dir. Missing folders on the way are made;
    the file itself is not created."""
    run_dir = Path(run_dir)
    parts = Path(relative).parts
    if not parts or Path(relative).is_absolute() or ".." in parts:
        raise ConfigError(f"{key}: {relative!s} is not a path inside {run_dir}")
    path = run_dir
    for depth, part in enumerate(parts, start=1):
        path = path / part
        if path.is_symlink():
            raise ConfigError(f"{key}: {path} is a symlink (to {os.readlink(path)}); the lab does not write "
                              f"through links in a run folder: remove it, then run again")
        last = depth == len(parts)
        if path.exists() and not (path.is_file() if last else path.is_dir()):
            raise ConfigError(f"{key}: {path} is not a {'file' if last else 'folder'}; remove it, then run again")
        if not last and not path.exists():
            path.mkdir()
    if not path.resolve().is_relative_to(run_dir.resolve()):
        raise ConfigError(f"{key}: {path} resolves outside {run_dir}; the lab does not write there")
    return path


def write_private(path: Path, text: str) -> None:
    """A file that may name locations (a store's URL, a tracking server's), readable by its owner only."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(descriptor, 0o600)  # a file that was there before keeps its mode through O_CREAT
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)


def write_inside(run_dir: Path, relative, text: str, key: str = "run") -> Path:
    """`text` written to run_dir/relative (checked by `inside`) as a new file moved into place: a
    link that appears there after the check is replaced, never written through."""
    path = inside(run_dir, relative, key)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
