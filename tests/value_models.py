"""A small value function trained on hardware=synthetic's kernels and registered in a throwaway MLflow
registry: what the search suites give search=value (whose `model` must name a registered V)."""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np

from tuning.core.measure import MeasureSpec
from tuning.hardware.synthetic import SyntheticHardware
from tuning.value.net import KernelData, fit, log_value, shape_tag


def synthetic_kernels(tasks, configs=60, seed=0) -> list[KernelData]:
    """Measured configs of `tasks` on hardware=synthetic (deterministic latencies)."""
    hardware, rng, kernels = SyntheticHardware(), np.random.default_rng(seed), []
    for task in tasks:
        space = hardware.space(task)
        sampled = list(dict.fromkeys(space.sample(rng) for _ in range(configs)))
        seconds = [r.cost for r in hardware.measure(task, sampled, MeasureSpec(repeat=1))]
        keep = [i for i, s in enumerate(seconds) if np.isfinite(s)]
        kernels.append(KernelData(task.name, space, [sampled[i] for i in keep], np.array([seconds[i] for i in keep])))
    return kernels


def register_tiny_value(registry: str, tasks, name: str = "v", epochs: int = 3) -> str:
    from tuning.tracking.registry import register

    net, losses = fit(synthetic_kernels(tasks), hidden=16, epochs=epochs, seed=0)
    return register(lambda mlflow: log_value(mlflow, net, name), name, registry, "value", {"epochs": epochs},
                    {"final_loss": losses[-1]}, shape_tag(net))


@functools.lru_cache(maxsize=None)
def shared_value_model() -> tuple[str, str]:
    """(reference, registry) of one V for a whole test session (trained once, on a gemm and a conv)."""
    from tuning.core.task import conv2d_task, gemm_task

    registry = f"sqlite:///{Path(tempfile.mkdtemp(prefix='tunelab-value-')) / 'mlflow.db'}"
    reference = register_tiny_value(registry, [gemm_task("g", 64, 64, 64), conv2d_task("c", 1, 16, 14, 14, 32, 3, 1, 1)])
    return reference, registry
