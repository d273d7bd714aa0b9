"""Whole networks through Relax: torch module -> Relax IRModule -> tuning tasks (imports TVM).

    mod = import_network(model, example, target)   # torch.export -> Relax, batch norm folded
    tasks = extract_tasks(mod, target)              # one ExtractedTask per distinct fused kernel

`extract_tasks` prepares the module exactly as `ms.relax_integration.compile_relax`
does before applying a database (library dispatch, LegalizeOps, FuseOps, FuseTIR),
so a task's `mod` is the function compile_relax will look up, and `key` (its
structural hash, MetaSchedule's "structural" module equality) identifies the
same kernel across runs, processes and models. Every function takes the
target (a dict) and, where it runs a model, the device string ("cpu",
"cuda:1") from its caller; nothing here assumes the CPU. See
docs/tvm.md §Whole models (Relax).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from importlib import import_module

from tuning.hardware.tvm_space import fast_tensor_intrin_import, make_target, tune_context


@dataclass(frozen=True)
class ExtractedTask:
    """One distinct fused kernel of a network."""

    name: str       # MetaSchedule's task name, e.g. "fused_conv2d1_add1_relu1" (unique per network only)
    mod: object     # tvm.IRModule holding one PrimFunc "main": the kernel to schedule
    weight: int     # how many times the network calls it per inference
    flops: float    # per call, tvm.s_tir.analysis.estimate_tir_flops
    key: str        # stable workload key: structural hash of `mod`, 16 hex digits


@dataclass
class LoadedModel:
    """A whole model ready to tune: its Relax module, an input, and the torch module if any."""

    mod: object                 # Relax IRModule, simplified (import_network / import_onnx)
    example: object             # numpy input
    torch_module: object = None  # the torch network the model came from (None for ONNX files)


def load_model(model_cfg, seed: int, target: dict) -> LoadedModel:
    """model.kind=network: a torch network of tuning/core/networks.py with weights from `seed`;
    model.kind=onnx: the user's file at model.path with model.input_shape."""
    if model_cfg["kind"] == "onnx":
        import numpy as np

        shape = [int(d) for d in model_cfg["input_shape"]]
        example = np.random.default_rng(seed).uniform(-1, 1, size=shape).astype("float32")
        return LoadedModel(import_onnx(model_cfg["path"], shape, target), example)
    from tuning.core.networks import build_network

    module, example = build_network(model_cfg["network"], seed)
    return LoadedModel(import_network(module, example, target), example.numpy(), module)


def import_onnx(path: str, input_shape: list[int], target: dict):
    """Relax IRModule of an ONNX file (weights bound as constants), simplified like import_network."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    model = onnx.load(path)
    graph_inputs = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    if len(graph_inputs) != 1:
        raise ValueError(f"model.path: {path} has inputs {graph_inputs}; tunelab tunes single-input models")
    return simplify(from_onnx(model, shape_dict={graph_inputs[0]: input_shape}), target)


def import_network(module, example, target: dict):
    """Relax IRModule of a torch module (eval mode), simplified for inference.

    Parameters stay bound as constants: FoldBatchnormToConv2D only matches constant
    weights, and tasks then carry the folded weights' shapes. Batch norm after a
    convolution is folded into its weights (the conv task gets a bias add instead of
    four elementwise ops); any other batch norm is decomposed into elementwise ops.
    CanonicalizeBindings removes the (out, mean, var) tuple batch norm leaves behind,
    which otherwise stops FuseOps from fusing the following relu into the conv."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad(), warnings.catch_warnings():  # torch's own pytree warns from export and from copying its result
        warnings.filterwarnings("ignore", "`isinstance\\(treespec, LeafSpec\\)` is deprecated", FutureWarning)
        exported = torch.export.export(module.eval(), (example,))
        imported = from_exported_program(exported)
    return simplify(imported, target)


