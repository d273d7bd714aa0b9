"""Every cost model in conf/cost_model/ (and in the directories of TUNELAB_CONF_DIRS) passes the shipped
contract suite (tuning.testing.cost_model_contract): shapes, tiny fits, the same predictions from the same
seed, ranking where it can, a predictive distribution where it declares one, per-store rows. The suite can
fail: a model that predicts NaN after a fit on no rows fails it, run by pytest from another folder."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from configs import group_yamls, instantiate_option
from tuning.testing.cost_model_contract import CostModelContract

REPO = Path(__file__).resolve().parents[1]
COST_MODEL_YAMLS = group_yamls("cost_model")


@pytest.fixture(params=COST_MODEL_YAMLS, ids=lambda p: p.stem)
def cost_model_yaml(request):
    return request.param


class TestCostModelOption(CostModelContract):
    """The shipped suite, once per conf/cost_model YAML (the test ids name the option)."""

    @pytest.fixture(autouse=True)
    def _option(self, cost_model_yaml):
        self.path = cost_model_yaml

    def make_cost_model(self):
        return instantiate_option(self.path)


# ---- the suite can fail -------------------------------------------------------------------------------
BROKEN_SUITE = '''
import warnings

import numpy as np

from tuning.cost_model.base import CostModel
from tuning.testing.cost_model_contract import CostModelContract


class Fine(CostModel):
    """The mean throughput it was fit on, for every config (0 before a fit with a row)."""
    can_rank = False

    def __init__(self):
        self.mean = 0.0

    def fit(self, X, y):
        self.mean = float(np.mean(y)) if len(y) else 0.0
        return self

    def predict(self, X):
        return np.full(len(X), self.mean)


class NoRows(Fine):
    """The mean of no rows is NaN."""

    def fit(self, X, y):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.mean = float(np.mean(y))
        return self


class TestFine(CostModelContract):
    def make_cost_model(self):
        return Fine()


class TestNoRows(CostModelContract):
    def make_cost_model(self):
        return NoRows()
'''


def test_the_suite_fails_a_model_that_predicts_nan_after_an_empty_fit(tmp_path):
    """Run by pytest from another folder against the package: the model that follows the contract passes
    every test it does not skip, the one that predicts NaN after a fit on no rows fails the test that asks."""
    (tmp_path / "test_broken_cost_model.py").write_text(textwrap.dedent(BROKEN_SUITE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "test_broken_cost_model.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    output = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 1, output
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    assert failed and all("TestNoRows" in line for line in failed), output
    assert any("test_tiny_and_degenerate_fits" in line for line in failed), output
    fine = [line for line in done.stdout.splitlines() if line.startswith("PASSED") and "TestFine" in line]
    assert len(fine) >= 5, output
