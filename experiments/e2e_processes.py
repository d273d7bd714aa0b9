"""A whole-model run's end-to-end check repeated in fresh processes: how far each heavy kernel's time
inside the model, and the model's own, sit from what the lab predicted, across processes.

    python experiments/e2e_processes.py outputs/runs/DAY/TIME --processes 8
    python experiments/e2e_processes.py RUN_A RUN_B --processes 8 --json readings.json   # alternated pairs

One reading is `python -m tuning.tools.apply` on a copy of the run folder (its MLflow run left as it
is), in a process of its own: the model compiled with the run's choice, its output checked, timed
against torch eager at the run's threads, and every tuned kernel read inside the model beside its
prediction (e2e.json `kernels`). The same build of a kernel reads differently from one process to the
next (the address layout, the host's drift between minutes), so one process's "all 10 within 1.05"
is a draw: this script gives each of the `--kernels` heaviest its in-model / predicted ratio over the
processes (geometric mean, 95% bootstrap interval, and a one-sided t-test of "below the margin",
Holm-adjusted across the kernels), beside the per-process counts. With several runs the processes
alternate between them, each process i starting with run i mod R, and the runs' model latencies are
compared pairwise (each run over the first, per process: geometric mean ratio, interval, Wilcoxon).
Real hardware; run it alone on the host.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

from tuning.engine.whole_model import KERNEL_MARGIN
from tuning.tools.compare.stats import holm, paired_ratio

NOT_COPIED = {"mlflow_run_id"}  # the copy's apply logs nowhere: the run's MLflow history stays as it is


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="finished whole-model run folders")
    parser.add_argument("--processes", type=int, default=8, help="fresh processes (one reading each) per run")
    parser.add_argument("--kernels", type=int, default=10, help="the heaviest kernels tabled (by calls x time)")
    parser.add_argument("--margin", type=float, default=KERNEL_MARGIN, help="the in-model / predicted ratio a kernel should stay under")
    parser.add_argument("--json", type=Path, help="also write every process's e2e.json here")
    args = parser.parse_args(argv)
    if args.processes < 2:
        parser.error("--processes: must be >= 2 (an interval needs two readings)")
    if args.kernels < 1:
        parser.error("--kernels: must be >= 1")
    if not args.margin > 1:
        parser.error("--margin: a ratio above 1")
    for run in args.runs:
        if not (run / "best_configs.json").is_file() or not (run / "config.yaml").is_file():
            parser.error(f"runs: {run} is not a finished whole-model run folder (no best_configs.json)")
    return args


def copy_run(run: Path, scratch: Path) -> Path:
    copy = scratch / run.name
    shutil.copytree(run, copy, symlinks=True, ignore=lambda _, names: [n for n in names if n in NOT_COPIED])
    return copy


def one_reading(copy: Path) -> dict:
    """One fresh process's apply of the copy, and the e2e.json it wrote."""
    (copy / "e2e.json").unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-m", "tuning.tools.apply", str(copy)], capture_output=True, text=True,
                          env=os.environ.copy())
    if done.returncode != 0 or not (copy / "e2e.json").is_file():
        raise SystemExit(f"apply of {copy} failed:\n{done.stderr[-3000:]}")
    return json.loads((copy / "e2e.json").read_text())


def read_all(runs: list[Path], processes: int) -> dict[str, list[dict]]:
    readings: dict[str, list[dict]] = {str(run): [] for run in runs}
    with tempfile.TemporaryDirectory(prefix="e2e_processes_") as scratch:
        copies = {str(run): copy_run(run, Path(scratch) / str(i)) for i, run in enumerate(runs)}
        for process in range(processes):
            order = runs[process % len(runs):] + runs[:process % len(runs)]
            for run in order:
                e2e = one_reading(copies[str(run)])
                readings[str(run)].append(e2e)
                print(f"process {process + 1}/{processes} {run}: {process_line(e2e)}", flush=True)
    return readings


def process_line(e2e: dict) -> str:
    latency = e2e["latency_ms"]
    line = f"tuned {latency['tuned']:.2f} ms, torch {latency['torch'] / latency['tuned']:.2f}x"
    if "estimate_ms" in e2e:
        line += f", tuned/estimate {latency['tuned'] / e2e['estimate_ms']:.3f}"
    return line


def heaviest_tasks(e2es: list[dict], count: int) -> list[str]:
    """The tasks with the largest median calls x in-model time over the processes."""
    weights: dict[str, list[float]] = {}
    for e2e in e2es:
        for row in e2e.get("kernels", []):
            weights.setdefault(row["task"], []).append(row["calls"] * row["in_model_us"])
    return sorted(weights, key=lambda task: -float(np.median(weights[task])))[:count]


