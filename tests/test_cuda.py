"""hardware=cuda without a GPU: MetaSchedule's CUDA design spaces for the lab's tasks, canonical configs,
GPU verification against the target's limits, kernels compiled to cubins by nvcc, the GPU error kinds,
and the checks that refuse what cannot work here, each naming its key. Tests that time kernels on a
GPU carry the `gpu` marker and are skipped where there is none."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.tvm

REPO = Path(__file__).resolve().parents[1]
CUDA = {"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024, "max_shared_memory_per_block": 49152,
        "thread_warp_size": 32, "registers_per_block": 65536}
GEMM_1024 = {"op": "gemm", "M": 1024, "N": 1024, "K": 1024, "dtype": "float32"}
CONV_L8 = {"op": "conv2d", "batch": 1, "in_channels": 256, "height": 14, "width": 14, "out_channels": 512,
           "kernel": 1, "stride": 2, "padding": 0, "dtype": "float32"}


def needs_nvcc(arch: str = "sm_90"):
    from tuning.hardware.cuda_compile import uncompilable

    problem = uncompilable(arch)
    if problem:
        pytest.skip(problem)


def has_gpu() -> bool:
    from tuning.hardware.tvm_device import device_name

    return device_name("cuda:0") is not None


def needs_gpu():
    if not has_gpu():
        pytest.skip("no CUDA GPU (with its driver) on this host")


# ---- design spaces ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spaces():
    from tuning.hardware.tvm_space import TaskSchedules

    return {"gemm_1024": TaskSchedules(GEMM_1024, CUDA), "conv_l8": TaskSchedules(CONV_L8, CUDA)}


@pytest.mark.parametrize("name", ["gemm_1024", "conv_l8"])
def test_cuda_design_spaces_are_metaschedules_cuda_rules_with_gpu_verification_last(spaces, name):
    schedules = spaces[name]
    postprocs = [type(p).__name__ for p in schedules.postprocs]
    assert postprocs[-1] == "VerifyGPUCode" and "RewriteCooperativeFetch" in postprocs
    assert len(schedules.sketches) >= 2 and schedules.space.size > 10**8
    kinds = {k.kind for k in schedules.space.knobs}
    assert {"sketch", "tile", "categorical"} <= kinds
    trace = str(schedules.sketches[0])
    assert "threadIdx.x" in trace and "shared" in trace  # thread binding, shared-memory caching


@pytest.mark.parametrize("name", ["gemm_1024", "conv_l8"])
def test_cuda_configs_are_canonical_and_verified_against_the_targets_limits(spaces, name):
    space = spaces[name].space
    rng = np.random.default_rng(0)
    legitimate, rejected = [], []
    for _ in range(50):
        config = space.canonical(space.sample(rng))
        assert space.canonical(config) == config
        (legitimate if space.is_legitimate(config) else rejected).append(config)
    assert legitimate and rejected  # a uniform sample of a GPU space: most exceed the thread or memory limits
    with pytest.raises(ValueError, match="VerifyGPUCode"):
        spaces[name].schedule(rejected[0])
    sch, effective = spaces[name].schedule(legitimate[0])
    assert tuple(effective) == legitimate[0]
    assert "threadIdx" in sch.mod.script()


def test_a_tighter_shared_memory_limit_rejects_more_configs():
    from tuning.hardware.tvm_space import TaskSchedules

    small = TaskSchedules(GEMM_1024, {**CUDA, "max_shared_memory_per_block": 4096})
    large = TaskSchedules(GEMM_1024, CUDA)
    rng = np.random.default_rng(1)
    configs = [large.space.canonical(large.space.sample(rng)) for _ in range(50)]
    assert sum(map(small.space.is_legitimate, configs)) < sum(map(large.space.is_legitimate, configs))


@pytest.fixture(scope="module")
def fresh_process():
    """A fresh process builds a cuda space, says whether that imported the CUDA tensor intrinsics, then
    builds an llvm space and says whether it has configs."""
    code = ("import sys; from tuning.hardware.tvm_space import TaskSchedules; "
            f"TaskSchedules({GEMM_1024!r}, {CUDA!r}); "
            "print('tvm.s_tir.tensor_intrin.cuda' in sys.modules, flush=True); "
            "s = TaskSchedules({'op': 'gemm', 'M': 64, 'N': 64, 'K': 64, 'dtype': 'float32'}, "
            "{'kind': 'llvm', 'mcpu': 'cascadelake', 'num-cores': 2}); "
            "print(s.space.size > 0)")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_the_cuda_rules_need_no_tensor_intrinsic_import(fresh_process):
    """MetaSchedule would pick its tensor-core rules for sm_90, which need every CUDA intrinsic
    (8.5 s of imports in every process); the lab's cuda rules need none."""
    assert fresh_process.stdout.split()[:1] == ["False"], fresh_process.stderr[-2000:]


