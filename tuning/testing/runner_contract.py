"""The contract suite of a runner (tuning/hardware/runners/base.py), for pytest; no TVM import here.

A runner passes it by subclassing `RunnerContract` in a test module and saying how to make one that
is not yet attached:

    from tuning.testing.runner_contract import RunnerContract

    class TestMyRunner(RunnerContract):
        def make_runner(self, tmp_path):
            return MyRunner(key="board")

The suite attaches the runner to `make_setup()` and measures `make_configs(task, count)` of
`make_task()`; the defaults are a 64x64x64 GEMM on this host's CPU and canonical configs of the
synthetic space (tuning/hardware/synthetic.py), which suit a runner over the synthetic landscape
(tests/fake_runner.py). A runner that builds real kernels gives its backend's setup and configs
(canonical, so that each result's effective config is the one asked for), and `unbuildable(task,
configs)` a config whose build fails where the default (a sketch index no space has) does not.

It checks that the runner is no abstract class, names its devices as strings, measures a batch into
one MeasureResult per config in order and hands each on in index order on the caller's thread, turns
a failed build into an error record rather than an exception, may be closed twice and measures again
after, has the methods of every capability it declares, and declares every capability whose methods
it has (a method of an undeclared capability is never called).
"""
from __future__ import annotations

import inspect
import threading
from typing import Any

import numpy as np
import pytest

from tuning.core.measure import MeasureSpec
from tuning.core.records import ERROR_KINDS, MeasureResult
from tuning.core.space import Config
from tuning.core.task import Task, gemm_task
from tuning.hardware.runners.base import CAPABILITIES, Runner, Setup, capabilities_of, runner_can
from tuning.hardware.synthetic import synthetic_space

SPEC = MeasureSpec(number=1, repeat=2, min_repeat_ms=0, cache_flush=False, timeout_s=10.0)
BATCH = 6  # configs measured at once


