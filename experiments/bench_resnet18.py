"""Tune ResNet-18 with a fixed budget, apply it, and print tuned / untuned / torch eager latency.

    python experiments/bench_resnet18.py                          # 2000 trials, sa + greedy + xgb, seed 0
    python experiments/bench_resnet18.py --trials 400 -- search=random scheduler=round_robin

Runs `run.py model=resnet18` (records, MLflow run and all), then prints the three
latencies the run measured side by side in one worker process (tuned and torch
calls alternating, same thread count) and their ratios, plus where the tuned
model's time goes (the five tasks with the largest weight x latency).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("overrides", nargs="*", help="more run.py overrides (after --)")
    args = parser.parse_args()
    run_dir = REPO / "outputs" / "bench" / f"{args.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    command = [sys.executable, "run.py", f"model={args.model}", f"budget.trials={args.trials}", f"seed={args.seed}",
               *args.overrides, f"hydra.run.dir={run_dir}"]
    print("running:", " ".join(command[1:]), flush=True)
    started = time.monotonic()
    output = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if output.returncode != 0:
        sys.exit(output.stdout[-3000:] + output.stderr[-3000:])
    e2e = json.loads((run_dir / "e2e.json").read_text())
    latency = e2e["latency_ms"]
    print(f"\n{args.model}, {args.trials} trials, seed {args.seed}, {e2e['num_threads']} threads, "
          f"{(time.monotonic() - started) / 60:.1f} min in all")
    print(f"{'variant':<10} {'median ms':>10} {'runs':>5}")
    for name in ("tuned", "torch", "untuned"):
        if name in latency:
            print(f"{name:<10} {latency[name]:>10.2f} {e2e['runs'][name]:>5}")
    if "torch" in latency:
        print(f"tuned vs torch eager: {latency['torch'] / latency['tuned']:.2f}x "
              f"({'faster' if latency['tuned'] < latency['torch'] else 'slower'})")
    print(f"tuned vs untuned: {latency['untuned'] / latency['tuned']:.1f}x")
    print(f"outputs match {e2e['reference']}: {e2e['match']} (max abs diff {e2e['max_abs_diff']:.2e})")
    table = [line for line in output.stdout.splitlines() if line.strip()]
    start = next(i for i, line in enumerate(table) if line.startswith("task "))
    print("\nwhere the tuned model's time goes (top 5 of weight x latency):")
    print("\n".join(table[start:start + 7]))
    print(f"\nrun folder: {run_dir}")


if __name__ == "__main__":
    main()
