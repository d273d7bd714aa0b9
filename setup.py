"""The package list lives here because conf/ (kept at the top level of the checkout, where Hydra users
look for it) is shipped as the package `tuning.conf`, which pyproject's `packages.find` cannot express;
everything else is in pyproject.toml."""
from pathlib import Path

from setuptools import find_namespace_packages, setup

CODE = find_namespace_packages(include=["tuning", "tuning.*", "tunelab", "tunelab.*", "hydra_plugins.*"],
                               exclude=["*.__pycache__"])
CONF = ["tuning.conf", *sorted("tuning.conf." + ".".join(d.relative_to("conf").parts)
                               for d in Path("conf").rglob("*") if d.is_dir() and d.name != "__pycache__")]

setup(packages=[*CODE, *CONF],
      package_dir={"tuning.conf": "conf"},
      package_data={**{package: ["*.yaml", "*.md"] for package in CONF}, "tuning": ["py.typed"],
                    "tuning.cost_model.priors": ["*.ubj", "*.json"],
                    "tunelab": ["py.typed"]})