# ---- the hardware config ----------------------------------------------------------------------------
def run_cli(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run.py", "hardware=cuda", "model=gemm_64", "tracking=none", *overrides],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("overrides, says", [
    ((), "hardware.arch: expected the GPU's sm_XX arch"),
    (("hardware.arch=sm_70",), "hardware.arch: expected the GPU's sm_XX arch"),
    (("hardware.arch=ampere",), "got 'ampere'"),
    (("hardware.arch=sm_90", "hardware.max_threads_per_block=0"), "hardware.max_threads_per_block"),
    (("hardware.arch=sm_90", "model=resnet18"), "model.kind=network")])
def test_hardware_cuda_refuses_what_it_cannot_do_naming_the_key(compose_cfg, overrides, says):
    from tuning.config import ConfigError
    from tuning.engine.validate import validate

    with pytest.raises(ConfigError, match=says.replace(".", r"\.").replace("(", r"\(")):
        validate(compose_cfg("hardware=cuda", "model=gemm_64", "tracking=none", *overrides))


def test_hardware_cuda_on_a_host_without_a_gpu_says_so_before_any_work(tmp_path, monkeypatch):
    import tunelab
    from tuning.config import ConfigError

    needs_nvcc()
    if has_gpu():
        pytest.skip("this host has a GPU")
    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "outputs"))
    with pytest.raises(ConfigError, match="hardware.runner.device_index: this host has no cuda:0"):
        tunelab.tune(["hardware=cuda", "model=gemm_64", "tracking=none", "hardware.arch=sm_90",
                      f"output_dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run" / "records.jsonl").exists()


def test_an_arch_this_nvcc_does_not_know_is_refused():
    from tuning.hardware.cuda_compile import uncompilable

    needs_nvcc()
    assert "does not compile for sm_999" in uncompilable("sm_999")


def test_the_target_carries_the_arch_and_the_limits():
    from tuning.hardware.cuda import CUDAHardware

    hardware = CUDAHardware(arch="sm_80", gpu="NVIDIA A100-SXM4-40GB", max_shared_memory_per_block=65536)
    assert hardware.target == {**CUDA, "arch": "sm_80", "max_shared_memory_per_block": 65536}
    described = hardware.describe()
    assert described["gpu"] == "NVIDIA A100-SXM4-40GB" and described["hardware"] == "cuda"
    assert "sm_80" in described["target"]


def test_a_gpu_named_auto_without_a_device_cannot_describe_itself():
    from tuning.hardware.cuda import CUDAHardware

    if has_gpu():
        pytest.skip("this host has a GPU")
    hardware = CUDAHardware(arch="sm_90")
    assert "hardware.gpu: auto" in hardware.unnamed()
    with pytest.raises(ValueError, match="hardware.backend.gpu="):
        hardware.describe()
    assert CUDAHardware(arch="sm_90", gpu="NVIDIA H100 80GB HBM3").unnamed() is None


def test_a_replay_that_never_measures_needs_no_gpu_only_its_name(tmp_path):
    from tuning.hardware.cuda import CUDAHardware
    from tuning.hardware.replay import ReplayHardware

    if has_gpu():
        pytest.skip("this host has a GPU")
    named = ReplayHardware(CUDAHardware(arch="sm_90", gpu="NVIDIA H100 80GB HBM3"), str(tmp_path / "s.sqlite"),
                           on_miss="error")
    assert named.unreachable() is None
    unnamed = ReplayHardware(CUDAHardware(arch="sm_90"), str(tmp_path / "s.sqlite"), on_miss="error")
    assert "hardware.gpu" in unnamed.unreachable()
    measuring = ReplayHardware(CUDAHardware(arch="sm_90", gpu="NVIDIA H100 80GB HBM3"), str(tmp_path / "s.sqlite"))
    assert "cuda:0" in measuring.unreachable() or "nvcc" in measuring.unreachable()


# ---- nvcc: kernels compiled to cubins ------------------------------------------------------------------
def test_an_exported_cuda_library_carries_a_cubin_not_source(tmp_path):
    import tvm

    from tuning.hardware.cuda_compile import blob_of_library, cuda_formats, parse_blob, parse_cuda_module
    from tuning.hardware.tvm_worker import _compile, export, gauge_module

    needs_nvcc()
    path = tmp_path / "gauge.so"
    export(_compile(gauge_module(CUDA), CUDA), CUDA, str(path))
    blob = blob_of_library(path)
    assert cuda_formats(blob) == ["cubin"]
    _, _, modules = parse_blob(blob)
    _, table, cubin = parse_cuda_module(dict(m for m in modules if m[0] == "cuda")["cuda"])
    assert cubin[:4] == b"\x7fELF" and b"main_kernel" in table  # a cubin is an ELF file; the kernel's entry
    with pytest.raises(Exception, match="load_from_bytes.cuda"):  # no CUDA runtime here: the loader is absent
        tvm.runtime.load_module(str(path))


def test_a_kernel_nvcc_refuses_is_a_build_error_before_it_travels(tmp_path, monkeypatch):
    from tuning.hardware import cuda_compile
    from tuning.hardware.tvm_worker import build

    needs_nvcc()
    from tuning.hardware.tvm_space import TaskSchedules

    def refused(source, arch, workdir):
        raise cuda_compile.CompileError(f"nvcc for {arch} failed: ptxas error")

    monkeypatch.setattr(cuda_compile, "compile_source", refused)

    schedules = TaskSchedules(GEMM_1024, CUDA)
    rng = np.random.default_rng(0)
    config = next(c for c in (schedules.space.canonical(schedules.space.sample(rng)) for _ in range(500))
                  if schedules.space.is_legitimate(c))
    result = build(GEMM_1024, CUDA, list(config), str(tmp_path / "k.so"))
    assert result["error"] == "build" and "ptxas error" in result["message"]


def test_the_blob_round_trips_and_refuses_truncation():
    from tuning.hardware.cuda_compile import cuda_module_bytes, parse_blob, parse_cuda_module, write_blob

    module = cuda_module_bytes("cuda", b"\x00" * 8, b"__global__ void k() {}")
    blob = write_blob([0, 1, 1], [1], [("_lib", None), ("cuda", module)])
    assert parse_blob(blob) == ([0, 1, 1], [1], [("_lib", None), ("cuda", module)])
    assert parse_cuda_module(module) == ("cuda", b"\x00" * 8, b"__global__ void k() {}")
    with pytest.raises(ValueError):
        parse_blob(blob[:-3])


# ---- GPU error kinds ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("message, kind", [
    ("CUDALaunch Error: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "out_of_resources"),
    ("too many resources requested for launch", "out_of_resources"),
    ("CUDA: an illegal memory access was encountered", "launch_failed"),
    ("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure", "launch_failed"),
    ("CUDA_ERROR_LAUNCH_TIMEOUT", "device_hang"),
    ("ValueError: cannot find file", None)])
