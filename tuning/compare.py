"""Compare tuning methods the way a paper can cite: true-cost curves with bands, paired CIs,
censored times to an external target, one aggregate score (docs/compare.md).

    python -m tuning.compare --experiment replay-conv_l8 --baseline sa
    python -m tuning.compare --parent <multirun parent run id> --baseline sa+greedy --budgets 64 256 1000
    python -m tuning.compare --experiment tunelab --tag experiment=chameleon_ablation_reduced --baseline sa+greedy

Reads finished MLflow runs (by experiment, tags, multirun parent, model) and their records.jsonl,
config.yaml and tasks.json artifacts. A method is the runs' group choices (search, sampler,
cost_model, evaluator; `--method-by` changes which keys), named by the parts that differ between
the runs; runs pair by seed. Per task and method it reports:

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
                      measurements axis (tuning/stats.py: methodology_score)

Runs without a store (real runs with no hardware.store) are scored by their own readings, which
the output says: the minimum of noisy readings is biased low. Everything goes to a folder
(compare.md, compare.csv, curves_<task>.png) and to an MLflow run of its own in `--log-experiment`.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tuning import stats
from tuning.records import RecordError, RecordLog

GROUPS = ("search", "sampler", "cost_model", "evaluator")
DEFAULT_BUDGETS = (64, 256, 1000)
GRID_POINTS = 200


# ---- what one run contributes ------------------------------------------------------------------
@dataclass
class Curve:
    """One run's curve for one task: index n-1 holds the value after n measurements of the task."""

    task: str
    method: str
    seed: int
    run_id: str
    true_s: np.ndarray  # the incumbent's true latency (inf before the first valid measurement)
    elapsed_s: np.ndarray  # seconds since the run started (simulated under hardware=replay)
    scored_by: str  # "store" or "readings"
    init_random: int = 0
    errors: dict = field(default_factory=dict)  # error kind -> count, and "fewer_runs": slow kernels timed shorter

    @property
    def length(self) -> int:
        return len(self.true_s)


@dataclass
class TaskTruth:
    """A task's scores: each config's truth (store) and the best config known."""

    by_config: dict
    best_s: float
    source: str  # "store <path>" or "readings of the compared runs"


def incumbent_curve(records, truth: dict | None) -> np.ndarray:
    """The true latency of the run's incumbent after each measurement: the config with the lowest
    reading so far (what the run would return), scored by `truth` (config -> seconds), or by its
    own reading when the store has no truth for it."""
    best_reading, incumbent, values = math.inf, math.inf, []
    for record in records:
        if record.result.ok and record.result.cost < best_reading:
            best_reading = record.result.cost
            incumbent = (truth or {}).get(tuple(record.config), best_reading)
        values.append(incumbent)
    return np.asarray(values, dtype=np.float64)


def run_curves(records, tasks: list[dict], truths: dict, method: str, seed: int, run_id: str,
               start_s: float, init_random: int) -> list[Curve]:
    """One Curve per task of a run; `truths[task name]` is the task's TaskTruth (or None)."""
    by_key = defaultdict(list)
    for record in records:
        by_key[record.workload_key].append(record)
    curves = []
    for task in tasks:
        own = by_key.get(task["key"], [])
        if not own:
            continue
        truth = truths.get(task["name"])
        scored = truth is not None and truth.source.startswith("store")
        curves.append(Curve(task["name"], method, seed, run_id,
                            incumbent_curve(own, truth.by_config if scored else None),
                            np.asarray([r.time - start_s for r in own], dtype=np.float64),
                            "store" if scored else "readings", init_random, error_counts(own)))
    return curves


def error_counts(records) -> dict:
    """Failed measurements by kind, and the valid ones a slow kernel got with fewer runs (the run
    worker notes those in the message)."""
    counts = Counter(r.result.error for r in records if r.result.error)
    counts["fewer_runs"] = sum(1 for r in records if r.result.ok and r.result.message.startswith("fewer_runs"))
    return {kind: n for kind, n in counts.items() if n}


# ---- the statistics of one task ------------------------------------------------------------------
def value_at(curve: Curve, n: int) -> float:
    """The incumbent after n measurements (a run that stopped sooner keeps its last incumbent)."""
    return float(curve.true_s[min(n, curve.length) - 1])


def value_at_seconds(curve: Curve, seconds: float) -> float:
    """The incumbent after the last measurement that finished within `seconds` of the run's start
    (inf when none had; a run that ended sooner keeps its last incumbent)."""
    done = int(np.searchsorted(curve.elapsed_s, seconds, side="right"))
    return float(curve.true_s[done - 1]) if done else math.inf


