"""Print finished tunelab runs side by side from an MLflow store.

    python experiments/compare_runs.py                       # the 20 latest runs
    python experiments/compare_runs.py --parent <run id>     # the children of one multirun
    python experiments/compare_runs.py --model conv_l8 --uri sqlite:///outputs/mlflow.db

Columns: the group options, final best (incumbent re-measured at the end), the
best seen during tuning, measurements, invalid, and where the time went
(run_s: seconds spent running kernels, the measurement time evaluators differ in).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from mlflow.tracking import MlflowClient

from tuning.tracking.base import option_name

COLUMNS = ("run", "search", "sampler", "cost_model", "evaluator", "seed", "meas", "invalid", "final GFLOP/s",
           "tuning best", "search_s", "model_s", "build_s", "run_s")


def rows(client: MlflowClient, experiment: str, parent: str | None, model: str | None, limit: int):
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"no experiment {experiment!r} in this store")
    filters = ["attributes.status = 'FINISHED'"]
    if parent:
        filters.append(f"tags.mlflow.parentRunId = '{parent}'")
    if model:
        filters.append(f"params.`model.name` = '{model}'")
    for run in client.search_runs([found.experiment_id], " and ".join(filters), max_results=limit,
                                  order_by=["attributes.start_time DESC"]):
        p, m = run.data.params, run.data.metrics
        if "tuning/final_gflops" not in m:
            continue  # a multirun parent, or a run from before final metrics
        yield (run.info.run_name, *(_option(run, group) for group in ("search", "sampler", "cost_model", "evaluator")),
               p.get("seed", "?"), int(m.get("tuning/measurements", 0)), int(m.get("tuning/invalid", 0)),
               f"{m['tuning/final_gflops']:.2f}", f"{m.get('tuning/best_gflops', 0):.2f}",
               *(f"{m.get(f'time/{k}', 0):.1f}" for k in ("search_s", "model_s", "build_s", "run_s")))


def _option(run, group: str) -> str:
    """The group option the run was started with (older runs: the class name)."""
    return option_name(run.data.tags.get(f"choice.{group}"), run.data.params.get(f"{group}._target_", "?"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", default=f"sqlite:///{Path('outputs/mlflow.db').resolve()}")
    parser.add_argument("--experiment", default="tunelab")
    parser.add_argument("--parent", help="only the children of this multirun parent run id")
    parser.add_argument("--model", help="only runs of this model name")
    parser.add_argument("--limit", type=int, default=20)
    args = parser.parse_args()
    table = [COLUMNS, *rows(MlflowClient(args.uri), args.experiment, args.parent, args.model, args.limit)]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(COLUMNS))]
    for row in table:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)))


if __name__ == "__main__":
    main()
