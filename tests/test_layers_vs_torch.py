"""experiments/layers_vs_torch.py's torch side and its grouping (the tuned side needs a finished run)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "layers_vs_torch.py"
spec = importlib.util.spec_from_file_location("layers_vs_torch", SCRIPT)
layers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(layers)


class SharedRelu(nn.Module):
    """One ReLU module called twice a forward, as torchvision's BasicBlock does."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        return self.pool(self.relu(self.relu(self.conv(x)) + 1.0))


def test_each_leaf_module_is_timed_once_a_run_by_the_shape_it_writes():
    module = SharedRelu().eval()
    times, shapes, forward = layers.torch_side(module, torch.randn(1, 3, 8, 8), runs=5)
    assert set(times) == {"conv", "relu", "pool"}
    assert shapes == {"conv": "1x4x8x8", "relu": "1x4x8x8", "pool": "1x4x4x4"}
    assert forward > 0 and all(seconds > 0 for seconds in times.values())
    assert not module._forward_hooks and not module.relu._forward_pre_hooks  # the timers are taken off


def test_rows_sum_each_side_by_shape_and_take_the_median_over_blocks():
    tvm = [layers.grouped({"k1": 1e-3, "k2": 2e-3, "alloc": 1e-4}, {"k1": "a", "k2": "a", "alloc": "other"}),
           layers.grouped({"k1": 3e-3, "k2": 2e-3, "alloc": 1e-4}, {"k1": "a", "k2": "a", "alloc": "other"}),
           layers.grouped({"k1": 1e-3, "k2": 3e-3, "alloc": 1e-4}, {"k1": "a", "k2": "a", "alloc": "other"})]
    torch_blocks = [{"a": 2e-3, "other": 1e-4}, {"a": 2e-3, "other": 1e-4}, {"a": 4e-3, "other": 1e-4}]
    table = {row["writes"]: row for row in layers.rows(tvm, torch_blocks)}
    assert abs(table["a"]["tuned_ms"] - 4.0) < 1e-9 and abs(table["a"]["torch_ms"] - 2.0) < 1e-9
    assert abs(table["a"]["tuned_over_torch"] - 2.0) < 1e-9
    assert [row["writes"] for row in layers.rows(tvm, torch_blocks)] == ["a", "other"]  # the heaviest first
