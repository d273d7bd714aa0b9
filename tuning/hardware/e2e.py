"""Apply and time a whole model: tuned vs untuned TVM builds vs torch eager or onnxruntime (no TVM import here).

    evaluate_model(model_cfg, seed, database_dir, out_dir, timing,
                   target=..., device=..., env=..., num_threads=..., weight_prepack=...)

The caller (TVMHardware) passes its TVM target, device string ("cpu", "cpu:0",
"cuda:1"; tvm_device.py) and the measuring process's environment; with `remote` (a tracker, key,
priority and session timeout) the builds run and are timed on a server of the key, each run by the
device's own clock, and torch (which does not run there) checks the output but is not timed. The
TVM builds and the torch module live in two worker processes (e2e_worker.py); torch gets
`num_threads` threads (None: its default). Tuned and torch are timed in
alternating blocks (BLOCKS each, an untimed call first): this host's speed
drifts by ~25% over tens of seconds, so one long block each would compare two
different machines. The untuned build (seconds per call) gets `min_runs` calls.
With `fresh_input` (the default) every variant's input is written again before each
call, untimed, as a caller's new input would be (e2e_worker.time_block says why).
On this host each tuned kernel is then read inside the model by the VM's instrument
(`kernels_in_model`: seconds per call, calls per run), which the lab sets beside
each kernel's prediction.
Latency = median. The tuned output is checked against torch (or, for an ONNX
file, against onnxruntime; the untuned build where onnxruntime, an optional
extra, is not installed).

An ONNX file is timed beside onnxruntime's CPU session, the runtime its users
already have: the same input and intra-op thread count, in its own worker,
alternating with the tuned build like torch.
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np

from tuning.hardware.workers import Worker

WORKER = "tuning.hardware.e2e_worker"
BLOCKS = 5


def evaluate_model(model_cfg, seed, database_dir, out_dir, timing, *, target: dict, device: str, env: dict,
                   num_threads: int | None, weight_prepack: bool, remote: dict | None = None) -> dict:
    timeout = timing.get("timeout_s", 3600)
    fresh_input = bool(timing.get("fresh_input", True))
    workers = {"tvm": Worker(env, f"{WORKER}:init_tvm", init_args=(target,))}
    if model_cfg["kind"] == "network":
        workers["torch"] = Worker({"OMP_NUM_THREADS": num_threads} if num_threads else {}, f"{WORKER}:init_torch")
    elif has_onnxruntime():
        workers["onnxruntime"] = Worker({}, f"{WORKER}:init_onnxruntime")
    peer_version = None
    try:
        tvm_side = _call(workers["tvm"], "prepare_tvm", model_cfg, seed, target, device, str(database_dir),
                         weight_prepack, remote, timeout=timeout)
        outputs = dict(tvm_side["outputs"])
        owner = {"tuned": workers["tvm"], "untuned": workers["tvm"]}
        if "torch" in workers:
            torch_side = _call(workers["torch"], "prepare_torch", model_cfg["network"], seed, num_threads,
                               timeout=timeout)
            if not np.array_equal(torch_side["example"], tvm_side["example"]):
                raise RuntimeError("the torch and TVM workers built different inputs from the same seed")
            outputs.update(torch_side["outputs"])
            if not remote:  # torch runs on this host only: its output checks a remote run, its time does not compare
                owner["torch"] = workers["torch"]
        if "onnxruntime" in workers:
            runtime_side = _call(workers["onnxruntime"], "prepare_onnxruntime", model_cfg["path"], tvm_side["example"],
                                 num_threads, timeout=timeout)
            outputs.update(runtime_side["outputs"])
            peer_version = runtime_side["version"]
            if not remote:
                owner["onnxruntime"] = workers["onnxruntime"]
        times = _alternate({name: owner[name] for name in owner if name != "untuned"}, timing, fresh_input, timeout)
        times["untuned"] = _call(workers["tvm"], "time_block", "untuned", timing["min_runs"], timing["min_runs"],
                                 0.0, fresh_input, timeout=timeout)
        kernels = _call(workers["tvm"], "tuned_kernels", timing["runs"], fresh_input, timeout=timeout)
    finally:
        for worker in workers.values():
            worker.close()
    np.save(os.path.join(out_dir, "e2e_input.npy"), tvm_side["example"])
    np.save(os.path.join(out_dir, "e2e_output.npy"), outputs["tuned"])
    verdict = _verdict(outputs, times, num_threads, tvm_side)
    verdict["fresh_input"] = fresh_input and not remote
    if kernels:
        verdict["kernels_in_model"] = kernels
    if model_cfg["kind"] == "onnx":
        verdict["onnxruntime"] = peer_version or "not installed (pip install 'tunelab[onnxruntime]')"
    if remote:
        verdict["remote_device"] = tvm_side["remote_device"]
    return verdict


def _alternate(owners: dict, timing: dict, fresh_input: bool, timeout: float) -> dict[str, list[float]]:
    times = {name: [] for name in owners}
    per_block = -(-timing["runs"] // BLOCKS)
    for _ in range(BLOCKS):
        for name, worker in owners.items():
            wanted = min(per_block, timing["runs"] - len(times[name]))
            if wanted > 0:
                times[name] += _call(worker, "time_block", name, wanted, min(wanted, timing["min_runs"]),
                                     timing["max_seconds"] / BLOCKS, fresh_input, timeout=timeout)
    return times


def _verdict(outputs: dict, times: dict, num_threads: int, tvm_side: dict) -> dict:
    reference = next(name for name in ("torch", "onnxruntime", "untuned") if name in outputs)
    expected = outputs[reference]
    scale = max(1.0, float(np.max(np.abs(expected))))

    def close(name):
        return bool(np.allclose(outputs[name], expected, rtol=1e-3, atol=1e-4 * scale))

    return {
        "num_threads": num_threads,
        "reference": reference,
        "max_abs_diff": float(np.max(np.abs(outputs["tuned"] - expected))),
        "tolerance": 1e-4 * scale,
        "match": close("tuned"),
        "untuned_matches_reference": close("untuned"),
        "latency_ms": {name: float(np.median(t)) * 1e3 for name, t in times.items()},
        "runs": {name: len(t) for name, t in times.items()},
        "latencies_ms": {name: [x * 1e3 for x in t] for name, t in times.items()},
        "compile_tuned_s": tvm_side["compile_tuned_s"],
        "compile_untuned_s": tvm_side["compile_untuned_s"],
    }


def has_onnxruntime() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


def _call(worker: Worker, function: str, *args, timeout: float):
    status, value = worker.call(f"{WORKER}:{function}", *args, timeout=timeout)
    if status != "ok":
        raise RuntimeError(f"end-to-end evaluation: {function} failed ({status}): {value}")
    return value
