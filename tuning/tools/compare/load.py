"""Finished runs read from MLflow: `find_runs`, the one run lookup every reader of runs uses (the
comparison and the ablation presets), then each run's records, tasks and identity, the method it
belongs to, and its tasks' truths from the measurement store it recorded.
The artifacts are untrusted input: what does not parse is a reason to leave a run out, not a crash.
Imports mlflow only through the client handed in."""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tuning.config.identity import method_rows, method_value, run_settings, shared_differences
from tuning.config.naming import with_current_names
from tuning.core.records import RecordError, RecordLog
from tuning.tools.compare.curves import Curve, TaskTruth, run_curves

GROUPS = ("search", "sampler", "cost_model", "evaluator")


def find_runs(client, experiment: str, where=(), parents=(), limit: int = 50_000, required: bool = True) -> list:
    """The finished runs of MLflow experiment `experiment` that meet every `where` clause (MLflow's
    search syntax), newest first; with `parents`, only the children of those multirun parent runs.
    A missing experiment stops the command, or with `required=False` has no runs."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        if required:
            raise SystemExit(f"tuning.tools.compare: no MLflow experiment {experiment!r} at this tracking URI")
        return []
    runs = []
    for parent in list(parents) or [None]:
        query = " and ".join(["attributes.status = 'FINISHED'", *where,
                              *([f"tags.mlflow.parentRunId = '{parent}'"] if parent else [])])
        runs += client.search_runs([found.experiment_id], query, max_results=limit,
                                   order_by=["attributes.start_time DESC"])
    return runs


# ---- the runs of a comparison ---------------------------------------------------------------------
def job_runs(client, experiment: str, parents=(), tags=(), model: str | None = None) -> list:
    """Finished tunelab job runs (not multirun parents, not comparisons), newest first."""
    where = ["tags.`choice.search` != ''", *(f"tags.`{key}` = '{value}'" for key, value in tags)]
    if model:
        where.append(f"params.`model.name` = '{model}'")
    return find_runs(client, experiment, where, parents)


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
    metrics: dict = field(default_factory=dict)  # the run's final MLflow metrics (an older run's under today's names too)
    host: str = ""  # the hardware that measured it: option, CPU model, target (its describe() tags)
    settings: dict = field(default_factory=dict)  # what it ran under but its seed (tuning/config/identity.py)


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
                     with_current_names(run.data.metrics), _host(tags), run_settings(params, tags))


def measured_rounds(records) -> int:
    """The most rounds any task of a run measured in: below two its search never saw a measurement."""
    rounds: dict = {}
    for record in records:
        rounds.setdefault(record.task, set()).add(record.round)
    return max(map(len, rounds.values()), default=0)


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
    return method_value(run.data.params, run.data.tags, key)


def method_labels(runs: list[LoadedRun], method_by) -> dict[str, str]:
    """run id -> method name: the --method-by values that differ between the runs, joined by '+'
    (every value when none differ)."""
    names, _ = method_rows([r.keys for r in runs], [r.settings for r in runs], by_settings=False)
    return {r.run_id: name for r, name in zip(runs, names)}


GROUP_BY = ("identity", "name")


def row_labels(runs: list[LoadedRun], group_by: str = "identity", rename: dict | None = None
               ) -> tuple[dict[str, str], dict, list[str]]:
    """(run id -> its row, method name -> the settings its runs differ in, the lines the report opens
    with). `group_by` identity: runs of one method name that did not run alike (budget, hardware, space,
    store, a hyperparameter: tuning/config/identity.py) are rows of their own, named by what tells them
    apart; name: they share the name's row, and the report warns so."""
    rows, unlike = method_rows([r.keys for r in runs], [r.settings for r in runs], group_by == "identity", rename)
    lines = []
    for name, differ in unlike.items():
        if not differ:
            continue
        if group_by == "identity":
            lines.append(f"{name}: its runs did not all run alike, so they are rows of their own, told apart by "
                         f"{', '.join(differ)} (--group-by name pools them)")
        else:
            lines.append(f"warning: {name} pools runs that did not run alike: " + "; ".join(
                f"{key} {' / '.join(values)}" for key, values in differ.items())
                         + " (--group-by identity makes them rows of their own)")
    return {r.run_id: row for r, row in zip(runs, rows)}, unlike, lines


