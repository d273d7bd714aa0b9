"""A tuned network's time beside torch eager's, grouped by what each step writes: where the gap to torch is.

    python experiments/layers_vs_torch.py outputs/runs/DAY/TIME [--runs 30] [--json layers.json]

For a whole-model run of a torch network (model.kind=network), in one process at the run's threads:

- the tuned model, compiled with the run's database as the end-to-end check compiles it, run under
  the VM instrument of experiments/profile_model.py: each call's median seconds per model run (a
  tuned kernel's time is an upper bound: each call also pays the worker threads' wake-up);
- torch eager's forward with a timer around each leaf module (convolution, batch norm, ReLU, pooling,
  linear): each module's median seconds per model run; what runs outside the leaf modules (a
  residual block's addition, Python) is the forward's time less theirs.

A step is grouped by the shape it writes (a tuned kernel's output, a module's output), so
ResNet-18's stem, each of its four stages, its pooling and its classifier are a row each, both
sides' steps of that shape summed. The two sides alternate in `--blocks` blocks of `--runs` model
runs each; each number is the median over the blocks. One process, one sitting: it says which
rows are behind and by how much, not a speed-up to cite (that is the end-to-end check's, over
fresh processes).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from tuning.hardware.kernel_context import PREPACKED


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished whole-model run folder of a torch network (with database/)")
    parser.add_argument("--runs", type=int, default=30, help="model runs per block and side")
    parser.add_argument("--blocks", type=int, default=3, help="blocks per side, alternating")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.blocks < 1:
        parser.error("--runs and --blocks: must be >= 1")
    if not (args.run / "database" / "database_tuning_record.json").is_file():
        parser.error(f"run: {args.run} has no database/ (a finished whole-model run)")
    return args


def shape_label(shape) -> str:
    return "x".join(str(int(d)) for d in shape)


def kernel_outputs(fused) -> dict[str, str]:
    """Each fused kernel's name -> the shape it writes, from the fused Relax module's call_tir bindings
    (the callee's name, the type of the variable the call binds): the names the VM calls the kernels by."""
    import tvm
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")
    out = {}
    for function in fused.functions.values():
        if not isinstance(function, relax.Function) or not isinstance(function.body, relax.SeqExpr):
            continue
        for block in function.body.blocks:
            for binding in block.bindings:
                value = binding.value
                if isinstance(value, relax.Call) and value.op.same_as(call_tir):
                    shape = getattr(getattr(binding.var, "ty", None), "shape", None)  # 0.27: a TensorType's
                    dims = getattr(shape, "values", shape)
                    if dims is not None:
                        out[value.args[0].name_hint] = shape_label(dims)
    return out


def tvm_side(vm, x, runs: int) -> tuple[dict[str, float], float]:
    """(each call's median seconds per model run, the uninstrumented run's median seconds)."""
    from tuning.hardware.kernel_context import model_call_seconds
    from tuning.hardware.relax_models import plain_seconds

    plain = float(np.median(plain_seconds(vm, x, runs)))
    calls, _, _ = model_call_seconds(vm, x, runs)
    return {symbol: float(np.median(seconds)) for symbol, seconds in calls.items()}, plain


def torch_side(module, example, runs: int) -> tuple[dict[str, float], dict[str, str], float]:
    """(each leaf module's median seconds per model run, its output shape, the forward's median seconds
    without the timers)."""
    import torch

    leaves = {name: m for name, m in module.named_modules() if not list(m.children())}
    started: dict[str, float] = {}
    spent: dict[str, list[float]] = defaultdict(list)
    shapes: dict[str, str] = {}

    def before(name):
        def hook(_module, _inputs):
            started[name] = time.perf_counter()
        return hook

    def after(name):
        def hook(_module, _inputs, output):
            spent[name].append(time.perf_counter() - started[name])
            shapes[name] = shape_label(output.shape)
        return hook

    with torch.no_grad():
        module(example)
        plain = []
        for _ in range(runs):
            begun = time.perf_counter()
            module(example)
            plain.append(time.perf_counter() - begun)
        handles = [h for name, m in leaves.items()
                   for h in (m.register_forward_pre_hook(before(name)), m.register_forward_hook(after(name)))]
        try:
            for _ in range(runs):
                module(example)
        finally:
            for handle in handles:
                handle.remove()
    # a module called several times per forward (torchvision's shared ReLU) sums its calls
    per_run = {name: float(np.median(np.add.reduceat(v, np.arange(0, len(v), len(v) // runs))))
               for name, v in spent.items()}
    return per_run, shapes, float(np.median(plain))


def grouped(times: dict[str, float], shape_of: dict[str, str]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for name, seconds in times.items():
        out[shape_of.get(name, "other")] += seconds
    return dict(out)


def rows(tvm_blocks: list[dict[str, float]], torch_blocks: list[dict[str, float]]) -> list[dict]:
    """Per output shape, the tuned model's and torch's median milliseconds over the blocks, the slowest first."""
    labels = {*(k for b in tvm_blocks for k in b), *(k for b in torch_blocks for k in b)}
    out = []
    for label in labels:
        tuned = float(np.median([b.get(label, 0.0) for b in tvm_blocks])) * 1e3
        torch_ms = float(np.median([b.get(label, 0.0) for b in torch_blocks])) * 1e3
        out.append({"writes": label, "tuned_ms": tuned, "torch_ms": torch_ms,
                    "tuned_over_torch": tuned / torch_ms if torch_ms > 0 else None})
    return sorted(out, key=lambda row: (-max(row["tuned_ms"], row["torch_ms"]), row["writes"]))


def main(argv=None) -> None:
    args = parse_args(argv)
    from omegaconf import OmegaConf

    from tuning.core.task import is_whole_model
    from tuning.engine.run_folder import load_config
    from tuning.engine.validate import validate

    cfg = load_config(args.run / "config.yaml", "run")
    validate(cfg)
    if not is_whole_model(cfg.model) or cfg.model.get("kind") != "network":
        raise SystemExit(f"tunelab: model: {args.run} is not a whole-model run of a torch network")
    threads = int((cfg.hardware.get("backend") or cfg.hardware).num_threads)
    os.environ["TVM_NUM_THREADS"] = str(threads)  # before TVM's runtime starts
    import torch
    from hydra.utils import instantiate

    from tuning.hardware.relax_models import compiled_model, fuse_for_tuning, load_model

    torch.set_num_threads(threads)
    hardware = instantiate(cfg.hardware)
    try:
        tvm_hardware = getattr(hardware, "backend", hardware)
        loaded = load_model(OmegaConf.to_container(cfg.model, resolve=True), cfg.seed, tvm_hardware.target)
        writes = kernel_outputs(fuse_for_tuning(loaded.mod, tvm_hardware.target, tvm_hardware.weight_prepack))
        vm, x, _ = compiled_model(loaded, tvm_hardware.target, str(args.run / "database"), tvm_hardware.weight_prepack)
        example = torch.from_numpy(loaded.example)
        tvm_blocks, torch_blocks, wholes = [], [], {"tuned": [], "torch": []}
        for _ in range(args.blocks):
            calls, plain = tvm_side(vm, x, args.runs)
            tvm_blocks.append(grouped(calls, {s: writes.get(s.removesuffix(PREPACKED), "other") for s in calls}))
            modules, shapes, forward = torch_side(loaded.torch_module, example, args.runs)
            torch_blocks.append({**grouped(modules, shapes), "other": forward - sum(modules.values())})
            wholes["tuned"].append(plain)
            wholes["torch"].append(forward)
    finally:
        hardware.close()
    table = rows(tvm_blocks, torch_blocks)
    tuned_ms, torch_ms = (float(np.median(wholes[k])) * 1e3 for k in ("tuned", "torch"))
    print(f"{args.run}: {threads} threads, {args.blocks} blocks x {args.runs} runs a side; whole model, "
          f"uninstrumented: tuned {tuned_ms:.2f} ms, torch eager {torch_ms:.2f} ms ({torch_ms / tuned_ms:.2f}x)")
    print("| writes | tuned (ms per run) | torch eager (ms per run) | tuned / torch |\n|---|---|---|---|")
    for row in table:
        ratio = "-" if row["tuned_over_torch"] is None else f"{row['tuned_over_torch']:.2f}"
        print(f"| {row['writes']} | {row['tuned_ms']:.3f} | {row['torch_ms']:.3f} | {ratio} |")
    print("'other': tuned, the VM's calls outside the run's kernels (layout changes, allocations); torch, the "
          "forward outside its leaf modules (residual additions, Python).")
    if args.json:
        args.json.write_text(json.dumps({"run": str(args.run), "threads": threads, "tuned_ms": tuned_ms,
                                         "torch_ms": torch_ms, "rows": table}, indent=1))


if __name__ == "__main__":
    main()
