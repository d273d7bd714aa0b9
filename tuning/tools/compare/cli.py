"""Compare tuning methods the way a paper can cite: true-cost curves with bands, paired CIs,
censored times to an external target, one aggregate score (docs/compare.md).

    python -m tuning.tools.compare --experiment replay-conv_l8 --baseline sa
    python -m tuning.tools.compare --parent <multirun parent run id> --baseline sa+greedy --budgets 64 256 1000
    python -m tuning.tools.compare --experiment tunelab --tag experiment=chameleon_ablation_reduced --baseline sa+greedy

Reads finished MLflow runs (by experiment, tags, multirun parent, model; without --parent, --tag or
--all-runs the experiment's latest grid, the report's first line saying which) and their records.jsonl,
config.yaml and tasks.json artifacts. A method is the runs' group choices (search, sampler,
cost_model, evaluator; `--method-by` changes which keys), named by the parts that differ between
the runs; runs of one method that did not run alike (budget, hardware, space, store, a
hyperparameter: everything but the seed) are rows of their own, e.g. sa[budget.trials=32]
(`--group-by name` pools them, warning so); runs pair by seed. Per task and method it reports:

    curves            the incumbent's true latency (the config the run would return after n
                      measurements, scored by the store's median over every reading of it)
                      against measurements and against seconds (simulated under hardware=replay):
                      median over seeds with a bootstrap 95% band, as PNG
    at each budget    (measurements, and with --seconds seconds since the start: a paper's time budget)
                      the median true latency [95% CI] and the paired ratio to the baseline
                      (geometric mean over seeds [95% CI]), the Wilcoxon signed-rank p-value and
                      its Holm adjustment across tasks, and a verdict: better / worse / undecided
    to the target     target = the best config the store knows for the task (its truth) /
                      `--fraction`; measurements and seconds until the incumbent is at least that
                      good, censored at the run's end when it never is (Kaplan-Meier median,
                      or ">= N"), log-rank test against the baseline
    score             the autotuning-methodology score (Willemsen et al. 2024) on the
                      measurements axis (tuning/tools/compare/stats.py: methodology_score)

Runs without a store (real runs with no hardware.store) are scored by their own readings, which
the output says: the minimum of noisy readings is biased low. Everything goes to a folder
(compare.md, compare.csv, curves_<task>.png) and to an MLflow run of its own in `--log-experiment`.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from tuning.config.cli import add_tracking_uri, new_parser
from tuning.config.untrusted import without_secrets
from tuning.tools.compare.load import GROUP_BY, GROUPS, gather, job_runs
from tuning.tools.compare.report import log_to_mlflow, mlflow_links, write_outputs
from tuning.tools.compare.selection import (
    Refused,
    experiment_or_refuse,
    refuse_missing_store,
    refuse_unlike_baseline,
    selected,
)
from tuning.tools.compare.statistics import DEFAULT_BUDGETS, Comparison, compare


def default_out_dir(uri: str, name: str = "compare") -> Path:
    """<name>/<time> beside the MLflow sqlite file (outputs/ by default), else under outputs/."""
    from tuning.config.storage import outputs_dir
    from tuning.config.tracking_uri import sqlite_path

    db = sqlite_path(uri)
    base = db.parent if db is not None else outputs_dir()
    return base / name / time.strftime("%Y-%m-%d_%H-%M-%S")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = new_parser("python -m tuning.tools.compare", __doc__, prog)
    parser.add_argument("--experiment", default="tunelab", help="the MLflow experiment holding the runs")
    parser.add_argument("--parent", action="append", default=[], help="only children of this multirun parent run id")
    parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="only runs with this tag")
    parser.add_argument("--model", help="only runs of this model.name; default: every model")
    parser.add_argument("--all-runs", action="store_true",
                        help="every finished run of the experiment; default (without --parent or --tag): the latest "
                             "grid, or every run where the experiment holds no grid (the report says which)")
    parser.add_argument("--group-by", choices=GROUP_BY, default="identity",
                        help="identity (default): runs of one method that did not run alike (budget, hardware, space, "
                             "store, a hyperparameter; only the seed may differ) are rows of their own, e.g. "
                             "sa[budget.trials=32]; name: pooled under the method's name, the report warning so")
    parser.add_argument("--baseline", required=True, help="the method every other is compared to (a name printed "
                                                          "in the table, e.g. sa or sa+greedy)")
    parser.add_argument("--budgets", type=int, nargs="+", default=list(DEFAULT_BUDGETS), metavar="N",
                        help="compare the incumbents after these many measurements; default: "
                             + " ".join(map(str, DEFAULT_BUDGETS)))
    parser.add_argument("--seconds", type=float, nargs="+", default=[],
                        help="also compare the incumbents at these seconds since each run started (simulated "
                             "under hardware=replay), e.g. a paper's time budget")
    parser.add_argument("--fraction", type=float, default=1.0,
                        help="target = the best config known / this (0.95: within 95%% of its throughput)")
    parser.add_argument("--method-by", default=",".join(GROUPS),
                        help="what makes a method: group names (their choice) or param keys, comma-separated")
    parser.add_argument("--metric", action="append", default=[],
                        help="also compare this final MLflow metric (lower is better, e.g. run/run_s), paired by seed")
    parser.add_argument("--store", help="the measurement store, when it moved since the runs; default: the one "
                                        "each run's tasks.json names")
    add_tracking_uri(parser, help="the MLflow store holding the runs (the comparison's own run goes there too)")
    parser.add_argument("--log-experiment", default="tunelab-compare", help="where the comparison's own run goes")
    parser.add_argument("--no-mlflow-run", action="store_true", help="write the files only")
    parser.add_argument("--out", help="output folder (default: compare/<time> beside a sqlite MLflow store, "
                                      "else outputs/compare/<time>)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the bootstrap")
    parser.add_argument("--with-overhead", action="store_true",
                        help="the seconds axis also counts each run's own search and model-fitting seconds "
                             "(logged per round), the same rule for every method; default: build and run seconds")
    parser.add_argument("--margin", type=float, default=None, metavar="RATIO",
                        help="an equivalence margin (e.g. 1.05): a budget row reads 'the same within RATIO' only "
                             "when both one-sided tests (TOST on the per-seed log ratios, Holm-adjusted) put the "
                             "ratio inside [1/RATIO, RATIO]; without it no verdict says 'the same'")
    return parser


def parse_args(argv=None, prog: str | None = None) -> argparse.Namespace:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    problems = []
    if not (math.isfinite(args.fraction) and 0 < args.fraction <= 1):
        problems.append(f"--fraction: expected a number in (0, 1], got {args.fraction}")
    if any(b < 1 for b in args.budgets):
        problems.append(f"--budgets: expected positive measurement counts, got {args.budgets}")
    if args.margin is not None and not (math.isfinite(args.margin) and args.margin > 1):
        problems.append(f"--margin: expected a ratio above 1 (e.g. 1.05), got {args.margin}")
    if any(not (math.isfinite(t) and t > 0) for t in args.seconds):
        problems.append(f"--seconds: expected positive finite seconds, got {args.seconds}")
    bad_tags = [t for t in args.tag if "=" not in t or not t.split("=", 1)[0]]
    if bad_tags:
        problems.append(f"--tag: expected KEY=VALUE, got {', '.join(bad_tags)}")
    if any("'" in v for v in [args.experiment, args.model or "", *args.parent, *args.tag]):
        problems.append("--experiment/--model/--parent/--tag: quotes are not allowed")
    if problems:
        parser.error("; ".join(problems))
    args.tag = [tuple(t.split("=", 1)) for t in args.tag]
    args.method_by = [k.strip() for k in args.method_by.split(",") if k.strip()]
    return args


def main(argv=None, rename: dict | None = None, prog: str | None = None) -> Comparison:
    """The command; `rename` (method name -> name shown) is for presets (experiments/*_table.py), `prog`
    the name usage shows. Input that compares nothing exits with status 2, its message on stderr."""
    try:
        return _main(argv, rename, prog)
    except Refused as refused:
        print(f"tuning.tools.compare: {refused}", file=sys.stderr)
        raise
    except SystemExit as stop:
        if not isinstance(stop.code, str):  # argparse's own exit (--help, a bad flag)
            raise
        message = stop.code.removeprefix("tuning.tools.compare: ")
        print(f"tuning.tools.compare: {message}", file=sys.stderr)
        raise Refused(message) from None


def _main(argv, rename: dict | None, prog: str | None) -> Comparison:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    args = parse_args(argv, prog)
    uri = args.tracking_uri
    refuse_missing_store(uri)  # before the client, which would create the database
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment_or_refuse(client, args.experiment, uri)
    runs, picked = selected(client, job_runs(client, args.experiment, args.parent, args.tag, args.model), args)
    if not runs:
        raise Refused(f"no finished tunelab run in experiment {args.experiment!r} at {without_secrets(uri)} matches "
                      "the selection")
    with tempfile.TemporaryDirectory() as scratch:
        found = gather(client, runs, Path(scratch), args.method_by, args.store, rename, args.with_overhead,
                       args.group_by)
    refuse_unlike_baseline(args.baseline, {c.method for c in found.curves}, found.unlike)
    try:
        result = compare(found.curves, found.truths, args.baseline, args.budgets, args.fraction, args.seed,
                         found.metrics, args.metric, args.seconds, args.margin)
    except ValueError as error:
        raise Refused(str(error)) from None
    result.notes = found.notes + result.notes
    result.preface = [picked, *found.preface]
    selection = {"experiment": args.experiment, "parents": args.parent, "tags": [f"{k}={v}" for k, v in args.tag],
                 "model": args.model or "", "uri": uri}
    described = " ".join(f"{k}={v}" for k, v in selection.items() if v and k != "uri")
    out_dir = Path(args.out) if args.out else default_out_dir(uri)
    files = write_outputs(result, out_dir, described, args.seed)
    print((out_dir / "compare.md").read_text())
    print(f"files: {out_dir}")
    comparison_run = None
    if not args.no_mlflow_run:
        run_id = log_to_mlflow(client, args.log_experiment, result, files, selection, uri)
        print(f"MLflow: run {run_id} in experiment {args.log_experiment!r} at {uri}")
        comparison_run = client.get_run(run_id)
    print("\n".join(mlflow_links(uri, runs, result, comparison_run)))
    return result
