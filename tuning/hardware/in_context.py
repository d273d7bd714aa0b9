"""The in-context evaluator: a whole model's candidate kernels timed inside the model (imports TVM;
runs in a worker process that the local runner starts, one per reading process).

    time_candidates(model_cfg, seed, target, device, database_dir, weight_prepack,
                    candidates={task name: [config, ...]}, rounds=3, runs=20)
        -> {task name: [[seconds per call, one per round] per config]}, the tasks the model calls
           (a reshape the VM runs as a view of its input has no kernel to replace: left out)

The model is compiled with the run's database, as the end-to-end check compiles it. Each candidate
is the task's own build of its config (as_built: the weight it re-lays-out taken already
rewritten), called in place of the model's call to that task by the VM's instrument, on the
model's own buffers: the input the kernel before it has just written, the output the memory
planner gave it, the cache state the rest of the model leaves. A candidate whose weight layout
differs from the model's build gets its own weight tensor of its layout, random values (the
values do not change a kernel's time; the model's output is not read here). The median over
`runs` model runs is one reading; every candidate is read once a round, in an order rotated each
round, so the host's drift falls on all.

Why: a kernel's time inside the model is not its time alone. Four configs of ResNet-18's stem
convolution within 3% of each other alone read 0.95-1.11 ms inside the model (docs/methods.md,
"Inside the model"): the tuner ranks by a number the model does not pay unless it reads the kernel
where the model runs it.
"""
from __future__ import annotations

import time

import numpy as np

from tuning.hardware.kernel_context import PREPACKED, capture_calls, input_writer


def time_candidates(model_cfg: dict, seed: int, target: dict, device: str, database_dir: str, weight_prepack: bool,
                    candidates: dict, rounds: int, runs: int) -> dict:
    from tuning.hardware.relax_models import as_tuning_tasks, compiled_model, extract_tasks, load_model

    loaded = load_model(model_cfg, seed, target)
    vm, x, dev = compiled_model(loaded, target, database_dir, weight_prepack, device)
    tasks = {t.name: t for t in as_tuning_tasks(extract_tasks(loaded.mod, target, weight_prepack))}
    symbols = {str(symbol).removesuffix(PREPACKED): str(symbol) for symbol, _, _ in capture_calls(vm, x)}
    unknown = sorted(set(candidates) - set(tasks))
    if unknown:
        raise ValueError(f"the model has no task(s) {unknown}")
    built = {name: [build_candidate(tasks[name], target, tuple(config), dev) for config in configs]
             for name, configs in candidates.items() if name in symbols}
    readings = {name: [[] for _ in kernels] for name, kernels in built.items()}
    for round_ in range(rounds):
        for name, kernels in built.items():
            order = list(range(len(kernels)))
            order = order[round_ % len(order):] + order[:round_ % len(order)]
            for i in order:
                readings[name][i].append(substituted_seconds(vm, x, symbols[name], kernels[i], runs))
    return readings


def build_candidate(task, target: dict, config: tuple, dev) -> tuple:
    """(function, own(k): a tensor of each argument's shape for the k-th call of a model run, the
    library that holds the function) of the task's own build of `config`. Each call site gets its
    own tensors, as the model's call sites have their own weights: one shared tensor would stay in
    the caches between two calls of a run and flatter the candidate."""
    import tvm

    from tuning.hardware.tvm_worker import _compile, as_built, task_schedules

    mod, shapes = as_built(task_schedules(task.workload, target).schedule(config)[0])
    lib = _compile(mod, target)
    by_call: dict = {}

    def own(k: int) -> list:
        if k not in by_call:
            rng = np.random.default_rng(k)
            by_call[k] = [tvm.runtime.tensor(rng.uniform(-1, 1, size=shape).astype(dtype), dev) for shape, dtype in shapes]
        return by_call[k]

    return lib[lib.entry_name], own, lib


def substituted_seconds(vm, x, symbol: str, kernel: tuple, runs: int) -> float:
    """Median seconds of `kernel` called in place of the model's calls to `symbol`, over `runs` model
    runs after one that is not read, the input written before each run (input_writer)."""
    from tvm.runtime.vm import VMInstrumentReturnKind

    function, own, _ = kernel
    seconds: list = []
    calls_this_run = [0]

    def instrument(func, called, before_run, ret_value, *args):
        if str(called) != symbol:
            return VMInstrumentReturnKind.NO_OP
        if before_run:
            mine = own(calls_this_run[0])
            calls_this_run[0] += 1
            used = [arg if tuple(arg.shape) == tuple(m.shape) else m for arg, m in zip(args, mine)]
            started = time.perf_counter()
            function(*used)
            seconds.append(time.perf_counter() - started)
        return VMInstrumentReturnKind.SKIP_RUN

    write_input = input_writer(x)
    vm.set_instrument(instrument)
    try:
        for _ in range(runs + 1):
            write_input()
            calls_this_run[0] = 0
            vm["main"](x)
    finally:
        vm.set_instrument(None)
    calls = max(1, len(seconds) // (runs + 1))
    per_run = [sum(seconds[i:i + calls]) / calls for i in range(calls, len(seconds), calls)]
    return float(np.median(per_run))
