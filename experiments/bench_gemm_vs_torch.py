"""Tuned GEMM kernels against torch and numpy, side by side on this host.

    python experiments/bench_gemm_vs_torch.py RUN_DIR [RUN_DIR ...] --passes 7

Each RUN_DIR is a finished single-GEMM run (any search, any space). Its best record's config is
timed the way the lab measures (hardware=cpu's run worker, evaluator=fixed: 5 repeats of at least
50 ms, the output checked against the untuned kernel), and in the same pass torch.matmul and numpy's
`@` on the same shape, with the same thread count (hardware.num_threads, default 2), each timed as
median of 5 repeats of at least 50 ms of back-to-back calls. Passes rotate the order so the host's
drift falls on all alike. Prints per kernel the median seconds and GFLOP/s over passes and, paired by
pass, its speed relative to torch (torch seconds / its seconds, geometric mean with a bootstrap 95% CI
over passes). The lab's side measures on conf/hardware's `--hardware` (Hydra overrides, default
hardware=cpu; hardware.num_threads is set to --threads). Real hardware only; run it alone on the host.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def best_of_run(run_dir: Path):
    """(label, task, best config) of a finished single-operator run."""
    from tuning.core.outcome import TaskOutcome, best_from_records
    from tuning.core.records import RecordLog
    from tuning.core.task import build_tasks
    from tuning.engine.run_folder import load_config

    cfg = load_config(run_dir / "config.yaml", "run")
    [task] = build_tasks(cfg.model)
    outcome = TaskOutcome(task, [r for r in RecordLog(run_dir / "records.jsonl").load() if r.workload_key == task.key])
    best_from_records(outcome)
    if outcome.best_config is None:
        raise SystemExit(f"{run_dir}: no valid record")
    search = cfg.search._target_.rsplit(".", 1)[-1]
    return f"{search} ({run_dir.name}, {cfg.model.get('space', 'full')} space)", task, outcome.best_config


def library_timers(shape, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    M, N, K = shape
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (M, K)).astype("float32"), rng.uniform(-1, 1, (K, N)).astype("float32")
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    return {"torch.matmul": lambda: torch.matmul(ta, tb), "numpy @": lambda: a @ b}


def geomean_ci(ratios, rng, draws: int = 2000) -> tuple[float, float, float]:
    logs = np.log(np.asarray(ratios))
    means = [logs[rng.integers(len(logs), size=len(logs))].mean() for _ in range(draws)]
    return float(np.exp(logs.mean())), float(np.exp(np.percentile(means, 2.5))), float(np.exp(np.percentile(means, 97.5)))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--passes", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2, help="hardware.num_threads, and torch's threads")
    parser.add_argument("--hardware", nargs="+", default=["hardware=cpu"], metavar="OVERRIDE",
                        help="the hardware that measures the kernels, as Hydra overrides of conf/")
    args = parser.parse_args(argv)

    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from tuning.hardware.tvm_export import call_seconds, rotated_passes
    from tuning.tools.dataset import compose

    kernels = [best_of_run(run.expanduser().resolve()) for run in args.runs]
    shapes = {(t.workload["M"], t.workload["N"], t.workload["K"]) for _, t, _ in kernels}
    if len(shapes) != 1:
        raise SystemExit(f"runs: expected one GEMM shape, got {sorted(shapes)}")
    [shape] = shapes
    flops = kernels[0][1].flops
    spec = instantiate(OmegaConf.load(REPO / "conf" / "evaluator" / "fixed.yaml")).spec
    libraries = library_timers(shape, args.threads)

    def measured(hardware, task, config) -> float:
        [result] = hardware.measure(task, [config], spec)
        return float(np.median(result.costs)) if result.ok else float("nan")

    def report_pass(step, seconds) -> None:
        print(f"pass {step + 1}/{args.passes}: " + ", ".join(f"{n} {s[-1] * 1e3:.2f} ms" for n, s in seconds.items()),
              flush=True)

    with instantiate(compose([*args.hardware, f"hardware.num_threads={args.threads}"]).hardware) as hardware:
        timers = {label: (lambda t=task, c=config: measured(hardware, t, c)) for label, task, config in kernels}
        timers.update({name: (lambda c=call: call_seconds(c, 5, 50)) for name, call in libraries.items()})
        seconds = rotated_passes(timers, args.passes, after_pass=report_pass)
    rng = np.random.default_rng(0)
    torch_s = np.asarray(seconds["torch.matmul"])
    print(f"\nGEMM {shape[0]}x{shape[1]}x{shape[2]} float32, {args.threads} threads, {args.passes} passes")
    print(f"{'kernel':60s} {'median ms':>10s} {'GFLOP/s':>9s}  speed vs torch [95% CI]")
    for name, values in seconds.items():
        values = np.asarray(values)
        ratio, low, high = geomean_ci(torch_s / values, rng)
        print(f"{name:60s} {np.median(values) * 1e3:10.3f} {flops / np.median(values) / 1e9:9.1f}  "
              f"{ratio:.3f}x [{low:.3f}, {high:.3f}]")


if __name__ == "__main__":
    main()
