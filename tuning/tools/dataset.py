"""Fill, inspect, export and copy a measurement store (tuning/store/; docs/store.md).

    python -m tuning.tools.dataset build  --store stores/host.sqlite --model conv_l8 gemm_512 --configs 2000
    python -m tuning.tools.dataset build  --store stores/host.sqlite --model squeezenet1_0 --configs 32   # each kernel
    python -m tuning.tools.dataset import --store stores/host.sqlite outputs/runs/*/records.jsonl
    python -m tuning.tools.dataset reread --store stores/host.sqlite outputs/runs/*/* --top 1 --measurements 5
    python -m tuning.tools.dataset stats  --store stores/host.sqlite
    python -m tuning.tools.dataset agree  --store stores/host.sqlite --against stores/host-again.sqlite
    python -m tuning.tools.dataset export --store stores/host.sqlite --task conv_l8 --out conv_l8_cache.json
    python -m tuning.tools.dataset copy   --store stores/host.sqlite --to postgresql://lab@db:5432/tunelab
    python -m tuning.tools.dataset gpu-batch export --model conv_l8 --configs 500 --out packs hardware.arch=sm_90
    python -m tuning.tools.dataset import --store stores/h100.sqlite packs/conv_l8   # a timed pack's readings

A store is a sqlite file or a PostgreSQL database named by its URL (postgresql://user@host:port/db;
tuning/store/postgres.py); every command takes either.

`build` measures, on this host, a seeded random sample of each model's space (or the whole space
when it has at most --exhaustive-limit configs), with the hardware and evaluator a run would use
(Hydra overrides anywhere after `build`, e.g. `hardware.build_workers=2 evaluator=adaptive`). It prints
how long it expects to take before starting, writes every result as it arrives, and skips what the
store already holds: running the same command again resumes a killed build.
`import` adds the records of earlier runs (single operators and whole models) whose saved config
names the same hardware and evaluator settings as a composition with the given overrides; a saved
config is untrusted (tuning/engine/run_folder.py `load_config`): one naming a class the lab does not
register is skipped, nothing in it instantiated.

`reread` measures each run's best `--top` configs again (by the run's own readings) until the store
holds `--measurements` readings of each, on the hardware and evaluator of the run's saved config, in
passes over all of them (a config is measured once per pass, so the host's drift spreads over them
all): a final kernel's true latency is then the median of several readings, not of one noisy one. A
config shared by several runs is measured for all of them at once; a second call adds nothing.

`agree` sets two stores' readings of the configs both hold side by side, per task: a second build
of one store (the same `build` command and seed into another file, in another sitting) shows how far
the store's own numbers move: the median ratio of the configs' medians (second / first) with its
interval, the spread of the ratios, the share within 10%, the rank correlation, where the first
store's best config ranks in the second, and the drift gauges' ratio (the host's speed between them).

`gpu-batch export` builds a batch of candidates into packs that a GPU host with only TVM's runtime
times (tuning/tools/gpu_batch.py; docs/gpus.md); `import` of a pack's folder adds the readings
its runner wrote.

`copy` copies every row of one store into another (sqlite to PostgreSQL or back, or between two of
either): the hardware, task and space descriptions, then the readings in the order they were
written, in batches. The source is untrusted: a reading no reader would accept is left behind and
counted as unreadable. A reading the target holds already (the same hardware, task, space, config,
costs, error, message, time and source) is skipped, so running a killed copy again resumes it. It
prints how many readings it copied and skipped.

One builder per store: `build`, `import` and `copy` (of its target) hold an OS lock on
`<store>.build.lock` (for a PostgreSQL store, an advisory lock in its database) from
before they plan until they end, and a second one on the same store is refused at once (naming the
holder's pid), since each plans from what the store held at its start and both would add the same
configs. `import` adds no reading the store already holds (a run made with that store wrote its rows
itself). `stats`, `export`, `build --dry-run` and the source of `copy` only read the store (they
never create or change it); `build`, `import` and `copy` are refused before any work when their
store cannot be written.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tqdm import tqdm

from tuning.config.cli import add_command, new_parser
from tuning.hardware.gpu_pack import PackError
from tuning.store import MeasurementStore, StoreError, TaskRows, copy_store, is_store_url, open_store
from tuning.tools.gpu_batch import add_gpu_batch
from tuning.tools.gpu_batch import export as gpu_batch_export
from tuning.tools.run_config import compose, full_readings, model_tasks

DEFAULT_SECONDS = 0.85  # a real measurement on the 2-core development host (build + check + 5 x 50 ms)


# ---- build -------------------------------------------------------------------------------------
def plan(space, count: int, exhaustive_limit: int, seed: int) -> list[tuple]:
    """The configs a build measures: the whole space if small, else `count` distinct random ones
    (canonical, in a seeded order, so a resumed build continues the same sample)."""
    if space.size <= exhaustive_limit:
        return list(dict.fromkeys(space.canonical(c) for c in space.enumerate()))
    rng = np.random.default_rng(seed)
    chosen: dict = {}
    for _ in range(count * 20):
        if len(chosen) >= count:
            break
        chosen.setdefault(space.canonical(space.sample(rng)), None)
    return list(chosen)


def seconds_per_measurement(store, key: str) -> tuple[float, str]:
    """(seconds, where they come from): the median of this hardware's last stored readings, or a guess."""
    seconds = store.measurement_seconds(key, 500) if store else []
    if len(seconds) >= 20:
        return statistics.median(seconds), "on this host"
    why = "the store has too few readings of this hardware to say" if store else "no store yet"
    return DEFAULT_SECONDS, f"a guess ({why}; a slow task takes longer)"


