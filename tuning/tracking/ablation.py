"""Reading an experiment's finished runs back from MLflow, and printing its tables.

Shared by the experiments/*_table.py scripts: find the runs of one `+experiment=...` sweep
(by the `experiment` tag every run carries), fetch each run's records.jsonl, and lay out
text tables. Imports mlflow only through the client handed in.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from tuning.records import RecordLog


def find_runs(client, mlflow_experiment: str, prefix: str, tag: str | None, parent: str | None) -> tuple[str, list]:
    """Finished runs tagged `experiment` = `tag` (default: the latest tag starting with `prefix`),
    newest first; optionally only the children of one multirun parent."""
    found = client.get_experiment_by_name(mlflow_experiment)
    if found is None:
        raise SystemExit(f"no MLflow experiment {mlflow_experiment!r} in this store")
    filters = ["attributes.status = 'FINISHED'", f"tags.experiment LIKE '{prefix}%'"]
    if tag:
        filters.append(f"tags.experiment = '{tag}'")
    if parent:
        filters.append(f"tags.mlflow.parentRunId = '{parent}'")
    runs = client.search_runs([found.experiment_id], " and ".join(filters), max_results=5000,
                              order_by=["attributes.start_time DESC"])
    if not runs:
        raise SystemExit(f"no finished runs of +experiment={prefix}... found "
                         f"(run: python run.py -m +experiment={prefix}_reduced)")
    tag = tag or runs[0].data.tags["experiment"]  # the latest experiment, when not told
    return tag, [r for r in runs if r.data.tags.get("experiment") == tag]


def run_records(client, run_id: str, scratch: Path) -> list:
    (scratch / run_id).mkdir(parents=True, exist_ok=True)
    return RecordLog(Path(client.download_artifacts(run_id, "records.jsonl", str(scratch / run_id)))).load()


def final_latency_s(metrics: dict) -> float:
    """A single-operator run's incumbent, re-measured at the end (nan for whole models)."""
    finals = [v for k, v in metrics.items() if k.startswith("task/") and k.endswith("/final_latency_us")]
    return finals[0] * 1e-6 if len(finals) == 1 else math.nan


def newest_per(described: list[dict], *keys: str) -> list[dict]:
    """One run per combination of `keys` (runs arrive newest first: the newest wins)."""
    latest: dict = {}
    for run in described:
        latest.setdefault(tuple(run[k] for k in keys), run)
    return list(latest.values())


def first_index_at_most(curve, target: float) -> int | None:
    """0-based index of the first value <= target, or None."""
    reached = np.nonzero(np.asarray(curve) <= target)[0]
    return int(reached[0]) if len(reached) else None


def mean(values) -> float:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(values)) if values else math.nan


def geometric_mean(ratios) -> float:
    return math.exp(np.mean(np.log(ratios))) if ratios else math.nan


def fmt(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:{spec}}{suffix}"


def reach_cell(reach: list, spec: str = ".0f") -> str:
    """Mean over the seeds that got there, with the count when some did not."""
    if not reach:
        return "-"
    got = [r for r in reach if r is not None]
    if len(got) == len(reach):
        return f"{np.mean(got):{spec}}"
    return f"- ({len(got)}/{len(reach)})" if not got else f"{np.mean(got):{spec}} ({len(got)}/{len(reach)})"


def print_table(title: str, rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print(title)
    for row in rows:
        print("  " + "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    print()
