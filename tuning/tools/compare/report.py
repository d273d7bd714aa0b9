"""A comparison rendered: compare.md (per task the budget and target tables, failures, the curves;
the aggregate score, final metrics, verdicts and notes), compare.csv, one PNG of curves per task and
the comparison's own MLflow run."""
from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import numpy as np

from tuning.tools.compare import stats
from tuning.tools.compare.curves import Curve, value_at
from tuning.tools.compare.statistics import Comparison


# ---- compare.md ------------------------------------------------------------------------------
def verdict_lines(result: Comparison) -> list[str]:
    """One line per comparison: method vs baseline per task and budget, and to the target."""
    lines = []
    for row in result.budget_table:
        if "verdict" in row:
            lines.append(f"{row['task']} at {_budget_cell(row)}: {row['method']} vs {result.baseline}: "
                         f"{row['ratio']:.3f}x [{row['ratio_low']:.3f}, {row['ratio_high']:.3f}] over {row['pairs']} "
                         f"paired seeds, Wilcoxon p={row['p']:.3g} (Holm {row['p_holm']:.3g}){_tost(row)} -> "
                         f"{_said(row['verdict'], row['pairs'])}")
    for row in result.metric_table:
        if "verdict" in row:
            where = f" on {row['model']}" if row["model"] else ""
            lines.append(f"{row['metric']}: {row['method']} vs {result.baseline}{where}: {row['ratio']:.3f}x "
                         f"[{row['ratio_low']:.3f}, {row['ratio_high']:.3f}] over {row['pairs']} paired seeds, Wilcoxon "
                         f"p={row['p']:.3g} (Holm {row['p_holm']:.3g}) -> {_said(row['verdict'], row['pairs'])}")
    for row in result.target_table:
        if "verdict" in row:
            lines.append(f"{row['task']} {row['axis']} to target: {row['method']} vs {result.baseline}: "
                         f"{_km_cell(row, row['axis'])} vs {_km_cell(_baseline_row(result, row), row['axis'])}, "
                         f"log-rank p={row['p']:.3g} (Holm {row['p_holm']:.3g}) -> {_said(row['verdict'], row['runs'])}")
    return lines


def _budget_cell(row: dict) -> str:
    return f"{row['budget']:g} s" if row["axis"] == "seconds" else f"{row['budget']} measurements"


def _tost(row: dict) -> str:
    return f", equivalence TOST p={row['p_same']:.3g} (Holm {row['p_same_holm']:.3g})" if "p_same" in row else ""


def _said(verdict: str, n: int) -> str:
    return f"undecided at this power ({n} seeds)" if verdict == "undecided" else verdict


def _baseline_row(result: Comparison, row: dict) -> dict:
    return next(r for r in result.target_table if r["task"] == row["task"] and r["axis"] == row["axis"]
                and r["method"] == result.baseline)


def _km_cell(row: dict, axis: str) -> str:
    unit = "" if axis == "measurements" else " s"
    spec = ".0f" if axis == "measurements" else ".1f"
    if row["median"] is None:
        return f">= {row['at_least']:{spec}}{unit} ({row['reached']}/{row['runs']} reached)"
    bounds = [("?" if v is None else f"{v:{spec}}") for v in (row["low"], row["high"])]
    return f"{row['median']:{spec}}{unit} [{bounds[0]}, {bounds[1]}] ({row['reached']}/{row['runs']} reached)"


