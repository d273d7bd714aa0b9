"""Tasks: one tunable operator each, described as plain data.

A task's `workload` dict is all a hardware backend needs to rebuild the
TIR function (in any process), and its `key` identifies the same operator
across runs and models.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Task:
    name: str
    # {"op": "gemm", "M":.., ...}, {"op": "batch_matmul", ...}, {"op": "conv2d", ...}, or a network's kernel
    # {"op": "tir", "key": structural hash, "mod": tvm.ir.save_json text}
    workload: dict[str, Any] = field(hash=False)
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


def pair(value: int | Sequence[int]) -> tuple[int, int]:
    """A conv2d size as (height, width): an int is square, a list/tuple is [h, w]."""
    if isinstance(value, int):
        return value, value
    h, w = value
    return int(h), int(w)


def _compact(value: int | Sequence[int]) -> int | list[int]:
    """Square sizes stay ints, so the workload (and the task key) of a square conv is unchanged."""
    h, w = pair(value)
    return h if h == w else [h, w]


# model.space values the backend builds from the workload (a different task key): tiling, the GEMM-tiling
# paper's space; wide, MetaSchedule's sketches and more (docs/tvm.md). full and store leave it out.
WORKLOAD_SPACES = ("tiling", "wide")


def _with_space(workload: dict[str, Any], space: str) -> dict[str, Any]:
    if space in WORKLOAD_SPACES:
        workload["space"] = space
    return workload


def gemm_task(name: str, M: int, N: int, K: int, dtype: str = "float32", weight: int = 1,
              space: str = "full") -> Task:
    """space="tiling" or "wide": the backend gives that space (a different task key)."""
    workload = _with_space({"op": "gemm", "M": M, "N": N, "K": K, "dtype": dtype}, space)
    return Task(name, workload, flops=2.0 * M * N * K, weight=weight)


def batch_matmul_task(name: str, batch: int, M: int, N: int, K: int, dtype: str = "float32",
                      weight: int = 1, space: str = "full") -> Task:
    """C[b] = A[b] @ B[b] with A (batch, M, K) and B (batch, K, N): attention's Q K^T and P V."""
    workload = _with_space({"op": "batch_matmul", "batch": batch, "M": M, "N": N, "K": K, "dtype": dtype}, space)
    return Task(name, workload, flops=2.0 * batch * M * N * K, weight=weight)


def conv2d_task(
    name: str, batch: int, in_channels: int, height: int, width: int, out_channels: int,
    kernel: int | Sequence[int], stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
    dtype: str = "float32", weight: int = 1, groups: int = 1, dilation: int | Sequence[int] = 1,
    space: str = "full",
) -> Task:
    """NCHW input, OIHW weight (I = in_channels / groups, torch's layout). kernel, stride, padding
    and dilation are an int (both axes) or [height, width]; groups == in_channels is depthwise.
    groups and dilation enter the workload only when not 1, so older tasks keep their keys."""
    workload: dict[str, Any] = {
        "op": "conv2d", "batch": batch, "in_channels": in_channels, "height": height,
        "width": width, "out_channels": out_channels, "kernel": _compact(kernel), "stride": _compact(stride),
        "padding": _compact(padding), "dtype": dtype,
    }
    if groups != 1:
        workload["groups"] = groups
    if pair(dilation) != (1, 1):
        workload["dilation"] = _compact(dilation)
    _with_space(workload, space)
    out_h, out_w = conv2d_output_shape(workload)
    kh, kw = pair(kernel)
    flops = 2.0 * batch * out_channels * out_h * out_w * (in_channels // groups) * kh * kw
    return Task(name, workload, flops=flops, weight=weight)


def conv2d_output_shape(workload: Mapping[str, Any]) -> tuple[int, int]:
    """(out_height, out_width) of a conv2d workload."""
    kernel, stride, padding = (pair(workload[k]) for k in ("kernel", "stride", "padding"))
    dilation = pair(workload.get("dilation", 1))
    height, width = (conv2d_output_size(workload[side], kernel[a], stride[a], padding[a], dilation[a])
                     for a, side in enumerate(("height", "width")))
    return height, width


def build_tasks(model_cfg: Mapping[str, Any]) -> list[Task]:
    """Tasks of a single-operator `model` config group entry (networks: the hardware backend's
    `network_tasks`)."""
    kind = model_cfg["kind"]
    name = model_cfg["name"]  # the task's name groups comparisons and metrics: the run's name carries the shape
    if kind == "gemm":
        return [gemm_task(name, model_cfg["M"], model_cfg["N"], model_cfg["K"], model_cfg.get("dtype", "float32"),
                          space=model_cfg.get("space", "full"))]
    if kind == "batch_matmul":
        batch, M, N, K = (int(model_cfg[k]) for k in ("batch", "M", "N", "K"))
        return [batch_matmul_task(name, batch, M, N, K, model_cfg.get("dtype", "float32"),
                                  space=model_cfg.get("space", "full"))]
    if kind == "conv2d":
        batch, channels, height, width, out_channels = (
            int(model_cfg[k]) for k in ("batch", "in_channels", "height", "width", "out_channels"))
        sizes: dict[str, Any] = {k: _size(model_cfg.get(k, default)) for k, default in
                                 (("kernel", None), ("stride", 1), ("padding", 0), ("dilation", 1))}
        return [conv2d_task(name, batch, channels, height, width, out_channels, **sizes,
                            groups=int(model_cfg.get("groups", 1)), dtype=model_cfg.get("dtype", "float32"),
                            space=model_cfg.get("space", "full"))]
    raise ValueError(f"model.kind: unknown kind {kind!r} (allowed: gemm, batch_matmul, conv2d)")


def _size(value: int | Sequence[int]) -> int | list[int]:
    return int(value) if isinstance(value, int) else [int(v) for v in value]


def reference_output(workload: Mapping[str, Any], inputs: Sequence[np.ndarray]) -> np.ndarray:
    """The right answer of a single operator on numpy inputs, in float64: numpy's product for
    (batch) matmuls, torch's conv2d for convolutions (the same layout, groups and dilation)."""
    import numpy as np

    if workload["op"] in ("gemm", "batch_matmul"):
        return np.matmul(inputs[0].astype("float64"), inputs[1].astype("float64"))
    if workload["op"] == "conv2d":
        import torch

        x, w = (torch.from_numpy(a.astype("float64")) for a in inputs)
        return torch.nn.functional.conv2d(x, w, stride=pair(workload["stride"]), padding=pair(workload["padding"]),
                                          dilation=pair(workload.get("dilation", 1)),
                                          groups=workload.get("groups", 1)).numpy()
    raise ValueError(f"no reference for op {workload['op']!r}")


WHOLE_MODEL_KINDS = ("network", "onnx")  # model kinds whose tasks come from a whole model, not one operator


def is_whole_model(model_cfg: Mapping[str, Any]) -> bool:
    return model_cfg["kind"] in WHOLE_MODEL_KINDS