def test_cuda_failures_are_error_kinds_of_their_own(message, kind):
    from tuning.core.records import ERROR_KINDS
    from tuning.hardware.gpu_pack_runner import gpu_error_kind

    assert gpu_error_kind(message) == kind
    assert kind is None or kind in ERROR_KINDS


def test_a_gpu_error_restarts_the_run_worker(monkeypatch):
    """The local runner turns a run worker's GPU error into its record kind and starts the worker
    again (a CUDA context is unusable after most errors)."""
    from tuning.core.measure import MeasureSpec
    from tuning.core.task import build_tasks
    from tuning.hardware.runners.base import Setup
    from tuning.hardware.runners.local import LocalRunner

    runner = LocalRunner()
    runner.attach(Setup(target=CUDA, device="cuda"))
    calls = []

    class FakeWorker:
        def call(self, function, *args, timeout):
            calls.append(function.split(":")[1])
            return "ok", {"error": "launch_failed", "message": "CUDA: illegal address", "run_s": 0.1,
                          "restart": True}

        def kill(self):
            calls.append("kill")

    runner.run_worker, runner.builds = FakeWorker(), object()
    task = build_tasks({"name": "gemm_64", "kind": "gemm", "M": 64, "N": 64, "K": 64})[0]
    monkeypatch.setattr(runner, "prepare", lambda t: calls.append("prepare"))
    result = runner._time(task, (0,), {"error": None, "build_s": 0.1, "path": "x.so", "args": []}, MeasureSpec(),
                          "cuda:0")
    assert result.error == "launch_failed" and calls == ["run", "kill", "prepare"]