def markdown(result: Comparison, selection: str) -> str:
    seeds = sorted({c.seed for c in result.curves})
    crn = sorted({c.init_random for c in result.curves})
    out = [f"# Comparison: {selection}", "", *[f"{line}  " for line in result.preface],
           *([""] if result.preface else []),
           f"Baseline **{result.baseline}**; {len(seeds)} seeds ({_ranges(seeds)}); common random numbers: "
           + (f"first {crn[0]} measurements shared per seed" if crn != [0] and len(crn) == 1 else
              "none (pairs share only the seed)" if crn == [0] else f"mixed budget.init_random {crn}")
           + f"; target = best known / {result.fraction:g}. Lower latency is better; CIs are 95% bootstrap "
           "intervals over seeds; p-values Holm-adjusted across tasks.", ""]
    for task in result.tasks():
        truth = result.truths[task]
        out += [f"## {task}", "", f"Scored by {truth.source}; best known {truth.best_s * 1e6:.1f} us "
                f"(target {truth.best_s / result.fraction * 1e6:.1f} us).", ""]
        out += _table(["budget", "method", "seeds", "median true us [95% CI]", "ratio to baseline [95% CI]",
                       "p (Holm)", "verdict"],
                      [[_budget_cell(r), r["method"], r["seeds"],
                        f"{r['median_us']:.1f} [{r['median_low_us']:.1f}, {r['median_high_us']:.1f}]",
                        f"{r['ratio']:.3f} [{r['ratio_low']:.3f}, {r['ratio_high']:.3f}]" if "ratio" in r else "-",
                        f"{r['p']:.3g} ({r['p_holm']:.3g})" if "p" in r else "-", r.get("verdict", "baseline")]
                       for r in result.budget_table if r["task"] == task])
        out += [""] + _table(["to target", "method", "Kaplan-Meier median [95% CI]", "log-rank p (Holm)", "verdict"],
                             [[r["axis"], r["method"], _km_cell(r, r["axis"]),
                               f"{r['p']:.3g} ({r['p_holm']:.3g})" if "p" in r else "-", r.get("verdict", "baseline")]
                              for r in result.target_table if r["task"] == task])
        out += [""] + _error_table(result.by_method(task))
        out += ["", f"![curves](curves_{_file_part(task)}.png)", ""]
    if result.scores:
        out += ["## Aggregate score", "", "The autotuning-methodology score (Willemsen et al. 2024) on the measurements "
                "axis, between its cutoffs (random search's expected measurements to 1% and 95% of the way from the "
                "space's median to its best): 0 is random search, 1 the best config at once. Over several tasks, the "
                "mean of the per-task scores.", ""]
        out += _table(["method", "score [95% CI]", "tasks", "per task (measurements scored)"],
                      [[m, _score_cell(s), s["tasks"], ", ".join(f"{t} {v['score']:.3f} ({v['fevals'][0]}-{v['fevals'][1]})"
                                                                  for t, v in s["per_task"].items())]
                       for m, s in sorted(result.scores.items())])
    if result.metric_table:
        out += ["", "## Final metrics", "", "Lower is better; the ratio is paired by seed.", ""]
        out += _table(["metric", "model", "method", "seeds", "median [95% CI]", "ratio to baseline [95% CI]",
                       "p (Holm)", "verdict"],
                      [[r["metric"], r["model"], r["method"], r["seeds"], f"{r['median']:.4g} [{r['low']:.4g}, {r['high']:.4g}]",
                        f"{r['ratio']:.3f} [{r['ratio_low']:.3f}, {r['ratio_high']:.3f}]" if "ratio" in r else "-",
                        f"{r['p']:.3g} ({r['p_holm']:.3g})" if "p" in r else "-", r.get("verdict", "baseline")]
                       for r in result.metric_table])
    out += ["", "## Verdicts", ""] + [f"- {line}" for line in verdict_lines(result)]
    if result.notes:
        out += ["", "## Notes", ""] + [f"- {note}" for note in result.notes]
    return "\n".join(out) + "\n"


def _error_table(by_method: dict) -> list[str]:
    """Per method: median measurements per run and the mean count of each failure kind per run."""
    kinds = sorted({"invalid", "timeout"} | {kind for curves in by_method.values() for c in curves for kind in c.errors})
    rows = [[method, f"{np.median([c.length for c in curves]):.0f}",
             *(f"{np.mean([c.errors.get(kind, 0) for c in curves]):.1f}" for kind in kinds)]
            for method, curves in by_method.items()]
    return _table(["method", "measurements per run (median)", *(f"{kind} per run (mean)" for kind in kinds)], rows)


