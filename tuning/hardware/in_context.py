"""The in-context evaluator: a whole model's candidate kernels timed inside the model (imports TVM;
runs in worker processes that the local runner starts).

    prepare_reading(model_cfg, seed, target, device, database_dir, weight_prepack,
                    candidates={task name: [config, ...]}, folder)
        -> a manifest of what it built into `folder`: the model compiled with the run's database
           and every candidate's own build, once, for every reading process
    time_candidates(manifest, device, rounds=3, runs=20)
        -> {task name: [[seconds per call, one per round] per config]}, the tasks the model calls
           (a reshape the VM runs as a view of its input has no kernel to replace: left out)

The model is compiled with the run's database, as the end-to-end check compiles it. Each candidate
is the task's own build of its config (as_built: the weight it re-lays-out taken already
rewritten), called in place of the model's call to that task by the VM's instrument, on the
model's own buffers: the input the kernel before it has just written, the output the memory
planner gave it, the cache state the rest of the model leaves. A candidate whose weight layout
differs from the model's build gets its own weight tensor of its layout, random values (the
values do not change a kernel's time; the model's output is not read here).

One model run reads every task at once: in each pass, each task's calls go to one of its
candidates (pass_slots), the slot turning by one between passes from an offset of the task's that
is drawn anew each round (a generator seeded by the round), so each candidate is read once a round,
and which candidate goes first, and which of its neighbours' candidates a candidate is read beside,
change from round to round, by chance rather than in a fixed pattern that could line the same
neighbours up every time (a task with fewer candidates than the widest runs the model's own kernel
in the passes it has none for). The median over `runs` model runs is one reading. Reading the
tasks one at a time took as many model runs for each task as this takes for all of them.

The builds are made once, by `prepare_reading`, and loaded by every reading process: a process
lays the model's buffers out anew when it loads it (a kernel's time inside the model differs
between processes by more than between rounds of one), and building in each cost the model's
import, its compilation and every candidate's build again.

Why: a kernel's time inside the model is not its time alone. Four configs of ResNet-18's stem
convolution within 3% of each other alone read 0.95-1.11 ms inside the model (docs/methods.md,
"Inside the model"): the tuner ranks by a number the model does not pay unless it reads the kernel
where the model runs it.
"""
from __future__ import annotations

import os
import random
import time

import numpy as np

from tuning.hardware.kernel_context import PREPACKED, capture_calls, input_writer

MODEL_FILE = "model.so"


def prepare_reading(model_cfg: dict, seed: int, target: dict, device: str, database_dir: str, weight_prepack: bool,
                    candidates: dict, folder: str) -> dict:
    """The model compiled with the database into folder/model.so and each candidate of each task the
    model calls built into folder/; the manifest the reading processes load them by: {"model": its
    file, "input": the model's input (numpy), "symbols": {task: the VM's symbol for it}, "kernels":
    {task: [[file, its arguments' [shape, dtype]] per candidate]}}."""
    import tvm
    from tvm import relax

    from tuning.hardware.relax_models import as_tuning_tasks, compile_with_database, extract_tasks, load_model
    from tuning.hardware.tvm_device import tvm_device

    loaded = load_model(model_cfg, seed, target)
    tasks = {t.name: t for t in as_tuning_tasks(extract_tasks(loaded.mod, target, weight_prepack))}
    unknown = sorted(set(candidates) - set(tasks))
    if unknown:
        raise ValueError(f"the model has no task(s) {unknown}")
    executable = compile_with_database(loaded.mod, target, database_dir, weight_prepack)
    model_file = os.path.join(folder, MODEL_FILE)
    executable.export_library(model_file)
    dev = tvm_device(device)
    vm = relax.VirtualMachine(executable, dev)
    called = {str(symbol).removesuffix(PREPACKED): str(symbol)
              for symbol, _, _ in capture_calls(vm, tvm.runtime.tensor(loaded.example, dev))}
    symbols = {name: called[name] for name in candidates if name in called}
    kernels = {name: [build_candidate(tasks[name], target, tuple(config), os.path.join(folder, f"k{t}-{i}.so"))
                      for i, config in enumerate(candidates[name])]
               for t, name in enumerate(symbols)}
    return {"model": model_file, "input": loaded.example, "symbols": symbols, "kernels": kernels}


def build_candidate(task, target: dict, config: tuple, path: str) -> list:
    """[file, its arguments' [shape, dtype]]: the task's own build of `config`, exported to `path`."""
    from tuning.hardware.tvm_worker import _compile, as_built, export, task_schedules

    mod, shapes = as_built(task_schedules(task.workload, target).schedule(config)[0])
    export(_compile(mod, target), target, path)
    return [path, shapes]


