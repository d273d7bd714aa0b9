"""Replayed candidates per second, and what bounds them: the search, the cost model or the store.

    python experiments/bench_replay.py --store stores/lab.sqlite [--model conv_l8] [--trials 256] [--seeds 0 1]
    python experiments/bench_replay.py --store stores/lab.sqlite --before 769448d   # that commit's code beside this one

Runs sa+greedy+xgb and ppo+kmeans+xgb on hardware=replay (on_miss=error: nothing is measured) over
the store-restricted space (model.space=store, the fully offline comparison) and the full space
(where most proposals are `not_in_store`), and prints per method the candidates per second and the
seconds spent in the search (propose + observe), the cost model (fit + predict), the store (lookups)
and the rest of the loop. Every run is a fresh process. `--before REV` also runs each row with the
code of git revision REV (checked out into a temporary folder), alternating with this code seed by
seed in one sitting, and prints the speed-up. Build a store first:
python -m tuning.tools.dataset build --store stores/lab.sqlite --model conv_l8 evaluator=adatune_de
(docs/claims.md; a store timed with another evaluator: --evaluator).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from tuning.config.cli import child_json

REPO = Path(__file__).resolve().parents[1]
METHODS = {"sa+greedy+xgb": ("sa", "greedy", "xgb"), "ppo+kmeans+xgb": ("ppo", "kmeans", "xgb")}
PARTS = ("search", "cost model", "store", "rest")


class Timed:
    """Counts the seconds spent in a component's methods."""

    def __init__(self, target, names):
        self.seconds = 0.0
        for name in names:
            method = getattr(target, name)
            setattr(target, name, self._timed(method))

    def _timed(self, method):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
        return timed


def one_run(store: str, model: str, evaluator: str, method: str, space: str, trials: int, seed: int) -> dict:
    """One replayed run in this process, with the `tuning` package this process imports."""
    from hydra.utils import instantiate

    from tuning.core.task import build_tasks
    from tuning.engine.budget import DEFAULT_FIRST
    from tuning.engine.loop import Components, RunInfo, tune_task
    from tuning.tools.dataset import compose

    search, sampler, cost_model = METHODS[method]
    cfg = compose([f"model={model}", f"model.space={space}", f"evaluator={evaluator}", "hardware=replay",
                   f"hardware.store={store}", "hardware.on_miss=error", f"search={search}", f"sampler={sampler}", f"cost_model={cost_model}",
                   f"seed={seed}", f"budget.trials={trials}", "tracking=none"])
    parts = Components(*(instantiate(cfg[g]) for g in ("search", "sampler", "evaluator", "cost_model", "hardware",
                                                         "tracking")))
    if space == "store":
        parts.hardware.restrict_to_store(parts.evaluator.spec)
    task = build_tasks(cfg.model)[0]
    parts.hardware.space(task)  # the space (TVM's design space, the store's configs) is set-up, not timed
    store_time = Timed(parts.hardware, ["measure"])
    with tempfile.TemporaryDirectory() as out:
        run = RunInfo(seed=seed, out_dir=Path(out), method=method, trials=trials,
                      plan_size=cfg.budget.plan_size or parts.search.default_plan_size,
                      min_trials_per_task=(DEFAULT_FIRST if cfg.budget.min_trials_per_task is None
                                           else cfg.budget.min_trials_per_task), callbacks=[])
        started = time.perf_counter()
        outcome = tune_task(task, parts, run)
        wall = time.perf_counter() - started
    parts.hardware.close()
    times = outcome.times
    found = sum(r.result.error != "not_in_store" for r in outcome.records)
    parts_s = {"search": times["search_s"], "cost model": times["model_s"], "store": store_time.seconds}
    return {"candidates": len(outcome.records), "answered": found, "wall": wall, **parts_s,
            "rest": wall - sum(parts_s.values()), "best_us": outcome.best_cost * 1e6}


def run_in(tree: Path, *args) -> dict:
    """one_run(*args) in a fresh process that imports `tuning` from `tree`."""
    code = ("import importlib.util, json, sys\n"
            "spec = importlib.util.spec_from_file_location('bench_replay', sys.argv[1])\n"
            "bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)\n"
            "store, model, evaluator, method, space, trials, seed = sys.argv[2:]\n"
            "print(json.dumps(bench.one_run(store, model, evaluator, method, space, int(trials), int(seed))))\n")
    env = {**os.environ, "PYTHONPATH": str(tree), "HYDRA_FULL_ERROR": "1"}
    return child_json([sys.executable, "-c", code, __file__, *map(str, args)], f"the run in {tree} failed",
                      cwd=tree, env=env)