def _score_cell(score: dict) -> str:
    if not math.isfinite(score["low"]):
        return f"{score['score']:.3f}"
    return f"{score['score']:.3f} [{score['low']:.3f}, {score['high']:.3f}]"


def _table(header: list, rows: list[list]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def _ranges(values: list[int]) -> str:
    return f"{values[0]}-{values[-1]}" if values == list(range(values[0], values[-1] + 1)) and len(values) > 2 \
        else ", ".join(map(str, values))


def _file_part(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


# ---- the files and the MLflow run ---------------------------------------------------------------
def write_csv(result: Comparison, path: Path) -> None:
    columns = ["kind", "task", "metric", "model", "method", "budget", "axis", "seeds", "median_us", "median_low_us", "median_high_us",
               "pairs", "ratio", "ratio_low", "ratio_high", "runs", "reached", "median", "low", "high", "at_least",
               "p", "p_holm", "p_same", "p_same_holm", "verdict", "score"]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        for row in result.budget_table:
            writer.writerow({"kind": "budget", **row})
        for row in result.target_table:
            writer.writerow({"kind": "to_target", **row})
        for row in result.metric_table:
            writer.writerow({"kind": "metric", **row, "median": row["median"], "low": row["low"], "high": row["high"]})
        for method, score in sorted(result.scores.items()):
            writer.writerow({"kind": "score", "method": method, "score": score["score"], "low": score["low"],
                             "high": score["high"]})


GRID_POINTS = 200


def curves_png(result: Comparison, task: str, path: Path, rng) -> Path:
    curves_figure(result, task, rng).savefig(path, dpi=110)
    return path


def curves_figure(result: Comparison, task: str, rng=None):
    """A task's curves: the median per method with its bootstrap band, against measurements and seconds.
    A `matplotlib.figure.Figure` with an Agg canvas of its own, never through pyplot, so the caller's
    backend (a notebook's inline figures) stays as it was; a notebook shows it as the cell's value."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rng = np.random.default_rng(0) if rng is None else rng
    fig = Figure(figsize=(12, 4.5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    truth = result.truths[task]
    for method, curves in result.by_method(task).items():
        for ax, axis in zip(axes, ("measurements", "seconds")):
            xs, matrix = _on_grid(curves, axis)
            low, high = stats.curve_band(matrix, np.median, rng)
            line, = ax.plot(xs, np.median(matrix, axis=0) * 1e6, label=f"{method} ({len(curves)} seeds)")
            ax.fill_between(xs, low * 1e6, high * 1e6, color=line.get_color(), alpha=0.2, linewidth=0)
    for ax, axis in zip(axes, ("measurements", "seconds (simulated under replay)")):
        ax.axhline(truth.best_s / result.fraction * 1e6, color="k", linestyle=":", linewidth=1, label="target")
        ax.set_xlabel(axis)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[1].set_xscale("log")
    axes[0].set_ylabel(f"incumbent's true latency (us; {'store' if truth.source.startswith('store') else 'readings'})")
    axes[0].legend()
    methods = result.by_method(task)
    seeds = sorted({c.seed for curves in methods.values() for c in curves})
    fig.suptitle(f"{task}: {len(methods)} methods (baseline {result.baseline}), median over seeds {_ranges(seeds)}, "
                 "bootstrap 95% band")
    fig.tight_layout()
    return fig


def _on_grid(curves: list[Curve], axis: str) -> tuple[np.ndarray, np.ndarray]:
    """Every curve on one x grid (carried forward past a run's end; inf before its first incumbent)."""
    if axis == "measurements":
        xs = np.unique(np.linspace(1, max(c.length for c in curves), GRID_POINTS).astype(int))
        return xs, np.vstack([[value_at(c, int(n)) for n in xs] for c in curves])
    start = max(min(float(c.elapsed_s[0]) for c in curves), 1e-3)
    xs = np.geomspace(start, max(float(c.elapsed_s[-1]) for c in curves), GRID_POINTS)
    rows = []
    for c in curves:
        at = np.searchsorted(c.elapsed_s, xs, side="right") - 1
        rows.append(np.where(at >= 0, c.true_s[np.clip(at, 0, None)], np.inf))
    return xs, np.vstack(rows)


def write_outputs(result: Comparison, out_dir: Path, selection: str, seed: int = 0) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    (out_dir / "compare.md").write_text(markdown(result, selection))
    write_csv(result, out_dir / "compare.csv")
    pngs = [curves_png(result, task, out_dir / f"curves_{_file_part(task)}.png", rng) for task in result.tasks()]
    return [out_dir / "compare.md", out_dir / "compare.csv", *pngs]


def log_to_mlflow(client, experiment: str, result: Comparison, files: list[Path], selection: dict, uri: str) -> str:
    """The comparison as an MLflow run of its own: the selection as params, scores as metrics, the
    files as artifacts."""
    from mlflow.entities import Metric, Param, RunTag

    from tuning.tracking.mlflow_tracker import _key, get_or_create_experiment, sqlite_path

    experiment_id = get_or_create_experiment(client, experiment, sqlite_path(uri))
    run = client.create_run(experiment_id, run_name=f"compare-{selection.get('experiment', '')}",
                            tags={"tunelab.kind": "compare"})
    now = int(time.time() * 1000)
    params = {**{k: json.dumps(v) if isinstance(v, (list, tuple)) else str(v) for k, v in selection.items()},
              "baseline": result.baseline, "budgets": json.dumps(result.budgets), "fraction": str(result.fraction),
              "methods": json.dumps(sorted({c.method for c in result.curves})),
              "seeds": json.dumps(sorted({c.seed for c in result.curves}))}
    metrics = [Metric(_key(f"score/{m}"), s["score"], now, 0) for m, s in result.scores.items()]
    metrics += [Metric(_key(f"ratio/{r['task']}/{r['method']}/at_{r['budget']}" + ("s" if r["axis"] == "seconds" else "")),
                       r["ratio"], now, 0)
                for r in result.budget_table if math.isfinite(r.get("ratio", math.nan))]
    client.log_batch(run.info.run_id, metrics=metrics, params=[Param(_key(k), v[:6000]) for k, v in params.items()],
                     tags=[RunTag("verdicts", "\n".join(verdict_lines(result))[:8000])])
    for path in files:
        client.log_artifact(run.info.run_id, str(path))
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


# ---- links into MLflow's UI ---------------------------------------------------------------------
def mlflow_links(uri: str, runs, result: Comparison, comparison_run=None) -> list[str]:
    """Where to look in MLflow's UI (its model-training view): the comparison's own run, and MLflow's
    compare-runs page of the runs compared (their metric charts, params and tags side by side);
    `runs`: the MLflow runs the selection found, `comparison_run`: the one log_to_mlflow made."""
    from tuning.tracking.mlflow_tracker import ui_address, ui_command, ui_link

    lines = [f"MLflow UI{f' (serve it: {ui_command(uri)})' if ui_command(uri) else ''}:"]
    if comparison_run is not None:
        info = comparison_run.info
        lines.append(f"  the comparison: {ui_link(uri, f'/#/experiments/{info.experiment_id}/runs/{info.run_id}')}")
    compared_ids = {c.run_id for c in result.curves}
    compared = [r for r in runs if r.info.run_id in compared_ids]
    lines.append(f"  the compared runs' charts: {ui_address(uri)}{compare_runs_page(compared)}")
    return lines


def compare_runs_page(runs) -> str:
    """MLflow's compare-runs route; its page reads `runs` only as the query's first key."""
    from urllib.parse import quote

    from tuning.tracking.mlflow_tracker import MODEL_TRAINING_VIEW

    ids = json.dumps([r.info.run_id for r in runs])
    experiments = json.dumps(sorted({r.info.experiment_id for r in runs}))
    return f"/#/compare-runs?runs={quote(ids)}&experiments={quote(experiments)}&{MODEL_TRAINING_VIEW}"
