"""Pre-train MetaSchedule's cost model on every kernel of measurement stores; register it in MLflow.

    python -m tuning.tools.pretrain --store stores/lab.sqlite --name tunelab-xgb-ms
    python run.py model=conv_l8 search=evolutionary cost_model=xgb_ms \\
        cost_model.pretrained=models:/tunelab-xgb-ms/1

Reads the stores with tuning/hardware/corpus.py (the same loader every cross-kernel model uses), rebuilds
each kernel's space for the hardware its rows were measured on, describes every measured config by
TVM's per-store features of its scheduled program, labels it with its kernel's best seconds / its
seconds, and fits cost_model=xgb_ms's pack-sum XGBoost (conf/cost_model/xgb_ms.yaml's
hyperparameters) on all kernels at once. First, each kernel is held out in turn: the model fit on
the others ranks the held-out kernel's configs, and the Spearman correlation with the measurements
is what a run on an unseen kernel can expect before it has measured anything (--no-heldout skips
it). --configs-per-kernel N cuts every kernel to N configs at most (a seeded draw), so corpora from
two sources can be compared at one size. The final model is
logged to MLflow (experiment `pretrain`) and registered as a new version of --name, tagged with the
kernels it saw, the features it reads and the held-out correlations.

The stores may hold several hosts: each kernel's space is rebuilt for the host its rows were measured
on (its target's mcpu and cores), and its labels are normalised within that host, so one model learns
from every host at once. A transfer test holds out what it will tune: --exclude-model NAME leaves out
every kernel of a model (by structural key, wherever it was measured), --exclude-hardware PREFIX a
host. --save PATH also writes the booster and what it was trained on as PATH.ubj and PATH.json, the
form a prior ships in with the package (tuning/cost_model/priors/).

Per-store features only: knob features have another meaning and width in every kernel's space.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr
from tqdm import tqdm

from tuning.config.cli import add_tracking_uri, new_parser, tunelab_command
from tuning.config.conf_dir import CONF_DIR
from tuning.core.task import build_tasks
from tuning.hardware.corpus import at_most, each_backend, features, load_corpus
from tuning.store import display_location, is_store_url, store_argument


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = new_parser("python -m tuning.tools.pretrain", __doc__.split("\n\n")[0], prog)
    parser.add_argument("--store", action="append", required=True, type=store_argument,
                        help="a measurement store: a file or a postgresql:// URL (repeatable)")
    parser.add_argument("--name", default="tunelab-xgb-ms", help="registered model name")
    parser.add_argument("--hardware", default=None,
                        help="keep rows of this hardware fingerprint (a prefix); default: every row "
                             "(the stores must then hold one hardware)")
    add_tracking_uri(parser, help="the MLflow store the model is logged and registered in")
    parser.add_argument("--experiment", default="pretrain", help="the MLflow experiment of the training run")
    parser.add_argument("--seed", type=int, default=0, help="seeds XGBoost and --configs-per-kernel's draw")
    parser.add_argument("--min-configs", type=int, default=20, help="kernels with fewer measured configs are skipped")
    parser.add_argument("--exclude", nargs="+", default=[], metavar="NAME",
                        help="kernels (by name) to leave out, e.g. the one a transfer test will tune")
    parser.add_argument("--exclude-model", nargs="+", default=[], metavar="MODEL",
                        help="models (conf/model names) whose kernels are left out wherever they were measured, "
                             "matched by structural key: a transfer test's held-out kernels")
    parser.add_argument("--exclude-hardware", nargs="+", default=[], metavar="PREFIX",
                        help="hardware fingerprints (a prefix) left out: a transfer test's held-out host")
    parser.add_argument("--rounds", type=int, default=None, metavar="N",
                        help="boosting rounds at most (default: conf/cost_model/xgb_ms.yaml's, with its early stop)")
    parser.add_argument("--max-depth", type=int, default=None, metavar="N",
                        help="tree depth (default: conf/cost_model/xgb_ms.yaml's); smaller trees ship smaller")
    parser.add_argument("--save", type=Path, default=None, metavar="PATH",
                        help="also write PATH.ubj (the booster) and PATH.json (what it was trained on)")
    parser.add_argument("--configs-per-kernel", type=int, default=None, metavar="N",
                        help="each kernel's configs cut to N at most, drawn with --seed (corpora of one size; "
                             "default: all)")
    parser.add_argument("--no-heldout", action="store_true",
                        help="skip the leave-one-kernel-out correlations (one fit per kernel): the final model only")
    return parser


def parse_args(argv=None, prog: str | None = None):
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    for store in args.store:
        if not is_store_url(store) and not store.is_file():
            parser.error(f"--store: {store} is not a file")
    if args.min_configs < 2:
        parser.error("--min-configs: must be >= 2")
    if args.configs_per_kernel is not None and args.configs_per_kernel < 2:
        parser.error("--configs-per-kernel: must be >= 2")
    for option in ("rounds", "max_depth"):
        if getattr(args, option) is not None and getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')}: must be >= 1")
    if args.save is not None and not args.save.parent.is_dir():
        parser.error(f"--save: {args.save.parent} is not a folder")
    if args.exclude_model:
        unknown = [m for m in args.exclude_model if not (CONF_DIR / "model" / f"{m}.yaml").is_file()]
        if unknown:
            parser.error(f"--exclude-model: no model named {', '.join(unknown)} (conf/model/)")
    return args


def model(seed: int, rounds: int | None = None, max_depth: int | None = None):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    node = OmegaConf.load(CONF_DIR / "cost_model" / "xgb_ms.yaml")
    if rounds is not None:
        node.num_boost_round = rounds
    if max_depth is not None:
        node.max_depth = max_depth
    return instantiate(OmegaConf.create({"seed": seed, "node": node}).node)


def model_keys(names: list[str]) -> set[str]:
    """The store keys (structural hashes of the TIR) of every kernel of these models (conf/model):
    the tasks a run of them tunes on this host's CPU, under whichever name a store holds them."""
    from omegaconf import OmegaConf

    from tuning.hardware.cpu import CPUHardware

    hardware = CPUHardware()
    keys = set()
    for name in names:
        model_cfg = OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml")
        tasks = hardware.model_tasks(model_cfg, 0) if model_cfg.kind == "network" else build_tasks(model_cfg)
        keys |= {hardware.store_key(task) for task in tasks}
    return keys