def build(args) -> None:
    cfgs = [compose([f"model={name}", *args.overrides]) for name in args.model]
    if args.dry_run:
        exists = is_store_url(args.store) or Path(args.store).expanduser().is_file()
        plan_build(args, cfgs, open_store(args.store, "--store", read_only=True) if exists else None)
        return
    store = open_store(args.store, "--store")
    with sole_builder(store):
        plan_build(args, cfgs, store)
    print(f"store: {store.location} ({store.count():,} rows)")


def plan_build(args, cfgs, store: MeasurementStore | None) -> None:
    """Plan what the store lacks, say how long it takes, and (unless a dry run) measure it. A dry
    run reads the store, if there is one, and writes nothing."""
    from hydra.utils import instantiate

    hardware, evaluator = instantiate(cfgs[0].hardware), instantiate(cfgs[0].evaluator)
    spec = full_readings(evaluator.spec)
    with hardware:
        jobs = []
        for cfg in cfgs:
            for task in model_tasks(cfg, hardware):
                table = TaskRows(store, hardware, spec, task, hardware.space(task))
                if not args.dry_run:
                    table.register()
                have = set(table.configs()) if store else set()
                todo = [c for c in plan(table.space, args.configs, args.exhaustive_limit, args.seed) if c not in have]
                jobs.append((table, todo))
                print(f"{task.name}: space {table.space.size:,} configs, {len(have):,} stored, {len(todo):,} to measure")
        total = sum(len(todo) for _, todo in jobs)
        per, basis = seconds_per_measurement(store, jobs[0][0].hardware_key) if jobs else (DEFAULT_SECONDS, "")
        print(f"about {total:,} measurements x {per:.2f} s = {_duration(total * per)}{', ' if basis else ''}{basis} "
              f"(store: {store.location if store else Path(args.store).expanduser()}"
              f"{'' if store else ', not created by a dry run'})", flush=True)
        if args.dry_run:
            return
        with tqdm(total=total, unit="config", dynamic_ncols=True, disable=None) as bar:
            for table, todo in jobs:
                bar.set_description(table.task.name)
                for start in range(0, len(todo), args.batch):
                    measure_into(table, hardware, spec, todo[start:start + args.batch], on_row=lambda: bar.update(1))


@contextmanager
def sole_builder(store, key: str = "--store"):
    """Hold the store's build lock (store.builder_lock: an OS lock beside a sqlite file, an advisory
    lock in a PostgreSQL database, dropped however the build ends); refused at once, naming the
    holder, while another build holds it."""
    with store.builder_lock(key):
        yield


def measure_into(table: TaskRows, hardware, spec, configs, source: str = "dataset", on_row=None) -> None:
    """Measure `configs` on `hardware` and add each result to the store as it arrives."""
    def write(i, result):
        table.add(configs[i], result, source)
        if on_row:
            on_row()

    hardware.measure(table.task, list(configs), spec, write)