# ---- on a GPU ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_hardware_cuda_tunes_on_this_hosts_gpu(tmp_path):
    needs_gpu()
    needs_nvcc()
    from tuning.hardware.tvm_device import device_name

    name = device_name("cuda:0")
    arch = "sm_" + __import__("tvm").cuda(0).compute_version.replace(".", "")
    done = run_cli(f"hardware.arch={arch}", "budget.trials=16", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr
    assert name and "best" in done.stdout


def test_a_library_that_fails_keeps_the_kernels_that_build(tmp_path, monkeypatch):
    """One kernel nvcc refuses costs only itself: the library is built again without it."""
    from tuning.hardware import cuda_compile
    from tuning.hardware.cuda_compile import blob_of_library, cuda_formats
    from tuning.hardware.gpu_pack import build_library
    from tuning.hardware.tvm_space import TaskSchedules

    def nvcc(source, arch, workdir):  # no nvcc run: a refusal for k1, a stand-in cubin otherwise
        if "k1_kernel" in source:
            raise cuda_compile.CompileError("nvcc for sm_90 failed: ptxas error in k1_kernel")
        return b"\x7fELF stand-in cubin"

    monkeypatch.setattr(cuda_compile, "compile_source", nvcc)
    schedules = TaskSchedules(GEMM_1024, CUDA)
    rng = np.random.default_rng(0)
    legitimate = []
    while len(legitimate) < 3:
        config = schedules.space.canonical(schedules.space.sample(rng))
        if schedules.space.is_legitimate(config) and config not in legitimate:
            legitimate.append(config)
    outcomes = build_library(GEMM_1024, CUDA, [[f"k{i}", list(c)] for i, c in enumerate(legitimate)],
                             str(tmp_path / "lib.so"))
    assert [o["error"] for o in outcomes] == [None, "build", None]
    assert "ptxas error in k1_kernel" in outcomes[1]["message"]
    assert cuda_formats(blob_of_library(tmp_path / "lib.so")) == ["cubin"]
    assert not (tmp_path / "lib.so.alone").exists()


def test_a_cpu_space_after_a_cuda_space_in_one_process_has_its_intrinsics(fresh_process):
    """The cuda rules import no tensor intrinsic; an llvm space built later in the same process still
    gets the CPU's (VNNI and the like), which its rules need."""
    assert fresh_process.returncode == 0, fresh_process.stderr[-2000:]
    assert fresh_process.stdout.split()[1:] == ["True"]
