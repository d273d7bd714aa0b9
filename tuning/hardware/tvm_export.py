"""A task's best schedule as a shared library anyone can load without tunelab (python -m tuning.tools.export).

export_library builds the scheduled module, writes `<name>.so` (TVM's export_library: the host
compiler links it), loads it back as a user would, checks its answer on random inputs (a single
operator against tuning.core.task.reference_output, numpy's or torch's; a network's kernel against its
unscheduled TIR built without tuning) and times it beside the untuned kernel and, for single
operators on a CPU, torch, with the measuring thread count. Devices are device strings ("cpu",
"cuda:1"; tvm_device.py); where untuned TIR cannot run on the target (a GPU), the untuned kernel is
built for this host's CPU for the check only and not timed. `snippet` is the Python file that loads
and calls the library on the device it was exported for, written beside it. check_script is the
same check on an exported TVMScript file (python -m tuning.tools.apply on a single operator).
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from tuning.core.task import reference_output
from tuning.hardware.tvm_device import device_kind, parse_device, tvm_device
from tuning.hardware.tvm_space import HOST_TARGET, arg_shapes, make_target, untuned_runs_on, workload_module

TIMING = {"number": 1, "repeat": 10, "min_repeat_ms": 50}  # as tuning.tools.apply's check: median of 10


def export_library(workload: dict, target: dict, scheduled_mod, path: Path, device: str = "cpu",
                   num_threads: int | None = None) -> dict:
    """Returns {"library", "args", "correct", "max_abs_error", "reference_max", "reference",
    "tuned_s", "untuned_s", "torch_s", "torch_readings", "torch_threads"} (torch_s, the median of
    torch_readings timed at torch_threads, None for a network's kernel and off a CPU; untuned_s None
    where untuned TIR cannot run on the target). Whether torch's readings can stand as its latency is
    the reader's to check (tuning.core.plausible.reference_problem)."""
    import tvm

    path.parent.mkdir(parents=True, exist_ok=True)
    tvm.tirx.build(scheduled_mod, target=make_target(target)).export_library(str(path))
    lib = tvm.runtime.load_module(str(path))
    on_target = untuned_runs_on(target)
    untuned_dev = tvm_device(device if on_target else "cpu")
    untuned = tvm.tirx.build(workload_module(workload), target=make_target(target if on_target else HOST_TARGET))
    shapes = arg_shapes(workload_module(workload)["main"])
    inputs = _random_inputs(shapes)
    dev = tvm_device(device)
    tuned_args, got = _call(lib, inputs, shapes[-1], dev)
    untuned_args, untuned_out = _call(untuned, inputs, shapes[-1], untuned_dev)
    single = workload["op"] != "tir"
    expected = reference_output(workload, inputs) if single else untuned_out
    tuned_s = _seconds(lib, tuned_args, dev)
    untuned_s = _seconds(untuned, untuned_args, untuned_dev) if on_target else None
    torch_times = torch_readings(workload, inputs, num_threads) if single and device_kind(device) == "cpu" else None
    return {"library": str(path), "args": [[list(shape), dtype] for shape, dtype in shapes],
            **_agreement(got, expected),
            "reference": ("numpy" if workload["op"] in ("gemm", "batch_matmul") else "torch") if single
            else "the untuned kernel",
            "tuned_s": tuned_s, "untuned_s": untuned_s, "torch_s": _median(torch_times) if torch_times else None,
            "torch_readings": torch_times, "torch_threads": num_threads}


def check_script(workload: dict, target: dict, script: str, device: str = "cpu") -> dict:
    """Compile an exported schedule (TVMScript text) as a user would, run it on random inputs and
    compare with the right answer (tuning.core.task.reference_output: numpy's product, torch's conv2d);
    time it (python -m tuning.tools.apply on a single operator). Returns {"correct", "max_abs_error",
    "reference_max", "seconds"}."""
    import tvm

    shapes = arg_shapes(workload_module(workload)["main"])
    inputs = _random_inputs(shapes)
    dev = tvm_device(device)
    lib = tvm.tirx.build(tvm.script.from_source(script), target=make_target(target))
    args, got = _call(lib, inputs, shapes[-1], dev)
    return {**_agreement(got, reference_output(workload, inputs)), "seconds": _seconds(lib, args, dev)}


def _random_inputs(shapes) -> list:
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.uniform(-1, 1, size=shape).astype(dtype) for shape, dtype in shapes[:-1]]


def _agreement(got, expected) -> dict:
    """float32 against a float64 reference: relative 1e-3, absolute 1e-4 of the largest value."""
    import numpy as np

    scale = float(np.abs(expected).max())
    return {"correct": bool(np.allclose(got, expected, rtol=1e-3, atol=1e-4 * max(1.0, scale))),
            "max_abs_error": float(np.abs(got - expected).max()), "reference_max": scale}


def _call(lib, inputs, output, dev):
    import numpy as np
    import tvm

    args = [tvm.runtime.tensor(a, dev) for a in inputs] + [tvm.runtime.tensor(np.zeros(*output), dev)]
    lib[lib.entry_name](*args)
    return args, args[-1].numpy()


def _seconds(lib, args, dev) -> float:
    import numpy as np

    timer = lib.time_evaluator(lib.entry_name, dev, **TIMING)
    return float(np.median(timer(*args).results))


