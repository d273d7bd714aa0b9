"""Replayed candidates per second, and what bounds them: the search, the cost model or the store.

    python experiments/bench_replay.py --store stores/lab.sqlite [--model conv_l8] [--trials 256] [--seeds 0 1]

Runs sa+greedy+xgb and ppo+kmeans+xgb on hardware=replay (on_miss=error: nothing is measured) over
the store-restricted space (model.space=store, the fully offline comparison) and the full space
(where most proposals are `not_in_store`), side by side in one process, and prints per method the
candidates per second and the seconds spent in the search (propose + observe), the cost model
(fit + predict), the store (lookups) and the rest of the loop. Build a store first:
python -m tuning.tools.dataset build --store stores/lab.sqlite --model conv_l8 (docs/store.md).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from hydra.utils import instantiate

from tuning.tools.dataset import compose
from tuning.loop import Components, RunInfo, tune_task
from tuning.core.task import build_tasks

METHODS = {"sa+greedy+xgb": ("sa", "greedy", "xgb"), "ppo+kmeans+xgb": ("ppo", "kmeans", "xgb")}


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


def one_run(store: str, model: str, method: str, space: str, trials: int, seed: int, extra=(),
            per_walker_step: bool = False) -> dict:
    search, sampler, cost_model = METHODS[method]
    cfg = compose([f"model={model}", f"model.space={space}", "hardware=replay", f"hardware.store={store}",
                   "hardware.on_miss=error", f"search={search}", f"sampler={sampler}", f"cost_model={cost_model}",
                   f"seed={seed}", f"budget.trials={trials}", *extra])
    parts = Components(*(instantiate(cfg[g]) for g in ("search", "sampler", "evaluator", "cost_model", "hardware",
                                                         "tracking")))
    if space == "store":
        parts.hardware.restrict_to_store(parts.evaluator.spec)
    task = build_tasks(cfg.model)[0]
    restricted = parts.hardware.space(task)  # the space (TVM's design space, the store's configs) is set-up
    if per_walker_step:
        restricted.step_all = lambda c, d: _per_walker_step(restricted, np.asarray(c), d)
    store_time = Timed(parts.hardware, ["measure"])
    with tempfile.TemporaryDirectory() as out:
        run = RunInfo(seed=seed, out_dir=Path(out), method=method, trials=trials, plan_size=cfg.budget.plan_size or parts.search.default_plan_size,
                      min_trials_per_task=cfg.budget.min_trials_per_task, callbacks=[])
        started = time.perf_counter()
        outcome = tune_task(task, parts, run)
        wall = time.perf_counter() - started
    parts.hardware.close()
    times = outcome.times
    found = sum(r.result.error != "not_in_store" for r in outcome.records)
    parts_s = {"search": times["search_s"], "cost model": times["model_s"], "store": store_time.seconds}
    return {"candidates": len(outcome.records), "answered": found, "wall": wall, **parts_s,
            "rest": wall - sum(parts_s.values()), "best_us": outcome.best_cost * 1e6}


def _per_walker_step(space, configs, deltas):
    """The restricted step as first written: one nearest() lookup per walker that left the set."""
    moved = space.base.step_all(configs, deltas)
    return np.asarray([m if m in space._allowed_set else space.nearest(m, exclude=tuple(s))
                       for s, m in zip(map(tuple, configs.tolist()), map(tuple, moved.tolist()))])


def restricted_step_speedup(store: str, model: str, walkers: int = 128, steps: int = 100) -> tuple[float, float]:
    """Seconds for `steps` PPO steps of `walkers` on the store-restricted space: one batched tree
    query per step (RestrictedSpace.step_all) against one nearest() lookup per walker that left."""
    cfg = compose([f"model={model}", "model.space=store", "hardware=replay", f"hardware.store={store}"])
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True)
    parser.add_argument("--model", default="conv_l8")
    parser.add_argument("--trials", type=int, default=256)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--spaces", nargs="+", default=["store", "full"], choices=["store", "full"])
    parser.add_argument("--ppo-threads", type=int, nargs="+", default=[1, 2],
                        help="ppo's torch threads, each a row on the store space (1 is the default)")
    args = parser.parse_args()
    old, new = restricted_step_speedup(args.store, args.model)
    print(f"restricted-space PPO step, 128 walkers x 100 steps: per-walker lookups {old:.2f} s, batched {new:.2f} s "
          f"({old / new:.1f}x)")
    print(f"{args.model}, {args.trials} candidates per run, seeds {args.seeds}, store {args.store}")
    print(f"{'method':<26}{'space':<7}{'cand/s':>8}{'wall s':>8}{'search':>8}{'model':>8}{'store':>8}{'rest':>8}"
          f"{'answered':>10}{'best us':>9}  bound by")
    rows = [(m, s, (), False) for m in args.methods for s in args.spaces]
    if "ppo+kmeans+xgb" in args.methods and "store" in args.spaces:
        rows += [("ppo+kmeans+xgb", "store", (f"search.threads={t}",), False) for t in args.ppo_threads if t != 1]
        rows += [("ppo+kmeans+xgb", "store", (), True)]
    for method, space, extra, per_walker in rows:
        runs = [one_run(args.store, args.model, method, space, args.trials, seed, extra, per_walker)
                for seed in args.seeds]
        mean = {k: statistics.mean(r[k] for r in runs) for k in runs[0]}
        bound = max(("search", "cost model", "store", "rest"), key=lambda k: mean[k])
        spread = (f" ({min(r['candidates'] / r['wall'] for r in runs):.1f}-"
                  f"{max(r['candidates'] / r['wall'] for r in runs):.1f})" if len(runs) > 1 else "")
        label = method + (f" {extra[0].split('.')[-1]}" if extra else "") + (" per-walker" if per_walker else "")
        print(f"{label:<26}{space:<7}{mean['candidates'] / mean['wall']:>8.1f}{mean['wall']:>8.1f}"
              f"{mean['search']:>8.1f}{mean['cost model']:>8.1f}{mean['store']:>8.1f}{mean['rest']:>8.1f}"
              f"{mean['answered']:>10.0f}{mean['best_us']:>9.1f}  {bound} "
              f"({mean[bound] / mean['wall']:.0%}){spread}", flush=True)


if __name__ == "__main__":
    main()
