"""Fill, inspect and export a measurement store (tuning/store.py; docs/store.md).

    python -m tuning.dataset build  --store stores/host.sqlite --model conv_l8 gemm_512 --configs 2000
    python -m tuning.dataset import --store stores/host.sqlite outputs/runs/*/records.jsonl
    python -m tuning.dataset stats  --store stores/host.sqlite
    python -m tuning.dataset export --store stores/host.sqlite --task conv_l8 --out conv_l8_cache.json

`build` measures, on this host, a seeded random sample of each model's space (or the whole space
when it has at most --exhaustive-limit configs), with the hardware and evaluator a run would use
(Hydra overrides after the options, e.g. `hardware.build_workers=2 evaluator=adaptive`). It prints
how long it expects to take before starting, writes every result as it arrives, and skips what the
store already holds: running the same command again resumes a killed build.
`import` adds the records of earlier runs (single operators and whole models) whose saved config
names the same hardware and evaluator settings as a composition with the given overrides.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from tuning.store import MeasurementStore, fingerprint, space_signature

CONF = Path(__file__).resolve().parents[1] / "conf"
DEFAULT_SECONDS = 0.85  # a real measurement on the 2-core development host (build + check + 5 x 50 ms)


def compose(overrides: list[str]):
    """The run config these overrides give (the same defaults and validation as run.py)."""
    from hydra import compose as hydra_compose, initialize_config_dir

    from tuning.config import ConfigError, register, validate

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = hydra_compose("config", overrides=[*overrides, "tracking=none"], return_hydra_config=False)
    try:
        validate(cfg)
    except ConfigError as error:
        raise SystemExit(f"tunelab: {error}") from error
    return cfg


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


def seconds_per_measurement(store, key: str) -> float:
    rows = store.conn.execute("SELECT build_s + run_s FROM readings WHERE hardware = ? ORDER BY id DESC LIMIT 500",
                              (key,)).fetchall()
    return statistics.median(r[0] for r in rows) if len(rows) >= 20 else DEFAULT_SECONDS


def build(args) -> None:
    from hydra.utils import instantiate

    from tuning.task import build_tasks

    store = MeasurementStore(args.store)
    cfgs = [compose([f"model={name}", *args.overrides]) for name in args.model]
    hardware, evaluator = instantiate(cfgs[0].hardware), instantiate(cfgs[0].evaluator)
    with hardware:
        key, description = fingerprint(hardware, evaluator.spec)
        jobs = []
        for cfg in cfgs:
            for task in build_tasks(cfg.model):
                space = hardware.space(task)
                task_key, signature = hardware.store_key(task), space_signature(space)
                store.register(key, description, task_key, task)
                have = set(store.configs(key, task_key, signature))
                todo = [c for c in plan(space, args.configs, args.exhaustive_limit, args.seed) if c not in have]
                jobs.append((task, space, task_key, signature, todo))
                print(f"{task.name}: space {space.size:,} configs, {len(have):,} stored, {len(todo):,} to measure")
        total = sum(len(todo) for *_, todo in jobs)
        per = seconds_per_measurement(store, key)
        print(f"about {total:,} measurements x {per:.2f} s = {_duration(total * per)} on this host "
              f"(store: {store.path})", flush=True)
        if args.dry_run:
            return
        with tqdm(total=total, unit="config", dynamic_ncols=True) as bar:
            for task, space, task_key, signature, todo in jobs:
                bar.set_description(task.name)
                for start in range(0, len(todo), args.batch):
                    _measure_batch(store, hardware, evaluator, key, task, space, task_key, signature,
                                   todo[start:start + args.batch], bar)
    print(f"store: {store.path} ({store.count():,} rows)")


def _measure_batch(store, hardware, evaluator, key, task, space, task_key, signature, batch, bar) -> None:
    def write(i, result):
        config = tuple(result.config) if result.config is not None else batch[i]
        store.add(key, task_key, signature, config, _jsonable(space.decisions(config)), result, "dataset")
        bar.update(1)

    evaluator.measure(hardware, task, batch, on_result=write)


def _duration(seconds: float) -> str:
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


# ---- import ------------------------------------------------------------------------------------
def import_records(args) -> None:
    """Rows from earlier runs' records.jsonl; a run whose hardware or evaluator settings differ from
    the composition's is skipped with a message (its readings mean something else)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from tuning.records import RecordLog
    from tuning.task import build_tasks

    store = MeasurementStore(args.store)
    added = 0
    for path in map(Path, args.records):
        run_dir = path.parent if path.is_file() else path
        log = RecordLog(run_dir / "records.jsonl")
        saved = run_dir / "config.yaml"
        if not log.path.is_file() or not saved.is_file():
            print(f"skip {run_dir}: no records.jsonl and config.yaml")
            continue
        try:
            cfg = compose([*_run_overrides(OmegaConf.load(saved)), *args.overrides])
            records = log.load()
        except (SystemExit, ValueError, TypeError, KeyError) as error:
            print(f"skip {run_dir}: {error}")
            continue
        with instantiate(cfg.hardware) as hardware:
            evaluator = instantiate(cfg.evaluator)
            key, description = fingerprint(hardware, evaluator.spec)
            tasks = (build_tasks(cfg.model) if cfg.model.kind in ("gemm", "conv2d")
                     else hardware.model_tasks(cfg.model, cfg.seed))
            by_key = {task.key: task for task in tasks}
            for record in records:
                task = by_key.get(record.workload_key)
                if task is None or record.result.reused:
                    continue
                space = hardware.space(task)
                task_key, signature = hardware.store_key(task), space_signature(space)
                store.register(key, description, task_key, task)
                config = tuple(record.result.config or record.config)
                if not space.is_valid(config):
                    continue
                store.add(key, task_key, signature, config, _jsonable(space.decisions(config)), record.result,
                          "import", measured_at=record.time)
                added += 1
        print(f"{run_dir}: {len(records)} records read")
    print(f"added {added:,} rows; store: {store.path} ({store.count():,} rows)")