def unlike_rows(runs: list[LoadedRun], labels: dict[str, str]) -> list[str]:
    """A warning for the report's top when the compared rows did not share the settings every method
    should (tuning/config/identity.py SHARED_SETTINGS: the hardware, the space, the budget, the store)."""
    found = shared_differences([labels[r.run_id] for r in runs], [r.settings for r in runs])
    if not found:
        return []
    return ["warning: the compared rows did not run alike: " + "; ".join(
        f"{key} " + ", ".join(f"{value} ({', '.join(rows)})" for value, rows in values.items())
        for key, values in found.items())]


def task_truths(runs: list[LoadedRun], store_override: str | None) -> tuple[dict, list[str]]:
    """task name -> TaskTruth: from the store the runs recorded (or `store_override`) when every run of
    the task names the same rows, else from the pooled readings of the compared runs."""
    from tuning.store import StoreError, connect_store, display_location, is_store_url

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
            if not store_override:
                _refuse_unnamed_server(path, name, runs)
            try:
                if not is_store_url(path) and not Path(path).is_file():
                    raise StoreError(f"{path}: no such file (--store names where it is now)")
                store = stores.setdefault(path, connect_store(path, read_only=True))  # only read, never changed
                readings = store.readings(*keys.pop())
            except StoreError as error:
                raise SystemExit(f"tuning.tools.compare: {error} (the store {named_by} names)") from None
            if readings:
                by_config = {config: statistics.median(values) for config, values in readings.items()}
                found[name] = TaskTruth(by_config, min(by_config.values()), f"store {display_location(path)}", readings)
                continue
            notes.append(f"{name}: the store {display_location(path)} holds no reading of it; scored by the runs' "
                         "own readings")
        else:
            notes.append(f"{name}: not every run used the same measurement store; scored by the runs' own readings "
                         "(the minimum of noisy readings is biased low)")
        found[name] = _pooled_truth(runs, entries[0]["key"])
    return found, notes


def _refuse_unnamed_server(path: str, task_name: str, runs: list[LoadedRun]) -> None:
    """A run's artifacts are anyone's who can write to its MLflow store: a database server they
    name is opened only when the user names it too (tuning/config/untrusted.py)."""
    from tuning.config.untrusted import refusal, unnamed_servers, user_named_servers

    found = unnamed_servers({"store": path}, user_named_servers())
    if found:
        run_id = next(r.run_id for r in runs if any(t.get("name") == task_name for t in r.tasks))
        raise SystemExit("tuning.tools.compare: " + refusal(f"tasks.json of MLflow run {run_id} (task {task_name})", found,
                                                       "name the store with --store"))


def _store_entry(task: dict) -> tuple[str | None, tuple]:
    """(the store file a tasks.json entry names, its rows' [hardware, task, space] key), or (None, ())
    when the entry names none or names it malformed (the artifact is untrusted)."""
    path, key = task.get("store"), task.get("store_key")
    if not (isinstance(path, str) and path and isinstance(key, list) and len(key) == 3
            and all(isinstance(k, str) and _utf8(k) for k in key)):
        return None, ()
    return path, tuple(key)


