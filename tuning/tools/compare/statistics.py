"""The statistics of a comparison, from the runs' curves (each estimator is tuning/tools/compare/stats.py's): per
task and budget the median incumbent with its bootstrap CI and the paired ratio to the baseline
(Wilcoxon, Holm across tasks), the censored time to the target (Kaplan-Meier, log-rank), final
metrics paired by seed, the methodology score."""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from tuning.tools.compare import stats
from tuning.tools.compare.curves import Curve, paired_by_seed, time_to_target, value_at, value_at_seconds

DEFAULT_BUDGETS = (64, 256, 1000)


# ---- the statistics of one task ------------------------------------------------------------------
def budget_rows(task: str, by_method: dict, baseline: str, budgets, rng, axis: str = "measurements",
                margin: float | None = None) -> list[dict]:
    """The incumbent at each budget, on the measurements axis or (--seconds) the seconds axis; with an
    equivalence `margin`, each ratio's TOST p-value too (`p_same`)."""
    at = value_at if axis == "measurements" else value_at_seconds
    rows = []
    for budget in budgets:
        for method, curves in by_method.items():
            values = [at(c, budget) for c in curves]
            median, low, high = stats.bootstrap_ci(values, np.median, rng)
            row = {"task": task, "budget": budget, "axis": axis, "method": method, "seeds": len(values),
                   "median_us": median * 1e6, "median_low_us": low * 1e6, "median_high_us": high * 1e6}
            if method != baseline and baseline in by_method:
                pairs = [(at(a, budget), at(b, budget)) for a, b in paired_by_seed(curves, by_method[baseline])]
                pairs = [(a, b) for a, b in pairs if math.isfinite(a) and math.isfinite(b)]  # no incumbent yet: no ratio
                ratio = stats.paired_ratio([a for a, _ in pairs], [b for _, b in pairs], rng, margin=margin)
                row.update(pairs=ratio["n"], ratio=ratio["ratio"], ratio_low=ratio["low"], ratio_high=ratio["high"],
                           p=ratio["p"], **({"p_same": ratio["p_same"]} if margin is not None else {}))
            rows.append(row)
    return rows


def target_rows(task: str, by_method: dict, baseline: str, target_s: float) -> list[dict]:
    rows = []
    for axis in ("measurements", "seconds"):
        outcomes = {m: [time_to_target(c, target_s, axis) for c in curves] for m, curves in by_method.items()}
        for method, found in outcomes.items():
            times, reached = zip(*found)
            km = stats.kaplan_meier_median(times, reached)
            row = {"task": task, "axis": axis, "method": method, "runs": km["n"], "reached": km["reached"],
                   "median": km["median"], "low": km["low"], "high": km["high"], "at_least": km["at_least"]}
            if method != baseline and baseline in outcomes:
                base_times, base_reached = zip(*outcomes[baseline])
                row["p"] = stats.logrank_p(times, reached, base_times, base_reached)
            rows.append(row)
    return rows


def holm_within(rows: list[dict], group_keys: tuple[str, ...], key: str = "p") -> None:
    """Holm-adjust each row's `key` (a p-value) into `{key}_holm` within its family: the rows of one
    method with the same `group_keys` (the tasks of one budget, or the metrics of one comparison)."""
    families = defaultdict(list)
    for row in rows:
        if key in row:
            families[tuple(row[k] for k in ("method", *group_keys))].append(row)
    for family in families.values():
        for row, adjusted in zip(family, stats.holm([r[key] for r in family])):
            row[f"{key}_holm"] = adjusted


# ---- the whole comparison --------------------------------------------------------------------
@dataclass
class Comparison:
    baseline: str
    budgets: list
    fraction: float
    curves: list[Curve]
    truths: dict  # task -> TaskTruth
    budget_table: list[dict] = field(default_factory=list)
    target_table: list[dict] = field(default_factory=list)
    metric_table: list[dict] = field(default_factory=list)  # --metric: a final MLflow metric, paired by seed
    run_metrics: dict = field(default_factory=dict)  # (method, seed, model) -> final metrics (presets' sub-comparisons)
    scores: dict = field(default_factory=dict)  # method -> score row
    notes: list[str] = field(default_factory=list)
    preface: list[str] = field(default_factory=list)  # what was selected, how runs became rows: the report's top

    def tasks(self) -> list[str]:
        return sorted({c.task for c in self.curves})

    def by_method(self, task: str) -> dict[str, list[Curve]]:
        found = defaultdict(list)
        for curve in self.curves:
            if curve.task == task:
                found[curve.method].append(curve)
        return dict(sorted(found.items(), key=lambda item: (item[0] != self.baseline, item[0])))