class RunnerContract:
    """Subclass it with `make_runner(tmp_path)`; pytest collects the tests below."""

    spec: MeasureSpec = SPEC

    def make_runner(self, tmp_path) -> Runner:
        raise NotImplementedError("a runner's contract test says how to make its runner")

    def make_setup(self) -> Setup:
        return Setup(target={"kind": "llvm"}, device="cpu")

    def make_task(self) -> Task:
        return gemm_task("gemm_64", 64, 64, 64)

    def make_configs(self, task: Task, count: int) -> list[Config]:
        """`count` distinct canonical configs, the same ones every call."""
        space, rng = synthetic_space(task.workload), np.random.default_rng(0)
        configs: dict[Config, None] = {}
        while len(configs) < count:
            configs[space.canonical(space.sample(rng))] = None
        return list(configs)

    def unbuildable(self, task: Task, configs: list[Config]) -> Config:
        """A config whose build fails: the first config with a sketch index no space has."""
        return (10**6, *configs[0][1:])

    # ---- helpers ------------------------------------------------------------------------------
    def _made(self, tmp_path) -> Runner:
        try:
            return self.make_runner(tmp_path)
        except TypeError as error:  # an abstract class: a core method or a declared capability's is missing
            pytest.fail(f"the runner cannot be made: {error}")

    @pytest.fixture
    def runner(self, tmp_path):
        runner = self._made(tmp_path)
        runner.attach(self.make_setup())
        yield runner
        runner.close()

    def _measured(self, runner: Runner, configs: list[Config]) -> tuple[list[MeasureResult], list[tuple]]:
        """The results, and (index, result, thread id) for each on_result call."""
        handed: list[tuple] = []
        results = runner.measure(self.make_task(), configs, self.spec,
                                 on_result=lambda i, r: handed.append((i, r, threading.get_ident())))
        return results, handed

    # ---- the core ------------------------------------------------------------------------------
    def test_it_is_a_runner_that_is_no_abstract_class_and_starts_nothing(self, tmp_path):
        runner = self._made(tmp_path)
        assert isinstance(runner, Runner), f"{type(runner).__name__} does not derive from Runner"
        assert not inspect.isabstract(type(runner)), sorted(getattr(type(runner), "__abstractmethods__", ()))
        assert runner.setup is None, "a runner is attached by the hardware, not by its constructor"
        runner.close()  # closing one that never started

    def test_it_names_its_devices_as_strings(self, runner):
        devices = runner.devices
        assert isinstance(devices, list) and devices, f"devices: {devices!r}"
        assert all(isinstance(d, str) and d for d in devices), devices
        assert len(set(devices)) == len(devices), f"a device named twice: {devices}"

    def test_a_batch_is_one_result_per_config_in_order_handed_on_in_order(self, runner):
        configs = self.make_configs(self.make_task(), BATCH)
        results, handed = self._measured(runner, configs)
        assert isinstance(results, list) and len(results) == len(configs), f"{len(results)} results for {len(configs)}"
        assert all(isinstance(r, MeasureResult) for r in results), [type(r).__name__ for r in results]
        assert [tuple(r.config or ()) for r in results] == configs, "results out of order (their .config)"
        assert [i for i, _, _ in handed] == list(range(len(configs))), f"on_result indices {[i for i, _, _ in handed]}"
        assert all(r is results[i] for i, r, _ in handed), "on_result was handed another result than returned"
        assert {t for _, _, t in handed} <= {threading.get_ident()}, "on_result called on another thread"
        assert all(r.ok or r.error in ERROR_KINDS for r in results), [r.error for r in results]
        assert all(r.device is None or r.device in runner.devices for r in results), [r.device for r in results]

    def test_a_failed_build_is_an_error_record_not_an_exception(self, runner):
        task = self.make_task()
        configs = self.make_configs(task, 2)
        bad = self.unbuildable(task, configs)
        batch = [configs[0], bad, configs[1]]
        results, handed = self._measured(runner, batch)
        assert len(results) == 3 and [i for i, _, _ in handed] == [0, 1, 2]
        assert not results[1].ok and results[1].error in ERROR_KINDS, results[1]
        assert tuple(results[1].config or ()) == bad, f"the failed build's record names {results[1].config}"
        assert [tuple(r.config or ()) for r in (results[0], results[2])] == configs

    def test_it_may_be_closed_twice_and_measures_again(self, runner):
        configs = self.make_configs(self.make_task(), 2)
        self._measured(runner, configs)
        runner.close()
        runner.close()
        results, handed = self._measured(runner, configs)  # the next call starts it again
        assert [tuple(r.config or ()) for r in results] == configs and len(handed) == 2

    # ---- capabilities --------------------------------------------------------------------------
    def test_every_declared_capability_has_its_methods(self, runner):
        for capability in capabilities_of(runner):
            for name in sorted(capability.__abstractmethods__):
                method = getattr(runner, name, None)
                assert callable(method) and not getattr(method, "__isabstractmethod__", False), (
                    f"{type(runner).__name__} declares {capability.__name__} but has no {name}")
                wanted = [p for p in inspect.signature(getattr(capability, name)).parameters if p != "self"]
                arguments: list[Any] = [None] * len(wanted)
                try:
                    inspect.signature(method).bind(*arguments)
                except TypeError as error:
                    pytest.fail(f"{type(runner).__name__}.{name} does not take {capability.__name__}'s arguments "
                                f"({', '.join(wanted)}): {error}")

    def test_it_declares_every_capability_whose_methods_it_has(self, runner):
        for capability in CAPABILITIES:
            names = sorted(capability.__abstractmethods__)
            if all(callable(getattr(runner, name, None)) for name in names):
                assert runner_can(runner, capability), (
                    f"{type(runner).__name__} has {', '.join(names)} but does not declare {capability.__name__} "
                    f"(class {type(runner).__name__}(Runner, {capability.__name__})): the hardware never calls them")
