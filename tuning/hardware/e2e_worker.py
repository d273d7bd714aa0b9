"""Apply and time a whole model (runs in a worker process with TVM_NUM_THREADS set; imports TVM).

    evaluate(model_cfg, seed, target, database_dir, num_threads, timing, out_dir) -> dict

compiles the model twice (with the tuned MetaSchedule database; untuned, TVM's
default pipeline), runs both on the Relax VM and the torch module in eager mode on
the same input with the same thread count, checks the outputs, and times each the
same way: a warm-up call, then calls (tuned and torch alternating) until `runs`
each or `max_seconds` per variant (at least `min_runs`); the median is the latency.
The untuned build (seconds per call) gets `min_runs` calls.
"""
from __future__ import annotations

import os
import time

import numpy as np

from tuning.hardware.tvm_space import fast_tensor_intrin_import, make_target


def init() -> None:
    fast_tensor_intrin_import("llvm")
    import torch  # noqa: F401
    import tvm  # noqa: F401


def compile_untuned(mod, target: dict):
    from tvm import relax

    return relax.build(mod, target=make_target(target))


def vm_function(executable):
    import tvm
    from tvm import relax

    device = tvm.cpu(0)
    vm = relax.VirtualMachine(executable, device)

    def call(tensor):
        out = vm["main"](tensor)
        while not hasattr(out, "numpy"):  # torch.export outputs come back as a tuple
            out = out[0]
        return out

    return call, device


def latencies(calls: dict, timing: dict) -> dict[str, list[float]]:
    """Seconds per call of each variant. Calls alternate between the variants (this host's speed
    drifts by ~25% over tens of seconds, so back-to-back blocks would compare different machines).
    One warm-up call each: first-call allocation and page faults are not latency."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    started = time.perf_counter()
    for done in range(timing["runs"]):
        if done >= timing["min_runs"] and time.perf_counter() - started >= timing["max_seconds"] * len(calls):
            break
        for name, call in calls.items():
            begin = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - begin)
    return times


def evaluate(model_cfg: dict, seed: int, target: dict, database_dir: str, num_threads: int,
             timing: dict, out_dir: str, weight_prepack: bool) -> dict:
    import torch
    import tvm

    from tuning.hardware.relax_models import compile_with_database, load_model

    torch.set_num_threads(num_threads)
    loaded = load_model(model_cfg, seed, target)
    result = {"num_threads": num_threads, "tvm_num_threads": os.environ.get("TVM_NUM_THREADS")}
    started = time.perf_counter()
    tuned_exec = compile_with_database(loaded.mod, target, database_dir, weight_prepack)
    result["compile_tuned_s"] = time.perf_counter() - started
    started = time.perf_counter()
    untuned_exec = compile_untuned(loaded.mod, target)
    result["compile_untuned_s"] = time.perf_counter() - started

    tuned, device = vm_function(tuned_exec)
    untuned, _ = vm_function(untuned_exec)
    x = tvm.runtime.tensor(loaded.example, device)
    outputs = {"tuned": tuned(x).numpy(), "untuned": untuned(x).numpy()}
    calls = {"tuned": lambda: tuned(x)}
    if loaded.torch_module is not None:
        example = torch.from_numpy(loaded.example)
        with torch.no_grad():
            outputs["torch"] = _first(loaded.torch_module(example)).numpy()
        calls["torch"] = torch.no_grad()(lambda: loaded.torch_module(example))
    runs = latencies(calls, timing)
    runs.update(latencies({"untuned": lambda: untuned(x)}, {**timing, "runs": timing["min_runs"]}))
    reference = "torch" if "torch" in outputs else "untuned"
    expected = outputs[reference]
    difference = float(np.max(np.abs(outputs["tuned"] - expected)))
    scale = max(1.0, float(np.max(np.abs(expected))))
    result.update({
        "reference": reference,
        "max_abs_diff": difference,
        "tolerance": 1e-4 * scale,
        "match": bool(np.allclose(outputs["tuned"], expected, rtol=1e-3, atol=1e-4 * scale)),
        "untuned_matches_reference": bool(np.allclose(outputs["untuned"], expected, rtol=1e-3, atol=1e-4 * scale)),
        "latency_ms": {name: float(np.median(times)) * 1e3 for name, times in runs.items()},
        "runs": {name: len(times) for name, times in runs.items()},
        "latencies_ms": {name: [t * 1e3 for t in times] for name, times in runs.items()},
    })
    np.save(os.path.join(out_dir, "e2e_input.npy"), loaded.example)
    np.save(os.path.join(out_dir, "e2e_output.npy"), outputs["tuned"])
    return result


def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output
