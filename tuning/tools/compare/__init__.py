"""Tuning methods compared the way a paper can cite (docs/compare.md): `python -m tuning.tools.compare`.

    curves.py      what one run contributes: per task the incumbent's true latency after each
                   measurement and at each second; what a curve says at a budget or about a target
    statistics.py  the comparison's statistics (budgets, times to the target, final metrics, the
                   methodology score)
    load.py        finished runs from MLflow: find_runs, the one run lookup; records, tasks, truths
    report.py      compare.md, compare.csv, the curves' PNGs, the comparison's MLflow run
    cli.py         the command (python -m tuning.tools.compare --help)
    ablation.py    an `+experiment=` sweep's runs and the presets of experiments/*_table.py

The names below are importable from the package itself (`from tuning.tools.compare import compare`); each
is looked up in its module when first asked for, so importing one module of the package does not
import the others (mlflow, matplotlib).
"""
from __future__ import annotations

import importlib

HOMES = {
    "curves": ("Curve", "TaskTruth", "incumbent_curve", "run_curves", "error_counts", "value_at", "value_at_seconds",
               "time_to_target", "paired_by_seed"),
    "statistics": ("DEFAULT_BUDGETS", "Comparison", "compare", "budget_rows", "target_rows", "holm_within",
                   "metric_rows", "methodology_scores"),
    "load": ("GROUPS", "find_runs", "job_runs", "LoadedRun", "load_run", "method_labels",
             "task_truths", "Gathered", "gather"),
    "report": ("verdict_lines", "markdown", "write_csv", "curves_png", "write_outputs", "log_to_mlflow"),
    "cli": ("default_out_dir", "parse_args", "main"),
}
_HOME_OF = {name: module for module, names in HOMES.items() for name in names}
__all__ = sorted(_HOME_OF)


def __getattr__(name: str):
    if name not in _HOME_OF:
        raise AttributeError(f"module 'tuning.tools.compare' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tuning.tools.compare.{_HOME_OF[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
