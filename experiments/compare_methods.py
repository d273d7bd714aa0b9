"""Which method finds faster kernels: paired by seed, scored by the store's truth, with a 95% CI.

    python experiments/compare_methods.py --parent <multirun parent id> [--parent <id> ...] [--baseline sa+greedy]
    python experiments/compare_methods.py --model conv_l8 --uri sqlite:///outputs/mlflow.db

Reads finished runs that logged `tuning/best_true_us` (runs with a measurement store: the store's
median over every reading of the run's incumbent, docs/store.md §Truth scoring), groups them by
model and method (search+sampler+cost_model+evaluator), and prints per model each method's mean
true latency with a bootstrap 95% confidence interval, then each pair of methods compared on the
seeds both ran: the mean of the per-seed ratio B/A - 1 with its bootstrap 95% CI, and a verdict
("A faster", "B faster", or "undecided" when the interval holds 0). The bootstrap is seeded.
"""
from __future__ import annotations

import argparse
import itertools
from collections import defaultdict
from pathlib import Path

import numpy as np

METRIC = "tuning/best_true_us"
RESAMPLES = 10_000


def bootstrap_ci(values, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the percentile bootstrap interval of the mean."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return float(values.mean()), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(len(values), size=(RESAMPLES, len(values)))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    return float(values.mean()), float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def paired(a: dict, b: dict, seed: int = 0) -> dict:
    """Method A's and B's true latency by seed -> the relative difference B/A - 1 over shared seeds."""
    seeds = sorted(set(a) & set(b))
    ratios = [b[s] / a[s] - 1 for s in seeds]
    if len(ratios) < 2:
        return {"seeds": len(seeds), "mean": float("nan"), "low": float("nan"), "high": float("nan"),
                "verdict": "undecided (fewer than 2 shared seeds)"}
    mean, low, high = bootstrap_ci(ratios, seed)
    verdict = "B faster" if high < 0 else "A faster" if low > 0 else "undecided"
    return {"seeds": len(seeds), "mean": mean, "low": low, "high": high, "verdict": verdict}


def load(uri: str, experiment: str, parents: list[str], model: str | None) -> dict:
    """{model: {method: {seed: true_us}}} from finished MLflow runs."""
    from mlflow.tracking import MlflowClient

    from tuning.tracking.base import option_name

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"no experiment {experiment!r} in {uri}")
    filters = ["attributes.status = 'FINISHED'"] + ([f"params.`model.name` = '{model}'"] if model else [])
    runs = []
    for parent in parents or [None]:
        query = " and ".join(filters + ([f"tags.mlflow.parentRunId = '{parent}'"] if parent else []))
        runs += client.search_runs([found.experiment_id], query, max_results=5000)
    table: dict = defaultdict(lambda: defaultdict(dict))
    for run in runs:
        value = run.data.metrics.get(METRIC)
        if value is None:
            continue
        method = "+".join(option_name(run.data.tags.get(f"choice.{g}"), run.data.params.get(f"{g}._target_", "?"))
                          for g in ("search", "sampler", "cost_model", "evaluator"))
        table[run.data.params.get("model.name", "?")][method][int(run.data.params.get("seed", -1))] = value
    return table


def report(table: dict, baseline: str | None = None) -> None:
    for model, methods in sorted(table.items()):
        print(f"\n{model}")
        for method, by_seed in sorted(methods.items()):
            mean, low, high = bootstrap_ci(list(by_seed.values()))
            print(f"  {method:<34} {len(by_seed):>3} seeds  true latency {mean:8.1f} us  95% CI [{low:.1f}, {high:.1f}]")
        ordered = sorted(methods.items(), key=lambda item: (not (baseline and item[0].startswith(baseline)), item[0]))
        for (name_a, a), (name_b, b) in itertools.combinations(ordered, 2):
            result = paired(a, b)
            print(f"  A={name_a} vs B={name_b}: B/A - 1 = {result['mean']:+.1%} "
                  f"[{result['low']:+.1%}, {result['high']:+.1%}] over {result['seeds']} seeds -> {result['verdict']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=f"sqlite:///{Path('outputs/mlflow.db').resolve()}")
    parser.add_argument("--experiment", default="tunelab")
    parser.add_argument("--parent", action="append", default=[], help="a multirun parent run id (repeatable)")
    parser.add_argument("--model", help="only runs of this model name")
    parser.add_argument("--baseline", help="the method (a prefix, e.g. sa+greedy) every pair puts as A")
    args = parser.parse_args()
    report(load(args.uri, args.experiment, args.parent, args.model), args.baseline)


if __name__ == "__main__":
    main()
