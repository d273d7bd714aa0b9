"""The headline command at its defaults, and with each piece of its defaults switched off, in one go
on this host: wall time, the model against torch eager over fresh processes, the untuned build, and
how the tuning time was spread over the kernels.

    python experiments/headline.py                                    # seed 0, every arm, 3 processes each
    python experiments/headline.py --seeds 0 1 2 --arms defaults sa_greedy --json headline.json
    python experiments/headline.py --figure curve.png                  # and the estimate over wall time, per arm

Each arm is `tunelab run model=resnet18 search=ppo sampler=kmeans` (the headline) plus the arm's
overrides, run as a new user types it, in its own run folder under --work, tracked in --work's own
MLflow store. Over several seeds the arms are taken in an order rotated by the seed, so the host's
drift falls on all. After each run, experiments/e2e_processes.py re-reads its model in --processes
fresh processes (each compiles the run's choice, checks its output and times it against torch eager
at the run's threads, the two alternating in blocks): the speed-up is the median over those
processes of torch / tuned, each process's pair read side by side. Real hardware: run it alone on
the host (one arm at ResNet-18's defaults is about 15 minutes and 3 processes about 3 more).
"""
from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
HEADLINE = ("model=resnet18", "search=ppo", "sampler=kmeans")
ARMS = {  # what each arm switches off, as overrides of the headline
    "defaults": (),  # the command as typed
    "count_budget": ("budget.trials=704",),  # the count default before minutes: 32 a kernel, rounds of 64
    "no_in_model_choice": ("e2e.in_model_kernels=0",),  # the standalone choice kept, no reading inside the model
    "round_robin": ("scheduler=round_robin",),  # kernels by turns, not by their share of the model's latency
    "no_prior": ("tuning.prior=null",),  # each kernel's first round the method's own, not the shipped prior's
    "screening": ("evaluator.screen=1.5",),  # off by default: a candidate 1.5x slower than the best so far read once
    "sa_greedy": ("search=sa", "sampler=greedy"),  # the lab's other default method, at the same defaults
}
ONE_ROUND = "no measurement is fed back to the search"
SHARES_SHOWN = 5  # the kernels with the largest share of the latency, set beside their share of the tuning


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="which arms, in this order")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--processes", type=int, default=3, help="fresh processes re-reading each run's model (>= 2)")
    parser.add_argument("--work", type=Path, help="where the runs and their MLflow store go (default: a new folder "
                                                 "under outputs/headline/)")
    parser.add_argument("--json", type=Path, help="also write every row here")
    parser.add_argument("--figure", type=Path, help="also draw each run's estimated speed-up over torch eager "
                                                    "against wall time here (a PNG)")
    args = parser.parse_args(argv)
    if args.processes < 2:
        parser.error("--processes: must be >= 2 (a median over processes needs several)")
    if any(seed < 0 for seed in args.seeds):
        parser.error("--seeds: non-negative integers")
    return args


def arm_order(arms: list[str], seed: int) -> list[str]:
    """The arms rotated by the seed: seed s starts with arm s mod A."""
    start = seed % len(arms)
    return arms[start:] + arms[:start]


def run_arm(arm: str, seed: int, work: Path) -> dict:
    """One `tunelab run` of the arm at the seed; its row (wall, tuning, warning, the run's own end-to-end line)."""
    run_dir = work / f"{arm}-seed{seed}"
    command = [sys.executable, "-m", "tuning", "run", *HEADLINE, *ARMS[arm], f"seed={seed}",
               f"hydra.run.dir={run_dir}", f"tracking.uri=sqlite:///{work / 'mlflow.db'}"]
    print(f"{time.strftime('%H:%M:%S')} {arm} seed {seed}: {' '.join(command[3:])}", flush=True)
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall_s = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{arm} seed {seed} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    (run_dir / "stdout.txt").write_text(done.stdout + done.stderr)
    metrics = json.loads((run_dir / "final_metrics.json").read_text())["metrics"]
    e2e = json.loads((run_dir / "e2e.json").read_text())
    return {"arm": arm, "seed": seed, "run": str(run_dir), "wall_min": wall_s / 60,
            "tuning_min": metrics.get("run/tuning_wall_s", float("nan")) / 60,
            "measurements": sum(1 for _ in (run_dir / "records.jsonl").open()),
            "one_round_warning": ONE_ROUND in done.stdout + done.stderr,
            "estimate_ms": e2e.get("estimate_ms"), "run_tuned_ms": e2e["latency_ms"]["tuned"],
            "run_torch_ms": e2e["latency_ms"].get("torch"), "untuned_ms": e2e["latency_ms"]["untuned"],
            "match": e2e["match"], "shares": kernel_shares(run_dir / "network_time.csv"),
            "curve": estimate_curve(run_dir / "network_rounds.jsonl")}


