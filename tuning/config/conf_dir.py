"""Where the lab's own configs are: the checkout's top-level conf/ beside the `tuning` package that
is running (a second checkout on PYTHONPATH, e.g. a git worktree, reads its own, not the installed
one's), else `tuning.conf`, which a wheel carries as package data (setup.py maps it)."""
from __future__ import annotations

from pathlib import Path


def _conf_dir() -> Path:
    beside = Path(__file__).resolve().parents[2] / "conf"
    if (beside / "config.yaml").is_file():  # a checkout: its own conf/, even where another one is installed
        return beside
    from importlib.resources import files

    return Path(str(files("tuning.conf")))


CONF_DIR = _conf_dir()

