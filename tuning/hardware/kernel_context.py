"""One tuned kernel of a compiled model timed in several contexts: what makes it slower inside the
model than alone (imports TVM; experiments/in_model.py runs it and prints the table).

    vm, x = compiled model and its input (relax_models.compile_with_database)
    calls = capture_calls(vm, x)                 # every VM call of one model run: symbol, function, args
    time_contexts(vm, x, calls, symbols, ...)    # {symbol: {context: [seconds per call, one a pass]}}

The contexts, each a column of the table (seconds per call of the kernel):
    alone        the task's own build, as the tuner timed it (`standalone_timers`: as_built, TVM's
                 time_evaluator with the run's number / repeat / min_repeat_ms, random inputs)
    args_flushed the same build timed as evaluator.cache_flush=true times it (evaluator=autotvm_x86):
                 single calls, every argument but the first (the input, which the kernel before it
                 in a model has just written) evicted from the caches before each call
    model_fn     the model's compiled function on fresh random buffers of its arguments' shapes,
                 `number` calls back to back (the same loop as `model_args`)
    model_args   the same loop on the model's own arguments (its prepacked weights, its planned buffers)
    idle         one call after an idle gap as long as a flush (TVM's workers have gone to sleep)
    flushed      one call after every core wrote a buffer twice the size of its caches (L2 + L3):
                 nothing of the kernel's data, code or page tables is left in any cache
    model_only   inside the model with every other kernel skipped (the VM still runs its builtins)
    in_model     inside the whole model (the VM instrument's reading of each call), the model's input
                 written before each run as a caller's fresh input is (and as the end-to-end check does)
    stale_input  the same with the input left as it was between runs: nothing writes it, so the rest
                 of the model has evicted it by the next run's first kernel
    skip_delta   the model's time minus its time with this kernel's calls skipped, over its calls:
                 what the model pays for it, neighbours' slowdown included (a block of runs with the
                 calls, then one without; the median of the differences run by run)

Every model run here writes the input first (untimed) unless a context says otherwise.
Every context is read once a pass, in an order rotated each pass, so the host's drift falls on all.
The thread pool's own settings (spin count, affinity) are environment variables read when TVM's
runtime starts: the experiment runs one process per setting.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np

CONTEXTS = ("alone", "args_flushed", "model_fn", "model_args", "idle", "flushed", "model_only", "in_model",
            "stale_input", "skip_delta")
CACHE_LEVELS = ("index2", "index3")  # sysfs names of the L2 and L3 caches
PREPACKED = "_prepacked"  # the suffix of a kernel compiled with its weights' layout rewritten (weight_prepack)


def capture_calls(vm, x) -> list[tuple]:
    """[(symbol, function, args)] of every call the VM makes in one run of `main`, in order; the
    arguments are kept alive (the memory planner's buffers, the prepacked weights)."""
    from tvm.runtime.vm import VMInstrumentReturnKind

    calls = []

    def instrument(func, symbol, before_run, ret_value, *args):
        if before_run:
            calls.append((str(symbol), func, list(args)))
        return VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    try:
        vm["main"](x)
    finally:
        vm.set_instrument(None)
    return calls


def input_writer(x, fresh_input: bool = True):
    """What runs (untimed) before each model run: x's own values written back into it, as a caller
    hands the model a new input it has just written; a no-op with fresh_input=False."""
    if not fresh_input:
        return lambda: None
    values = x.numpy()
    return lambda: x.copyfrom(values)


def model_call_seconds(vm, x, runs: int, skip=frozenset(), fresh_input: bool = True) -> tuple[dict, list, dict]:
    """({symbol: [seconds it took per model run]}, [model seconds per run], {symbol: calls per
    run}) over `runs` runs under the instrument, after one run that is not read; calls to a symbol
    in `skip` do not run; the input written before each run (input_writer)."""
    from tvm.runtime.vm import VMInstrumentReturnKind

    this_run: dict = {}
    opened: list = []

    def instrument(func, symbol, before_run, ret_value, *args):
        symbol = str(symbol)
        if symbol in skip:
            return VMInstrumentReturnKind.SKIP_RUN
        if before_run:
            opened.append(time.perf_counter())
        else:
            this_run[symbol] = this_run.get(symbol, 0.0) + time.perf_counter() - opened.pop()
            counts[symbol] = counts.get(symbol, 0) + 1
        return VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    per_symbol: dict = {}
    counts: dict = {}
    whole = []
    write_input = input_writer(x, fresh_input)
    try:
        vm["main"](x)  # the first run after a change of instrument is not read
        counts.clear()
        for _ in range(runs):
            this_run.clear()
            write_input()
            started = time.perf_counter()
            vm["main"](x)
            whole.append(time.perf_counter() - started)
            for symbol, seconds in this_run.items():
                per_symbol.setdefault(symbol, []).append(seconds)
    finally:
        vm.set_instrument(None)
    return per_symbol, whole, {symbol: n // runs for symbol, n in counts.items()}


def kernels_in_model(vm, x, runs: int, fresh_input: bool = True) -> dict:
    """{kernel: {"seconds": median seconds per call, "calls": calls per run}} of every compiled
    kernel of the model (the VM's builtins left out), read by the VM's instrument over `runs` runs,
    named as the tuning tasks are (PREPACKED dropped)."""
    per_symbol, _, counts = model_call_seconds(vm, x, runs, fresh_input=fresh_input)
    return {symbol.removesuffix(PREPACKED): {"seconds": float(np.median(seconds)) / max(counts[symbol], 1),
                                             "calls": counts[symbol]}
            for symbol, seconds in per_symbol.items() if "." not in symbol and counts.get(symbol)}


def skip_delta(vm, x, symbol: str, calls: int, runs: int) -> float:
    """Median of (model with the symbol's calls) - (model without them), per call: `runs` runs with
    them, then `runs` without, differenced run by run."""
    with_it = model_call_seconds(vm, x, runs)[1]
    without = model_call_seconds(vm, x, runs, skip=frozenset([symbol]))[1]
    return float(np.median(np.asarray(with_it) - np.asarray(without))) / calls


def loop_seconds(func, args, number: int, repeat: int) -> float:
    """Median over `repeat` of (`number` back-to-back calls) / number: time_evaluator's loop, from
    Python (about a microsecond a call of foreign-function overhead)."""
    readings = []
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(number):
            func(*args)
        readings.append((time.perf_counter() - started) / number)
    return float(np.median(readings))


def single_call_seconds(func, args, before, runs: int) -> float:
    """Median over `runs` of one call, each after `before()` (untimed)."""
    readings = []
    for _ in range(runs):
        before()
        started = time.perf_counter()
        func(*args)
        readings.append(time.perf_counter() - started)
    return float(np.median(readings))


def cache_bytes() -> int:
    """L2 + L3 of cpu0 as sysfs reports them (8 MiB + 32 MiB when it reports nothing)."""
    total = 0
    for level, fallback in zip(CACHE_LEVELS, (8 << 20, 32 << 20)):
        path = Path(f"/sys/devices/system/cpu/cpu0/cache/{level}/size")
        try:
            text = path.read_text().strip().upper()
            total += int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1], 0)
        except (OSError, ValueError, IndexError):
            total += fallback
    return total