def leave_out(corpus, args) -> None:
    """--exclude, --exclude-model and --exclude-hardware applied to the corpus, each left-out kernel
    named in its `skipped`; exits naming the kernels where --exclude names none of them."""
    unknown = set(args.exclude) - {t.task.name for t in corpus.tasks}
    if unknown:
        raise SystemExit(f"tunelab: --exclude: no kernel named {', '.join(sorted(unknown))} in the stores "
                         f"(kernels: {', '.join(sorted({t.task.name for t in corpus.tasks}))})")
    keys = model_keys(args.exclude_model) if args.exclude_model else set()
    kept = []
    for task in corpus.tasks:
        why = ("--exclude" if task.task.name in args.exclude else
               "--exclude-model" if task.task_key in keys else
               "--exclude-hardware" if any(task.hardware.startswith(p) for p in args.exclude_hardware) else None)
        if why:
            corpus.skipped.append(f"{display_location(task.store)}: {task.task.name} ({task.hardware}): {why}")
        else:
            kept.append(task)
    corpus.tasks = kept


def held_out(X, ratios, args, names, keys) -> dict[str, float]:
    """Leave-one-kernel-out Spearman correlation of predicted and measured throughput ratios. A
    kernel found in several stores is one kernel: all of its entries are held out together."""
    scores = {}
    for key in tqdm(list(dict.fromkeys(keys)), desc="held-out kernels", unit="kernel", disable=None):
        inside = [i for i, k in enumerate(keys) if k == key]
        others = [j for j in range(len(X)) if keys[j] != key]
        if not others:
            continue
        fitted = model(args.seed, args.rounds, args.max_depth).fit_kernels([X[j] for j in others], [ratios[j] for j in others])
        predicted = np.concatenate([fitted.predict(X[i]) for i in inside])
        scores[names[inside[0]]] = float(spearmanr(predicted, np.concatenate([ratios[i] for i in inside])).correlation)
    return scores


