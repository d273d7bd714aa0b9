"""What a first-round prior saves on kernels and a host it was not trained on: measurements to reach
within 5% of a run without the prior, over seeds.

    python -m tuning.tools.pretrain --store ... --exclude-model resnet18 --exclude-hardware HOST \\
        --name tunelab-prior-heldout                       # a prior that never saw these kernels or this host
    python experiments/prior_heldout.py --prior models:/tunelab-prior-heldout/1 --seeds 0 1

Fixed before any data: the kernels are four of ResNet-18's 3x3 convolutions, one per stage
(KERNELS), each tuned alone (`+model.kernels=[...]`, the others keep TVM's schedules, no end-to-end
check) with the headline's method, `search=ppo sampler=kmeans`, in rounds of 16 (its rounds under a
whole model's minutes), 256 measurements a kernel (`budget.trials_per_task`, round robin), once with
`tuning.prior` null and once with --prior, the two arms of a seed one after the other in an order
that alternates with the seed, so the host's drift falls on both.

Per kernel and seed: the target is 1.05 x the best of the run without the prior (its 256 selecting
readings, the median of each config's readings); each arm's count is the first measurement at or
below it (the run without the prior always reaches it; the prior's run is censored at 257 where it
never does). Reported: the log ratio of counts (prior / none) per pair, its mean with a t interval
over the pairs (kernel x seed), and the first round's best, prior over none, the same way. The
pairs of one seed share a process and a sitting: the interval treats the kernels as independent,
which the page says.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

REPO = Path(__file__).resolve().parents[1]
KERNELS = ("fused_conv2d1_add1_relu11", "fused_conv2d4_add3_relu21", "fused_conv2d7_add5_relu31",
           "fused_conv2d10_add7_relu41")  # ResNet-18's 3x3 convolutions of stages 1-4 (64 to 512 channels)
TRIALS = 256
PLAN = 16
MARGIN = 1.05
COMMON = ("model=resnet18", "search=ppo", "sampler=kmeans", "scheduler=round_robin", f"budget.plan_size={PLAN}",
          f"budget.min_trials_per_task={PLAN}", f"budget.trials_per_task={TRIALS}", "e2e.enabled=false")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prior", required=True, help="the prior held out from these kernels and this host "
                                                       "(tuning.prior's forms: models:/NAME/VERSION, package:NAME)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), help="ResNet-18 kernels by name")
    parser.add_argument("--work", type=Path, help="run folders and their MLflow store (default: outputs/prior-heldout/<time>)")
    parser.add_argument("--json", type=Path, help="also write every pair here")
    args = parser.parse_args(argv)
    if any(seed < 0 for seed in args.seeds):
        parser.error("--seeds: non-negative integers")
    return args


def run_arm(arm: str, prior: str | None, seed: int, kernels: list[str], work: Path) -> Path:
    run_dir = work / f"{arm}-seed{seed}"
    command = [sys.executable, "-m", "tuning", "run", *COMMON, f"+model.kernels=[{','.join(kernels)}]",
               f"tuning.prior={prior if prior else 'null'}", f"seed={seed}", f"hydra.run.dir={run_dir}",
               f"tracking.uri=sqlite:///{work / 'mlflow.db'}"]
    print(f"{time.strftime('%H:%M:%S')} {arm} seed {seed}", flush=True)
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    (work / f"{arm}-seed{seed}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{arm} seed {seed} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    return run_dir


def readings(run_dir: Path) -> dict[str, list[float]]:
    """Each kernel's selecting readings in measuring order (seconds; inf for an error)."""
    out: dict[str, list[float]] = {}
    for line in (run_dir / "records.jsonl").open():
        record = json.loads(line)
        result = record["result"]
        cost = statistics.median(result["costs"]) if not result.get("error") and result.get("costs") else math.inf
        out.setdefault(record["task"], []).append(cost)
    return out


def first_at_or_below(costs: list[float], target: float) -> int:
    """1-based index of the first reading at or below target; len + 1 where none is (censored)."""
    return next((i + 1 for i, cost in enumerate(costs) if cost <= target), len(costs) + 1)


def pairs(none: dict[str, list[float]], prior: dict[str, list[float]], seed: int) -> list[dict]:
    rows = []
    for kernel in none:
        target = MARGIN * min(none[kernel])
        rows.append({"kernel": kernel, "seed": seed, "target_us": target * 1e6,
                     "none_to_target": first_at_or_below(none[kernel], target),
                     "prior_to_target": first_at_or_below(prior[kernel], target),
                     "none_first_round_us": min(none[kernel][:PLAN]) * 1e6,
                     "prior_first_round_us": min(prior[kernel][:PLAN]) * 1e6,
                     "none_best_us": min(none[kernel]) * 1e6, "prior_best_us": min(prior[kernel]) * 1e6})
    return rows


def interval(logs: list[float]) -> tuple[float, float, float]:
    """exp of the mean log ratio and its 95% t interval."""
    mean = float(np.mean(logs))
    if len(logs) < 2:
        return math.exp(mean), math.nan, math.nan
    half = float(stats.t.ppf(0.975, len(logs) - 1) * np.std(logs, ddof=1) / math.sqrt(len(logs)))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def summary(rows: list[dict]) -> list[str]:
    counts = interval([math.log(r["prior_to_target"] / r["none_to_target"]) for r in rows])
    first = interval([math.log(r["prior_first_round_us"] / r["none_first_round_us"]) for r in rows])
    best = interval([math.log(r["prior_best_us"] / r["none_best_us"]) for r in rows])
    censored = sum(r["prior_to_target"] > TRIALS for r in rows)
    return [f"pairs: {len(rows)} ({len({r['kernel'] for r in rows})} kernels x {len({r['seed'] for r in rows})} seeds)",
            f"measurements to {MARGIN:g} x the no-prior best, prior / none: {counts[0]:.2f}x [{counts[1]:.2f}, "
            f"{counts[2]:.2f}] (geometric mean, 95% t interval; {censored} prior runs censored at {TRIALS + 1})",
            f"median measurements to target: none {statistics.median(r['none_to_target'] for r in rows):g}, "
            f"prior {statistics.median(r['prior_to_target'] for r in rows):g}",
            f"first round's best, prior / none: {first[0]:.3f}x [{first[1]:.3f}, {first[2]:.3f}] (below 1: faster)",
            f"best after {TRIALS}, prior / none: {best[0]:.3f}x [{best[1]:.3f}, {best[2]:.3f}]"]


def main(argv=None) -> None:
    args = parse_args(argv)
    work = args.work or REPO / "outputs" / "prior-heldout" / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for seed in args.seeds:
        order = [("none", None), ("prior", args.prior)]
        order = order if seed % 2 == 0 else order[::-1]  # the drift falls on both arms
        folders = {arm: run_arm(arm, prior, seed, args.kernels, work) for arm, prior in order}
        rows += pairs(readings(folders["none"]), readings(folders["prior"]), seed)
        for row in rows[-len(args.kernels):]:
            print(json.dumps(row), flush=True)
    print("\n".join(summary(rows)))
    if args.json:
        args.json.write_text(json.dumps({"prior": args.prior, "seeds": args.seeds, "kernels": args.kernels,
                                         "rows": rows, "summary": summary(rows)}, indent=1))


if __name__ == "__main__":
    main()
