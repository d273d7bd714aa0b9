"""What the TVM backend's worker processes run (imports TVM; never imported by the parent).

Build worker: config -> schedule -> library file. Run worker: library file ->
correctness check against the untuned kernel -> time_evaluator costs, on the
device string the runner passes ("cpu", "cpu:0", "cuda:1"; tvm_device.py).
Nothing here needs untuned TIR to run on the target: on a GPU the reference
output is computed on this host's CPU (reference_arrays) and the drift gauge
is a GEMM in fixed thread blocks (gauge_module). Handled failures come back as
{"error": kind, "message": ...} values. The local runner (runners/local.py)
drives these functions in its worker pools.
"""
from __future__ import annotations

import json
import time
import traceback

import numpy as np

from tuning.core.measure import CVStop
from tuning.hardware.gpu_pack_runner import ATOL, GAUGE_RUNS, RTOL, gpu_error_kind, runs_within
from tuning.hardware.tvm_device import device_kind, tvm_device
from tuning.hardware.tvm_space import (
    HOST_TARGET,
    TaskSchedules,
    arg_shapes,
    arguments,
    fast_tensor_intrin_import,
    make_target,
    untuned_runs_on,
    workload_module,
)

_schedules: dict = {}
_references: dict = {}
_gauges: dict = {}

# The drift gauge: a fixed kernel (a 128^3 GEMM, a few ms; untuned on a CPU) timed with every measured
# batch, so the store knows how fast the host was when each row was read (docs/store.md §The drift gauge).
GAUGE_WORKLOAD = {"op": "gemm", "M": 128, "N": 128, "K": 128, "dtype": "float32"}
GAUGE_THREAD_BLOCK = 16  # on a GPU: 16 x 16 threads a block, one output element each


def init(target: dict) -> None:
    """Pay the imports once, at worker start (tensor intrinsics for the target's kind only)."""
    without_torch()
    fast_tensor_intrin_import(target.get("kind", "llvm"))
    import tvm  # noqa: F401


def without_torch() -> None:
    """Keep torch out of a process that never uses it: tvm_ffi imports torch eagerly when it is
    installed (about 2 of the 2.7 s `import tvm` takes on a 2-core host, paid by every worker
    start); a None entry in sys.modules makes that import fail at once, as if torch were absent."""
    import sys

    if "tvm" not in sys.modules:
        sys.modules.setdefault("torch", None)


def _key(workload: dict, target: dict) -> str:
    """Cache key; a network kernel is named by its structural hash, not its (long) JSON text."""
    return json.dumps([workload.get("key") or workload, target], sort_keys=True)


def task_schedules(workload: dict, target: dict) -> TaskSchedules:
    key = _key(workload, target)
    if key not in _schedules:
        _schedules[key] = TaskSchedules(workload, target)
    return _schedules[key]


def as_built(sch) -> tuple:
    """The scheduled module as it is built, and its arguments' [shape, dtype]. A kernel whose
    schedule re-lays-out a (layout-free) weight takes that weight already rewritten: the rewrite is
    folded into the constants when the model is compiled."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(sch.mod)
    return mod, arguments(mod["main"])


def _compile(mod, target):
    import tvm

    return tvm.tirx.build(mod, target=make_target(target))


def export(lib, target: dict, lib_path: str) -> None:
    """A built module as a shared library; a cuda target's kernels compiled to a cubin by nvcc here
    (cuda_compile.py), so a kernel that does not compile is a build error before it is timed."""
    if target.get("kind") == "cuda":
        from tuning.hardware.cuda_compile import export_compiled

        export_compiled(lib, target["arch"], lib_path)
    else:
        lib.export_library(lib_path)


def build(workload: dict, target: dict, config: list, lib_path: str) -> dict:
    start = time.perf_counter()
    schedules = task_schedules(workload, target)
    try:
        sch, effective = schedules.schedule(tuple(config))
    except Exception as error:  # noqa: BLE001 - invalid decisions are a record, not a crash
        return {"error": "invalid", "message": f"{type(error).__name__}: {error}", "build_s": time.perf_counter() - start}
    try:
        mod, args = as_built(sch)
        export(_compile(mod, target), target, lib_path)
    except Exception:  # noqa: BLE001
        return {"error": "build", "message": traceback.format_exc(limit=3), "config": list(effective),
                "build_s": time.perf_counter() - start}
    return {"error": None, "config": list(effective), "args": args, "build_s": time.perf_counter() - start}


def reference_arrays(workload: dict, target: dict, device: str = "cpu") -> tuple[list, np.ndarray]:
    """The check's arrays, (inputs with a zero output buffer last, expected output): random inputs
    (seed 0) and the untuned kernel's output on them, run on `device` where the untuned kernel runs
    on the target, else built for HOST_TARGET and run on this host's CPU."""
    import tvm

    mod = workload_module(workload)
    shapes = arg_shapes(mod["main"])
    arrays = random_arguments(shapes)
    if not untuned_runs_on(target):
        target, device = HOST_TARGET, "cpu"
    lib = _compile(mod, target)
    dev = tvm_device(device)
    tensors = [tvm.runtime.tensor(a, dev) for a in arrays]
    lib[lib.entry_name](*tensors)
    return arrays, tensors[-1].numpy()