def _duration(seconds: float) -> str:
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


# ---- import ------------------------------------------------------------------------------------
def import_records(args) -> None:
    """Rows from earlier runs' records.jsonl; a run whose hardware or evaluator settings differ from
    the composition's is skipped with a message (its readings mean something else). Imports and
    builds into one store take turns (its build lock)."""
    import tempfile

    from tuning.tools.gpu_batch import import_pack, is_pack, unpacked

    store = open_store(args.store, "--store")
    readings = Path(args.readings) if args.readings else None
    added = 0
    with sole_builder(store), tempfile.TemporaryDirectory(prefix="tunelab-pack-") as scratch:
        for path in map(Path, args.records):
            if str(path).endswith(".tar.gz") or is_pack(path):
                added += import_pack(store, unpacked(path, Path(scratch)), readings)
            else:
                added += _import_run(store, path, args.overrides)
    print(f"added {added:,} rows; store: {store.location} ({store.count():,} rows)")


def _import_run(store, path: Path, overrides: list[str]) -> int:
    """One run folder's (or records.jsonl's) records into the store; returns the rows added. A
    record the store already holds (the run wrote it there, or it was imported before) is not
    added again: its readings would count twice in every median."""
    from hydra.utils import instantiate

    from tuning.core.records import RecordLog
    from tuning.core.task import build_tasks

    run_dir = path.parent if path.is_file() else path
    loaded = saved_run(run_dir, overrides, lambda: RecordLog(run_dir / "records.jsonl").load())
    if loaded is None:
        return 0
    cfg, records = loaded
    added = 0
    with instantiate(cfg.hardware) as hardware:
        evaluator = instantiate(cfg.evaluator)
        tasks = (build_tasks(cfg.model) if cfg.model.kind in ("gemm", "batch_matmul", "conv2d")
                 else hardware.model_tasks(cfg.model, cfg.seed))
        by_key, tables = {task.key: task for task in tasks}, {}
        for record in records:
            task = by_key.get(record.workload_key)
            if task is None or record.result.reused or record.result.screened:  # one run, not a store's reading
                continue
            if task.key not in tables:
                tables[task.key] = TaskRows(store, hardware, evaluator.spec, task, hardware.space(task))
            config = tuple(record.config)
            if not tables[task.key].space.is_valid(config) or tables[task.key].holds(config, record.result):
                continue
            tables[task.key].add(config, record.result, "import", measured_at=record.time)
            added += 1
    print(f"{run_dir}: {len(records)} records read, {added} added")
    return added


def saved_run(run_dir: Path, overrides: list[str], read=lambda: None):
    """(config, read()) of a run folder, or None with a message saying why it is skipped: no
    records.jsonl and config.yaml, or either unreadable (saved_config; `read` loads what else the
    caller needs from it)."""
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    if not (run_dir / "records.jsonl").is_file() or not (run_dir / "config.yaml").is_file():
        print(f"skip {run_dir}: no records.jsonl and config.yaml")
        return None
    try:
        return saved_config(run_dir / "config.yaml", overrides), read()
    except (ValueError, TypeError, KeyError, AttributeError, OSError, OmegaConfBaseException, YAMLError) as error:
        print(f"skip {run_dir}: {error}")
        return None


def saved_config(path: Path, overrides: list[str]):
    """A run folder's config.yaml (untrusted: only registered classes, no interpolations, validated
    like a new run's) with dotlist overrides."""
    from omegaconf import OmegaConf

    from tuning.config import ConfigError
    from tuning.engine.run_folder import load_config
    from tuning.engine.validate import validate

    given = OmegaConf.from_dotlist(list(overrides))
    saved = load_config(path, "import", named=[given], replaced=tuple(o.split("=", 1)[0] for o in overrides),
                        how="name it with --override KEY=URL")
    cfg = OmegaConf.merge(saved, given)
    if not all(key in cfg for key in ("model", "hardware", "evaluator", "seed")):
        raise ConfigError(f"import: {path}: not a tunelab run config (no model, hardware, evaluator or seed)")
    validate(cfg)
    return cfg