def kernel_rows(e2es: list[dict], tasks: list[str], margin: float) -> list[dict]:
    """Per task: its prediction, in-model readings, the ratio's geometric mean and interval, the
    processes within the margin, and the one-sided p of "below the margin" (Holm across the tasks)."""
    rows = []
    for task in tasks:
        found = [row for e2e in e2es for row in e2e.get("kernels", []) if row["task"] == task]
        in_model = [row["in_model_us"] for row in found]
        predicted = [row["predicted_us"] for row in found]
        ratio = paired_ratio(in_model, predicted, np.random.default_rng(0))
        logs = np.log(np.asarray(in_model) / np.asarray(predicted))
        p_below = below_margin_p(logs, margin)
        rows.append({"task": task, "calls": found[0]["calls"], "predicted_us": float(np.median(predicted)),
                     "in_model_us": in_model, "ratio": ratio["ratio"], "low": ratio["low"], "high": ratio["high"],
                     "within": int(np.sum(np.exp(logs) <= margin)), "processes": len(found), "p_below": p_below})
    for row, adjusted in zip(rows, holm([r["p_below"] for r in rows])):
        row["p_below_holm"] = adjusted
    return rows


def below_margin_p(logs, margin: float) -> float:
    """One-sided t-test p of "the mean log ratio is below log(margin)"; without spread 0 below, 1 not."""
    if len(logs) < 2 or np.ptp(logs) == 0:
        return 0.0 if len(logs) and logs[0] < math.log(margin) else 1.0
    return float(scipy_stats.ttest_1samp(logs, math.log(margin), alternative="less").pvalue)


def kernel_table(rows: list[dict], margin: float) -> str:
    lines = [f"{'kernel':<34} {'calls':>5} {'predicted':>9} {'in model':>9}  in model / predicted (geomean, 95% CI)"
             f"  within {margin}  p(below) Holm"]
    for row in rows:
        lines.append(f"{row['task']:<34} {row['calls']:>5} {row['predicted_us']:>9.0f} "
                     f"{float(np.median(row['in_model_us'])):>9.0f}  {row['ratio']:.3f} [{row['low']:.3f}, {row['high']:.3f}]"
                     f"{'':>20}{row['within']:>3} of {row['processes']:<3} {row['p_below_holm']:.3g}")
    return "\n".join(lines)


def run_summary(e2es: list[dict], rows: list[dict], margin: float) -> str:
    tuned = [e["latency_ms"]["tuned"] for e in e2es]
    torch = [e["latency_ms"]["torch"] / e["latency_ms"]["tuned"] for e in e2es]
    all_within = sum(all(row["in_model_us"][i] <= margin * row["predicted_us"] for row in rows)
                     for i in range(min(row["processes"] for row in rows)))
    below = sum(row["ratio"] <= margin for row in rows)
    shown = sum(row["p_below_holm"] < 0.05 for row in rows)
    lines = [f"model: tuned {np.median(tuned):.2f} ms median ({min(tuned):.2f}-{max(tuned):.2f}) over {len(e2es)} "
             f"processes; {np.median(torch):.2f}x torch ({min(torch):.2f}-{max(torch):.2f}); outputs "
             f"{'all match' if all(e['match'] for e in e2es) else 'DIFFER in some'}"]
    if all("estimate_ms" in e for e in e2es):
        over = [e["latency_ms"]["tuned"] / e["estimate_ms"] for e in e2es]
        close = sum(abs(o - 1) <= 0.05 for o in over)
        lines.append(f"tuned / the lab's estimate ({e2es[0]['estimate_ms']:.2f} ms): {np.median(over):.3f} median "
                     f"({min(over):.3f}-{max(over):.3f}), within 5% in {close} of {len(over)}")
    lines.append(f"the {len(rows)} heaviest: geomean at or below {margin} for {below} of {len(rows)}, below it at "
                 f"p < 0.05 (Holm) for {shown}; all {len(rows)} within {margin} in {all_within} of {len(e2es)} processes")
    return "\n".join(lines)


def pair_lines(runs: list[Path], readings: dict[str, list[dict]]) -> list[str]:
    first = [e["latency_ms"]["tuned"] for e in readings[str(runs[0])]]
    lines = []
    for run in runs[1:]:
        other = [e["latency_ms"]["tuned"] for e in readings[str(run)]]
        n = min(len(first), len(other))
        found = paired_ratio(other[:n], first[:n], np.random.default_rng(0))
        lines.append(f"{run} over {runs[0]}, end to end: {found['ratio']:.3f}x [{found['low']:.3f}, {found['high']:.3f}] "
                     f"over {n} processes each (Wilcoxon p = {found['p']:.3g})")
    return lines


def main(argv=None) -> None:
    args = parse_args(argv)
    readings = read_all(args.runs, args.processes)
    for run in args.runs:
        e2es = readings[str(run)]
        rows = kernel_rows(e2es, heaviest_tasks(e2es, args.kernels), args.margin)
        print(f"\n{run} (us per call: the prediction, the median inside the model over processes)")
        print(kernel_table(rows, args.margin))
        print(run_summary(e2es, rows, args.margin))
    for line in pair_lines(args.runs, readings):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(readings, indent=1))


if __name__ == "__main__":
    main()
