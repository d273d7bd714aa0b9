"""What the end-to-end workers run (tuning/hardware/e2e.py drives them; never imported by the parent).

One worker holds the TVM builds of a model (tuned with the run's MetaSchedule
database, and untuned), another the torch module, each in its own process
with its own thread pool: in one process, the idle-spinning threads of one
runtime slow the other's calls (torch eager read 33 ms beside TVM's pool and
26 ms alone on this 2-core host).
"""
from __future__ import annotations

import time

_variants: dict = {}  # name -> a callable that runs the model once on the stored input


def init_tvm(target: dict) -> None:
    from tuning.hardware.tvm_space import fast_tensor_intrin_import

    fast_tensor_intrin_import(target.get("kind", "llvm"))
    import tvm  # noqa: F401


def init_torch() -> None:
    import torch  # noqa: F401


def prepare_tvm(model_cfg: dict, seed: int, target: dict, device: str, database_dir: str,
                weight_prepack: bool) -> dict:
    """Compile tuned and untuned for `target`, load them on `device` (a device string: "cpu",
    "cuda:1"); returns their outputs, the input, and compile seconds."""
    import tvm
    from tvm import relax

    from tuning.hardware.relax_models import compile_with_database, load_model
    from tuning.hardware.tvm_device import tvm_device
    from tuning.hardware.tvm_space import make_target

    loaded = load_model(model_cfg, seed, target)
    started = time.perf_counter()
    tuned = compile_with_database(loaded.mod, target, database_dir, weight_prepack)
    compile_tuned_s = time.perf_counter() - started
    started = time.perf_counter()
    untuned = relax.build(loaded.mod, target=make_target(target))
    compile_untuned_s = time.perf_counter() - started
    dev = tvm_device(device)
    x = tvm.runtime.tensor(loaded.example, dev)
    for name, executable in (("tuned", tuned), ("untuned", untuned)):
        vm = relax.VirtualMachine(executable, dev)
        _variants[name] = (lambda vm=vm: _first_tensor(vm["main"](x)))
    return {"example": loaded.example, "compile_tuned_s": compile_tuned_s, "compile_untuned_s": compile_untuned_s,
            "outputs": {name: _variants[name]().numpy() for name in ("tuned", "untuned")}}


def prepare_torch(network: str, seed: int, num_threads: int | None) -> dict:
    import torch

    from tuning.networks import build_network

    if num_threads:
        torch.set_num_threads(num_threads)
    module, example = build_network(network, seed)

    @torch.no_grad()
    def call():
        output = module(example)
        return output[0] if isinstance(output, (tuple, list)) else output

    _variants["torch"] = call
    return {"outputs": {"torch": call().numpy()}, "example": example.numpy()}


def time_block(name: str, runs: int, min_runs: int, max_seconds: float) -> list[float]:
    """Seconds of up to `runs` back-to-back calls (at least `min_runs`, stopping after `max_seconds`),
    after one untimed call (warm-up; the other process's idle threads go to sleep meanwhile)."""
    call = _variants[name]
    call()
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < runs and (len(times) < min_runs or time.perf_counter() - started < max_seconds):
        begin = time.perf_counter()
        call()
        times.append(time.perf_counter() - begin)
    return times


def _first_tensor(output):
    while not hasattr(output, "numpy"):  # torch.export outputs come back as a tuple
        output = output[0]
    return output
