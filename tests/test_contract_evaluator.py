"""Every evaluator in conf/evaluator/ (and in the directories of TUNELAB_CONF_DIRS) passes the shipped
contract suite (tuning.testing.evaluator_contract) on the synthetic hardware (with a noise model): one
result per config in order, each handed on, errors as results, remeasure, the same costs. The suite can
fail: an evaluator that hands its results on out of order fails it, run by pytest from another folder."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from configs import group_yamls, instantiate_option
from tuning.testing.evaluator_contract import EvaluatorContract

REPO = Path(__file__).resolve().parents[1]
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
    (tmp_path / "test_broken_evaluator.py").write_text(textwrap.dedent(BROKEN_SUITE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "test_broken_evaluator.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    output = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 1, output
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    assert failed and all("TestBackwards" in line for line in failed), output
    assert any("test_one_result_per_config_in_order_each_handed_out" in line for line in failed), output
    assert "not handed on, each with its index, in order" in done.stdout, output
    fine = [line for line in done.stdout.splitlines() if line.startswith("PASSED") and "TestFine" in line]
    assert len(fine) == 4, output
