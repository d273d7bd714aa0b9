"""hardware=cuda: kernels for an NVIDIA GPU, from MetaSchedule's CUDA design spaces (docs/gpus.md).

Only what is CUDA-specific lives here: the target (the required `arch` and the GPU's limits, which
MetaSchedule's GPU verification checks every schedule against before anything is built), the
"cuda" device, and the GPU's name in the fingerprint. Builds compile every kernel to a cubin with
nvcc on this host (tvm_worker.export, cuda_compile.py), so a GPU host needs only TVM's runtime; the
reference output is computed on this host's CPU (tvm_worker.reference_arrays). Timing on the GPU is
the runner's: hardware/runner=local on a workstation with the GPU and TVM, or the offline pack
(`tunelab dataset gpu-batch export`) on a GPU host with only TVM's runtime.
"""
from __future__ import annotations

from tuning.hardware.cuda_compile import MIN_ARCH, arch_number, no_nvcc, uncompilable
from tuning.hardware.runners.base import Runner
from tuning.hardware.tvm_backend import TVMHardware

AUTO = "auto"


class CUDAHardware(TVMHardware):
    """Hyperparameters:
    arch                         the GPU's compute capability as nvcc names it: sm_80 (A100), sm_86,
                                 sm_89, sm_90 (H100), ... (required; sm_75 or later)
    gpu                          the GPU's name as its driver reports it, in the store's fingerprint
                                 ("auto": read from the device; a replay on a host without it names it)
    max_threads_per_block, max_shared_memory_per_block, thread_warp_size, registers_per_block
                                 the GPU's limits; schedules that exceed them are invalid before building
    build_workers                parallel build processes (each runs nvcc)
    store, reuse                 the measurement store (docs/store.md), as for hardware=cpu
    runner                       where kernels are timed (conf/hardware/runner/)
    """

    name = "cuda"
    device = "cuda"
    model_kinds = ("gemm", "batch_matmul", "conv2d")  # whole models on a GPU: not yet (docs/gpus.md §Whole models)
    ranges = {"build_workers": (1, 64), "max_threads_per_block": (32, 4096),
              "max_shared_memory_per_block": (1024, 1 << 20), "thread_warp_size": (1, 128),
              "registers_per_block": (1024, 1 << 20)}

    def __init__(self, arch: str = "", gpu: str = AUTO, max_threads_per_block: int = 1024,
                 max_shared_memory_per_block: int = 49152, thread_warp_size: int = 32,
                 registers_per_block: int = 65536, build_workers: int = 1, store: str | None = None,
                 reuse: bool = False, runner: Runner | None = None):
        super().__init__(runner)
        self.arch = arch
        self.gpu = gpu
        self.limits = {"max_threads_per_block": max_threads_per_block,
                       "max_shared_memory_per_block": max_shared_memory_per_block,
                       "thread_warp_size": thread_warp_size, "registers_per_block": registers_per_block}
        self.build_workers = build_workers
        self.store = store
        self.reuse = reuse

    @classmethod
    def check(cls, params, group):
        problems = super().check(params, group)
        number = arch_number(params.get("arch") or "")
        if number is None or number < MIN_ARCH:
            problems.append(f"{group}.arch: expected the GPU's sm_XX arch, sm_{MIN_ARCH} or later (e.g. "
                            f"{group}.arch=sm_90 for an H100, sm_80 for an A100), got {params.get('arch')!r}")
        if not str(params.get("gpu") or "").strip():
            problems.append(f"{group}.gpu: the GPU's name, or {AUTO!r} to read it from the device")
        return problems

    @classmethod
    def missing_here(cls, params, group):
        """No GPU here (the runner's), then no nvcc: said before a missing arch, which cannot help."""
        compiler = no_nvcc(f"{group}.arch")
        return super().missing_here(params, group) + ([compiler] if compiler else [])

    @property
    def target(self) -> dict:
        return {"kind": "cuda", "arch": self.arch, **self.limits}

    def worker_env(self) -> dict:
        return {}

    def unbuildable(self) -> str | None:
        return uncompilable(self.arch)

    def unreachable(self) -> str | None:
        """nvcc compiles for the arch here, then the runner's devices (a GPU of this host)."""
        return self.unbuildable() or super().unreachable() or self.unnamed()

    def identified(self) -> str | None:
        """The GPU's name as its runner's device reports it (None where there is none)."""
        return self.attached().identity().get("gpu")

    def unnamed(self) -> str | None:
        if self.gpu == AUTO and not self.identified():
            return ("hardware.gpu: auto reads the GPU's name from the device, and there is none here; a replay of "
                    "GPU readings names the GPU they were taken on (tunelab dataset stats lists it), e.g. "
                    "hardware.backend.gpu='NVIDIA H100 80GB HBM3'")
        return None

    def gpu_name(self) -> str:
        if self.gpu != AUTO:
            return self.gpu
        name = self.identified()
        if not name:
            raise ValueError(self.unnamed())
        self.gpu = name  # read once
        return name

    def describe(self) -> dict:
        return {**super().describe(), "gpu": self.gpu_name()}