def time_to_target(curve: Curve, target_s: float, axis: str) -> tuple[float, bool]:
    """(time, reached): measurements or seconds until the incumbent is within the target, else the
    run's end, censored."""
    hits = np.flatnonzero(curve.true_s <= target_s)
    if axis == "measurements":
        return (float(hits[0] + 1), True) if len(hits) else (float(curve.length), False)
    return (float(curve.elapsed_s[hits[0]]), True) if len(hits) else (float(curve.elapsed_s[-1]), False)


def paired_by_seed(curves: list[Curve], baseline: list[Curve]) -> list[tuple[Curve, Curve]]:
    base = {c.seed: c for c in baseline}
    return [(c, base[c.seed]) for c in sorted(curves, key=lambda c: c.seed) if c.seed in base]


def budget_rows(task: str, by_method: dict, baseline: str, budgets, rng, axis: str = "measurements") -> list[dict]:
    """The incumbent at each budget, on the measurements axis or (--seconds) the seconds axis."""
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
                ratio = stats.paired_ratio([a for a, _ in pairs], [b for _, b in pairs], rng)
                row.update(pairs=ratio["n"], ratio=ratio["ratio"], ratio_low=ratio["low"], ratio_high=ratio["high"],
                           p=ratio["p"])
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


def holm_within(rows: list[dict], group_keys: tuple[str, ...]) -> None:
    """Holm-adjust each row's `p` within its family: the rows of one method with the same `group_keys`
    (the tasks of one budget, or the metrics of one comparison)."""
    families = defaultdict(list)
    for row in rows:
        if "p" in row:
            families[tuple(row[k] for k in ("method", *group_keys))].append(row)
    for family in families.values():
        for row, adjusted in zip(family, stats.holm([r["p"] for r in family])):
            row["p_holm"] = adjusted


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

    def tasks(self) -> list[str]:
        return sorted({c.task for c in self.curves})

    def by_method(self, task: str) -> dict[str, list[Curve]]:
        found = defaultdict(list)
        for curve in self.curves:
            if curve.task == task:
                found[curve.method].append(curve)
        return dict(sorted(found.items(), key=lambda item: (item[0] != self.baseline, item[0])))


def compare(curves: list[Curve], truths: dict, baseline: str, budgets=DEFAULT_BUDGETS, fraction: float = 1.0,
            seed: int = 0, run_metrics: dict | None = None, metric_keys=(), seconds=()) -> Comparison:
    """Every statistic of the comparison, from the runs' curves (seeded: the same inputs give the
    same numbers)."""
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
        result.budget_table += budget_rows(task, by_method, baseline, result.budgets, rng)
        result.budget_table += budget_rows(task, by_method, baseline, sorted(seconds), rng, axis="seconds")
        target = truths[task].best_s / fraction
        result.target_table += target_rows(task, by_method, baseline, target)
    ended = sorted({c.method for c in curves if seconds and c.elapsed_s[-1] < max(seconds)})
    if ended:
        result.notes.append(f"runs of {', '.join(ended)} ended before {max(seconds):g} s: at a later seconds budget "
                            "they keep their last incumbent (more measurements could have improved it)")
    holm_within(result.budget_table, ("budget", "axis"))
    holm_within(result.target_table, ("axis",))
    for row in result.budget_table:
        if "ratio" in row:
            row["verdict"] = stats.verdict(row["ratio_low"], row["ratio_high"], row["p_holm"])
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


# ---- reading the runs from MLflow --------------------------------------------------------------
@dataclass
class LoadedRun:
    run_id: str
    name: str
    keys: dict  # --method-by key -> value
    seed: int
    model: str  # model.name: a grid over models has a run per model at one seed
    start_s: float  # 0 under a simulated clock, else the run's start (unix seconds)
    init_random: int
    records: list
    tasks: list[dict]
    metrics: dict = field(default_factory=dict)  # the run's final MLflow metrics
    host: str = ""  # the hardware that measured it: option, CPU model, target (its describe() tags)


