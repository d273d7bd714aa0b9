"""An `+experiment=` sweep's runs for the experiments/ scripts: the latest sweep's finished runs
(by the `experiment` tag every run carries), their records.jsonl, text tables, and the presets of
`python -m tuning.tools.compare` (experiments/*_table.py). Every statistic is the comparison's
(tuning/tools/compare/statistics.py) and tuning/tools/compare/stats.py's. Imports mlflow only through the client handed
in, and in run_preset."""
from __future__ import annotations

from pathlib import Path

from tuning.core.records import RecordLog
from tuning.tools.compare.load import find_runs


def latest_sweep(client, mlflow_experiment: str, prefix: str, tag: str | None, parent: str | None) -> tuple[str, list]:
    """Finished runs tagged `experiment` = `tag` (default: the latest tag starting with `prefix`),
    newest first; optionally only the children of one multirun parent."""
    where = [f"tags.experiment LIKE '{prefix}%'", *([f"tags.experiment = '{tag}'"] if tag else [])]
    runs = find_runs(client, mlflow_experiment, where, [parent] if parent else [], limit=5000)
    if not runs:
        raise SystemExit(f"no finished runs of +experiment={prefix}... found "
                         f"(run: tunelab run -m +experiment={prefix}_reduced)")
    tag = tag or runs[0].data.tags["experiment"]  # the latest experiment, when not told
    return tag, [r for r in runs if r.data.tags.get("experiment") == tag]


def run_records(client, run_id: str, scratch: Path) -> list:
    (scratch / run_id).mkdir(parents=True, exist_ok=True)
    return RecordLog(Path(client.download_artifacts(run_id, "records.jsonl", str(scratch / run_id)))).load()


def newest_per(described: list[dict], *keys: str) -> list[dict]:
    """One run per combination of `keys` (runs arrive newest first: the newest wins)."""
    latest: dict = {}
    for run in described:
        latest.setdefault(tuple(run[k] for k in keys), run)
    return list(latest.values())


def print_table(title: str, rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print(title)
    for row in rows:
        print("  " + "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    print()


def preset_argv(args, tag: str, fixed: list[str]) -> list[str]:
    """`python -m tuning.tools.compare` arguments for one `+experiment=` sweep's runs (tag `tag`)."""
    argv = ["--experiment", args.mlflow_experiment, "--tag", f"experiment={tag}", "--fraction", str(args.fraction),
            "--tracking-uri", args.uri, *fixed]
    for parent in args.parent:
        argv += ["--parent", parent]
    return argv + (["--budgets", *map(str, args.budgets)] if args.budgets else [])


def run_preset(doc: str, prefix: str, fixed: list[str], rename: dict, argv=None):
    """An experiments/*_table.py preset: its command line, the latest `prefix...` sweep unless
    told, then tuning.tools.compare on those runs; returns the Comparison."""
    import argparse

    from mlflow.tracking import MlflowClient

    from tuning.config.cli import HelpFormatter, add_tracking_uri
    from tuning.tools.compare.cli import main

    parser = argparse.ArgumentParser(description=doc, formatter_class=HelpFormatter)
    add_tracking_uri(parser, help="the MLflow store holding the sweep's runs", dest="uri")
    parser.add_argument("--mlflow-experiment", default="tunelab", help="the MLflow experiment holding the runs")
    parser.add_argument("--experiment", help=f"{prefix} or {prefix}_reduced (default: the latest)")
    parser.add_argument("--parent", action="append", default=[], help="only the children of this multirun parent")
    parser.add_argument("--fraction", type=float, default=0.95, help="target: this fraction of the best throughput")
    parser.add_argument("--budgets", type=int, nargs="+", metavar="N",
                        help="compare the incumbents after these many measurements; default: the comparison's")
    args = parser.parse_args(argv)
    tag, _ = latest_sweep(MlflowClient(args.uri), args.mlflow_experiment, prefix, args.experiment, None)
    print(f"+experiment={tag}\n")
    return main(preset_argv(args, tag, fixed), rename=rename)
