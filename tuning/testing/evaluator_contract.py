"""The contract suite of an evaluator (tuning/evaluator/base.py), for pytest; no TVM import here.

An evaluator passes it by subclassing `EvaluatorContract` in a test module and saying how to make one:

    from tuning.testing.evaluator_contract import EvaluatorContract

    class TestMyEvaluator(EvaluatorContract):
        def make_evaluator(self):
            return MyEvaluator(repeat=3)

It measures on the synthetic hardware only (tuning/hardware/synthetic.py; `make_hardware(noise)`, with
the noise model's relative spread, may be overridden), canonical random configs of a 128x128x128 GEMM,
some of them invalid. Every test makes fresh evaluators with `make_evaluator()`.

What it checks: `measure` gives one MeasureResult per config, in order, each with its own config, each
handed on to `on_result` with its index in order; a valid config has positive costs and seconds, an
invalid one is an error result, never an exception; `measure_against` a best so far is the same, one
result per config in order, and a result it screened has one cost above that best; `metrics()` holds
floats; `remeasure` gives every
config that measured at least as many costs as `measure` did, and `final_candidates` is at least 1; two
evaluators made alike give the same costs for the same configs on the same (seeded) hardware.
"""
from __future__ import annotations

import numpy as np
import pytest

from tuning.core.space import Config
from tuning.core.task import gemm_task
from tuning.evaluator.base import Evaluator
from tuning.hardware.base import Hardware
from tuning.hardware.synthetic import SyntheticHardware

TASK = gemm_task("g", 128, 128, 128)


def configs(hardware: Hardware, count: int = 12, seed: int = 0) -> list[Config]:
    """Up to `count` distinct canonical random configs of TASK."""
    space = hardware.space(TASK)
    rng = np.random.default_rng(seed)
    return list(dict.fromkeys(space.canonical(space.sample(rng)) for _ in range(count)))


class EvaluatorContract:
    """Subclass it with `make_evaluator()`; pytest collects the tests below."""

    def make_evaluator(self) -> Evaluator:
        raise NotImplementedError("an evaluator's contract test says how to make one")

    def make_hardware(self, noise: float) -> Hardware:
        return SyntheticHardware(noise=noise)

    # ---- the contract ---------------------------------------------------------------------------
    @pytest.mark.parametrize("noise", [0.0, 0.3])
    def test_one_result_per_config_in_order_each_handed_out(self, noise):
        hardware, evaluator = self.make_hardware(noise), self.make_evaluator()
        assert isinstance(evaluator, Evaluator)
        batch = configs(hardware)
        seen = []
        results = evaluator.measure(hardware, TASK, batch, on_result=lambda i, r: seen.append((i, r)))
        assert len(results) == len(batch), f"{len(results)} results for {len(batch)} configs"
        assert seen == list(enumerate(results)), "results not handed on, each with its index, in order"
        for config, result in zip(batch, results):
            assert result.config == config, "a result not of the config at its place"
            if result.ok:
                assert result.costs and all(c > 0 for c in result.costs) and result.run_s > 0
        assert any(r.ok for r in results) and any(not r.ok for r in results)  # errors are results too
        assert all(isinstance(v, float) for v in evaluator.metrics().values())

    def test_measured_against_a_best_so_far_one_result_per_config_and_screened_ones_slower(self):
        hardware, evaluator = self.make_hardware(0.0), self.make_evaluator()
        batch = configs(hardware)
        plain = evaluator.measure(hardware, TASK, batch)
        best = min(r.cost for r in plain if r.ok)
        seen = []
        results = evaluator.measure_against(hardware, TASK, batch, best, on_result=lambda i, r: seen.append(i))
        assert len(results) == len(batch) and seen == list(range(len(batch)))
        for config, before, result in zip(batch, plain, results):
            assert result.config == config and result.ok == before.ok
            if result.screened:
                assert len(result.costs) == 1 and result.cost > best, "a screened result faster than the best"
        assert len(evaluator.measure_against(hardware, TASK, batch, None)) == len(batch)

    def test_remeasure_gives_at_least_as_many_costs(self):
        hardware, evaluator = self.make_hardware(0.3), self.make_evaluator()
        batch = [c for c, r in zip(configs(hardware), evaluator.measure(hardware, TASK, configs(hardware))) if r.ok][:3]
        first = evaluator.measure(hardware, TASK, batch)
        again = evaluator.remeasure(hardware, TASK, batch)
        assert len(again) == len(batch) and all(r.ok for r in again)
        assert all(len(a.costs) >= len(f.costs) for a, f in zip(again, first))
        assert 1 <= evaluator.final_candidates

    def test_same_config_same_costs(self):
        hardware = self.make_hardware(0.3)
        batch = configs(hardware)
        first = [r.costs for r in self.make_evaluator().measure(hardware, TASK, batch)]
        assert first == [r.costs for r in self.make_evaluator().measure(hardware, TASK, batch)]