def _run_overrides(cfg) -> list[str]:
    """The group choices and keys that decide what a saved run measured, as overrides."""
    from omegaconf import OmegaConf

    model = OmegaConf.to_container(cfg.model, resolve=True)
    out = [f"++model.{k}={_override_value(v)}" for k, v in model.items()]
    for group in ("hardware", "evaluator"):
        node = OmegaConf.to_container(cfg[group], resolve=True)
        out += [f"++{group}.{k}={_override_value(v)}" for k, v in node.items()]
    return out + [f"seed={cfg.seed}"]


def _override_value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)


# ---- command line ------------------------------------------------------------------------------
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tuning.dataset", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help="measure a random sample (or all) of each model's space")
    b.add_argument("--store", required=True)
    b.add_argument("--model", nargs="+", required=True, help="single-operator model options, e.g. conv_l8 gemm_512")
    b.add_argument("--configs", type=int, default=2000, help="random configs per task (default 2000)")
    b.add_argument("--exhaustive-limit", type=int, default=5000,
                   help="measure every config of spaces at most this big (default 5000)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--batch", type=int, default=32, help="configs built, then timed, together")
    b.add_argument("--dry-run", action="store_true", help="print the plan and the time estimate only")
    b.add_argument("overrides", nargs="*", help="Hydra overrides for the hardware and evaluator")
    i = commands.add_parser("import", help="add earlier runs' records")
    i.add_argument("--store", required=True)
    i.add_argument("records", nargs="+", help="run folders or their records.jsonl")
    i.add_argument("--override", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    for key in ("configs", "exhaustive_limit", "batch"):
        if getattr(args, key, 1) < (0 if key == "exhaustive_limit" else 1):
            parser.error(f"--{key.replace('_', '-')}: must be positive")
    {"build": build, "import": import_records}[args.command](args)


if __name__ == "__main__":
    main(sys.argv[1:])
