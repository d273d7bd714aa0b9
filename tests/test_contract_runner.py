"""The runner contract (tuning/hardware/runners/base.py): an abstract core, capabilities a runner
declares, and the suite shipped in tuning.testing.runner_contract, run here over the fake remote
runner (tests/fake_runner.py) and shown to fail a runner that breaks the contract."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fake_runner import BuildsWhileTiming, RemoteSynthetic, TwoDevices
from helpers import write_and_run
from tuning.core.task import gemm_task
from tuning.hardware.runners.base import (
    CAPABILITIES,
    Exports,
    Runner,
    RunsWholeModels,
    TimesInModel,
    capabilities_of,
    require,
    runner_can,
)
from tuning.hardware.runners.local import LocalRunner
from tuning.hardware.runners.rpc import RPCRunner
from tuning.testing.runner_contract import SPEC, RunnerContract

TESTS = Path(__file__).resolve().parent
TASK = gemm_task("gemm_64", 64, 64, 64)


class TestTwoDevices(RunnerContract):
    def make_runner(self, tmp_path):
        return TwoDevices(pause_s=0.002)


class TestBuildsWhileTiming(RunnerContract):
    def make_runner(self, tmp_path):
        return BuildsWhileTiming(pause_s=0.002, build_pause_s=0.001)


def test_a_runner_that_overlaps_times_the_first_candidates_while_the_rest_build():
    runner = BuildsWhileTiming(pause_s=0.01, build_pause_s=0.01)
    contract = TestBuildsWhileTiming()
    runner.attach(contract.make_setup())
    configs = contract.make_configs(TASK, 8)
    results = runner.measure(TASK, configs, SPEC)
    assert [r.config for r in results] == [tuple(c) for c in configs]
    assert all(r.ok or r.error == "invalid" for r in results) and any(r.ok for r in results)
    assert min(start for _, start, _ in runner.busy) < max(runner.handed)  # timing began before the last build


def test_the_rpc_runner_overlaps_only_where_its_devices_say_they_are_elsewhere():
    import platform

    runner = RPCRunner()
    assert runner.overlaps_builds() is False  # nothing known of the devices yet (TVM's stock server says nothing)
    runner._identity = {"hostname": platform.node()}
    assert runner.overlaps_builds() is False  # a server on this host is timed beside no build
    runner._identity = {"hostname": "board-7"}
    assert runner.overlaps_builds() is True
    assert RPCRunner(overlap_builds=False).overlaps_builds() is False
    assert RPCRunner(overlap_builds=True).overlaps_builds() is True


def test_a_building_that_fails_is_raised_not_waited_for():
    runner = BuildsWhileTiming(fail_at=3)
    contract = TestBuildsWhileTiming()
    runner.attach(contract.make_setup())
    with pytest.raises(RuntimeError, match=r"building the batch failed before its candidate 3: OSError"):
        runner.measure(TASK, contract.make_configs(TASK, 6), SPEC)


class WholeModels(TwoDevices, RunsWholeModels):
    """The fake runner with a capability: it "runs" a whole model."""

    def evaluate_model(self, model_cfg, seed, database_dir, out_dir, timing):
        return {"latency_ms": 1.0, "match": True}


class TestTwoDevicesRunningWholeModels(RunnerContract):
    def make_runner(self, tmp_path):
        return WholeModels(pause_s=0.002)


# ---- the abstract core and the capabilities -----------------------------------------------------
def test_the_core_is_devices_build_and_run_one():
    assert Runner.__abstractmethods__ == {"devices", "build", "run_one"}
    with pytest.raises(TypeError, match="abstract"):
        Runner()  # type: ignore[abstract]

    class NoRunOne(Runner):
        devices = ["x:0"]

        def build(self, task, configs, spec):
            return []

    with pytest.raises(TypeError, match="run_one"):
        NoRunOne()  # type: ignore[abstract]


def test_a_runner_declaring_a_capability_without_its_method_cannot_be_made():
    class Half(TwoDevices, Exports):
        def check_export(self, task, script_text):
            return {}

    with pytest.raises(TypeError, match="export_library"):
        Half()  # type: ignore[abstract]


def test_the_lab_runners_declare_what_they_implement():
    assert capabilities_of(LocalRunner) == [Exports, RunsWholeModels, TimesInModel]
    assert capabilities_of(RPCRunner) == [RunsWholeModels]
    assert capabilities_of(TwoDevices) == [] and capabilities_of(WholeModels()) == [RunsWholeModels]
    assert runner_can(LocalRunner(), TimesInModel) and not runner_can(RPCRunner, Exports)
    assert set(CAPABILITIES) == {Exports, RunsWholeModels, TimesInModel}


def test_a_missing_capability_is_the_same_error_as_before_naming_the_runner(tmp_path):
    hardware = RemoteSynthetic(TwoDevices())
    with pytest.raises(NotImplementedError, match="^TwoDevices cannot check an exported schedule$"):
        hardware.check_export(TASK, tmp_path / "none.py")
    with pytest.raises(NotImplementedError, match="^TwoDevices cannot build a library$"):
        hardware.export_library(TASK, (0,), tmp_path / "export")  # refused before anything is scheduled
    with pytest.raises(NotImplementedError, match="^TwoDevices cannot run whole models$"):
        hardware.evaluate_model({}, 0, tmp_path, tmp_path, {})
    with pytest.raises(NotImplementedError, match="^TwoDevices cannot time kernels inside a model$"):
        hardware.time_in_model({}, 0, tmp_path, {}, {})
    assert hardware.runner.setup is None  # nothing was attached for a call it cannot answer
    assert RemoteSynthetic(WholeModels()).evaluate_model({}, 0, tmp_path, tmp_path, {})["match"] is True
    with pytest.raises(NotImplementedError, match="^RPCRunner cannot build a library$"):
        require(RPCRunner(), Exports, "cannot build a library")


# ---- the suite can fail -------------------------------------------------------------------------
BROKEN = '''
from fake_runner import TwoDevices
from tuning.testing.runner_contract import RunnerContract


class Reversed(TwoDevices):
    """Hands results on and returns them last first."""

    def run_batch(self, task, configs, built, spec, on_result=None):
        results = super().run_batch(task, configs, built, spec)[::-1]
        for i, result in enumerate(results):
            if on_result:
                on_result(i, result)
        return results


class TestReversed(RunnerContract):
    def make_runner(self, tmp_path):
        return Reversed(pause_s=0.001)
'''


def test_the_suite_fails_a_runner_that_breaks_the_order(tmp_path):
    run = write_and_run(tmp_path, "test_reversed.py", BROKEN, pythonpath=[tmp_path, TESTS])
    failed = {line.split("::")[-1].split(" ")[0] for line in run.failed}
    assert run.returncode == 1, run.tail(3000)
    assert failed == {"test_a_batch_is_one_result_per_config_in_order_handed_on_in_order",
                      "test_a_failed_build_is_an_error_record_not_an_exception",
                      "test_it_may_be_closed_twice_and_measures_again"}, run.stdout[-3000:]


def test_the_suite_fails_a_runner_that_hides_a_capability():
    class Undeclared(TwoDevices):
        def evaluate_model(self, model_cfg, seed, database_dir, out_dir, timing):
            return {}

    class Check(RunnerContract):
        def make_runner(self, tmp_path):
            return Undeclared()

    with pytest.raises(AssertionError, match="does not declare RunsWholeModels"):
        Check().test_it_declares_every_capability_whose_methods_it_has(Undeclared())


def test_the_suite_imports_no_tvm():
    done = subprocess.run([sys.executable, "-c", "import sys, tuning.testing.runner_contract; "
                           "print(sorted(m for m in sys.modules if m == 'tvm' or m.startswith('tvm.')))"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