# ---- reread ------------------------------------------------------------------------------------
def reread(args) -> None:
    """More readings of each run's best configs, until the store holds --measurements of each."""
    store = open_store(args.store, "--store")
    added = 0
    with sole_builder(store):
        for (cfg, folders) in _runs_by_config(args.runs, args.overrides).values():
            added += _reread_group(store, cfg, folders, args.top, args.measurements)
    print(f"added {added:,} readings; store: {store.location} ({store.count():,} rows)")


def _runs_by_config(paths: list[str], overrides: list[str]) -> dict:
    """Run folders grouped by the model, hardware and evaluator of their saved configs (one
    instantiation per group); a folder without a readable run is skipped with a message."""
    from omegaconf import OmegaConf

    groups: dict = {}
    for path in map(Path, paths):
        run_dir = path.parent if path.is_file() else path
        loaded = saved_run(run_dir, overrides)
        if loaded is None:
            continue
        cfg = loaded[0]
        key = OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, ["model", "hardware", "evaluator"]))
        groups.setdefault(key, (cfg, []))[1].append(run_dir)
    return groups


def _reread_group(store, cfg, folders: list[Path], top: int, measurements: int) -> int:
    """Re-read the best `top` configs of each run in `folders` (one model, hardware and evaluator)."""
    from hydra.utils import instantiate

    from tuning.core.records import RecordLog

    added = 0
    with instantiate(cfg.hardware) as hardware:
        backend = getattr(hardware, "backend", hardware)  # a replay's readings come from its backend
        spec = full_readings(instantiate(cfg.evaluator).spec)
        tables = {task.key: TaskRows(store, backend, spec, task, backend.space(task))
                  for task in model_tasks(cfg, backend)}
        wanted: dict = {key: {} for key in tables}
        for folder in folders:
            for key, configs in best_configs(RecordLog(folder / "records.jsonl").load(), top).items():
                if key in tables:
                    wanted[key].update(dict.fromkeys(tables[key].space.canonical(c) for c in configs))
        for key, table in tables.items():
            added += _reread_table(table, backend, spec, list(wanted[key]), measurements)
    return added


def best_configs(records, top: int) -> dict[str, list[tuple]]:
    """Per task key, the `top` distinct configs with the lowest readings among the records."""
    by_task: dict = {}
    for record in sorted((r for r in records if r.result.ok), key=lambda r: r.result.cost):
        configs = by_task.setdefault(record.workload_key, [])
        if len(configs) < top and tuple(record.config) not in configs:
            configs.append(tuple(record.config))
    return by_task


def _reread_table(table: TaskRows, backend, spec, configs: list[tuple], measurements: int) -> int:
    """Measure `configs` in passes until each has `measurements` valid readings (at most that many
    passes: a config that fails to measure is not retried forever)."""
    def valid(config) -> int:
        return sum(row.ok for row in table.store.rows(*table.key, config))

    added = 0
    for _ in range(measurements):
        todo = [c for c in configs if valid(c) < measurements]
        if not todo:
            break
        measure_into(table, backend, spec, todo, source="reread")
        added += len(todo)
    print(f"{table.task.name}: {len(configs)} configs, {added} readings added (at most {measurements} each)")
    return added


# ---- stats and export -------------------------------------------------------------------------
def task_table(store, hardware: str, task_key: str, space: str) -> dict:
    """Per config: its earliest row (what a replay answers) and the median of all its readings."""
    table: dict = {}
    for row in store.rows(hardware, task_key, space):
        entry = table.setdefault(row.config, {"first": row, "readings": []})
        if row.ok:
            entry["readings"] += row.costs
    return table


