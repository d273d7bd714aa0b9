"""Every cost model in conf/cost_model/ (and in the directories of TUNELAB_CONF_DIRS) passes the shipped
contract suite (tuning.testing.cost_model_contract): shapes, tiny fits, the same predictions from the same
seed, ranking where it can, a predictive distribution where it declares one, per-store rows. The suite can
fail: a model that predicts NaN after a fit on no rows fails it, run by pytest from another folder."""
from __future__ import annotations

import pytest

from configs import group_yamls, instantiate_option
from helpers import write_and_run
from tuning.testing.cost_model_contract import CostModelContract

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
    run = write_and_run(tmp_path, "test_broken_cost_model.py", BROKEN_SUITE)
    run.assert_failed_only_in("TestNoRows", "test_tiny_and_degenerate_fits")
    assert len(run.passed_in("TestFine")) >= 5, run.output
