"""hardware=cpu: real kernels built by TVM (llvm) and timed on this host's CPU.

Only what is CPU-specific lives here: the llvm target (mcpu, num-cores), the
"cpu" device, TVM_NUM_THREADS for the measuring process (1 for the build
processes), and the CPU model tag. Spaces, measuring, exports and whole
models are TVMHardware's (tvm_backend.py); the worker processes are the
runner's (tuning/hardware/runners/, hardware/runner=local by default).
"""
from __future__ import annotations

from tuning.core.task import WORKLOAD_SPACES
from tuning.hardware.gpu_pack_runner import cpu_name as cpu_model  # standalone there: a pack carries it
from tuning.hardware.runners.base import Runner
from tuning.hardware.tvm_backend import TVMHardware


class CPUHardware(TVMHardware):
    """Hyperparameters:
    mcpu           LLVM cpu name; "auto" asks LLVM for the device's (e.g. znver3): the host's, or
                   what a remote runner's devices report
    num_threads    runtime threads for measuring (TVM_NUM_THREADS); also the target's num-cores
    build_workers  parallel build processes
    weight_prepack whole models: let schedules choose the (constant) weights' layout; the rewrite is
                   folded into the weights when the model is compiled (MetaSchedule's
                   cpu_weight_prepack). Kernels whose weight layout changed are timed on zeros and
                   not checked one by one; the whole model's output is checked against torch.
    store          a measurement store file every reading is written to (docs/store.md), or None
    reuse          answer configs the store already holds from it instead of measuring them again
    runner         where kernels are built and timed (conf/hardware/runner/: local, this host's device)
    """

    name = "cpu"
    device = "cpu"
    default_prior = "package:cpu"  # pre-trained on the lab's CPU stores (docs/methods.md §The first-round prior)
    model_spaces = ("full", *WORKLOAD_SPACES)
    ranges = {"num_threads": (1, 256), "build_workers": (1, 64)}

    def __init__(self, mcpu: str = "auto", num_threads: int = 2, build_workers: int = 1,
                 weight_prepack: bool = True, store: str | None = None, reuse: bool = False,
                 runner: Runner | None = None):
        super().__init__(runner)
        self.store = store
        self.reuse = reuse
        self.mcpu = mcpu
        self.weight_prepack = weight_prepack
        self.num_threads = num_threads
        self.build_workers = build_workers

    @property
    def target(self) -> dict:
        if self.mcpu == "auto":  # the device's own, where the runner's devices say which it is
            from tvm.target.codegen import llvm_get_system_cpu

            self.mcpu = self.runner.identity().get("mcpu") or str(llvm_get_system_cpu())
        return {"kind": "llvm", "mcpu": self.mcpu, "num-cores": self.num_threads}

    def worker_env(self) -> dict:
        return {"TVM_NUM_THREADS": self.num_threads}

    def build_env(self) -> dict:
        return {"TVM_NUM_THREADS": 1}  # a compile must not steal the measuring cores' threads

    def describe(self) -> dict:
        return {"num_threads": self.num_threads, "cpu_model": cpu_model(), **super().describe()}
