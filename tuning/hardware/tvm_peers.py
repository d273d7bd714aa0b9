"""The peers a benchmark compares tunelab with, on TVM's side (imports TVM).

MetaSchedule's own tuner (`tune_tir`: its evolutionary search, XGB model, builder and runner, with
tunelab's measurement settings) and the in-process timer that re-times every tuned kernel beside
torch and numpy. Used by experiments/bench_vs_peers.py; see docs/tvm.md §MetaSchedule as the peer
baseline.
"""
from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path

import numpy as np

from tuning.hardware.tvm_device import tvm_device
from tuning.hardware.tvm_export import _call
from tuning.hardware.tvm_space import (
    TaskSchedules,
    fast_tensor_intrin_import,
    make_target,
    prim_func,
    register_pool_fallbacks,
    space_generator,
    target_key,
)
from tuning.hardware.tvm_worker import reference_arrays

PROFILE_FILE = "profile.json"  # tune_tir's ms.Profiler seconds per scope, beside its database
FAILED_SECONDS = 1e9  # what MetaSchedule's database holds as the run time of a failed build or run

log = logging.getLogger(__name__)


def tune_with_metaschedule(workload: dict, target: dict, work_dir: Path, trials: int, seed: int, spec,
                           threads: int, trials_per_round: int = 64) -> None:
    """MetaSchedule's tune_tir on one operator; its database lands in `work_dir`. Its design space
    is the lab's (`space_generator`: the same generator as the lab's spaces, so that
    `metaschedule_configs` reads its records as lab configs; tune_tir's own default is the same on
    llvm, and the "cuda-tensorcore" rules on a cuda sm_80 or later)."""
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
                    num_tuning_cores=threads, seed=seed, space=space_generator(target))
    # MetaSchedule's own account of its seconds (scopes such as EvoSearch, SendToBuilder, JoinRunnerFutures)
    (Path(work_dir) / PROFILE_FILE).write_text(json.dumps({str(k): float(v) for k, v in profiler.get().items()}))


def metaschedule_best(workload: dict, target: dict, work_dir: Path):
    """The IRModule of the best schedule in a tune_tir database, or None."""
    from tvm.s_tir import meta_schedule as ms

    fast_tensor_intrin_import(target.get("kind", "llvm"))
    database = ms.database.JSONDatabase(work_dir=str(work_dir))
    sch = ms.tir_integration.compile_tir(database, prim_func(workload), make_target(target))
    return None if sch is None else sch.mod


def metaschedule_configs(workload: dict, target: dict, work_dir: Path) -> list[tuple[tuple, float]]:
    """Every tuning record of a tune_tir database as (lab config, mean run seconds; inf for a failed
    build or run), in the database's order. A record whose trace is no config of the lab's space
    (`TaskSchedules.config_of_trace`: MetaSchedule's MutateParallel changes a parallel extent that
    the lab's space fixes; model.space=tiling keeps one sketch and one unroll) is left out, and how
    many were is logged."""
    from tvm.s_tir import meta_schedule as ms

    schedules = TaskSchedules(workload, target)
    records = ms.database.JSONDatabase(work_dir=str(work_dir)).get_all_tuning_records()
    out = []
    for record in records:
        config = schedules.config_of_trace(record.trace)
        if config is not None:
            seconds = float(np.mean([float(s) for s in record.run_secs])) if record.run_secs else FAILED_SECONDS
            out.append((config, float("inf") if seconds >= FAILED_SECONDS else seconds))
    if len(out) < len(records):
        log.info("%d of %d tune_tir records in %s are no config of the lab's space; left out",
                 len(records) - len(out), len(records), work_dir)
    return out


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
