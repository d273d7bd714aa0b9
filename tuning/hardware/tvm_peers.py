"""The peers a benchmark compares tunelab with, on TVM's side (imports TVM).

MetaSchedule's own tuner (`tune_tir`: its evolutionary search, XGB model, builder and runner, with
tunelab's measurement settings) and the in-process timer that re-times every tuned kernel beside
torch and numpy. Used by experiments/bench_vs_peers.py; see docs/tvm.md §MetaSchedule as the peer
baseline.
"""
from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np

from tuning.hardware.tvm_device import tvm_device
from tuning.hardware.tvm_export import _call
from tuning.hardware.tvm_space import (
    fast_tensor_intrin_import,
    make_target,
    prim_func,
    register_pool_fallbacks,
    target_key,
)
from tuning.hardware.tvm_worker import reference_arrays

PROFILE_FILE = "profile.json"  # tune_tir's ms.Profiler seconds per scope, beside its database


def tune_with_metaschedule(workload: dict, target: dict, work_dir: Path, trials: int, seed: int, spec,
                           threads: int, trials_per_round: int = 64) -> None:
    """MetaSchedule's tune_tir on one operator; its database lands in `work_dir`."""
    from tvm.s_tir import meta_schedule as ms

    kind = target.get("kind", "llvm")
    fast_tensor_intrin_import(kind)
    register_pool_fallbacks(target_key(target))
    # each LocalBuilder worker imports the intrinsics too: without it every build times out (docs/tvm.md)
    builder = ms.builder.LocalBuilder(max_workers=1, timeout_sec=60,
                                      initializer=partial(fast_tensor_intrin_import, kind))
    # MetaSchedule's own runner on this host ("rpc" would be its remote one), timed as tunelab times
    runner = ms.runner.create("local", timeout_sec=spec.timeout_s, evaluator_config=ms.runner.EvaluatorConfig(
        number=spec.number, repeat=spec.repeat, min_repeat_ms=spec.min_repeat_ms,
        enable_cpu_cache_flush=spec.cache_flush))
    with ms.Profiler() as profiler:
        ms.tune_tir(mod=prim_func(workload), target=make_target(target), work_dir=str(work_dir),
                    max_trials_global=trials, num_trials_per_iter=trials_per_round, builder=builder, runner=runner,
                    num_tuning_cores=threads, seed=seed)
    # MetaSchedule's own account of its seconds (scopes such as EvoSearch, SendToBuilder, JoinRunnerFutures)
    (Path(work_dir) / PROFILE_FILE).write_text(json.dumps({str(k): float(v) for k, v in profiler.get().items()}))


def metaschedule_best(workload: dict, target: dict, work_dir: Path):
    """The IRModule of the best schedule in a tune_tir database, or None."""
    from tvm.s_tir import meta_schedule as ms

    fast_tensor_intrin_import(target.get("kind", "llvm"))
    database = ms.database.JSONDatabase(work_dir=str(work_dir))
    sch = ms.tir_integration.compile_tir(database, prim_func(workload), make_target(target))
    return None if sch is None else sch.mod


class KernelTimer:
    """Builds a scheduled IRModule here and times it as the lab's fixed evaluator does (TVM's
    time_evaluator: `repeat` repeats of at least `min_repeat_ms`, the median), on the export check's
    random inputs, after checking its output against the untuned kernel's (on `device`, a device
    string such as "cpu" or "cuda:1"; a GPU's reference is the untuned kernel run on this host)."""

    def __init__(self, workload: dict, target: dict, spec, device: str = "cpu"):
        import tvm

        self.tvm, self.target, self.spec, self.device = tvm, make_target(target), spec, tvm_device(device)
        arrays, self.reference = reference_arrays(workload, target, device)
        self.inputs, self.out_shape = arrays[:-1], (arrays[-1].shape, str(arrays[-1].dtype))

    def build(self, mod):
        """A timing function of the kernel, or ValueError when its output is wrong."""
        lib = self.tvm.tirx.build(mod, target=self.target)
        args, got = _call(lib, self.inputs, self.out_shape, self.device)
        if not np.allclose(got, self.reference, rtol=1e-3, atol=1e-3):
            raise ValueError(f"wrong output: max |error| {np.abs(got - self.reference).max():.3g}")
        evaluator = lib.time_evaluator(lib.entry_name, self.device, number=self.spec.number,
                                       repeat=self.spec.repeat, min_repeat_ms=self.spec.min_repeat_ms)
        return lambda: float(np.median(evaluator(*args).results))
