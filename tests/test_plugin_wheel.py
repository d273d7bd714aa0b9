"""A plug-in written outside the repository, built as a wheel and installed outside the checkout,
passes the contract suites the lab ships (tuning.testing) without an edit to any lab file: a toy
in-memory store backend (found by its entry point, `tunelab.store_backends`), a toy search and a
toy runner (a transport of one board). pytest runs in another folder, the plug-in importable only from where pip put it."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import PytestRun, run_pytest_elsewhere
from test_contract_store import TOY_BACKEND

PYPROJECT = '''
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "tunelab-toyplug"
version = "0.1.0"
description = "toy tunelab plug-ins"

[project.entry-points."tunelab.store_backends"]
memory = "toyplug.memory_store:MemoryStore"

[tool.setuptools]
packages = ["toyplug"]
'''

STORE_CHECK = '''
from tuning.store import connect_store
from tuning.testing.store_contract import StoreContract


class TestMemoryStore(StoreContract):
    def make_store(self, tmp_path, read_only=False):
        # no register_backend: the scheme comes from the installed wheel's entry point
        return connect_store(f"memory://{tmp_path.name}-{tmp_path.parent.name}", read_only=read_only)
'''


TOY_RUNNER = '''
"""A toy transport: one device that "times" a config with the synthetic landscape's cost."""
from tuning.core.records import MeasureResult
from tuning.hardware.runners.base import Runner
from tuning.hardware.synthetic import SyntheticHardware, synthetic_space


class OneBoard(Runner):
    def __init__(self, board: str = "toy"):
        self.board = board
        self.landscape = SyntheticHardware()

    @property
    def devices(self):
        return [f"{self.board}:0"]

    def build(self, task, configs, spec):
        space = synthetic_space(task.workload)
        return [(tuple(c), None if space.is_valid(tuple(c)) else "build") for c in configs]

    def run_one(self, task, config, built, spec, device):
        config, error = built
        if error:
            return MeasureResult.failed(error, "not a config of the space", config=config, device=device)
        result = self.landscape._measure_one(task, config, spec)
        result.device = device
        return result
'''

RUNNER_CHECK = '''
from toyplug.toy_runner import OneBoard
from tuning.testing.runner_contract import RunnerContract


class TestOneBoard(RunnerContract):
    def make_runner(self, tmp_path):
        return OneBoard()
'''


TOY_SEARCH = '''
"""A toy search: the cost model's best of twice as many random configs, declared hyperparameters."""
import numpy as np

from tuning.core.component import Hyper
from tuning.search.base import Search, fill_with_random, predict


class BestOfRandom(Search):
    hyperparameters = {
        "default_plan_size": Hyper(16, low=1, help="configs measured per round", cite="toy's"),
        "oversample": Hyper(2, low=1, high=64, help="random configs scored per config proposed", cite="toy's"),
    }

    def __init__(self, default_plan_size: int = 16, oversample: int = 2):
        self.default_plan_size, self.oversample = default_plan_size, oversample

    def propose(self, space, cost_model, n, visited, rng):
        drawn = fill_with_random([], space, visited, n * self.oversample, rng)
        if not drawn:
            return []
        order = np.argsort(-predict(space, cost_model, drawn), kind="stable")
        return [drawn[i] for i in order[:n]]
'''

SEARCH_CHECK = '''
from toyplug.toy_search import BestOfRandom
from tuning.testing.search_contract import SearchContract


class TestBestOfRandom(SearchContract):
    def make_search(self):
        return BestOfRandom()
'''


def plugin_sources(root: Path) -> dict[str, str]:
    """The plug-in's files: its package and the checks that run the shipped suites over it."""
    return {
        "src/pyproject.toml": PYPROJECT,
        "src/toyplug/__init__.py": '"""Toy tunelab plug-ins."""\n',
        "src/toyplug/memory_store.py": textwrap.dedent(TOY_BACKEND),
        "src/toyplug/toy_runner.py": TOY_RUNNER,
        "src/toyplug/toy_search.py": TOY_SEARCH,
        "checks/test_store.py": STORE_CHECK,
        "checks/test_search.py": SEARCH_CHECK,
        "checks/test_runner.py": RUNNER_CHECK,
    }


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The plug-in's wheel built and installed into a folder of its own; its checks beside it."""
    root = tmp_path_factory.mktemp("plugin")
    for relative, text in plugin_sources(root).items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(root / "src")],
                   check=True, capture_output=True, timeout=300)
    wheel = next((root / "dist").glob("tunelab_toyplug-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(root / "site"), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return root


def run_checks(root: Path, name: str) -> PytestRun:
    """The plug-in's checks of `name`, run with only the install folder on PYTHONPATH (not the checkout)."""
    return run_pytest_elsewhere(root / "checks", f"test_{name}.py", [root / "site"], timeout=600)


def test_the_wheel_is_installed_outside_the_checkout(installed):
    assert (installed / "site" / "toyplug" / "memory_store.py").is_file()
    assert not (installed / "site").resolve().is_relative_to(Path(__file__).resolve().parents[1])


def test_a_store_backend_from_a_wheel_passes_the_shipped_store_suite(installed):
    done = run_checks(installed, "store")
    assert done.returncode == 0 and " passed" in done.stdout, done.tail(3000)


def test_a_runner_from_a_wheel_passes_the_shipped_runner_suite(installed):
    done = run_checks(installed, "runner")
    assert done.returncode == 0 and " passed" in done.stdout, done.tail(3000)


def test_a_search_from_a_wheel_passes_the_shipped_search_suite(installed):
    done = run_checks(installed, "search")
    assert done.returncode == 0 and " passed" in done.stdout, done.tail(3000)