def stats(args) -> None:
    """Per (hardware, task): configs, rows, errors, best and median, coverage of the space, drift."""
    store = open_store(args.store, "--store", read_only=True)
    unreadable = store.unreadable()  # every row parsed: once
    print(f"store: {store.location}  {store.count():,} rows  ({store.size_bytes() / 2**20:.1f} MiB"
          f"{f', {unreadable} unreadable rows skipped' if unreadable else ''})")
    for hardware in sorted({h for h, _, _ in store.keys()}):
        info = store.hardware_info(hardware)
        gauges = store.gauge_readings(hardware)
        drift = (f"drift gauge {min(gauges) * 1e6:.1f}-{max(gauges) * 1e6:.1f} us (median "
                 f"{statistics.median(gauges) * 1e6:.1f}, max/min {max(gauges) / min(gauges):.2f})" if gauges
                 else "no drift gauge readings")
        device = (f"GPU {info['gpu']!r}" if info.get("gpu")
                  else f"{info.get('cpu_model', '')} {info.get('num_threads', '')} threads")
        print(f"\nhardware {hardware}: {info.get('hardware', '?')} {device}, number={info.get('number')} "
              f"min_repeat_ms={info.get('min_repeat_ms')}; {drift}")
        print(f"  {'task':<24}{'configs':>9}{'rows':>8}{'errors':>8}{'best us':>10}{'median us':>11}{'coverage':>11}")
        for _, task_key, space in sorted(k for k in store.keys() if k[0] == hardware):
            task = store.task_info(task_key) or {"name": task_key}
            table = task_table(store, hardware, task_key, space)
            medians = sorted(statistics.median(e["readings"]) for e in table.values() if e["readings"])
            rows = sum(1 for _ in store.rows(hardware, task_key, space))
            errors = sum(1 for e in table.values() if not e["readings"])
            size = store.space_size(space)
            coverage = f"{100 * len(table) / size:.2g}%" if size else "?"
            best = f"{medians[0] * 1e6:.1f}" if medians else "-"
            median = f"{statistics.median(medians) * 1e6:.1f}" if medians else "-"
            print(f"  {task['name'][:23]:<24}{len(table):>9,}{rows:>8,}{errors:>8,}{best:>10}{median:>11}{coverage:>11}")


def agree(args) -> None:
    """Per (hardware, task, space) both stores hold: how the configs both measured compare."""
    from scipy.stats import spearmanr

    from tuning.tools.compare.stats import bootstrap_ci

    first, second = open_store(args.store, "--store", read_only=True), open_store(args.against, "--against", read_only=True)
    shared = sorted(set(first.keys()) & set(second.keys()))
    print(f"{first.location} against {second.location}: {len(shared)} (hardware, task, space) in both")
    for hardware in sorted({h for h, _, _ in shared}):
        gauges = first.gauge_median(hardware), second.gauge_median(hardware)
        print(f"\nhardware {hardware}: drift gauge second / first "
              f"{gauges[1] / gauges[0]:.3f}" if all(gauges) else f"\nhardware {hardware}: no drift gauge in both")
        print(f"  {'task':<24}{'configs':>8}  {'median ratio [95% CI]':<24}{'5-95%':>14}{'within 10%':>12}"
              f"{'Spearman':>10}{'best ranks':>12}")
        for _, task_key, space in (k for k in shared if k[0] == hardware):
            a = first.truths(hardware, task_key, space, min_readings=1)
            b = second.truths(hardware, task_key, space, min_readings=1)
            configs = sorted(a.keys() & b.keys())
            name = (first.task_info(task_key) or {"name": task_key})["name"][:23]
            if len(configs) < 2:
                print(f"  {name:<24}{len(configs):>8}  fewer than 2 configs in both")
                continue
            ratios = np.array([b[c] / a[c] for c in configs])
            median, low, high = bootstrap_ci(ratios, np.median, np.random.default_rng(0))
            best = min(configs, key=a.__getitem__)
            rank = 1 + sum(b[c] < b[best] for c in configs)
            spread = np.percentile(ratios, [5, 95])
            print(f"  {name:<24}{len(configs):>8,}  {f'{median:.3f} [{low:.3f}, {high:.3f}]':<24}"
                  f"{f'{spread[0]:.2f}-{spread[1]:.2f}':>14}{np.mean(np.abs(ratios - 1) <= 0.1):>12.0%}"
                  f"{spearmanr([a[c] for c in configs], [b[c] for c in configs]).correlation:>10.3f}"
                  f"{f'{rank}/{len(configs)}':>12}")


KERNEL_TUNER_ERRORS = {"invalid": "InvalidConfig", "build": "CompilationFailedConfig"}  # the rest: RuntimeFailedConfig