def random_arguments(shapes) -> list[np.ndarray]:
    """A kernel's arguments ([shape, dtype] each, the output last): inputs uniform in [-1, 1) drawn
    from seed 0, a zero output. Every timing uses data like these, never zeros: on some CPUs a
    kernel runs many times slower on nonzero data than on zeros (floating-point assists; docs/runs.md
    §How measuring works), and a reading must be what the model will pay."""
    rng = np.random.default_rng(0)
    return [*(rng.uniform(-1, 1, size=s).astype(d) for s, d in shapes[:-1]), np.zeros(shapes[-1][0], dtype=shapes[-1][1])]


def reference(workload: dict, target: dict, device: str) -> None:
    """Inputs and the untuned kernel's output for a workload (cached per worker; `run` copies the
    inputs to its device)."""
    key = _key(workload, target)
    if key not in _references:
        _references[key] = reference_arrays(workload, target, device)


def run(workload: dict, target: dict, device: str, lib_path: str, args: list, spec: dict) -> dict:
    """Check the output, then time it on `device`. spec: MeasureSpec fields as a dict. On a GPU a
    failure is a value of its kind (gpu_error_kind) with "restart": the CUDA context is unusable
    after most errors, so the runner starts this process again."""
    import tvm

    start = time.perf_counter()
    try:
        lib = tvm.runtime.load_module(lib_path)
        return check_and_time(lib, tvm_device(device), device_kind(device), _references[_key(workload, target)],
                              args, spec, start)
    except Exception as error:  # noqa: BLE001
        kind = gpu_error_kind(str(error)) if device_kind(device) != "cpu" else None
        if kind is None:
            raise
        return {"error": kind, "message": f"{type(error).__name__}: {error}", "run_s": time.perf_counter() - start,
                "restart": True}


def check_and_time(lib, dev, kind: str, reference: tuple, args: list, spec: dict, start: float) -> dict:
    """A loaded library on `dev` (this host's, or a remote session's): its output checked against
    `reference` (inputs, expected output), then timed by the device's own time_evaluator."""
    import tvm

    function = lib[lib.entry_name]
    inputs, expected = reference
    same_layout = [list(a.shape) for a in inputs] == [shape for shape, _ in args[:len(inputs)]]
    if same_layout:
        tensors = [tvm.runtime.tensor(a, dev) for a in inputs]
    else:  # the schedule rewrote a weight layout: time it on random data in that layout, skip the check
        tensors = [tvm.runtime.tensor(a, dev) for a in random_arguments(args)]
    single = time.perf_counter()
    function(*tensors)
    dev.sync()
    single = time.perf_counter() - single
    if spec["check_correctness"] and same_layout:
        if not np.allclose(tensors[-1].numpy(), expected, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(expected).max()))):
            return {"error": "wrong_answer", "message": "output differs from the untuned kernel",
                    "run_s": time.perf_counter() - start}
    screened = screening(lib, dev, tensors, spec.get("screen_above_s"), single, spec["min_repeat_ms"])
    if screened is not None:
        return {**screened, "run_s": time.perf_counter() - start}
    spec, note = fit_to_timeout(spec, single)
    if spec is None:
        return {"error": "timeout", "run_s": time.perf_counter() - start, "message": note}
    if spec["cv_stop"]:
        costs = _time_until_stable(lib, dev, tensors, CVStop(**spec["cv_stop"]))
    else:
        # TVM's cache flush is a CPU preprocessor; other devices have no equivalent
        flush = spec["cache_flush"] and kind == "cpu"
        evaluator = lib.time_evaluator(
            lib.entry_name, dev, number=spec["number"], repeat=spec["repeat"],
            min_repeat_ms=spec["min_repeat_ms"], f_preproc="cache_flush_cpu_non_first_arg" if flush else "",
        )
        costs = [float(c) for c in evaluator(*tensors).results]
    return {"error": None, "costs": costs, "run_s": time.perf_counter() - start, "message": note}


SCREEN_MS = 10  # the screening reading lasts at least this long (runs averaged), where the full one's does longer