def time_candidates(manifest: dict, device: str, rounds: int, runs: int) -> dict:
    """Every candidate of `manifest` (prepare_reading's) read inside the model, in this process:
    {task: [[seconds per call, one a round] per candidate]} (module docstring: the passes)."""
    import tvm
    from tvm import relax

    from tuning.hardware.tvm_device import tvm_device

    dev = tvm_device(device)
    vm = relax.VirtualMachine(tvm.runtime.load_module(manifest["model"]), dev)
    x = tvm.runtime.tensor(manifest["input"], dev)
    kernels = {name: [load_candidate(path, shapes, dev) for path, shapes in files]
               for name, files in manifest["kernels"].items()}
    readings: dict = {name: [[] for _ in built] for name, built in kernels.items()}
    if not kernels:
        return readings
    width = max(len(built) for built in kernels.values())
    for round_ in range(rounds):
        for slot in range(width):
            chosen = pass_slots(kernels, width, slot, round_)
            seconds = substituted_seconds(
                vm, x, {manifest["symbols"][name]: kernels[name][i] for name, i in chosen.items()}, runs)
            for name, i in chosen.items():
                readings[name][i].append(seconds[manifest["symbols"][name]])
    return readings


def pass_slots(kernels: dict, width: int, slot: int, round_: int) -> dict:
    """{task: the candidate its calls go to in pass `slot` of round `round_`}: (slot + the task's
    offset this round) mod width, the offsets drawn in the tasks' order by random.Random(round_);
    the tasks without a candidate there left out (the model's own kernel runs)."""
    draw = random.Random(round_)
    slots = {name: (slot + draw.randrange(width)) % width for name in kernels}
    return {name: i for name, i in slots.items() if i < len(kernels[name])}


def load_candidate(path: str, shapes: list, dev) -> tuple:
    """(function, own(k): a tensor of each argument's shape for the k-th call of a model run, the
    library that holds the function) of a candidate's build. Each call site gets its own tensors, as
    the model's call sites have their own weights: one shared tensor would stay in the caches
    between two calls of a run and flatter the candidate."""
    import tvm

    lib = tvm.runtime.load_module(path)
    by_call: dict = {}

    def own(k: int) -> list:
        if k not in by_call:
            rng = np.random.default_rng(k)
            by_call[k] = [tvm.runtime.tensor(rng.uniform(-1, 1, size=shape).astype(dtype), dev)
                          for shape, dtype in shapes]
        return by_call[k]

    return lib[lib.entry_name], own, lib


def substituted_seconds(vm, x, replaced: dict, runs: int) -> dict:
    """{symbol: median seconds per call} of each kernel of `replaced` ({symbol: load_candidate's}) called
    in place of the model's calls to that symbol, all in the same runs: over `runs` model runs after one
    that is not read, the input written before each run (input_writer)."""
    from tvm.runtime.vm import VMInstrumentReturnKind

    seconds: dict = {symbol: [] for symbol in replaced}
    calls_this_run: dict = {}

    def instrument(func, called, before_run, ret_value, *args):
        symbol = str(called)
        kernel = replaced.get(symbol)
        if kernel is None:
            return VMInstrumentReturnKind.NO_OP
        if before_run:
            function, own, _ = kernel
            mine = own(calls_this_run.get(symbol, 0))
            calls_this_run[symbol] = calls_this_run.get(symbol, 0) + 1
            used = [arg if tuple(arg.shape) == tuple(m.shape) else m for arg, m in zip(args, mine)]
            started = time.perf_counter()
            function(*used)
            seconds[symbol].append(time.perf_counter() - started)
        return VMInstrumentReturnKind.SKIP_RUN

    write_input = input_writer(x)
    vm.set_instrument(instrument)
    try:
        for _ in range(runs + 1):
            write_input()
            calls_this_run.clear()
            vm["main"](x)
    finally:
        vm.set_instrument(None)
    return {symbol: median_per_call(readings, runs) for symbol, readings in seconds.items()}


def median_per_call(seconds: list, runs: int) -> float:
    """The median over the read runs (the first of `runs` + 1 is not read) of a run's mean seconds per call."""
    calls = max(1, len(seconds) // (runs + 1))
    per_run = [sum(seconds[i:i + calls]) / calls for i in range(calls, len(seconds), calls)]
    return float(np.median(per_run))