def export(args) -> None:
    """A task's table as a Kernel Tuner cache file (schema 1.0.0), which Kernel Tuner's simulation
    mode and the autotuning-methodology package read: one entry per config, parameters are the
    knobs' choice indices, times in milliseconds (Kernel Tuner's unit)."""
    from datetime import datetime, timezone

    store = open_store(args.store, "--store", read_only=True)
    matches = [k for k in store.keys() if (store.task_info(k[1]) or {}).get("name") == args.task or k[1] == args.task]
    if args.hardware:
        matches = [k for k in matches if k[0].startswith(args.hardware)]
    if len(matches) != 1:
        options = ", ".join(f"{(store.task_info(t) or {}).get('name', t)} (hardware {h})" for h, t, _ in store.keys())
        raise SystemExit(f"tunelab: --task {args.task!r} matches {len(matches)} tables; the store holds: {options}"
                         + (" (pick one with --hardware)" if len(matches) > 1 else ""))
    hardware, task_key, space = matches[0]
    info, task = store.hardware_info(hardware), store.task_info(task_key) or {"name": task_key, "flops": 0}
    table = task_table(store, hardware, task_key, space)
    decisions_by_config = store.decisions(hardware, task_key, space)
    width = max((len(c) for c in table), default=0)
    names = next(iter(decisions_by_config.values()), {})
    keys = list(names) if len(names) == width else [f"knob{i}" for i in range(width)]  # knob order
    cache = {}
    for config, entry in table.items():
        first = entry["first"]
        times = [c * 1e3 for c in entry["readings"]]
        time_value = (statistics.median(times) if times
                      else KERNEL_TUNER_ERRORS.get(first.error, "RuntimeFailedConfig"))
        cache[",".join(map(str, config))] = {
            **dict(zip(keys, config)), "time": time_value, "times": times,
            "compile_time": first.build_s * 1e3, "verification_time": 0.0, "benchmark_time": first.run_s * 1e3,
            "strategy_time": 0.0, "framework_time": 0.0,
            "timestamp": datetime.fromtimestamp(first.measured_at, timezone.utc).isoformat(),
            **({"GFLOP/s": task["flops"] / statistics.median(entry["readings"]) / 1e9} if times and task["flops"]
               else {}),
            "decisions": decisions_by_config.get(config, {})}
    document = {
        "schema_version": "1.0.0",
        "device_name": f"{info.get('cpu_model', info.get('hardware', 'unknown'))} ({hardware})",
        "kernel_name": task["name"],
        "problem_size": [int(v) for v in (task.get("workload") or {}).values()
                         if isinstance(v, int) and not isinstance(v, bool)],
        "tune_params_keys": keys,
        "tune_params": {k: sorted({c[i] for c in table if len(c) > i}) for i, k in enumerate(keys)},
        "objective": "time",
        "cache": cache,
    }
    Path(args.out).write_text(json.dumps(document))
    t4 = t4_path(args.out)
    t4.write_text(json.dumps(t4_results(table, keys, decisions_by_config)))
    print(f"{args.out}: {len(cache):,} configs of {task['name']} (hardware {hardware}); T4 results beside it: {t4}")


T4_INVALIDITY = {"invalid": "constraints", "build": "compile", "timeout": "timeout", "wrong_answer": "correctness"}


def t4_path(out) -> Path:
    """Where autotuning-methodology looks for the T4 results of a Kernel Tuner cache file."""
    out = Path(out)
    return out.with_name(f"{out.stem}_T4{out.suffix or '.json'}")


def t4_results(table: dict, keys: list, decisions_by_config: dict) -> dict:
    """The task's table in the T4 (Open Autotuning Results) schema, which autotuning-methodology
    reads: times in milliseconds, `time` the median of every reading, the valid configs first
    (the package needs its first row valid)."""
    results = []
    for config, entry in table.items():
        first, times = entry["first"], [c * 1e3 for c in entry["readings"]]
        results.append({
            "configuration": {**dict(zip(keys, config)), "decisions": decisions_by_config.get(config, {})},
            "times": {"compilation": first.build_s * 1e3, "runtimes": times, "framework": 0.0,
                      "search_algorithm": 0.0, "validation": 0.0},
            "invalidity": "correct" if times else T4_INVALIDITY.get(first.error, "runtime"),
            "correctness": 1 if times else 0,
            "measurements": [{"name": "time", "value": statistics.median(times) if times else
                              KERNEL_TUNER_ERRORS.get(first.error, "RuntimeFailedConfig"), "unit": "ms"}]})
    results.sort(key=lambda r: r["invalidity"] != "correct")
    return {"schema_version": "1.0.0", "metadata": {"timeunit": "milliseconds"}, "results": results}


