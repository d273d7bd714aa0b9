"""How well each feature set ranks measured kernels: knobs, per-store, both; xgb and xgb_ms.

    python experiments/bench_features.py --store stores/lab.sqlite --train 64 256 --splits 5

For every kernel of the stores (tuning/hardware/corpus.py), `--splits` seeded random splits of its measured
configs: each cost model x feature set is fit on `train` configs (the run's situation after that
many measurements) and ranks the others. Prints per kernel and train size the Spearman correlation
of predicted and measured throughput on the held-out configs and the held-out top-1 regret (how much
slower the predicted-best config is than the best held-out one), medians over splits with their
range. No measuring: the labels are the store's readings; features come from TVM's schedules of
each config (a few ms each), so run it on an idle host for the timings it prints to mean anything.
Final latency per feature set is a tuning comparison: `experiments/bench_vs_peers.py --methods
evolutionary+greedy+xgb_ms evolutionary+greedy+xgb_ms:cost_model.features=knobs ...`.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

MODELS = {  # name: (cost model class path, features)
    "xgb knobs": ("tuning.cost_model.xgb.XGBoostCostModel", "knobs"),
    "xgb per_store": ("tuning.cost_model.xgb.XGBoostCostModel", "per_store"),
    "xgb both": ("tuning.cost_model.xgb.XGBoostCostModel", "both"),
    "xgb_ms knobs": ("tuning.cost_model.xgb_ms.MetaScheduleXGBoost", "knobs"),
    "xgb_ms per_store": ("tuning.cost_model.xgb_ms.MetaScheduleXGBoost", "per_store"),
    "xgb_ms both": ("tuning.cost_model.xgb_ms.MetaScheduleXGBoost", "both"),
}


def make(name: str, seed: int):
    import importlib

    path, features = MODELS[name]
    module, _, cls = path.rpartition(".")
    kwargs = {"seed": seed, "features": features}
    if "xgb_ms" in path:
        kwargs["num_warmup_samples"] = 0  # judge the trees, not MetaSchedule's random warm-up scores
    return getattr(importlib.import_module(module), cls)(**kwargs)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", action="append", type=Path, required=True)
    parser.add_argument("--train", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--min-configs", type=int, default=100)
    args = parser.parse_args(argv)

    from tuning.hardware.corpus import features, load_corpus, one_backend

    corpus = load_corpus(args.store, min_configs=args.min_configs)
    if not corpus.tasks:
        raise SystemExit("no kernel with enough configs: " + "; ".join(corpus.skipped))
    started = time.perf_counter()
    by_kind = {}
    for kind in sorted({MODELS[m][1] for m in args.models}):
        backend, _ = one_backend(corpus)
        by_kind[kind] = features(corpus, backend, kind)
    print(f"features of {corpus.configs} configs in {time.perf_counter() - started:.0f} s")
    for reason in corpus.skipped:
        print(f"skipped {reason}")
    print(f"\n{'kernel':10s} {'train':>5s}  {'model':18s} {'Spearman (median [min, max])':>30s}  "
          f"{'top-1 regret':>14s}  fit s")
    for t, task in enumerate(corpus.tasks):
        throughput = task.ratio
        for train in args.train:
            if train >= len(task.configs) - 10:
                continue
            for name in args.models:
                X = by_kind[MODELS[name][1]][t]
                rho, regret, fit_s = [], [], []
                for split in range(args.splits):
                    order = np.random.default_rng(split).permutation(len(throughput))
                    fit, test = order[:train], order[train:]
                    begun = time.perf_counter()
                    model = make(name, split).fit(X[fit], throughput[fit])
                    fit_s.append(time.perf_counter() - begun)
                    predicted = model.predict(X[test])
                    rho.append(spearmanr(predicted, throughput[test]).correlation)
                    regret.append(throughput[test].max() / throughput[test][np.argmax(predicted)])
                print(f"{task.task.name:10s} {train:5d}  {name:18s} {np.median(rho):8.3f} "
                      f"[{min(rho):.3f}, {max(rho):.3f}]".ljust(70) + f"{np.median(regret):8.2f}x  "
                      f"{np.median(fit_s):5.2f}")


if __name__ == "__main__":
    main()
