"""Tasks: one tunable operator each, described as plain data.

A task's `workload` dict is all a hardware backend needs to rebuild the
TIR function (in any process), and its `key` identifies the same operator
across runs and models.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Task:
    name: str
    # {"op": "gemm", "M":.., ...}, {"op": "conv2d", ...}, or a network's kernel
    # {"op": "tir", "key": structural hash, "mod": tvm.ir.save_json text}
    workload: dict = field(hash=False)
    flops: float = 0.0
    weight: int = 1  # how often the model runs it

    @property
    def key(self) -> str:
        if self.workload["op"] == "tir":
            return f"tir-{self.workload['key']}"
        blob = json.dumps(self.workload, sort_keys=True)
        return f"{self.workload['op']}-{hashlib.sha1(blob.encode()).hexdigest()[:12]}"


def conv2d_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def gemm_task(name: str, M: int, N: int, K: int, dtype: str = "float32", weight: int = 1,
              space: str = "full") -> Task:
    """space="tiling": the backend gives the GEMM-tiling paper's space (a different task key)."""
    workload = {"op": "gemm", "M": M, "N": N, "K": K, "dtype": dtype}
    if space == "tiling":
        workload["space"] = "tiling"
    return Task(name, workload, flops=2.0 * M * N * K, weight=weight)


def conv2d_task(
    name: str, batch: int, in_channels: int, height: int, width: int, out_channels: int,
    kernel: int, stride: int = 1, padding: int = 0, dtype: str = "float32", weight: int = 1,
) -> Task:
    """NCHW input, OIHW weight, square kernel/stride/padding."""
    workload = {
        "op": "conv2d", "batch": batch, "in_channels": in_channels, "height": height,
        "width": width, "out_channels": out_channels, "kernel": kernel, "stride": stride,
        "padding": padding, "dtype": dtype,
    }
    out_h = conv2d_output_size(height, kernel, stride, padding)
    out_w = conv2d_output_size(width, kernel, stride, padding)
    flops = 2.0 * batch * out_channels * out_h * out_w * in_channels * kernel * kernel
    return Task(name, workload, flops=flops, weight=weight)


def build_tasks(model_cfg) -> list[Task]:
    """Tasks of a single-operator `model` config group entry (networks: the hardware backend's
    `network_tasks`)."""
    kind = model_cfg["kind"]
    name = model_cfg["name"]
    if kind == "gemm":
        return [gemm_task(name, model_cfg["M"], model_cfg["N"], model_cfg["K"], model_cfg.get("dtype", "float32"),
                          space=model_cfg.get("space", "full"))]
    if kind == "conv2d":
        keys = ("batch", "in_channels", "height", "width", "out_channels", "kernel", "stride", "padding")
        return [conv2d_task(name, *(int(model_cfg[k]) for k in keys), dtype=model_cfg.get("dtype", "float32"))]
    raise ValueError(f"model.kind: unknown kind {kind!r} (allowed: gemm, conv2d)")