# ---- copy ---------------------------------------------------------------------------------------
def copy(args) -> None:
    """Every row of --store that --to lacks, into --to (store.copy_store), under --to's build lock."""
    source = open_store(args.store, "--store", read_only=True)
    target = open_store(args.to, "--to")
    if source.address == target.address:
        raise StoreError(f"--to: {target.location} is the store copied from")
    with sole_builder(target, "--to"), tqdm(total=source.count(), unit="row", dynamic_ncols=True, disable=None) as bar:
        counts = copy_store(source, target, progress=bar.update)
    print(f"copied {counts.copied:,} readings from {source.location} to {target.location}; skipped "
          f"{counts.held:,} it held already and {counts.unreadable:,} unreadable; {counts.described:,} new "
          f"hardware, task and space rows{f' ({counts.invalid:,} invalid ones skipped)' if counts.invalid else ''}; "
          f"the store now holds {target.count():,} readings")


# ---- command line ------------------------------------------------------------------------------
STORE_HELP = "the measurement store (an sqlite file, or a PostgreSQL database: postgresql://user@host:port/db)"


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = new_parser("python -m tuning.tools.dataset", __doc__.split("\n\n")[0], prog)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     help="build, import, reread, stats, agree, export, copy or gpu-batch (each has its "
                                          "--help)")
    add_build(add_command(commands, "build", help="measure a random sample (or all) of each model's space"))
    add_import(add_command(commands, "import", help="add earlier runs' records"))
    add_reread(add_command(commands, "reread", help="measure runs' best configs again until each has N readings"))
    stats_cmd = add_command(commands, "stats", help="per task: configs, best, median, coverage, drift")
    stats_cmd.add_argument("--store", required=True, help=STORE_HELP)
    agree_cmd = add_command(commands, "agree", help="two stores' readings of the configs both hold, per task "
                                                    "(a second build against the first)")
    agree_cmd.add_argument("--store", required=True, help=f"the first store: {STORE_HELP}")
    agree_cmd.add_argument("--against", required=True, help="the second store, the same kinds of location")
    add_export(add_command(commands, "export",
                           help="a task's table as a Kernel Tuner cache JSON file (and T4 results)"))
    add_copy(add_command(commands, "copy", help="copy a store's rows into another (sqlite or PostgreSQL, either way)"))
    add_gpu_batch(add_command(commands, "gpu-batch", help="build candidates into packs that a GPU host times "
                                                          "(docs/gpus.md)"))
    return parser


def add_build(build_cmd) -> None:
    build_cmd.add_argument("--store", required=True, help=f"{STORE_HELP}; created if missing (not by --dry-run)")
    build_cmd.add_argument("--model", nargs="+", required=True, metavar="NAME",
                           help="model config names, e.g. conv_l8 gemm_512 (a network: each of its kernels)")
    build_cmd.add_argument("--configs", type=int, default=2000, help="random configs per task")
    build_cmd.add_argument("--exhaustive-limit", type=int, default=5000,
                           help="measure every config of spaces at most this big")
    build_cmd.add_argument("--seed", type=int, default=0, help="seeds the sample; the same seed resumes a build")
    build_cmd.add_argument("--batch", type=int, default=32, help="configs built, then timed, together")
    build_cmd.add_argument("--dry-run", action="store_true", help="print the plan and the time estimate only")
    build_cmd.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                           help="Hydra overrides of the run config, e.g. hardware.build_workers=2 evaluator=adaptive "
                                "(the hardware and evaluator measured with); anywhere after `build`")


