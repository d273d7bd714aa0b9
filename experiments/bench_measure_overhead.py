"""Seconds per measured candidate: tunelab's persistent workers vs MetaSchedule's stock ones.

    python experiments/bench_measure_overhead.py [--model gemm_64] [--batch 16] [--rounds 3]

Both sides build and time the same configs of the same task, round after
round (a round = one batch, as the tuning loop does). MetaSchedule's
LocalBuilder starts a fresh process pool on every build() call and its
workers import the tensor intrinsics again (docs/tvm.md §Pitfalls 2); tunelab's workers
start once. The script prints seconds per candidate for each and the ratio. tunelab's side is
conf/hardware's `--hardware` (Hydra overrides, default hardware=cpu); MetaSchedule's runs on this
host's CPU.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from hydra.utils import instantiate

from tuning.core.measure import MeasureSpec
from tuning.core.task import build_tasks
from tuning.tools.dataset import compose


def tunelab_round(hardware, task, configs, spec) -> float:
    start = time.perf_counter()
    results = hardware.measure(task, configs, spec)
    assert sum(r.ok for r in results) > 0, [r.message for r in results]
    return time.perf_counter() - start


def metaschedule_round(hardware, task, configs, spec) -> float:
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from tuning.hardware.tvm_space import fast_tensor_intrin_import

    schedules = hardware.schedules(task)
    start = time.perf_counter()
    fast_tensor_intrin_import("llvm")  # without it every LocalBuilder build times out (docs/tvm.md §Pitfalls 2)
    builder = ms.builder.LocalBuilder(max_workers=1, timeout_sec=60,
                                      initializer=lambda: fast_tensor_intrin_import("llvm"))
    runner = ms.runner.LocalRunner(timeout_sec=spec.timeout_s, evaluator_config=ms.runner.EvaluatorConfig(
        number=spec.number, repeat=spec.repeat, min_repeat_ms=spec.min_repeat_ms,
        enable_cpu_cache_flush=spec.cache_flush))
    mods = [schedules.schedule(c)[0].mod for c in configs]
    built = builder.build([ms.builder.BuilderInput(m, schedules.target) for m in mods])
    inputs = [ms.runner.RunnerInput(b.artifact_path, "cpu", ArgInfo.from_prim_func(m["main"]))
              for b, m in zip(built, mods) if b.error_msg is None]
    results = [f.result() for f in runner.run(inputs)]
    assert any(r.error_msg is None for r in results)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemm_64")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hardware", nargs="+", default=["hardware=cpu"], metavar="OVERRIDE",
                        help="tunelab's hardware, as Hydra overrides of conf/")
    args = parser.parse_args()
    cfg = compose([f"model={args.model}", *args.hardware])
    task = build_tasks(cfg.model)[0]
    spec = MeasureSpec(number=1, repeat=3, min_repeat_ms=0, cache_flush=False, check_correctness=False)
    hardware = instantiate(cfg.hardware)
    space = hardware.space(task)
    rng = np.random.default_rng(0)
    rounds = [[space.canonical(space.sample(rng)) for _ in range(args.batch)] for _ in range(args.rounds)]
    try:
        started = time.perf_counter()
        hardware.measure(task, rounds[0][:1], spec)  # worker start, paid once per run
        startup = time.perf_counter() - started
        ours = [tunelab_round(hardware, task, configs, spec) for configs in rounds]
        theirs = [metaschedule_round(hardware, task, configs, spec) for configs in rounds]
    finally:
        hardware.close()
    n = args.batch * args.rounds
    print(f"{args.model}: {args.rounds} rounds x {args.batch} candidates, same configs on both sides")
    print(f"  tunelab workers      {sum(ours) / n:.3f} s/candidate  (+{startup:.1f} s once at start)")
    print(f"  MetaSchedule Local*  {sum(theirs) / n:.3f} s/candidate")
    print(f"  ratio (MetaSchedule / tunelab): {sum(theirs) / sum(ours):.2f}x")


if __name__ == "__main__":
    main()
