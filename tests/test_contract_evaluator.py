"""Every evaluator in conf/evaluator/ (and in the directories of TUNELAB_CONF_DIRS) passes the shipped
contract suite (tuning.testing.evaluator_contract) on the synthetic hardware (with a noise model): one
result per config in order, each handed on, errors as results, remeasure, the same costs. The suite can
fail: an evaluator that hands its results on out of order fails it, run by pytest from another folder."""
from __future__ import annotations

import pytest

from configs import group_yamls, instantiate_option
from helpers import write_and_run
from tuning.testing.evaluator_contract import EvaluatorContract

EVALUATOR_YAMLS = group_yamls("evaluator")


@pytest.fixture(params=EVALUATOR_YAMLS, ids=lambda p: p.stem)
def evaluator_yaml(request):
    return request.param


class TestEvaluatorOption(EvaluatorContract):
    """The shipped suite, once per conf/evaluator YAML (the test ids name the option)."""

    @pytest.fixture(autouse=True)
    def _option(self, evaluator_yaml):
        self.path = evaluator_yaml

    def make_evaluator(self):
        return instantiate_option(self.path)


# ---- the suite can fail -------------------------------------------------------------------------------
BROKEN_SUITE = '''
from tuning.core.measure import MeasureSpec
from tuning.evaluator.base import Evaluator
from tuning.testing.evaluator_contract import EvaluatorContract


class Fine(Evaluator):
    spec = MeasureSpec(repeat=3, min_repeat_ms=0)

    def measure(self, hardware, task, configs, on_result=None):
        return hardware.measure(task, configs, self.spec, on_result=on_result)

    def remeasure(self, hardware, task, configs):
        return hardware.measure(task, configs, MeasureSpec(repeat=10, min_repeat_ms=0))


class Backwards(Fine):
    """Hands the results on once the batch is measured, last first."""

    def measure(self, hardware, task, configs, on_result=None):
        results = hardware.measure(task, configs, self.spec)
        for i in reversed(range(len(results))):
            if on_result is not None:
                on_result(i, results[i])
        return results


class TestFine(EvaluatorContract):
    def make_evaluator(self):
        return Fine()


class TestBackwards(EvaluatorContract):
    def make_evaluator(self):
        return Backwards()
'''


def test_the_suite_fails_an_evaluator_that_hands_results_on_out_of_order(tmp_path):
    """Run by pytest from another folder against the package: the evaluator that follows the contract
    passes every test, the one that hands its results on last first fails the tests that ask."""
    run = write_and_run(tmp_path, "test_broken_evaluator.py", BROKEN_SUITE)
    run.assert_failed_only_in("TestBackwards", "test_one_result_per_config_in_order_each_handed_out",
                              says="not handed on, each with its index, in order")
    assert len(run.passed_in("TestFine")) == 5, run.output