def simplify(mod, target: dict):
    """Fold batch norm into convolutions, fold constants, decompose what is left (see import_network)."""
    import tvm
    from tvm import relax

    with make_target(target):  # FoldConstant compiles and runs the folded ops for this target
        return tvm.transform.Sequential([
            relax.transform.FoldBatchnormToConv2D(),
            relax.transform.FoldConstant(),
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
        ])(mod)


def fuse_for_tuning(mod, target: dict, weight_prepack: bool = True):
    """The fused module whose PrimFuncs are the tasks: compile_relax's own preparation
    (extract_tasks on the unfused import finds 0 tasks). With `weight_prepack` the kernels'
    weight buffers are marked layout-free, so MetaSchedule's RewriteLayout may store the
    (constant) weights in whatever layout the schedule reads fastest; `compile_with_database`
    then folds that rewrite into the constants (static_shape_tuning_pipeline's
    cpu_weight_prepack, with no runtime transform because weights are bound)."""
    import tvm
    from tvm import relax

    tvm_target = make_target(target)
    with tvm_target:
        return tvm.transform.Sequential([
            *relax.pipeline.library_dispatch_passes(tvm_target),
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
            *([relax.transform.AttachAttrLayoutFreeBuffers()] if weight_prepack else []),
        ])(mod)


def compile_with_database(mod, target: dict, database_dir: str, weight_prepack: bool = True):
    """Relax VM executable of `mod` with the database's best schedules (what
    ms.relax_integration.compile_relax does, plus the weight-prepack passes)."""
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    tvm_target = make_target(target)
    backend = backend_pipeline(tvm_target)
    database = ms.database.JSONDatabase(work_dir=database_dir, allow_missing=False)

    @tvm.transform.module_pass(opt_level=3)
    def pipeline(mod, _context):
        mod = fuse_for_tuning(mod, target, weight_prepack)
        mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
        if weight_prepack:
            mod = tvm.transform.Sequential([relax.transform.SplitLayoutRewritePreproc(),
                                            relax.transform.FoldConstant()])(mod)
        return tvm.transform.Sequential([*backend.dataflow_lower_passes(tvm_target),
                                         *backend.finalize_passes(tvm_target)])(mod)

    with tvm_target, database, tvm.transform.PassContext(opt_level=3):
        return relax.build(mod, target=tvm_target, relax_pipeline=pipeline)


# target kind -> tvm.relax.backend package (what relax.pipeline dispatches on for these kinds)
BACKENDS = {"llvm": "cpu_generic", "cuda": "cuda", "rocm": "rocm", "metal": "gpu_generic",
            "vulkan": "gpu_generic", "opencl": "gpu_generic"}


def backend_pipeline(tvm_target):
    """The Relax backend's own `pipeline` module for the target. Imported directly: the backend
    packages forget to export dataflow_lower_passes, so relax.pipeline.dataflow_lower_passes(llvm
    target) raises AttributeError in 0.27 (docs/tvm.md §Whole models (Relax))."""
    kind = tvm_target.kind.name
    if kind not in BACKENDS:
        raise NotImplementedError(f"no Relax backend pipeline known for target kind {kind!r}")
    return import_module(f"tvm.relax.backend.{BACKENDS[kind]}.pipeline")


def workload_key(mod) -> str:
    """Structural hash: independent of the task's name and buffer names, equal across processes."""
    import tvm_ffi

    return f"{tvm_ffi.structural_hash(mod):016x}"


def make_task(name: str, mod, weight: int) -> ExtractedTask:
    from tvm.s_tir.analysis import estimate_tir_flops

    return ExtractedTask(name=name, mod=mod, weight=int(weight), flops=float(estimate_tir_flops(mod)),
                         key=workload_key(mod))


def extract_tasks(mod, target: dict, weight_prepack: bool = True) -> list[ExtractedTask]:
    """The network's distinct kernels with weights, FLOPs and keys, largest total FLOPs first."""
    from tvm.s_tir import meta_schedule as ms

    fast_tensor_intrin_import(target.get("kind", "llvm"))
    extracted = ms.relax_integration.extract_tasks(fuse_for_tuning(mod, target, weight_prepack), make_target(target))
    tasks = [make_task(t.task_name, t.dispatched[0], t.weight) for t in extracted]
    return sorted(tasks, key=lambda t: (-t.flops * t.weight, t.name))