def compare(curves: list[Curve], truths: dict, baseline: str, budgets=DEFAULT_BUDGETS, fraction: float = 1.0,
            seed: int = 0, run_metrics: dict | None = None, metric_keys=(), seconds=(),
            margin: float | None = None) -> Comparison:
    """Every statistic of the comparison, from the runs' curves (seeded: the same inputs give the
    same numbers). With an equivalence `margin` (a ratio above 1), a budget row whose TOST says the
    ratio lies within it (Holm-adjusted like the difference test) reads "the same within m";
    without one, no verdict says "the same"."""
    methods = sorted({c.method for c in curves})
    if baseline not in methods:
        raise ValueError(f"--baseline: no method {baseline!r} among the runs (methods: {', '.join(methods)})")
    result = Comparison(baseline, [], fraction, curves, truths)
    rng = np.random.default_rng(seed)
    shortest = min(c.length for c in curves)
    result.budgets = sorted({b for b in budgets if b <= shortest}) or [shortest]
    dropped = [b for b in budgets if b > shortest]
    if dropped:
        result.notes.append(f"budgets {', '.join(map(str, dropped))} left out: the shortest run has {shortest} "
                            "measurements of a task")
    for task in result.tasks():
        by_method = result.by_method(task)
        result.budget_table += budget_rows(task, by_method, baseline, result.budgets, rng, margin=margin)
        result.budget_table += budget_rows(task, by_method, baseline, sorted(seconds), rng, axis="seconds",
                                           margin=margin)
        target = truths[task].best_s / fraction
        result.target_table += target_rows(task, by_method, baseline, target)
    ended = sorted({c.method for c in curves if seconds and c.elapsed_s[-1] < max(seconds)})
    if ended:
        result.notes.append(f"runs of {', '.join(ended)} ended before {max(seconds):g} s: at a later seconds budget "
                            "they keep their last incumbent (more measurements could have improved it)")
    holm_within(result.budget_table, ("budget", "axis"))
    holm_within(result.budget_table, ("budget", "axis"), key="p_same")
    holm_within(result.target_table, ("axis",))
    for row in result.budget_table:
        if "ratio" in row:
            row["verdict"] = stats.verdict(row["ratio_low"], row["ratio_high"], row["p_holm"],
                                           equivalence_p=row.get("p_same_holm", math.nan), margin=margin)
    for row in result.target_table:
        if "p" in row:
            row["verdict"] = _target_verdict(row, result.target_table, baseline)
    result.scores = methodology_scores(result, rng)
    result.run_metrics = {(key if len(key) == 3 else (*key, "")): value for key, value in (run_metrics or {}).items()}
    result.metric_table = metric_rows(result.run_metrics, metric_keys, baseline, rng)
    return result


def metric_rows(run_metrics: dict, keys, baseline: str, rng) -> list[dict]:
    """Per final metric (lower is better, e.g. run/run_s), model and method: the median over seeds [CI]
    and the paired ratio to the baseline on the same model, Holm-adjusted across metrics and models."""
    rows = []
    methods = sorted({m for m, _, _ in run_metrics}, key=lambda m: (m != baseline, m))
    models = sorted({model for _, _, model in run_metrics})
    for key, model in ((k, model) for k in keys for model in models):
        def values(of: str) -> dict:
            return {s: v[key] for (m, s, where), v in run_metrics.items()
                    if m == of and where == model and math.isfinite(v.get(key, math.nan))}

        for method in methods:
            by_seed = values(method)
            if not by_seed:
                continue
            median, low, high = stats.bootstrap_ci(list(by_seed.values()), np.median, rng)
            row = {"metric": key, "model": model, "method": method, "seeds": len(by_seed), "median": median,
                   "low": low, "high": high}
            base = values(baseline)
            shared = sorted(set(by_seed) & set(base))
            if method != baseline and shared and all(base[s] > 0 and by_seed[s] > 0 for s in shared):
                ratio = stats.paired_ratio([by_seed[s] for s in shared], [base[s] for s in shared], rng)
                row.update(pairs=ratio["n"], ratio=ratio["ratio"], ratio_low=ratio["low"], ratio_high=ratio["high"],
                           p=ratio["p"])
            rows.append(row)
    holm_within(rows, ())
    for row in rows:
        if "ratio" in row:
            row["verdict"] = stats.verdict(row["ratio_low"], row["ratio_high"], row["p_holm"])
    return rows


def _target_verdict(row: dict, table: list[dict], baseline: str) -> str:
    base = next(r for r in table if r["task"] == row["task"] and r["axis"] == row["axis"] and r["method"] == baseline)
    if not math.isfinite(row.get("p_holm", math.nan)) or row["p_holm"] >= 1 - stats.LEVEL:
        return "undecided"
    mine, theirs = _km_or_bound(row), _km_or_bound(base)
    return "sooner" if mine < theirs else "later" if mine > theirs else "undecided"


def _km_or_bound(row: dict) -> float:
    return row["median"] if row["median"] is not None else math.inf


def methodology_scores(result: Comparison, rng) -> dict:
    """Per method: stats.methodology_score per task (store-scored tasks only), and their mean. The
    interval is given for one task; over several it is the mean of per-task scores without one."""
    per_task = defaultdict(dict)
    for task in result.tasks():
        truth = result.truths[task]
        if not truth.source.startswith("store") or len(truth.by_config) < 2:
            continue
        space = np.asarray(list(truth.by_config.values()), dtype=np.float64)
        for method, curves in result.by_method(task).items():
            horizon = min(c.length for c in curves)
            matrix = np.vstack([c.true_s[:horizon] for c in curves])
            per_task[method][task] = stats.methodology_score(matrix, space, rng)
    scores = {}
    for method, tasks in per_task.items():
        values = list(tasks.values())
        single = values[0] if len(values) == 1 else {"low": math.nan, "high": math.nan}
        scores[method] = {"score": float(np.mean([v["score"] for v in values])), "low": single["low"],
                          "high": single["high"], "tasks": len(values), "per_task": tasks}
    return scores
