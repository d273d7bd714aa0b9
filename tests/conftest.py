"""Fixtures shared by several test modules."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


@pytest.fixture
def experiment_script():
    """Load experiments/<name>.py as a module (the scripts are not a package)."""
    def load(name: str):
        path = Path(__file__).parents[1] / "experiments" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