def as_tuning_tasks(tasks: list[ExtractedTask]) -> list:
    """tunelab Tasks (plain data the workers can rebuild) of a network's kernels."""
    from tuning.core.task import Task

    return [Task(t.name, {"op": "tir", "key": t.key, "mod": d["mod"]}, flops=t.flops, weight=t.weight)
            for t, d in zip(tasks, tasks_as_json(tasks))]


def tasks_as_json(tasks: list[ExtractedTask]) -> list[dict]:
    """JSON-able task descriptions (how tasks travel to worker processes). Each module is
    serialised with tvm.ir.save_json and checked to load back structurally equal."""
    import tvm
    import tvm_ffi

    described = []
    for task in tasks:
        text = tvm.ir.save_json(task.mod)
        if not tvm_ffi.structural_equal(tvm.ir.load_json(text), task.mod):
            raise ValueError(f"task {task.name} does not round-trip through save_json/load_json")
        described.append({"name": task.name, "weight": task.weight, "flops": task.flops,
                          "key": task.key, "mod": text})
    return described


def tasks_from_json(described: list[dict]) -> list[ExtractedTask]:
    import tvm

    return [ExtractedTask(name=d["name"], mod=tvm.ir.load_json(d["mod"]), weight=d["weight"],
                          flops=d["flops"], key=d["key"]) for d in described]


def design_spaces(task: ExtractedTask, target: dict) -> list:
    """MetaSchedule's design spaces (s_tir.Schedule sketches) of a task, as TaskSchedules builds them."""
    return list(tune_context(task.mod, target, task.name).generate_design_space())


def compiled_model(loaded: LoadedModel, target: dict, database_dir: str, weight_prepack: bool = True,
                   device: str = "cpu") -> tuple:
    """(VirtualMachine, input tensor, device) of a loaded model compiled with the database, as the
    end-to-end check compiles it, on `device` (a device string: "cpu", "cuda:1")."""
    import tvm
    from tvm import relax

    from tuning.hardware.tvm_device import tvm_device

    dev = tvm_device(device)
    vm = relax.VirtualMachine(compile_with_database(loaded.mod, target, database_dir, weight_prepack), dev)
    return vm, tvm.runtime.tensor(loaded.example, dev), dev


def plain_seconds(vm, x, runs: int, fresh_input: bool = True) -> list:
    """Seconds of each of `runs` runs of the model's main, no instrument, after one untimed run; the
    input written before each (untimed: kernel_context.input_writer), as the end-to-end check does."""
    import time

    from tuning.hardware.kernel_context import input_writer

    write_input = input_writer(x, fresh_input)
    vm["main"](x)
    seconds = []
    for _ in range(runs):
        write_input()
        started = time.perf_counter()
        vm["main"](x)
        seconds.append(time.perf_counter() - started)
    return seconds


def profile_calls(model_cfg, seed: int, target: dict, database_dir: str, runs: int,
                  weight_prepack: bool = True, device: str = "cpu") -> dict:
    """Where a tuned model's time goes: the model compiled with the database and run `runs` times
    on `device` (a device string: "cpu", "cuda:1"; after one untimed call) under a VM instrument that times every call the VM makes (kernels, VM
    builtins such as allocations and reshapes). {"calls": {symbol: [seconds per run]}, "counts":
    {symbol: calls per run}, "whole": [seconds per run, instrumented], "plain": [seconds per run,
    no instrument]}."""
    from tuning.hardware.kernel_context import model_call_seconds

    vm, x, _ = compiled_model(load_model(model_cfg, seed, target), target, database_dir, weight_prepack, device)
    plain = plain_seconds(vm, x, runs)
    calls, whole, counts = model_call_seconds(vm, x, runs)
    return {"calls": calls, "counts": counts, "whole": whole, "plain": plain}