def estimate_curve(path: Path) -> list[tuple[float, float]]:
    """(wall seconds since tuning began, the lab's estimate of the model in ms) after each round that
    had one (tuning/engine/network_time.py)."""
    if not path.is_file():
        return []
    rounds = [json.loads(line) for line in path.open() if line.strip()]
    return [(r["wall_s"], r["estimate_ms"]) for r in rounds if r.get("estimate_ms")]


def kernel_shares(path: Path) -> list[dict]:
    """The SHARES_SHOWN kernels with the largest share of the model's latency, with their share of the tuning time."""
    if not path.is_file():
        return []
    with path.open() as file:
        rows = list(csv.DictReader(file))
    rows.sort(key=lambda row: -float(row["latency_share"]))
    return [{"kernel": row["kernel"], "latency_share": float(row["latency_share"]),
             "tuning_time_share": float(row["tuning_time_share"]), "measurements": int(row["measurements"])}
            for row in rows[:SHARES_SHOWN]]


def reread(row: dict, processes: int) -> dict:
    """The run's model re-read in fresh processes (experiments/e2e_processes.py): tuned and torch per process."""
    with tempfile.TemporaryDirectory(prefix="headline-") as scratch:
        out = Path(scratch) / "readings.json"
        done = subprocess.run([sys.executable, str(REPO / "experiments" / "e2e_processes.py"), row["run"],
                               "--processes", str(processes), "--json", str(out)],
                              cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"re-reading {row['run']} failed:\n{done.stderr[-3000:]}")
        readings = json.loads(out.read_text())[row["run"]]
    tuned = [e2e["latency_ms"]["tuned"] for e2e in readings]
    torch = [e2e["latency_ms"]["torch"] for e2e in readings]
    ratios = [t / m for t, m in zip(torch, tuned)]
    return {**row, "tuned_ms": tuned, "torch_ms": torch, "speedup_vs_torch": float(np.median(ratios)),
            "speedup_range": [min(ratios), max(ratios)]}


def table(rows: list[dict]) -> str:
    lines = ["| arm | seed | wall (min) | tuning (min) | after tuning (min) | measurements | one-round warning | "
             "tuned (ms, median of processes) | torch eager (ms) | speed-up vs torch (median, range) | untuned (ms) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['arm']} | {row['seed']} | {row['wall_min']:.1f} | {row['tuning_min']:.1f} | "
                     f"{row['wall_min'] - row['tuning_min']:.1f} | {row['measurements']} | "
                     f"{'yes' if row['one_round_warning'] else 'no'} | {float(np.median(row['tuned_ms'])):.2f} | "
                     f"{float(np.median(row['torch_ms'])):.2f} | {row['speedup_vs_torch']:.2f}x "
                     f"({row['speedup_range'][0]:.2f}-{row['speedup_range'][1]:.2f}) | {row['untuned_ms']:.0f} |")
    return "\n".join(lines)


def share_lines(rows: list[dict]) -> list[str]:
    lines = []
    for row in rows:
        shares = ", ".join(f"{s['kernel']} {s['latency_share']:.0%} of the latency / {s['tuning_time_share']:.0%} of "
                           f"the tuning ({s['measurements']} measured)" for s in row["shares"])
        lines.append(f"- {row['arm']} seed {row['seed']}: {shares}")
    return lines


def draw(rows: list[dict], path: Path) -> None:
    """Each run's curve as speed-up over torch eager: the run's median torch reading over the lab's
    estimate after each round, scaled so that its last point is the run's re-read tuned latency (the
    estimate sums selecting readings and leaves out what the model spends between kernels); x:
    minutes since the job's tuning began."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    for row in rows:
        if not row["curve"]:
            continue
        scale = float(np.median(row["tuned_ms"])) / row["curve"][-1][1]
        torch = float(np.median(row["torch_ms"]))
        axes.plot([t / 60 for t, _ in row["curve"]], [torch / (e * scale) for _, e in row["curve"]],
                  label=f"{row['arm']} (seed {row['seed']})")
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.axhline(1.5, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xlabel("minutes of tuning")
    axes.set_ylabel("estimated speed-up over torch eager")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv=None) -> None:
    args = parse_args(argv)
    work = args.work or REPO / "outputs" / "headline" / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in args.seeds:
        for arm in arm_order(args.arms, seed):
            rows.append(reread(run_arm(arm, seed, work), args.processes))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print("\n" + table(rows))
    print("\nThe heaviest kernels' share of the latency against their share of the tuning time:")
    print("\n".join(share_lines(rows)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.figure:
        draw(rows, args.figure)


if __name__ == "__main__":
    main()
