"""Fixtures shared by several test modules."""
from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig

# `make test` runs two workers on two cores: a second OpenMP thread in each (torch, XGBoost, BLAS) has no
# core of its own and spins, which cost the value-function tests up to 20x their CPU time. Set before any
# test imports torch; the runs' subprocesses inherit it. TVM's threads are set apart (TVM_NUM_THREADS).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# `make test` hands whole modules to its two workers in collection order (--dist loadfile
# --no-loadscope-reorder): the longest modules go first, so that neither worker is left with one of
# them while the other has finished. Ordered by the seconds each took in a full run on a 2-core host;
# the rest follow in their usual order.
LONGEST_MODULES_FIRST = ("test_value", "test_tvm_cpu", "test_sweep", "test_store", "test_cuda_pack", "test_smoke",
                         "test_plan_size", "test_config", "test_loop", "test_faults", "test_rpc", "test_cuda",
                         "test_sweep_faults")


def pytest_collection_modifyitems(items):
    rank = {name: place for place, name in enumerate(LONGEST_MODULES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: a module's own order is kept


@pytest.fixture
def experiment_script():
    """Load experiments/<name>.py as a module (the scripts are not a package)."""
    def load(name: str):
        path = Path(__file__).parents[1] / "experiments" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # a script's dataclasses look their module up there
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture
def compose_cfg(tmp_path, monkeypatch):
    """compose(overrides) -> the job config, with `${hydra:...}` resolvable as in a real run."""
    from configs import compose_job
    from tuning.config import register

    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "outputs"))  # tracking.uri: never the repo's
    register()

    def _compose(*overrides: str):
        return compose_job(tmp_path / "run", *overrides)

    yield _compose
    HydraConfig.instance().cfg = None


@pytest.fixture
def terminal_sigint():
    """SIGINT as a terminal gives it (Python's KeyboardInterrupt), even in a suite started in the
    background (`make test &`, nohup), whose processes inherit SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
