"""The TVM workers on a target other than this host's CPU: device strings, the correctness reference
and the drift gauge for a GPU target, pooling fallbacks under the target's key, and sketches with a
sampling instruction tunelab cannot read. Nothing here needs a GPU: CUDA code is only compiled."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.tvm

CUDA = {"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024, "max_shared_memory_per_block": 49152,
        "thread_warp_size": 32}
LLVM = {"kind": "llvm"}
GEMM = {"op": "gemm", "M": 32, "N": 16, "K": 8, "dtype": "float32"}


def needs_cuda_codegen():
    import tvm

    if tvm.get_global_func("target.build.cuda", allow_missing=True) is None:
        pytest.skip("this TVM cannot generate CUDA code")


# ---- device strings ---------------------------------------------------------------------------------
@pytest.mark.parametrize("device, parsed", [("cpu", ("cpu", 0)), ("cpu:0", ("cpu", 0)), ("cuda:1", ("cuda", 1))])
def test_device_strings_name_a_kind_and_an_index(device, parsed):
    import tvm

    from tuning.hardware.tvm_device import parse_device, tvm_device

    assert parse_device(device) == parsed
    assert tvm_device(device) == tvm.device(*parsed)


@pytest.mark.parametrize("device", ["", ":1", "cuda:x", "cuda:-1", "bogus:0"])
def test_a_bad_device_string_is_refused_naming_it(device):
    from tuning.hardware.tvm_device import tvm_device

    with pytest.raises(ValueError, match=f"device '{device}'"):
        tvm_device(device)


# ---- the correctness reference ------------------------------------------------------------------------
def test_untuned_tir_runs_on_a_cpu_target_only():
    from tuning.hardware.tvm_space import untuned_runs_on

    assert untuned_runs_on(LLVM) and untuned_runs_on({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})
    assert not untuned_runs_on(CUDA)


def test_a_gpu_targets_reference_is_computed_on_this_host():
    """The untuned kernel cannot run on a GPU: the reference comes from it built for this host's CPU,
    with the same inputs a CPU target gets; no CUDA device is touched."""
    from tuning.hardware.tvm_worker import reference_arrays

    inputs, expected = reference_arrays(GEMM, CUDA, "cuda:0")
    cpu_inputs, cpu_expected = reference_arrays(GEMM, LLVM, "cpu:0")
    assert [a.shape for a in inputs] == [(32, 8), (8, 16), (32, 16)]
    assert all(np.array_equal(a, b) for a, b in zip(inputs, cpu_inputs))
    assert np.array_equal(expected, cpu_expected)
    assert np.allclose(expected, inputs[0].astype("float64") @ inputs[1], rtol=1e-5, atol=1e-5)


# ---- the drift gauge ----------------------------------------------------------------------------------
def test_the_cpu_gauge_is_the_untuned_gemm():
    import tvm_ffi

    from tuning.hardware.tvm_space import workload_module
    from tuning.hardware.tvm_worker import GAUGE_WORKLOAD, gauge_module

    assert tvm_ffi.structural_equal(gauge_module(LLVM), workload_module(GAUGE_WORKLOAD))


def test_the_gpu_gauge_binds_threads_and_builds_for_cuda():
    from tuning.hardware.tvm_worker import _compile, gauge_module

    needs_cuda_codegen()
    lib = _compile(gauge_module(CUDA), CUDA)
    assert [m.kind for m in lib.imports] == ["cuda"]


# ---- design spaces on another target ------------------------------------------------------------------
def test_pool_fallbacks_go_under_the_key_tvm_looks_up_first():
    import tvm_ffi

    from tuning.hardware.tvm_space import POOL_RULES, register_pool_fallbacks, target_key

    assert target_key(LLVM) == "cpu" and target_key(CUDA) == "cuda"
    register_pool_fallbacks(target_key(CUDA))
    for rule in POOL_RULES:
        assert tvm_ffi.get_global_func(f"s_tir.meta_schedule.cuda.meta_schedule.{rule}", allow_missing=True)


@pytest.mark.slow
def test_a_gpu_pooling_kernel_is_scheduled_without_a_warning(capfd):
    """TOPI's pooling blocks name a custom rule no target registers; the fallback for the target's
    own key removes it quietly (CUDA's tensor intrinsics: half a minute to import)."""
    import tvm
    from tvm import te, topi

    from tuning.hardware.tvm_space import tune_context

    X = te.placeholder((1, 8, 16, 16), "float32", name="X")
    Y = topi.nn.pool2d(X, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max", layout="NCHW")
    spaces = tune_context(tvm.IRModule({"main": te.create_prim_func([X, Y])}), CUDA).generate_design_space()
    assert spaces and "Unknown schedule rule" not in capfd.readouterr().err


def test_a_sampling_instruction_that_is_no_knob_is_an_error_naming_it():
    """replay hands a decision to every Sample* instruction: one that _read_knobs skipped would shift
    every decision after it."""
    from tvm import s_tir

    from tuning.hardware.tvm_space import TaskSchedules, workload_module

    mod = workload_module(GEMM)
    sch = s_tir.Schedule(mod)
    i, _, _ = sch.get_loops(sch.get_sblock("C"))
    sch.sample_perfect_tile(i, n=2)
    sch.sample_partitioned_tile(i, n=2, partition_pos=1, innerpart_factor=1)
    schedules = object.__new__(TaskSchedules)  # only the knob reader: no design spaces generated
    schedules.mod, schedules.tiling = mod, False
    with pytest.raises(ValueError, match="SamplePartitionedTile"):
        schedules._read_knobs(sch.trace)


# ---- exports ------------------------------------------------------------------------------------------
def test_the_snippet_loads_the_library_on_the_device_it_was_exported_for():
    from tuning.hardware.tvm_export import snippet

    args = [[[32, 8], "float32"], [[8, 16], "float32"], [[32, 16], "float32"]]
    assert "dev = tvm.device('cuda', 1)\n" in snippet(GEMM, Path("gemm.so"), args, "cuda:1")
    assert "dev = tvm.device('cpu', 0)\n" in snippet(GEMM, Path("gemm.so"), args)