def screening(lib, dev, tensors, cut_s: float | None, single: float, min_repeat_ms: float) -> dict | None:
    """With a screening cut (MeasureSpec.screen_above_s), for a candidate whose first call (`single`,
    cold, a remote call's network in it) already took longer than the cut: one short warm reading by
    the device's own clock (runs averaged over at least min(SCREEN_MS, min_repeat_ms) ms, as the full
    reading averages over min_repeat_ms); the result without its run_s where that reading is over
    the cut too, else None (the candidate is timed in full, as every one under the cut is)."""
    if cut_s is None or single <= cut_s:
        return None
    timer = lib.time_evaluator(lib.entry_name, dev, number=1, repeat=1, min_repeat_ms=min(SCREEN_MS, min_repeat_ms))
    seconds = float(timer(*tensors).results[0])
    if seconds <= cut_s:
        return None
    return {"error": None, "costs": [seconds], "screened": True,
            "message": f"screened: a short reading took {seconds:.3g} s, over the round's cut of {cut_s:.3g} s"}


def fit_to_timeout(spec: dict, single: float) -> tuple[dict | None, str]:
    """The spec a kernel whose one run took `single` seconds is timed with, and a note.

    A measurement that would outlast `timeout_s` is cut to fewer runs per cost (`number`, or an
    adaptive evaluator's micro-batch), then to fewer costs, when `slow_kernels` is "fewer_runs":
    a slow kernel is still a valid reading, and failing it would hide it from the cost model.
    None (a timeout) when not even two runs fit, or under "timeout"."""
    rule = spec["cv_stop"]
    number = rule["micro_batch"] if rule else max(spec["number"], 1)
    repeat = rule["max_batches"] if rule else spec["repeat"]
    fitted = runs_within(number, repeat, spec["min_repeat_ms"], spec["timeout_s"], single)
    if fitted == (number, repeat):
        return spec, ""
    refused = f"one run took {single:.3f} s; the measurement would exceed timeout_s={spec['timeout_s']}"
    if spec.get("slow_kernels", "fewer_runs") != "fewer_runs" or fitted is None:
        return None, refused
    number, repeat = fitted
    if rule:
        rule = {**rule, "micro_batch": number, "max_batches": repeat,
                "min_batches": min(rule["min_batches"], repeat)}
        fitted = {**spec, "number": number, "repeat": repeat, "cv_stop": rule}
    else:
        fitted = {**spec, "number": number, "repeat": repeat}
    return fitted, (f"fewer_runs: {number} run(s) x {repeat} cost(s), one run {single:.3f} s "
                    f"(timeout_s={spec['timeout_s']})")


def gauge_module(target: dict):
    """The gauge kernel for a target: the untuned GEMM where untuned TIR runs (every CPU: the same
    kernel as ever, so stores compare readings across versions), else the same GEMM in fixed
    GAUGE_THREAD_BLOCK x GAUGE_THREAD_BLOCK thread blocks."""
    from tvm import s_tir

    mod = workload_module(GAUGE_WORKLOAD)
    if untuned_runs_on(target):
        return mod
    sch = s_tir.Schedule(mod)
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    i_block, i_thread = sch.split(i, [None, GAUGE_THREAD_BLOCK])
    j_block, j_thread = sch.split(j, [None, GAUGE_THREAD_BLOCK])
    sch.reorder(i_block, j_block, i_thread, j_thread, k)
    for loop, thread in ((i_block, "blockIdx.y"), (j_block, "blockIdx.x"), (i_thread, "threadIdx.y"),
                         (j_thread, "threadIdx.x")):
        sch.bind(loop, thread)
    return sch.mod


def gauge(target: dict, device: str) -> float:
    """Median seconds of the gauge kernel (gauge_timer's); built once per worker."""
    key = json.dumps([target, device], sort_keys=True)
    if key not in _gauges:
        mod = gauge_module(target)
        _gauges[key] = gauge_timer(mod, _compile(mod, target), tvm_device(device))
    return _gauges[key]()


def gauge_timer(mod, lib, dev):
    """A call that reads the gauge kernel `lib` (built from `mod`) on `dev`, this host's or a remote
    session's: the median of GAUGE_RUNS' costs, in seconds (a pack's script reads it alike)."""
    import tvm

    tensors = [tvm.runtime.tensor(np.ones(s, dtype=d), dev) for s, d in arg_shapes(mod["main"])]
    evaluator = lib.time_evaluator(lib.entry_name, dev, **GAUGE_RUNS)
    return lambda: float(np.median(evaluator(*tensors).results))


def _time_until_stable(lib, device, tensors, rule: CVStop) -> list[float]:
    """AdaTune's adaptive evaluator: one micro-batch at a time until the rule says stop.
    Each time_evaluator call runs the kernel once untimed before its batch, so the adaptive
    evaluator pays one extra run per micro-batch (2% at B = 50); run_s includes it."""
    batch = lib.time_evaluator(lib.entry_name, device, number=rule.micro_batch, repeat=1, min_repeat_ms=0)
    costs: list[float] = []
    while not rule.finished(costs):
        costs.append(float(batch(*tensors).results[0]))
    return costs
