"""Train the value function on measurement stores and register it in MLflow.

    python -m tuning.value train --store stores/lab.sqlite --name tunelab-value
    python -m tuning.value train --store stores/lab.sqlite --holdout 'resnet18*'   # kernels it must not see

Reads every kernel of the stores with tuning/corpus.py (the loader the pre-trained cost model uses),
rebuilds each kernel's space for the hardware it was measured on, and trains V (tuning/value/net.py)
on every prefix of the measured configs of the kernels not held out, except a seeded `--val-fraction`
of each kernel's configs. It reports, on complete schedules, V's R^2 of log10 seconds, its mean
relative error of seconds and its rank correlation within a kernel: on the training configs, on the
held-out configs of the same kernels, and on the held-out kernels (those `--holdout` names, by shell
pattern: what a run on an unseen network can expect). The model is logged to MLflow (experiment
`value`) and registered as a new version of --name, tagged with the kernels it saw and those numbers.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from tuning.corpus import load_corpus, one_backend, spaces
from tuning.value.net import KernelData, complete_errors, fit, log_value, shape_tag


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tuning.value", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train V on measurement stores and register it")
    train.add_argument("--store", action="append", required=True, type=Path, help="a measurement store (repeatable)")
    train.add_argument("--name", default="tunelab-value", help="registered model name")
    train.add_argument("--hardware", default=None, help="keep rows of this hardware fingerprint (a prefix)")
    train.add_argument("--holdout", nargs="+", default=[], metavar="PATTERN",
                       help="kernels (by name, shell patterns) left out of training and reported apart")
    train.add_argument("--val-fraction", type=float, default=0.2, help="each kernel's configs held out")
    train.add_argument("--min-configs", type=int, default=20, help="kernels with fewer measured configs are skipped")
    train.add_argument("--hidden", type=int, default=64)
    train.add_argument("--layers", type=int, default=1)
    train.add_argument("--epochs", type=int, default=40)
    train.add_argument("--lr", type=float, default=3e-3)
    train.add_argument("--batch", type=int, default=256)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--registry", default=None, help="MLflow tracking/registry URI (default: outputs/mlflow.db)")
    train.add_argument("--experiment", default="value")
    args = parser.parse_args(argv)
    for store in args.store:
        if not store.is_file():
            parser.error(f"--store: {store} is not a file")
    if not 0.0 <= args.val_fraction < 1.0:
        parser.error(f"--val-fraction: expected in [0, 1), got {args.val_fraction}")
    for key in ("min_configs", "hidden", "layers", "epochs", "batch"):
        if getattr(args, key) < (2 if key == "min_configs" else 1):
            parser.error(f"--{key.replace('_', '-')}: must be >= {2 if key == 'min_configs' else 1}")
    if not (np.isfinite(args.lr) and args.lr > 0):
        parser.error(f"--lr: expected a positive finite number, got {args.lr}")
    return args


def kernels_of(corpus, backend) -> list[KernelData]:
    with tqdm(total=len(corpus.tasks), desc="spaces", unit="kernel") as bar:
        task_spaces = spaces(corpus, backend, progress=lambda task: bar.update())
    return [KernelData(t.task.name, space, list(t.configs), np.asarray(t.seconds))
            for t, space in zip(corpus.tasks, task_spaces)]


def split(kernels: list[KernelData], fraction: float, rng) -> tuple[list[KernelData], list[KernelData]]:
    """Each kernel's configs in two: a random `fraction` held out (at least one config kept for training)."""
    train, held = [], []
    for kernel in kernels:
        order = rng.permutation(len(kernel.configs))
        cut = min(int(round(fraction * len(order))), len(order) - 1)
        for part, rows in ((held, order[:cut]), (train, order[cut:])):
            if len(rows):
                part.append(KernelData(kernel.name, kernel.space, [kernel.configs[i] for i in rows],
                                       kernel.seconds[rows]))
    return train, held


def train(args) -> None:
    corpus = load_corpus(args.store, args.hardware, args.min_configs)
    backend, fingerprint = one_backend(corpus)
    kernels = kernels_of(corpus, backend)
    for reason in corpus.skipped:
        print(f"tunelab: skipped {reason}", file=sys.stderr)
    unmatched = [p for p in args.holdout if not any(fnmatch.fnmatchcase(k.name, p) for k in kernels)]
    if unmatched:
        raise SystemExit(f"tunelab: --holdout: no kernel matches {', '.join(unmatched)} (kernels: "
                         f"{', '.join(sorted(k.name for k in kernels))})")
    outside = [k for k in kernels if any(fnmatch.fnmatchcase(k.name, p) for p in args.holdout)]
    inside = [k for k in kernels if k not in outside]
    if not inside:
        raise SystemExit("tunelab: --holdout leaves no kernel to train on")
    seen, held = split(inside, args.val_fraction, np.random.default_rng(args.seed))
    with tqdm(total=args.epochs, desc="training V", unit="epoch") as bar:
        net, losses = fit(seen, args.hidden, args.layers, args.epochs, args.lr, args.batch, args.seed,
                          progress=lambda epoch, loss: (bar.update(), bar.set_postfix(loss=f"{loss:.4f}")))
    results = {"train": complete_errors(net, seen), "heldout_configs": complete_errors(net, held),
               "heldout_kernels": complete_errors(net, outside)}
    reference = register_value(net, args, fingerprint, seen, outside, losses, results)
    print(f"trained on {len(seen)} kernels, {sum(len(k.configs) for k in seen)} measured configs "
          f"(final loss {losses[-1]:.4f})")
    for part, numbers in results.items():
        if numbers:
            print(f"  {part.replace('_', ' ')}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                             for k, v in numbers.items()))
    print(f"registered {reference} in {args.registry}\nuse it: python run.py search=value search.model={reference}")


def register_value(net, args, fingerprint, seen, outside, losses, results) -> str:
    from tuning.tracking.registry import default_registry, register

    args.registry = args.registry or default_registry()
    tasks = [{"name": k.name, "configs": len(k.configs)} for k in seen]
    metrics = {f"{part}/{key}": value for part, numbers in results.items() for key, value in numbers.items()}
    return register(
        lambda mlflow: log_value(mlflow, net, args.name),
        args.name, args.registry, args.experiment,
        params={"stores": ",".join(map(str, args.store)), "holdout": ",".join(args.holdout) or "none",
                "val_fraction": args.val_fraction, "hidden": args.hidden, "layers": args.layers,
                "epochs": args.epochs, "lr": args.lr, "batch": args.batch, "seed": args.seed,
                "kernels": len(seen), "hardware": fingerprint},
        metrics={**metrics, "final_loss": losses[-1]},
        tags={**shape_tag(net), "tunelab.tasks": json.dumps(tasks), "tunelab.hardware": fingerprint,
              "tunelab.heldout_kernels": json.dumps([k.name for k in outside]),
              "tunelab.errors": json.dumps(results)})


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.command == "train":
        train(args)


if __name__ == "__main__":
    main()
