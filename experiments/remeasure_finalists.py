"""Re-measure the best configs of an experiment's runs side by side, in one session.

    python experiments/remeasure_finalists.py --experiment adatune_ablation_reduced
    python experiments/remeasure_finalists.py --experiment chameleon_ablation_reduced --top 5 --passes 3

Each run re-measures its own best few at its end, but minutes or hours apart: on a small shared
host the same kernel reads 10-25% apart from one minute to the next, so "final best" differences
between runs of a grid are partly the host's. This script takes each finished run's `--top` best
configs (by their tuning readings), builds them, and times them in `--passes` round-robin passes
over all runs (each pass in a rotated order) with one evaluator (default: 10 x 50 runs, the
ablation's deterministic evaluator), so every run's finalists see the same host. A config's
latency is the median over passes; a run's best is its fastest config. Single-operator models
(conf/model/<name>.yaml) on conf/hardware's `--hardware` (Hydra overrides, default hardware=cpu).
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
from hydra.utils import instantiate
from omegaconf import OmegaConf

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
from mlflow.tracking import MlflowClient  # noqa: E402

from tuning.config.cli import add_tracking_uri  # noqa: E402
from tuning.core.task import build_tasks  # noqa: E402
from tuning.evaluator.fixed import FixedEvaluator  # noqa: E402
from tuning.tools.compare.ablation import latest_sweep, newest_per, print_table, run_records  # noqa: E402
from tuning.tools.dataset import compose  # noqa: E402

GROUPS = ("cost_model", "search", "sampler", "evaluator")


def finalists(client, runs, top: int, scratch: Path) -> list[dict]:
    """Each (model, scheme, seed)'s newest run with its `top` best configs by tuning reading."""
    labelled = [{"run": run, "model": run.data.params.get("model.name", "?"), "seed": run.data.params.get("seed", "?"),
                 "scheme": "+".join(run.data.tags.get(f"choice.{g}", "?") for g in GROUPS)} for run in runs]
    described = newest_per(labelled, "model", "scheme", "seed")
    for entry in described:
        ok = sorted((r for r in run_records(client, entry.pop("run").info.run_id, scratch) if r.result.ok),
                    key=lambda r: r.result.cost)
        entry["configs"] = list(dict.fromkeys(tuple(r.config) for r in ok))[:top]
        entry["readings"] = {tuple(r.config): r.result.cost for r in ok}
    return described


def remeasure(runs: list[dict], passes: int, evaluator, hardware_overrides: list[str]) -> None:
    tasks = {name: build_tasks(OmegaConf.load(Path("conf/model") / f"{name}.yaml"))[0]
             for name in {r["model"] for r in runs}}
    timings = defaultdict(list)
    with instantiate(compose(hardware_overrides).hardware) as hardware:
        for index in range(passes):
            for run in runs[index % len(runs):] + runs[:index % len(runs)]:
                results = evaluator.measure(hardware, tasks[run["model"]], run["configs"])
                for config, result in zip(run["configs"], results):
                    timings[(run["model"], config)].append(result.cost)
    for run in runs:
        run["latency_s"] = min(statistics.median(timings[(run["model"], c)]) for c in run["configs"])
        run["reading_s"] = min(run["readings"].values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_tracking_uri(parser, help="the MLflow store holding the sweep's runs")
    parser.add_argument("--mlflow-experiment", default="tunelab")
    parser.add_argument("--experiment", required=True, help="the runs' experiment tag, e.g. adatune_ablation_reduced")
    parser.add_argument("--parent", help="only the children of this multirun parent run id")
    parser.add_argument("--top", type=int, default=3, help="configs re-measured per run")
    parser.add_argument("--passes", type=int, default=3, help="round-robin passes over all runs")
    parser.add_argument("--number", type=int, default=50, help="runs per timed cost")
    parser.add_argument("--repeat", type=int, default=10, help="costs per measurement")
    parser.add_argument("--hardware", nargs="+", default=["hardware=cpu"], metavar="OVERRIDE",
                        help="the hardware that re-measures, as Hydra overrides of conf/")
    args = parser.parse_args()
    client = MlflowClient(args.tracking_uri)
    _, runs = latest_sweep(client, args.mlflow_experiment, args.experiment, args.experiment, args.parent)
    with tempfile.TemporaryDirectory() as scratch:
        described = finalists(client, runs, args.top, Path(scratch))
    remeasure(described, args.passes, FixedEvaluator(number=args.number, repeat=args.repeat, min_repeat_ms=0),
              args.hardware)
    by_model = defaultdict(lambda: defaultdict(list))
    for run in described:
        by_model[run["model"]][run["scheme"]].append(run)
    for model, schemes in sorted(by_model.items()):
        rows = [["scheme (cost_model+search+sampler+evaluator)", "seeds", "best reading us", "re-measured us",
                 "per seed"]]
        for scheme, group in schemes.items():
            group.sort(key=lambda r: r["seed"])
            rows.append([scheme, str(len(group)), f"{np.mean([r['reading_s'] for r in group]) * 1e6:.1f}",
                         f"{np.mean([r['latency_s'] for r in group]) * 1e6:.1f}",
                         " ".join(f"{r['latency_s'] * 1e6:.0f}" for r in group)])
        print_table(f"{model}: top {args.top} of each run, {args.passes} interleaved passes", rows)


if __name__ == "__main__":
    main()