def add_import(import_cmd) -> None:
    import_cmd.add_argument("--store", required=True, help=f"{STORE_HELP}; created if missing")
    import_cmd.add_argument("records", nargs="+", metavar="RUN",
                            help="run folders or their records.jsonl, or GPU pack folders with their readings.jsonl")
    import_cmd.add_argument("--readings", default=None, help="a GPU pack's readings file, when not in its folder")
    import_cmd.add_argument("--override", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                            help="a dotlist override of each run's saved config, e.g. hardware.num_threads=2 "
                                 "(repeatable)")


def add_reread(reread_cmd) -> None:
    reread_cmd.add_argument("--store", required=True, help=f"{STORE_HELP}; created if missing")
    reread_cmd.add_argument("runs", nargs="+", metavar="RUN", help="run folders (or their records.jsonl)")
    reread_cmd.add_argument("--top", type=int, default=1, help="each run's best this many configs (by its readings)")
    reread_cmd.add_argument("--measurements", type=int, default=5,
                            help="readings the store should hold of each of them, those it has counted")
    reread_cmd.add_argument("--override", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                            help="a dotlist override of each run's saved config (repeatable)")


def add_export(export_cmd) -> None:
    export_cmd.add_argument("--store", required=True, help=STORE_HELP)
    export_cmd.add_argument("--task", required=True, help="task name (e.g. conv_l8) or store key")
    export_cmd.add_argument("--hardware", default="",
                            help="hardware hash prefix, when the store holds several; default: any")
    export_cmd.add_argument("--out", required=True, help="the Kernel Tuner cache file to write (T4 results beside it)")


def add_copy(copy_cmd) -> None:
    copy_cmd.add_argument("--store", required=True, help="the store copied from (only read): an sqlite file or a "
                                                         "postgresql:// URL")
    copy_cmd.add_argument("--to", required=True, help="the store copied into (created if missing): an sqlite file "
                                                      "or a postgresql:// URL")


def parse_args(argv=None, prog: str | None = None) -> argparse.Namespace:
    parser = build_parser(prog)
    argv = sys.argv[1:] if argv is None else list(argv)
    args, unknown = parser.parse_known_args(argv)
    if args.command == "build" or getattr(args, "action", None) == "export":
        unknown = gather_overrides(args, unknown, argv)
        if args.command == "build" and not args.model:
            parser.error("--model: expected model names (key=value words are Hydra overrides)")
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command in ("stats", "agree", "export", "copy") and not is_store_url(args.store) \
            and not Path(args.store).is_file():
        parser.error(f"--store: no such file {args.store!r}")
    if args.command == "agree" and not is_store_url(args.against) and not Path(args.against).is_file():
        parser.error(f"--against: no such file {args.against!r}")
    if getattr(args, "python", None) is None and args.command == "gpu-batch":
        args.python = f"{sys.version_info.major}.{sys.version_info.minor}"
    for key in ("configs", "exhaustive_limit", "batch", "per_library", "attempts", "max_mib", "top", "measurements"):
        if getattr(args, key, 1) < (0 if key == "exhaustive_limit" else 1):
            parser.error(f"--{key.replace('_', '-')}: must be positive")
    return args


def gather_overrides(args, unknown: list[str], argv: list[str]) -> list[str]:
    """build's Hydra overrides may be typed anywhere after `build`, but argparse takes only the first
    run of them as positionals: a later run (after another option) comes back unknown, and a run
    right after --model's names is taken as more names. All join args.overrides in the order typed
    (of two overrides of one key the last wins); returns the unknown options."""
    swallowed = [word for word in args.model if "=" in word]
    args.model = [word for word in args.model if "=" not in word]
    later = [word for word in unknown if not word.startswith("-")]
    args.overrides = in_typed_order([*args.overrides, *swallowed, *later], argv)
    return [word for word in unknown if word.startswith("-")]


def in_typed_order(words: list[str], argv: list[str]) -> list[str]:
    left = Counter(words)
    ordered = []
    for word in argv:
        if left[word] > 0:
            ordered.append(word)
            left[word] -= 1
    return ordered


def main(argv=None, prog: str | None = None) -> None:
    args = parse_args(argv, prog)
    try:
        {"build": build, "import": import_records, "reread": reread, "stats": stats, "agree": agree, "export": export,
         "copy": copy, "gpu-batch": gpu_batch_export}[args.command](args)
    except (StoreError, PackError) as error:
        print(f"tunelab: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