def find_runs(client, experiment: str, parents=(), tags=(), model: str | None = None) -> list:
    """Finished tunelab job runs (not multirun parents, not comparisons), newest first."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"tuning.compare: no MLflow experiment {experiment!r} at this tracking URI")
    filters = ["attributes.status = 'FINISHED'", "tags.`choice.search` != ''"]
    filters += [f"tags.`{key}` = '{value}'" for key, value in tags]
    if model:
        filters.append(f"params.`model.name` = '{model}'")
    runs = []
    for parent in list(parents) or [None]:
        query = " and ".join(filters + ([f"tags.mlflow.parentRunId = '{parent}'"] if parent else []))
        runs += client.search_runs([found.experiment_id], query, max_results=50_000,
                                   order_by=["attributes.start_time DESC"])
    return runs


def load_run(client, run, scratch: Path, method_by) -> LoadedRun | str:
    """A run's records, tasks and identity, or the reason it cannot be compared. The artifacts are
    untrusted input: a file that does not parse is a reason, not a crash."""
    folder = scratch / run.info.run_id
    folder.mkdir(parents=True, exist_ok=True)
    try:
        records = RecordLog(Path(client.download_artifacts(run.info.run_id, "records.jsonl", str(folder)))).load()
    except RecordError as error:
        return str(error)
    except Exception as error:  # noqa: BLE001 - MLflow raises several kinds for a missing artifact
        return f"no records.jsonl artifact ({type(error).__name__})"
    tasks = _saved_tasks(client, run, folder)
    if isinstance(tasks, str):
        return tasks
    params, tags = run.data.params, run.data.tags
    simulated = (params.get("hardware._target_", "").endswith("ReplayHardware")
                 and params.get("hardware.simulated_clock", "True") in ("True", "true"))
    try:
        seed = int(params.get("seed", tags.get("seed", "")))
        init_random = int(params.get("budget.init_random", "0") or 0)
    except ValueError:
        return "no integer seed"
    return LoadedRun(run.info.run_id, run.info.run_name or run.info.run_id,
                     {key: _method_part(run, key) for key in method_by}, seed, params.get("model.name", ""),
                     0.0 if simulated else run.info.start_time / 1000, init_random, records, tasks,
                     dict(run.data.metrics), _host(tags))


def _host(tags: dict) -> str:
    return " / ".join(tags[k] for k in ("hardware", "cpu_model", "target") if tags.get(k))


def _saved_tasks(client, run, folder: Path) -> list[dict] | str:
    """tasks.json (runs from before it: one task named by the model, keyed by the records)."""
    try:
        path = Path(client.download_artifacts(run.info.run_id, "tasks.json", str(folder)))
        rows = json.loads(path.read_text())
        if not isinstance(rows, list) or not all(isinstance(r, dict) and isinstance(r.get("name"), str)
                                                 and isinstance(r.get("key"), str) for r in rows):
            return "tasks.json is not a task list"
        return rows
    except ValueError:
        return "tasks.json is not JSON"
    except Exception:  # noqa: BLE001 - an older run without tasks.json
        return []


def _method_part(run, key: str) -> str:
    from tuning.tracking.base import option_name

    if key in GROUPS or key == "hardware":
        return option_name(run.data.tags.get(f"choice.{key}"), run.data.params.get(f"{key}._target_", "?"))
    return run.data.params.get(key, run.data.tags.get(key, "?"))


def method_labels(runs: list[LoadedRun], method_by) -> dict[str, str]:
    """run id -> method name: the --method-by values that differ between the runs, joined by '+'
    (every value when none differ)."""
    varying = [k for k in method_by if len({r.keys[k] for r in runs}) > 1] or list(method_by)
    return {r.run_id: "+".join(r.keys[k] for k in varying) for r in runs}


def task_truths(runs: list[LoadedRun], store_override: str | None) -> tuple[dict, list[str]]:
    """task name -> TaskTruth: from the store the runs recorded (or `store_override`) when every run of
    the task names the same rows, else from the pooled readings of the compared runs."""
    from tuning.store import MeasurementStore, StoreError

    notes, found, stores = [], {}, {}
    by_task = defaultdict(list)
    for run in runs:
        for task in run.tasks:
            by_task[task["name"]].append(task)
    for name, entries in sorted(by_task.items()):
        keys = {_store_entry(t)[1] for t in entries}
        paths = {store_override or _store_entry(t)[0] for t in entries}
        if len(keys) == 1 and len(paths) == 1 and () not in keys and None not in paths:
            path = paths.pop()
            named_by = "--store" if store_override else "the runs' tasks.json"
            try:
                if not Path(path).is_file():
                    raise StoreError(f"{path}: no such file (--store names where it is now)")
                store = stores.setdefault(path, MeasurementStore(path, read_only=True))  # only read, never changed
                by_config = store.truths(*keys.pop())
            except StoreError as error:
                raise SystemExit(f"tuning.compare: {error} (the store {named_by} names)") from None
            if by_config:
                found[name] = TaskTruth(by_config, min(by_config.values()), f"store {path}")
                continue
            notes.append(f"{name}: the store {path} holds no reading of it; scored by the runs' own readings")
        else:
            notes.append(f"{name}: not every run used the same measurement store; scored by the runs' own readings "
                         "(the minimum of noisy readings is biased low)")
        found[name] = _pooled_truth(runs, entries[0]["key"])
    return found, notes


def _store_entry(task: dict) -> tuple[str | None, tuple]:
    """(the store file a tasks.json entry names, its rows' [hardware, task, space] key), or (None, ())
    when the entry names none or names it malformed (the artifact is untrusted)."""
    path, key = task.get("store"), task.get("store_key")
    if not (isinstance(path, str) and path and isinstance(key, list) and len(key) == 3
            and all(isinstance(k, str) for k in key)):
        return None, ()
    return path, tuple(key)


def _pooled_truth(runs: list[LoadedRun], key: str) -> TaskTruth:
    readings = [r.result.cost for run in runs for r in run.records if r.workload_key == key and r.result.ok]
    return TaskTruth({}, min(readings) if readings else math.inf, "readings of the compared runs")


@dataclass
class Gathered:
    curves: list[Curve]
    truths: dict
    notes: list[str]
    metrics: dict  # (method, seed, model) -> the run's final MLflow metrics


def gather(client, runs, scratch: Path, method_by, store_override: str | None = None,
           rename: dict | None = None) -> Gathered:
    """The curves, truths and notes of the selected MLflow runs (newest run per method, seed and model);
    `rename` maps method names to the names to show (e.g. sa+greedy -> SA)."""
    notes, loaded = [], []
    for run in runs:
        found = load_run(client, run, scratch, method_by)
        if isinstance(found, str):
            notes.append(f"run {run.info.run_name or run.info.run_id} left out: {found}")
        else:
            loaded.append(found)
    if not loaded:
        raise SystemExit("tuning.compare: no finished tunelab run with records matches the selection")
    for run in loaded:
        if not run.tasks:  # a run from before tasks.json: its records name its one task
            keys = sorted({r.workload_key for r in run.records})
            run.tasks = [{"name": run.records[0].task if run.records else "?", "key": k} for k in keys[:1]]
    labels = {run_id: (rename or {}).get(label, label) for run_id, label in method_labels(loaded, method_by).items()}
    newest: dict = {}
    for run in loaded:  # newest first
        slot = (labels[run.run_id], run.seed, run.model)  # a grid over models has one run per model at a seed
        if slot in newest:
            notes.append(f"{labels[run.run_id]} seed {run.seed} {run.model}: {run.name} left out, a newer run of it "
                         "is compared")
        newest.setdefault(slot, run)
    kept = list(newest.values())
    hosts = sorted({run.host for run in kept if run.host})
    if len(hosts) > 1:  # readings from different machines do not compare: say so before any table
        notes.append("the runs were measured on different hardware: " + "; ".join(hosts))
    elif hosts:
        notes.append(f"hardware: {hosts[0]}")
    truths, truth_notes = task_truths(kept, store_override)
    curves = [c for run in kept for c in run_curves(run.records, run.tasks, truths, labels[run.run_id], run.seed,
                                                     run.run_id, run.start_s, run.init_random)]
    return Gathered(curves, truths, notes + truth_notes, {slot: run.metrics for slot, run in newest.items()})


# ---- output ------------------------------------------------------------------------------------
def verdict_lines(result: Comparison) -> list[str]:
    """One line per comparison: method vs baseline per task and budget, and to the target."""
    lines = []
    for row in result.budget_table:
        if "verdict" in row:
            lines.append(f"{row['task']} at {_budget_cell(row)}: {row['method']} vs {result.baseline}: "
                         f"{row['ratio']:.3f}x [{row['ratio_low']:.3f}, {row['ratio_high']:.3f}] over {row['pairs']} "
                         f"paired seeds, Wilcoxon p={row['p']:.3g} (Holm {row['p_holm']:.3g}) -> "
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
    out = [f"# Comparison: {selection}", "",
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


def write_csv(result: Comparison, path: Path) -> None:
    columns = ["kind", "task", "metric", "model", "method", "budget", "axis", "seeds", "median_us", "median_low_us", "median_high_us",
               "pairs", "ratio", "ratio_low", "ratio_high", "runs", "reached", "median", "low", "high", "at_least",
               "p", "p_holm", "verdict", "score"]
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


def curves_png(result: Comparison, task: str, path: Path, rng) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
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
    fig.suptitle(f"{task}: median over seeds, bootstrap 95% band")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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


# ---- command line ------------------------------------------------------------------------------
def default_uri() -> str:
    outputs = os.environ.get("TUNELAB_OUTPUTS") or str(Path("outputs").resolve())
    return f"sqlite:///{outputs}/mlflow.db"


def default_out_dir(uri: str) -> Path:
    """compare/<time> beside the MLflow sqlite file (outputs/ by default), else under outputs/."""
    from tuning.tracking.mlflow_tracker import sqlite_path

    db = sqlite_path(uri)
    base = db.parent if db is not None else Path(os.environ.get("TUNELAB_OUTPUTS", "outputs"))
    return base / "compare" / time.strftime("%Y-%m-%d_%H-%M-%S")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tuning.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default="tunelab", help="the MLflow experiment holding the runs")
    parser.add_argument("--parent", action="append", default=[], help="only children of this multirun parent run id")
    parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="only runs with this tag")
    parser.add_argument("--model", help="only runs of this model.name")
    parser.add_argument("--baseline", required=True, help="the method every other is compared to (a name printed "
                                                          "in the table, e.g. sa or sa+greedy)")
    parser.add_argument("--budgets", type=int, nargs="+", default=list(DEFAULT_BUDGETS))
    parser.add_argument("--seconds", type=float, nargs="+", default=[],
                        help="also compare the incumbents at these seconds since each run started (simulated "
                             "under hardware=replay), e.g. a paper's time budget")
    parser.add_argument("--fraction", type=float, default=1.0,
                        help="target = the best config known / this (0.95: within 95%% of its throughput)")
    parser.add_argument("--method-by", default=",".join(GROUPS),
                        help="what makes a method: group names (their choice) or param keys, comma-separated")
    parser.add_argument("--metric", action="append", default=[],
                        help="also compare this final MLflow metric (lower is better, e.g. run/run_s), paired by seed")
    parser.add_argument("--store", help="the measurement store, when it moved since the runs")
    parser.add_argument("--uri", default=None, help="MLflow tracking URI (default: outputs/mlflow.db)")
    parser.add_argument("--log-experiment", default="tunelab-compare", help="where the comparison's own run goes")
    parser.add_argument("--no-mlflow-run", action="store_true", help="write the files only")
    parser.add_argument("--out", help="output folder (default: compare/<time> beside a sqlite MLflow store, "
                                      "else outputs/compare/<time>)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the bootstrap")
    args = parser.parse_args(argv)
    problems = []
    if not (math.isfinite(args.fraction) and 0 < args.fraction <= 1):
        problems.append(f"--fraction: expected a number in (0, 1], got {args.fraction}")
    if any(b < 1 for b in args.budgets):
        problems.append(f"--budgets: expected positive measurement counts, got {args.budgets}")
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


def main(argv=None, rename: dict | None = None) -> Comparison:
    """The command; `rename` (method name -> name shown) is for presets (experiments/*_table.py)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow.tracking import MlflowClient

    args = parse_args(argv)
    uri = args.uri or default_uri()
    client = MlflowClient(uri)
    runs = find_runs(client, args.experiment, args.parent, args.tag, args.model)
    with tempfile.TemporaryDirectory() as scratch:
        found = gather(client, runs, Path(scratch), args.method_by, args.store, rename)
    try:
        result = compare(found.curves, found.truths, args.baseline, args.budgets, args.fraction, args.seed,
                         found.metrics, args.metric, args.seconds)
    except ValueError as error:
        raise SystemExit(f"tuning.compare: {error}") from None
    result.notes = found.notes + result.notes
    selection = {"experiment": args.experiment, "parents": args.parent, "tags": [f"{k}={v}" for k, v in args.tag],
                 "model": args.model or "", "uri": uri}
    described = " ".join(f"{k}={v}" for k, v in selection.items() if v and k != "uri")
    out_dir = Path(args.out) if args.out else default_out_dir(uri)
    files = write_outputs(result, out_dir, described, args.seed)
    print((out_dir / "compare.md").read_text())
    print(f"files: {out_dir}")
    if not args.no_mlflow_run:
        run_id = log_to_mlflow(client, args.log_experiment, result, files, selection, uri)
        print(f"MLflow: run {run_id} in experiment {args.log_experiment!r} at {uri}")
    return result


if __name__ == "__main__":
    main()
