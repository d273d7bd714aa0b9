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


def expose_checkout_plugins() -> None:
    """Let Hydra find the lab's plugins in a checkout installed in editable mode. Hydra lists the
    folders of the `hydra_plugins` namespace to find plugins, and setuptools' editable finder maps the
    lab's plugin modules without a folder it can list, so `tunelab run hparams_search=...` from outside
    the checkout found no lab sweeper; the checkout's own hydra_plugins/ joins the namespace."""
    folder = Path(__file__).resolve().parents[2] / "hydra_plugins"
    if not folder.is_dir():
        return
    import hydra_plugins

    if str(folder) not in list(hydra_plugins.__path__):
        hydra_plugins.__path__.append(str(folder))