def torch_call(workload: dict, inputs: list, num_threads: int | None = None):
    """torch's eager call of the same operator on the same inputs (float32). `num_threads` sets torch's
    threads for good; torch_threads sets them for a while."""
    import torch

    from tuning.core.task import pair

    if num_threads:
        torch.set_num_threads(num_threads)
    tensors = [torch.from_numpy(a) for a in inputs]
    if workload["op"] == "conv2d":
        options = {"stride": pair(workload["stride"]), "padding": pair(workload["padding"]),
                   "dilation": pair(workload.get("dilation", 1)), "groups": workload.get("groups", 1)}
        return lambda: torch.nn.functional.conv2d(*tensors, **options)
    return lambda: torch.matmul(*tensors)


@contextmanager
def torch_threads(num_threads: int | None):
    """torch's intra-op threads set to `num_threads` (the tuned runtime's) for the block, then restored:
    torch at its own default beside a kernel timed at fewer threads oversubscribes a busy host's cores."""
    import torch

    before = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def call_seconds(call, repeat: int, min_repeat_ms: float) -> float:
    """A Python callable timed as TVM's time_evaluator times a kernel: after a warm-up call, the
    median over `repeat` of the mean call time in a block of at least `min_repeat_ms`."""
    return _median(call_readings(call, repeat, min_repeat_ms))


def call_readings(call, repeat: int, min_repeat_ms: float) -> list[float]:
    """call_seconds' readings: after a warm-up call, `repeat` mean call times, each over a block of
    at least `min_repeat_ms`."""
    import time

    call()
    samples = []
    for _ in range(repeat):
        calls, started = 0, time.perf_counter()
        while calls == 0 or time.perf_counter() - started < min_repeat_ms / 1e3:
            call()
            calls += 1
        samples.append((time.perf_counter() - started) / calls)
    return samples


def _median(values: list[float]) -> float:
    import numpy as np

    return float(np.median(values))


def rotated_passes(timers: dict, passes: int, after_pass=None) -> dict:
    """{key: [seconds, one a pass]}: every timer once a pass, the order rotated by one each pass so the
    host's drift falls on all alike; `after_pass(step, seconds)` after each pass."""
    seconds = {key: [] for key in timers}
    order = list(timers)
    for step in range(passes):
        for key in order[step % len(order):] + order[:step % len(order)]:
            seconds[key].append(timers[key]())
        if after_pass is not None:
            after_pass(step, seconds)
    return seconds


def torch_readings(workload: dict, inputs: list, num_threads: int | None) -> list[float]:
    """torch's readings of the same operator on the same inputs (float32, eager; 10 block means after a
    warm-up, each block at least 50 ms, as the TVM timings), at the tuned runtime's `num_threads`
    (torch_threads: restored after)."""
    import torch

    with torch_threads(num_threads), torch.inference_mode():
        return call_readings(torch_call(workload, inputs), TIMING["repeat"], TIMING["min_repeat_ms"])


def snippet(workload: dict, library: Path, args: list, device: str = "cpu") -> str:
    """A Python file that loads `library`, calls it on random inputs on `device` (the device string
    it was exported for), checks a single operator's answer against numpy/torch and times it: what a
    user copies into their own code."""
    kind, index = parse_device(device)
    inputs = "\n".join(f"    np.random.default_rng({i}).uniform(-1, 1, {tuple(shape)}).astype({dtype!r}),"
                       for i, (shape, dtype) in enumerate(args[:-1]))
    shape, dtype = args[-1]
    check = _check_lines(workload)
    return f'''"""Load and call the tuned kernel {library.name} (written by `python -m tuning.tools.export`).
Needs numpy and the TVM runtime (pip install apache-tvm){"; torch for the check" if "torch" in check else ""}."""
from pathlib import Path

import numpy as np
import tvm

lib = tvm.runtime.load_module(str(Path(__file__).with_name({library.name!r})))
dev = tvm.device({kind!r}, {index})
inputs = [
{inputs}
]
output = tvm.runtime.tensor(np.zeros({tuple(shape)}, {dtype!r}), dev)  # written in place
lib[lib.entry_name](*[tvm.runtime.tensor(a, dev) for a in inputs], output)
{check}
timer = lib.time_evaluator(lib.entry_name, dev, number=1, repeat=10, min_repeat_ms=50)
args = [tvm.runtime.tensor(a, dev) for a in inputs] + [output]
print(f"{library.stem}: {{np.median(timer(*args).results) * 1e6:.1f}} us per call (median of 10)")
'''


def _check_lines(workload: dict) -> str:
    if workload["op"] in ("gemm", "batch_matmul"):
        expected = "inputs[0].astype('float64') @ inputs[1].astype('float64')"
    elif workload["op"] == "conv2d":
        from tuning.core.task import pair

        options = (f"stride={pair(workload['stride'])}, padding={pair(workload['padding'])}, "
                   f"dilation={pair(workload.get('dilation', 1))}, groups={workload.get('groups', 1)}")
        expected = (f"torch.nn.functional.conv2d(*(torch.from_numpy(a).double() for a in inputs), "
                    f"{options}).numpy()")
    else:
        return "# a network's fused kernel: tuning.tools.export checked it against its untuned build"
    imports = "import torch\n\n" if "torch" in expected else ""
    return (f"{imports}expected = {expected}\n"
            f"assert np.allclose(output.numpy(), expected, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(expected).max()))\n"
            f"print('matches the reference')")
