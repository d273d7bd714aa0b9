"""What the end-to-end workers run (tuning/hardware/e2e.py drives them; never imported by the parent).

One worker holds the TVM builds of a model (tuned with the run's MetaSchedule
database, and untuned), another the torch module (or, for an ONNX file, an
onnxruntime session), each in its own process
with its own thread pool: in one process, the idle-spinning threads of one
runtime slow the other's calls (torch eager read 33 ms beside TVM's pool and
26 ms alone on this 2-core host).
"""
from __future__ import annotations

import time

import numpy as np

_variants: dict = {}  # name -> a callable that runs the model once on the stored input
_input_writers: dict = {}  # name -> a callable that writes the stored input again (a caller's fresh input)
_device_timed: dict = {}  # name -> runs -> seconds per run, timed on a remote device by its own clock
_sessions: list = []  # a remote device's session, held for as long as the worker lives
_tuned_local: list = []  # (vm, input) of the tuned build on this host: its kernels are read one by one


def init_tvm(target: dict) -> None:
    from tuning.hardware.tvm_space import fast_tensor_intrin_import

    fast_tensor_intrin_import(target.get("kind", "llvm"))
    import tvm  # noqa: F401


def init_torch() -> None:
    import torch  # noqa: F401


def prepare_tvm(model_cfg: dict, seed: int, target: dict, device: str, database_dir: str,
                weight_prepack: bool, remote: dict | None = None) -> dict:
    """Compile tuned and untuned for `target`, load them on `device` (a device string: "cpu",
    "cuda:1") of this host or, with `remote` (tracker, key, priority, session_timeout_s), of a server
    of the key; returns their outputs, the input, compile seconds and the remote device's name."""
    import tvm
    from tvm import relax

    from tuning.hardware.kernel_context import input_writer
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
    executables = {"tuned": tuned, "untuned": untuned}
    if remote:
        name = _load_remotely(executables, remote, device, loaded.example)
    else:
        dev = tvm_device(device)
        x = tvm.runtime.tensor(loaded.example, dev)
        write_x = input_writer(x)  # both builds read the one input tensor
        for variant, executable in executables.items():
            vm = relax.VirtualMachine(executable, dev)
            _variants[variant] = (lambda vm=vm: _first_tensor(vm["main"](x)))
            _input_writers[variant] = write_x
            if variant == "tuned":
                _tuned_local[:] = [(vm, x)]
        name = None
    return {"example": loaded.example, "compile_tuned_s": compile_tuned_s, "compile_untuned_s": compile_untuned_s,
            "outputs": {variant: _variants[variant]().numpy() for variant in executables}, "remote_device": name}


def _load_remotely(executables: dict, remote: dict, device: str, example) -> str:
    """Each executable exported, uploaded to one server of the key and loaded in a VM there; its
    runs timed by the device's own clock (relax VM time_evaluator). The device's name."""
    import json
    import os
    import tempfile

    import tvm
    from tvm import relax, rpc

    from tuning.hardware.rpc_server import IDENTITY_FUNCTION
    from tuning.hardware.tvm_device import parse_device

    host, port = remote["tracker"].rsplit(":", 1)
    session = rpc.connect_tracker(host, int(port)).request(remote["key"], priority=remote["priority"],
                                                           session_timeout=remote["session_timeout_s"])
    kind, index = parse_device(device)
    dev = session.device(kind, index)
    x = tvm.runtime.tensor(example, dev)
    for variant, executable in executables.items():
        with tempfile.TemporaryDirectory(prefix="tunelab-e2e-") as folder:
            path = os.path.join(folder, f"{variant}.so")
            executable.export_library(path)
            session.upload(path)
        vm = relax.VirtualMachine(session.load_module(f"{variant}.so"), dev)
        vm.set_input("main", x)  # the stateful calls: a tuple output cannot come back over RPC otherwise
        _variants[variant] = (lambda vm=vm: (vm.invoke_stateful("main"), _first_tensor(vm.get_outputs("main")))[1])
        _device_timed[variant] = (lambda runs, vm=vm: list(
            vm.time_evaluator("invoke_stateful", dev, number=1, repeat=runs)("main").results))
    _sessions.append(session)
    try:
        name = json.loads(session.get_function(IDENTITY_FUNCTION)()).get("name")
    except (AttributeError, RuntimeError):
        name = None
    return f"{remote['key']}@{name}" if name else f"{remote['key']} (TVM's stock server)"


def prepare_torch(network: str, seed: int, num_threads: int | None) -> dict:
    import torch

    from tuning.core.networks import build_network

    if num_threads:
        torch.set_num_threads(num_threads)
    module, example = build_network(network, seed)

    @torch.no_grad()
    def call():
        output = module(example)
        return output[0] if isinstance(output, (tuple, list)) else output

    _variants["torch"] = call
    values = example.clone()
    _input_writers["torch"] = lambda: example.copy_(values)
    return {"outputs": {"torch": call().numpy()}, "example": example.numpy()}


def init_onnxruntime() -> None:
    import onnxruntime  # noqa: F401


def prepare_onnxruntime(path: str, example, num_threads: int | None) -> dict:
    """onnxruntime's CPU session of the ONNX file: `num_threads` intra-op threads (None: its
    default), one inter-op thread, operators in sequence; its output on `example` and its version."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if num_threads:
        options.intra_op_num_threads = num_threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    session = onnxruntime.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    feed = {name: np.ascontiguousarray(example)}
    values = feed[name].copy()
    _variants["onnxruntime"] = lambda: session.run(None, feed)[0]
    _input_writers["onnxruntime"] = lambda: np.copyto(feed[name], values)
    return {"outputs": {"onnxruntime": _variants["onnxruntime"]()}, "version": onnxruntime.__version__}


def time_block(name: str, runs: int, min_runs: int, max_seconds: float, fresh_input: bool = True) -> list[float]:
    """Seconds of up to `runs` calls (at least `min_runs`, stopping after `max_seconds`), after one
    untimed call (warm-up; the other process's idle threads go to sleep meanwhile). With
    `fresh_input` the input is written before each call, untimed, as a caller hands a model an input
    it has just produced: back to back on one untouched input, the model's first kernels read it
    from memory (the rest of the model has evicted it), which no caller with new inputs pays. A
    remote device times back-to-back runs by its own clock, the input untouched."""
    if name in _device_timed:  # a remote device: its own clock, never the network's
        return _device_timed[name](max(runs, min_runs))
    call = _variants[name]
    write_input = _input_writers[name] if fresh_input else (lambda: None)
    call()
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < runs and (len(times) < min_runs or time.perf_counter() - started < max_seconds):
        write_input()
        begin = time.perf_counter()
        call()
        times.append(time.perf_counter() - begin)
    return times


def tuned_kernels(runs: int, fresh_input: bool = True) -> dict:
    """Each kernel's seconds per call inside the tuned model on this host (kernel_context.kernels_in_model),
    {} for a model run on a remote device."""
    from tuning.hardware.kernel_context import kernels_in_model

    if not _tuned_local:
        return {}
    vm, x = _tuned_local[0]
    return kernels_in_model(vm, x, runs, fresh_input)


def _first_tensor(output):
    while not hasattr(output, "numpy"):  # torch.export outputs come back as a tuple
        output = output[0]
    return output
