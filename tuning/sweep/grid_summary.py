"""A grid's summary (`tunelab run -m a=1,2 ...` on the basic sweeper): its finished jobs' best result per method
and model, on its MLflow parent run (metrics, the table as the run's description and as grid_summary.md) beside
the command that compares them, which the grid prints as its last line.

A method here is what `tunelab compare` makes a row (tuning/config/identity.py method_rows): the group
options that differ between the jobs, and where jobs of one option ran under other settings (a swept budget
or hyperparameter) those settings too, so the printed baseline is a row name compare knows."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from tuning.config.cli import tunelab_command
from tuning.config.identity import METHOD_GROUPS, method_rows, method_value, run_settings
from tuning.config.naming import FINAL_GFLOPS, FINAL_LATENCY_MS, FINAL_LATENCY_US, with_current_names
from tuning.config.untrusted import without_secrets

SUMMARY_FILE = "grid_summary.md"
COMPARE_TAG = "tunelab.compare_command"


@dataclass(frozen=True)
class Best:
    """A method's best job on one model: its headline metric, the seed that gave it, the median over its jobs."""
    method: str
    model: str
    metric: str  # FINAL_LATENCY_US or FINAL_LATENCY_MS (lower is better), else FINAL_GFLOPS
    best: float
    seed: str
    median: float
    jobs: int


def best_per_method(children: list[dict]) -> list[Best]:
    """`children`: the grid's finished job runs (run_id, start, params, tags, metrics), oldest first."""
    names = job_methods(children)
    found: dict = {}
    for child, name in zip(children, names):
        found.setdefault((name, child["params"].get("model.name", "?")), []).append(child)
    return [best for (name, model), runs in found.items() if (best := _best(name, model, runs)) is not None]


def job_methods(children: list[dict]) -> list[str]:
    """Each job's row name, as `tunelab compare` names it."""
    keys = [{group: method_value(c["params"], c["tags"], group) for group in METHOD_GROUPS} for c in children]
    names, _ = method_rows(keys, [run_settings(c["params"], c["tags"]) for c in children])
    return names


def _best(name: str, model: str, runs: list[dict]) -> Best | None:
    metrics = [with_current_names(r["metrics"]) for r in runs]
    for key, lower in ((FINAL_LATENCY_US, True), (FINAL_LATENCY_MS, True), (FINAL_GFLOPS, False)):
        values = [(m[key], r) for m, r in zip(metrics, runs) if key in m and math.isfinite(m[key])]
        if values:
            value, run = (min if lower else max)(values, key=lambda pair: pair[0])
            return Best(name, model, key, value, run["params"].get("seed", "?"),
                        statistics.median(v for v, _ in values), len(values))
    return None


def compare_command(children: list[dict], experiment: str, parent_id: str, uri: str) -> str:
    """The command that compares the grid's jobs (its parent run, the first job's method as the baseline), as a
    line that runs as printed with this installation (tunelab_command)."""
    baseline = job_methods(children)[0]
    return tunelab_command("compare", "--experiment", experiment, "--parent", parent_id, "--baseline", baseline,
                           "--tracking-uri", without_secrets(uri))


def summary_markdown(bests: list[Best], command: str, jobs: int) -> str:
    lines = [f"Grid of {jobs} finished jobs: each method's best job per model (the headline metric, re-measured at "
             "the end of each job), and the median over its jobs.", "",
             "| method | model | jobs | metric | best | seed of the best | median |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {b.method} | {b.model} | {b.jobs} | {b.metric} | {b.best:.4g} | {b.seed} | {b.median:.4g} |"
              for b in bests]
    return "\n".join(lines + ["", f"Compare them (paired by seed, with intervals): `{command}`", ""])


def summarise(tracker, parent_key: str, parent_id: str, sweep_dir: Path) -> str | None:
    """Put the grid's summary on its parent run and in the sweep folder; the compare command, or None when no
    job finished (or the store cannot be read)."""
    children = [c for c in tracker.children(parent_id) if c["tags"].get("choice.search")]  # tunelab jobs, as compare's
    if not children:
        return None
    command = compare_command(children, tracker.experiment, parent_id, tracker.uri)
    bests = best_per_method(children)
    text = summary_markdown(bests, command, len(children))
    path = sweep_dir / SUMMARY_FILE
    path.write_text(text)
    metrics = {f"{b.metric}/{b.method}/{b.model}": b.best for b in bests}
    tracker.log_to_parent(parent_key, {"grid.jobs": len(children)}, metrics,
                          {COMPARE_TAG: command, "mlflow.note.content": text}, [str(path)])
    return command
