"""Contract of every evaluator in conf/evaluator/ on the synthetic hardware (with a noise model)."""
from __future__ import annotations


import numpy as np
import pytest

from tuning.hardware.synthetic import SyntheticHardware
from tuning.core.task import gemm_task

from configs import group_yamls, instantiate_option

EVALUATOR_YAMLS = group_yamls("evaluator")
TASK = gemm_task("g", 128, 128, 128)


def configs(hardware, count=12, seed=0):
    space = hardware.space(TASK)
    rng = np.random.default_rng(seed)
    return list(dict.fromkeys(space.canonical(space.sample(rng)) for _ in range(count)))


@pytest.mark.parametrize("noise", [0.0, 0.3])
@pytest.mark.parametrize("path", EVALUATOR_YAMLS, ids=lambda p: p.stem)
def test_one_result_per_config_in_order_each_handed_out(path, noise):
    hardware, evaluator = SyntheticHardware(noise=noise), instantiate_option(path)
    batch = configs(hardware)
    seen = []
    results = evaluator.measure(hardware, TASK, batch, on_result=lambda i, r: seen.append((i, r)))
    assert len(results) == len(batch) and seen == list(enumerate(results))
    for config, result in zip(batch, results):
        assert result.config == config
        if result.ok:
            assert result.costs and all(c > 0 for c in result.costs) and result.run_s > 0
    assert any(r.ok for r in results) and any(not r.ok for r in results)  # errors are results too
    assert all(isinstance(v, float) for v in evaluator.metrics().values())


@pytest.mark.parametrize("path", EVALUATOR_YAMLS, ids=lambda p: p.stem)
def test_remeasure_gives_at_least_as_many_costs(path):
    hardware, evaluator = SyntheticHardware(noise=0.3), instantiate_option(path)
    batch = [c for c, r in zip(configs(hardware), evaluator.measure(hardware, TASK, configs(hardware))) if r.ok][:3]
    first = evaluator.measure(hardware, TASK, batch)
    again = evaluator.remeasure(hardware, TASK, batch)
    assert len(again) == len(batch) and all(r.ok for r in again)
    assert all(len(a.costs) >= len(f.costs) for a, f in zip(again, first))
    assert 1 <= evaluator.final_candidates


@pytest.mark.parametrize("path", EVALUATOR_YAMLS, ids=lambda p: p.stem)
def test_same_config_same_costs(path):
    hardware = SyntheticHardware(noise=0.3)
    batch = configs(hardware)
    first = [r.costs for r in instantiate_option(path).measure(hardware, TASK, batch)]
    assert first == [r.costs for r in instantiate_option(path).measure(hardware, TASK, batch)]