class CacheFlusher:
    """Every CPU this process may run on writes its own buffer of twice the caches' size, at once
    (a thread pinned to each CPU: a core's private L2 is only evicted by that core)."""

    def __init__(self):
        self.cpus = sorted(os.sched_getaffinity(0))
        size = 2 * cache_bytes() // 8
        self.buffers = [np.zeros(size) for _ in self.cpus]
        self.seconds = 0.0

    def __call__(self) -> None:
        started = time.perf_counter()
        threads = [threading.Thread(target=self._write, args=(cpu, buffer))
                   for cpu, buffer in zip(self.cpus, self.buffers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.seconds = time.perf_counter() - started

    @staticmethod
    def _write(cpu: int, buffer: np.ndarray) -> None:
        os.sched_setaffinity(0, {cpu})  # this thread only
        buffer += 1.0


def fresh_args(args, dev, rng) -> list:
    """New tensors of the arguments' shapes and dtypes on `dev`: uniform(-1, 1) floats, zero integers."""
    import tvm

    fresh = []
    for arg in args:
        shape, dtype = tuple(int(d) for d in arg.shape), str(arg.dtype)
        data = (rng.uniform(-1, 1, size=shape).astype(dtype) if dtype.startswith(("float", "bfloat"))
                else np.zeros(shape, dtype=dtype))
        fresh.append(tvm.runtime.tensor(data, dev))
    return fresh


def standalone_timers(workload: dict, target: dict, config: tuple, specs: dict, dev) -> dict:
    """{name: a function timing the task's own build of `config` as the tuner does with specs[name]}:
    the scheduled module as built (tvm_worker.as_built: weights taken already re-laid-out), built
    once, TVM's time_evaluator with the spec's number / repeat / min_repeat_ms (and its argument
    flush, when it flushes), the median of the repeats, on random inputs."""
    import tvm

    from tuning.hardware.tvm_worker import _compile, as_built, task_schedules

    mod, shapes = as_built(task_schedules(workload, target).schedule(tuple(config))[0])
    lib = _compile(mod, target)
    rng = np.random.default_rng(0)
    tensors = [tvm.runtime.tensor(rng.uniform(-1, 1, size=s).astype(d), dev) for s, d in shapes]

    def timer(spec):
        evaluator = lib.time_evaluator(lib.entry_name, dev, number=spec.number, repeat=spec.repeat,
                                       min_repeat_ms=spec.min_repeat_ms,
                                       f_preproc="cache_flush_cpu_non_first_arg" if spec.cache_flush else "")
        return lambda: float(np.median(evaluator(*tensors).results))

    return {name: timer(spec) for name, spec in specs.items()}


def zeros_and_uniform_seconds(workload: dict, target: dict, config: tuple, device: str, number: int = 1,
                              repeat: int = 3, min_repeat_ms: float = 20) -> tuple[float, float]:
    """(seconds on zeros, seconds on the uniform data every timing uses: tvm_worker.random_arguments)
    of the task's own build of `config` (as_built), each the median of TVM's time_evaluator's repeats."""
    import tvm

    from tuning.hardware.tvm_device import tvm_device
    from tuning.hardware.tvm_worker import _compile, as_built, random_arguments, task_schedules

    mod, shapes = as_built(task_schedules(workload, target).schedule(tuple(config))[0])
    lib, dev = _compile(mod, target), tvm_device(device)
    evaluator = lib.time_evaluator(lib.entry_name, dev, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)
    zeros = [tvm.runtime.tensor(np.zeros(s, dtype=d), dev) for s, d in shapes]
    uniform = [tvm.runtime.tensor(a, dev) for a in random_arguments(shapes)]
    return float(np.median(evaluator(*zeros).results)), float(np.median(evaluator(*uniform).results))


def time_contexts(vm, x, calls: list, kernels: dict, passes: int, runs: int, number: int, dev) -> dict:
    """{"readings": {symbol: {context: [seconds per call, one a pass]}}, "counts": {symbol: calls per
    model run}, "flush_s": one flush's seconds} for `kernels` ({symbol: {"alone": standalone timer,
    "args_flushed": the same with its arguments flushed}, or {} where there is none}); `calls` from
    capture_calls. CONTEXTS says what each context is."""
    counts: dict = {}
    first: dict = {}
    for symbol, func, args in calls:
        counts[symbol] = counts.get(symbol, 0) + 1
        first.setdefault(symbol, (func, args))
    compiled = {symbol for symbol in counts if "." not in symbol}  # the VM's builtins are vm.builtin.*
    fresh = {symbol: fresh_args(first[symbol][1], dev, np.random.default_rng(0)) for symbol in kernels}
    flusher = CacheFlusher()
    flusher()
    gap = flusher.seconds

    def in_model(skip_others: bool, fresh_input: bool = True) -> dict:
        if not skip_others:
            per_symbol = model_call_seconds(vm, x, runs, fresh_input=fresh_input)[0]
            return {s: float(np.median(per_symbol[s])) / counts[s] for s in kernels}
        out = {}
        for symbol in kernels:
            per_symbol = model_call_seconds(vm, x, runs, skip=frozenset(compiled - {symbol}))[0]
            out[symbol] = float(np.median(per_symbol[symbol])) / counts[symbol]
        return out

    def each(read) -> dict:
        return {symbol: read(symbol, *first[symbol]) for symbol in kernels}

    def standalone(context: str):
        return lambda: {symbol: timers[context]() for symbol, timers in kernels.items() if context in timers}

    readers = {
        "alone": standalone("alone"),
        "args_flushed": standalone("args_flushed"),
        "model_fn": lambda: each(lambda s, func, args: loop_seconds(func, fresh[s], number, 3)),
        "model_args": lambda: each(lambda s, func, args: loop_seconds(func, args, number, 3)),
        "idle": lambda: each(lambda s, func, args: single_call_seconds(func, args, lambda: time.sleep(gap), runs)),
        "flushed": lambda: each(lambda s, func, args: single_call_seconds(func, args, flusher, runs)),
        "model_only": lambda: in_model(skip_others=True),
        "in_model": lambda: in_model(skip_others=False),
        "stale_input": lambda: in_model(skip_others=False, fresh_input=False),
        "skip_delta": lambda: {s: skip_delta(vm, x, s, counts[s], runs) for s in kernels},
    }
    readings = {symbol: {context: [] for context in CONTEXTS} for symbol in kernels}
    for step in range(passes):
        for context in CONTEXTS[step % len(CONTEXTS):] + CONTEXTS[:step % len(CONTEXTS)]:
            for symbol, seconds in readers[context]().items():
                readings[symbol][context].append(seconds)
    return {"readings": readings, "counts": {s: counts[s] for s in kernels}, "flush_s": gap}
