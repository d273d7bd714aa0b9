"""Let Hydra find the lab's plugins in a checkout installed in editable mode.

Hydra lists the folders of the `hydra_plugins` namespace to find plugins, and setuptools' editable
finder maps the lab's plugin modules without a folder it can list, so `tunelab run hparams_search=...`
typed outside the checkout found no lab sweeper. The checkout's own hydra_plugins/ joins the namespace
when the command line or the API is imported (the `tuning` package never imports the plugins: they sit
above it).
"""
from __future__ import annotations

from pathlib import Path


def expose_checkout_plugins() -> None:
    folder = Path(__file__).resolve().parents[1] / "hydra_plugins"
    if not folder.is_dir():  # an installed wheel: its plugins are folders Hydra lists
        return
    import hydra_plugins

    if str(folder) not in list(hydra_plugins.__path__):
        hydra_plugins.__path__.append(str(folder))