def main(argv=None, prog: str | None = None) -> None:
    args = parse_args(argv, prog)
    corpus = at_most(load_corpus(args.store, args.hardware, args.min_configs), args.configs_per_kernel, args.seed)
    leave_out(corpus, args)
    backends = each_backend(corpus)
    fingerprint = ",".join(sorted({hardware for _, hardware in backends}))
    with tqdm(total=corpus.configs, desc="per-store features", unit="config", disable=None) as bar:
        X = features(corpus, backends, "per_store", progress=lambda task: bar.update(len(task.configs)))
    for reason in corpus.skipped:
        print(f"tunelab: skipped {reason}", file=sys.stderr)
    names = [f"{t.task.name} ({t.task_key})" for t in corpus.tasks]
    ratios = [t.ratio for t in corpus.tasks]
    scores = {} if args.no_heldout else held_out(X, ratios, args, names, [t.task_key for t in corpus.tasks])
    final = model(args.seed, args.rounds, args.max_depth).fit_kernels(X, ratios)
    from tuning.tracking.registry import register_booster

    registry = args.tracking_uri
    tasks = [{"name": t.task.name, "key": t.task_key, "configs": len(t.configs), "hardware": t.hardware,
              "store": display_location(t.store)}
             for t in corpus.tasks]
    mean = float(np.mean(list(scores.values()))) if scores else float("nan")
    reference = register_booster(
        final.booster, args.name, registry, args.experiment,
        params={"stores": ",".join(map(display_location, args.store)), "features": "per_store", "kernels": len(tasks),
                "excluded": ",".join(args.exclude) or "none",
                "excluded_models": ",".join(args.exclude_model) or "none",
                "excluded_hardware": ",".join(args.exclude_hardware) or "none", "configs_per_kernel": args.configs_per_kernel or "all",
                "configs": corpus.configs, "seed": args.seed, "hardware": fingerprint},
        metrics={**({"heldout_spearman_mean": mean} if scores else {}),
                 **{f"heldout_spearman/{name.split(' ')[0]}": s for name, s in scores.items()}},
        tags={"tunelab.features": "per_store", "tunelab.tasks": json.dumps(tasks),
              "tunelab.heldout_spearman": json.dumps(scores), "tunelab.hardware": fingerprint})
    if args.save is not None:
        save(final.booster, args.save, {
            "features": "per_store", "tasks": tasks, "hardware": sorted({t.hardware for t in corpus.tasks}),
            "excluded": {"kernels": args.exclude, "models": args.exclude_model, "hardware": args.exclude_hardware},
            "seed": args.seed, "configs_per_kernel": args.configs_per_kernel, "rounds": final.booster.num_boosted_rounds(),
            "heldout_spearman": scores, "registered": reference})
        print(f"saved {args.save.with_suffix('.ubj')} and {args.save.with_suffix('.json')}")
    print(f"trained on {len(tasks)} kernels, {corpus.configs} measured configs")
    for name, score in scores.items():
        print(f"  held out {name}: Spearman {score:.3f}")
    if scores:
        print(f"  mean held-out Spearman {mean:.3f}")
    use = tunelab_command("run", "search=evolutionary", "cost_model=xgb_ms", f"cost_model.pretrained={reference}")
    print(f"registered {reference} in {registry}\nuse it: {use}")


def save(booster, path: Path, about: dict) -> None:
    """The booster's bytes (UBJSON, read back by xgboost alone) and what it was trained on."""
    booster.save_model(str(path.with_suffix(".ubj")))
    path.with_suffix(".json").write_text(json.dumps(about, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
