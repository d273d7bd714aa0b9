"""Does a kernel's time depend on its data? Every config a run measured of its heaviest tasks, timed
on zeros and on the uniform data every timing uses (tvm_worker.random_arguments).

    python experiments/data_dependence.py outputs/runs/DAY/TIME                # the 3 heaviest tasks
    python experiments/data_dependence.py RUN --task fused_conv2d10_add7_relu41 --configs 16

On some CPUs a schedule runs many times slower on nonzero data than on zeros (floating-point assists:
the slowdown vanishes with denormals flushed), so a tuner that timed it on zeros would pick it as
the fastest (docs/runs.md §How measuring works). Per task: the configs timed, the ratio uniform /
zeros (median, largest, how many over 2x and 10x), the fastest config on zeros with its time on
uniform data, and the fastest on uniform data. Each config is built as the tuner builds it and
timed by TVM's time_evaluator (`--repeat` readings of at least `--min-repeat-ms`), zeros first, at
the run's threads. Real hardware only; run it alone on the host.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tuning.config import ConfigError
from tuning.core.records import RecordLog


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a finished run folder tuned on TVM hardware (hardware=cpu)")
    parser.add_argument("--task", action="append", default=[], help="a task by name (repeatable; default: the "
                                                                    "--tasks heaviest)")
    parser.add_argument("--tasks", type=int, default=3, help="the heaviest tasks (by FLOPs x calls) when no --task")
    parser.add_argument("--configs", type=int, default=64, help="at most this many configs a task (the run's "
                                                                "first measured)")
    parser.add_argument("--repeat", type=int, default=3, help="readings per config and data")
    parser.add_argument("--min-repeat-ms", type=float, default=20, help="each reading's least duration")
    parser.add_argument("--out", type=Path, help="write every config's two times here (JSON)")
    args = parser.parse_args(argv)
    if min(args.tasks, args.configs, args.repeat) < 1 or args.min_repeat_ms < 0:
        parser.error("--tasks, --configs and --repeat must be >= 1, --min-repeat-ms >= 0")
    if not (args.run / "config.yaml").is_file() or not (args.run / "records.jsonl").is_file():
        parser.error(f"run: {args.run} holds no config.yaml and records.jsonl (not a run folder)")
    return args


def measured_configs(records, task_key: str, limit: int) -> list[tuple]:
    """The task's configs with a valid reading, in the order the run first measured them."""
    configs = dict.fromkeys(tuple(r.config) for r in records if r.workload_key == task_key and r.result.ok)
    return list(configs)[:limit]


def task_summary(name: str, rows: list[tuple]) -> dict:
    ratios = np.array([uniform / zeros for _, zeros, uniform in rows])
    on_zeros, on_uniform = min(rows, key=lambda r: r[1]), min(rows, key=lambda r: r[2])
    return {"task": name, "configs": len(rows), "median": float(np.median(ratios)), "largest": float(ratios.max()),
            "over_2x": int((ratios > 2).sum()), "over_10x": int((ratios > 10).sum()),
            "fastest_on_zeros": {"config": list(on_zeros[0]), "zeros_ms": on_zeros[1] * 1e3,
                                 "uniform_ms": on_zeros[2] * 1e3},
            "fastest_on_uniform": {"config": list(on_uniform[0]), "zeros_ms": on_uniform[1] * 1e3,
                                   "uniform_ms": on_uniform[2] * 1e3}}


def main(argv=None) -> list[dict]:
    from tuning.core.task import build_tasks, is_whole_model
    from tuning.hardware.kernel_context import zeros_and_uniform_seconds
    from tuning.tools.export import open_tvm_run

    args = parse_args(argv)
    try:
        cfg, hardware = open_tvm_run(args.run, run_threads=True)
    except ConfigError as error:  # a run folder is untrusted input: one line naming the key
        raise SystemExit(f"tunelab: {error}") from None
    records = RecordLog(args.run / "records.jsonl").load()
    summaries, timed = [], {}
    with hardware:
        tasks = hardware.model_tasks(cfg.model, cfg.seed) if is_whole_model(cfg.model) else build_tasks(cfg.model)
        chosen = [t for t in tasks if t.name in args.task] if args.task else tasks[:args.tasks]
        if args.task and len(chosen) != len(set(args.task)):
            raise SystemExit(f"--task: the run's tasks are {', '.join(t.name for t in tasks)}")
        device = hardware.attached().devices[0]
        for task in chosen:
            rows = [(config, *zeros_and_uniform_seconds(task.workload, hardware.target, config, device, 1,
                                                        args.repeat, args.min_repeat_ms))
                    for config in measured_configs(records, task.key, args.configs)]
            if rows:
                summaries.append(task_summary(task.name, rows))
                timed[task.name] = [{"config": list(c), "zeros_s": z, "uniform_s": u} for c, z, u in rows]
    print("| task | configs | uniform / zeros: median | largest | > 2x | > 10x | fastest on zeros: zeros -> uniform ms "
          "| fastest on uniform: uniform ms |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for s in summaries:
        z, u = s["fastest_on_zeros"], s["fastest_on_uniform"]
        print(f"| {s['task']} | {s['configs']} | {s['median']:.2f} | {s['largest']:.1f} | {s['over_2x']} | "
              f"{s['over_10x']} | {z['zeros_ms']:.2f} -> {z['uniform_ms']:.2f} | {u['uniform_ms']:.2f} |")
    if args.out:
        args.out.write_text(json.dumps({"run": str(args.run), "summaries": summaries, "timed": timed}, indent=1))
    return summaries


if __name__ == "__main__":
    main()