def checkout(revision: str, into: Path) -> Path:
    """The repository's files at `revision` (git archive), unpacked into `into`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", revision], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--before {revision}: {archive.stderr.decode().strip()}")
    archive_path = into / "tree.tar"
    archive_path.write_bytes(archive.stdout)
    with tarfile.open(archive_path) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def _per_walker_step(space, configs, deltas):
    """The restricted step as first written: one nearest() lookup per walker that left the set."""
    moved = space.base.step_all(configs, deltas)
    return np.asarray([m if m in space._stored else space.nearest(m, exclude=tuple(s))
                       for s, m in zip(map(tuple, configs.tolist()), map(tuple, moved.tolist()))])


def restricted_step_speedup(store: str, model: str, evaluator: str, walkers: int = 128,
                            steps: int = 100) -> tuple[float, float]:
    """Seconds for `steps` PPO steps of `walkers` on the store-restricted space: one batched tree
    query per step (RestrictedSpace.step_all) against one nearest() lookup per walker that left."""
    from hydra.utils import instantiate

    from tuning.core.task import build_tasks
    from tuning.tools.dataset import compose

    cfg = compose([f"model={model}", "model.space=store", f"evaluator={evaluator}", "hardware=replay",
                   f"hardware.store={store}"])
    hardware, evaluator = instantiate(cfg.hardware), instantiate(cfg.evaluator)
    hardware.restrict_to_store(evaluator.spec)
    space = hardware.space(build_tasks(cfg.model)[0])
    rng = np.random.default_rng(0)
    configs = np.asarray([space.sample(rng) for _ in range(walkers)])
    deltas = [rng.integers(-1, 2, size=configs.shape) for _ in range(steps)]

    timings = []
    for step in (lambda c, d: _per_walker_step(space, c, d), space.step_all):
        started, current = time.perf_counter(), configs
        for d in deltas:
            current = step(current, d)
        timings.append(time.perf_counter() - started)
    hardware.close()
    return timings[0], timings[1]


def print_row(label: str, space: str, runs: list[dict]) -> dict:
    mean = {k: statistics.mean(r[k] for r in runs) for k in runs[0]}
    bound = max(PARTS, key=lambda k: mean[k])
    rates = [r["candidates"] / r["wall"] for r in runs]
    spread = f" ({min(rates):.1f}-{max(rates):.1f})" if len(runs) > 1 else ""
    print(f"{label:<26}{space:<7}{mean['candidates'] / mean['wall']:>8.1f}{mean['wall']:>8.1f}"
          + "".join(f"{mean[k]:>8.1f}" for k in PARTS)
          + f"{mean['answered']:>10.0f}{mean['best_us']:>9.1f}  {bound} ({mean[bound] / mean['wall']:.0%}){spread}",
          flush=True)
    return mean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="a measurement store holding the model's configs")
    parser.add_argument("--model", default="conv_l8", help="the task to replay (model group option)")
    parser.add_argument("--evaluator", default="adatune_de",
                        help="the evaluator the store was timed with (its readings are kept per evaluator; "
                             "adatune_de: the claims' store, docs/claims.md)")
    parser.add_argument("--trials", type=int, default=256, help="candidates per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="one run per seed and row")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), help="rows")
    parser.add_argument("--spaces", nargs="+", default=["store", "full"], choices=["store", "full"],
                        help="the store-restricted space, the full space, or both")
    parser.add_argument("--before", metavar="REV",
                        help="also run every row with the code of this git revision, alternating seed by seed")
    args = parser.parse_args()
    store = str(Path(args.store).resolve())
    old, new = restricted_step_speedup(store, args.model, args.evaluator)
    print(f"restricted-space PPO step, 128 walkers x 100 steps: per-walker lookups {old:.2f} s, batched {new:.2f} s "
          f"({old / new:.1f}x)")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"{args.model}, {args.trials} candidates per run, seeds {args.seeds}, store {args.store} "
          f"(evaluator={args.evaluator}), "
          f"this code: {commit or 'unknown'}" + (f", before: {args.before}" if args.before else ""))
    print(f"{'method':<26}{'space':<7}{'cand/s':>8}{'wall s':>8}{'search':>8}{'model':>8}{'store':>8}{'rest':>8}"
          f"{'answered':>10}{'best us':>9}  bound by")
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"now": REPO}
        if args.before:
            trees = {"before": checkout(args.before, Path(scratch)), **trees}
        for method in args.methods:
            for space in args.spaces:
                runs = {name: [] for name in trees}
                for seed in args.seeds:
                    for name, tree in trees.items():
                        runs[name].append(run_in(tree, store, args.model, args.evaluator, method, space,
                                                 args.trials, seed))
                means = {name: print_row(method + ("" if name == "now" else f" @{args.before}"), space, rows)
                         for name, rows in runs.items()}
                if args.before:
                    speedup = [b["wall"] / n["wall"] * n["candidates"] / b["candidates"]
                               for b, n in zip(runs["before"], runs["now"])]
                    rate = {name: mean["candidates"] / mean["wall"] for name, mean in means.items()}
                    per_seed = ", ".join(f"{x:.2f}" for x in speedup)
                    print(f"{'':<26}{space:<7}speed-up {rate['now'] / rate['before']:.2f}x (per seed {per_seed})",
                          flush=True)


if __name__ == "__main__":
    main()