def _utf8(text: str) -> bool:
    """False for a string sqlite cannot take as a parameter (a lone surrogate, which JSON can carry)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _pooled_truth(runs: list[LoadedRun], key: str) -> TaskTruth:
    readings = [r.result.cost for run in runs for r in run.records if r.workload_key == key and r.result.ok]
    return TaskTruth({}, min(readings) if readings else math.inf, "readings of the compared runs")


@dataclass
class Gathered:
    curves: list[Curve]
    truths: dict
    notes: list[str]
    metrics: dict  # (method, seed, model) -> the run's final MLflow metrics
    preface: list[str] = field(default_factory=list)  # how the runs became rows, said first in the report
    unlike: dict = field(default_factory=dict)  # method name -> the settings its runs differ in


def gather(client, runs, scratch: Path, method_by, store_override: str | None = None,
           rename: dict | None = None, with_overhead: bool = False, group_by: str = "identity") -> Gathered:
    """The curves, truths and notes of the selected MLflow runs (newest run per row, seed and model);
    `rename` maps method names to the names to show (e.g. sa+greedy -> SA). `with_overhead`: each
    curve's seconds also count its run's own search and model-fitting seconds (add_overhead).
    `group_by`: row_labels'."""
    notes, loaded = [], []
    for run in runs:
        found = load_run(client, run, scratch, method_by)
        if isinstance(found, str):
            notes.append(f"run {run.info.run_name or run.info.run_id} left out: {found}")
        else:
            loaded.append(found)
    if not loaded:
        raise SystemExit("tuning.tools.compare: no finished tunelab run with records matches the selection")
    for run in loaded:
        if not run.tasks:  # a run from before tasks.json: its records name its one task
            keys = sorted({r.workload_key for r in run.records})
            run.tasks = [{"name": run.records[0].task if run.records else "?", "key": k} for k in keys[:1]]
    labels, unlike, preface = row_labels(loaded, group_by, rename)
    newest: dict = {}
    for run in loaded:  # newest first
        slot = (labels[run.run_id], run.seed, run.model)  # a grid over models has one run per model at a seed
        if slot in newest:
            notes.append(f"{labels[run.run_id]} seed {run.seed} {run.model}: {run.name} left out, a newer run of it "
                         "is compared")
        newest.setdefault(slot, run)
    kept = list(newest.values())
    preface += unlike_rows(kept, labels)
    hosts = sorted({run.host for run in kept if run.host})
    if len(hosts) > 1:  # readings from different machines do not compare: say so before any table
        notes.append("the runs were measured on different hardware: " + "; ".join(hosts))
    elif hosts:
        notes.append(f"hardware: {hosts[0]}")
    blind = [f"{labels[run.run_id]} seed {run.seed}" for run in kept if measured_rounds(run.records) < 2]
    if blind:  # first in the notes: such a ratio compares first guesses, not searches
        notes.insert(0, "warning: measured in a single round, so no measurement was fed back to the search "
                        f"(budget.trials <= budget.plan_size): {', '.join(blind)}")
    truths, truth_notes = task_truths(kept, store_override)
    curves = [c for run in kept for c in run_curves(run.records, run.tasks, truths, labels[run.run_id], run.seed,
                                                     run.run_id, run.start_s, run.init_random)]
    if with_overhead:
        notes += add_overhead(client, kept, curves)
    return Gathered(curves, truths, notes + truth_notes, {slot: run.metrics for slot, run in newest.items()},
                    preface, unlike)


# per round, cumulative, at step = measurements so far; the search proposes a round before it is
# measured, the model is fitted after: a measurement has paid its round's search and the fits before it
OVERHEAD_METRICS = {"time/search_s": False, "time/model_s": True}  # key -> counted from the round before


def add_overhead(client, runs: list[LoadedRun], curves: list[Curve]) -> list[str]:
    """One time axis for every method: each curve's seconds plus its run's own search and model
    seconds so far (the runs' per-round metrics), so a method's compute counts as it does in its
    optimisation seconds. A run of several tasks logs those per task under one name: left as it is,
    and said."""
    notes, by_run = [], {run.run_id: run for run in runs}
    for curve in curves:
        run = by_run[curve.run_id]
        if len(run.tasks) != 1:
            notes.append(f"{curve.method} seed {curve.seed}: several tasks, seconds without search and model time")
            continue
        reused = run.metrics.get("tuning/measurements", 0) - run.metrics.get("tuning/new_measurements", 0)
        histories = {key: {m.step: m.value for m in client.get_metric_history(run.run_id, key)}
                     for key in OVERHEAD_METRICS}
        if not any(histories.values()):
            notes.append(f"{curve.method} seed {curve.seed}: no per-round search or model seconds in its MLflow run "
                         "(re-logged from a folder without round_times.jsonl), seconds without them")
        for key, before in OVERHEAD_METRICS.items():
            curve.elapsed_s = curve.elapsed_s + overhead_at_each(histories[key], curve.length, before, int(reused))
    return notes + ["seconds include each run's own search and model-fitting seconds (--with-overhead)"]


def overhead_at_each(history: dict, length: int, from_round_before: bool = False, reused: int = 0) -> np.ndarray:
    """Cumulative seconds ({step: seconds so far}, step = measurements after a round, `reused`
    records from tuning.database counted in it) at each of the run's own measurements 1..length: the
    value logged after the round that holds it, or with `from_round_before` after the round before
    it (0 in the first round); the last value past the last round; zeros with no history. A resume
    counts its seconds from 0 again: each later value keeps what was logged before the drop."""
    steps = np.array(sorted(history), dtype=np.int64)
    if not len(steps):
        return np.zeros(length)
    values = np.array([history[s] for s in steps], dtype=np.float64)
    drops = np.concatenate([[0.0], np.where(np.diff(values) < 0, values[:-1], 0.0)])
    values = values + np.cumsum(drops)
    index = np.searchsorted(steps, np.arange(1, length + 1) + reused, side="left")
    if from_round_before:
        values = np.concatenate([[0.0], values])
    return values[np.minimum(index, len(values) - 1)]
