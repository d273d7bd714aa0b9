"""Where the lab's own configs are: `tuning.conf`, which setup.py maps to the checkout's top-level
conf/ (an editable install finds it there, a wheel carries it as package data)."""
from __future__ import annotations

from pathlib import Path


def _conf_dir() -> Path:
    try:
        from importlib.resources import files

        found = Path(str(files("tuning.conf")))
    except ModuleNotFoundError:  # a checkout on PYTHONPATH, never installed
        found = Path(__file__).resolve().parents[1] / "conf"
    return found


CONF_DIR = _conf_dir()
