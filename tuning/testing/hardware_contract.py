"""The contract suite of a hardware, a device the lab measures on (tuning/hardware/base.py), for pytest;
no TVM import here.

A hardware passes it by subclassing `HardwareContract` in a test module and saying how to make one (not
yet entered: the suite enters and closes it):

    from tuning.testing.hardware_contract import HardwareContract

    class TestMyHardware(HardwareContract):
        def make_hardware(self):
            return MyHardware(noise=0.1)

The suite measures `make_task()` (a 64x64x64 GEMM, the smallest model, conf/model/gemm_64.yaml) with
`spec` (one run per cost, two costs, no minimum time), on a couple of canonical random configs of the
hardware's own space; both may be overridden. The synthetic hardware (tuning/hardware/synthetic.py)
passes it without TVM; a TVM backend's space and measurements are its own (a runner's part of the seam
is tuning.testing.runner_contract's).

What it checks: the hardware is a Hardware whose `schedules_programs` is a bool, whose `store_key` of
the task is a non-empty string, whose `unnamed()` is None or a reason, which describes itself (where it
can name itself) in a dict whose fingerprint is a JSON-serialisable dict, and which may be closed twice;
entered as a context manager, it gives the task a space to draw configs from, and `measure` gives one
MeasureResult per config, in order, each of its own config, handed on to `on_result` with its index in
order, each one a measurement or an error of a known kind (ERROR_KINDS), never an exception.
"""
from __future__ import annotations

import json

import numpy as np

from tuning.core.measure import MeasureSpec
from tuning.core.records import ERROR_KINDS, MeasureResult
from tuning.core.space import Config, Space
from tuning.core.task import Task, gemm_task
from tuning.hardware.base import Hardware

SPEC = MeasureSpec(number=1, repeat=2, min_repeat_ms=0, cache_flush=False, timeout_s=10.0)


def random_configs(space: Space, count: int, seed: int = 0) -> list[Config]:
    """Up to `count` distinct canonical configs drawn from the space."""
    rng = np.random.default_rng(seed)
    return list(dict.fromkeys(space.canonical(space.sample(rng)) for _ in range(count)))


class HardwareContract:
    """Subclass it with `make_hardware()`; pytest collects the tests below."""

    spec: MeasureSpec = SPEC
    batch = 2  # configs drawn for the measured batch (distinct ones kept)

    def make_hardware(self) -> Hardware:
        raise NotImplementedError("a hardware's contract test says how to make one")

    def make_task(self) -> Task:
        return gemm_task("gemm_64", 64, 64, 64)

    # ---- the contract ---------------------------------------------------------------------------
    def test_it_is_a_hardware_that_describes_itself_and_closes_twice(self):
        hardware, task = self.make_hardware(), self.make_task()
        try:
            assert isinstance(hardware, Hardware)
            assert isinstance(hardware.schedules_programs, bool)
            key = hardware.store_key(task)
            assert isinstance(key, str) and key, f"store_key gave {key!r}"
            unnamed = hardware.unnamed()
            assert unnamed is None or (isinstance(unnamed, str) and unnamed), f"unnamed() gave {unnamed!r}"
            if unnamed is None:
                assert isinstance(hardware.describe(), dict)
                fingerprint = hardware.fingerprint()
                assert isinstance(fingerprint, dict)
                json.dumps(fingerprint)
        finally:
            hardware.close()
        hardware.close()

    def test_measures_a_batch_in_order_handing_each_on(self):
        task = self.make_task()
        with self.make_hardware() as hardware:
            assert isinstance(hardware, Hardware)
            space = hardware.space(task)
            configs = random_configs(space, self.batch)
            assert configs, "no config drawn from the task's space"
            handed: list = []
            results = hardware.measure(task, configs, self.spec, on_result=lambda i, r: handed.append((i, r)))
        assert all(isinstance(r, MeasureResult) for r in results) and len(results) == len(configs), \
            f"{len(results)} results for {len(configs)} configs"
        assert [tuple(r.config) for r in results] == configs, "results not in the order of their configs"
        assert [i for i, _ in handed] == list(range(len(configs))) and [r for _, r in handed] == results, \
            "results not handed on, each with its index, in order"
        assert all(r.ok or r.error in ERROR_KINDS for r in results), [r.error for r in results]
