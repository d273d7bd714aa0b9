"""Train the value function on measurement stores and register it in MLflow.

    python -m tuning.tools.value train --store stores/lab.sqlite --name tunelab-value
    python -m tuning.tools.value train --store stores/lab.sqlite --holdout 'fused_conv2d1_*'   # kernels it must not see
    python -m tuning.tools.value train --store stores/squeezenet.sqlite --holdout-store stores/resnet18.sqlite
                                   # a network left out: its kernels only evaluated
    python -m tuning.tools.value improve --model models:/tunelab-value/1 --store stores/lab.sqlite --network resnet18
                                   # the paper's Algorithm 2: tuning/tools/value_improve.py

Reads every kernel of the stores with tuning/hardware/corpus.py (the loader the pre-trained cost model uses),
rebuilds each kernel's space for the hardware it was measured on (every kernel cut to
`--configs-per-kernel` configs by a seeded draw when given: corpora of one size), and trains V (tuning/value/net.py)
on every prefix of the measured configs of the kernels not held out, except a seeded `--val-fraction`
of each kernel's configs, chosen by groups of configs that share their first decisions, and any
training config one decision from a held-out one (tuning/value/net.py `split`). It reports, on
complete schedules, V's R^2 of log10 seconds, its mean relative error of seconds and its rank
correlation within a kernel: on the training configs, on the
held-out configs of the same kernels, and on the held-out kernels (those `--holdout` names, by shell
pattern, or all kernels of a `--holdout-store`). A network's kernels are named by their fused
operators, not by the network: to hold out a whole network, keep each network's measurements in its
own store and pass it as --holdout-store. The model is logged to MLflow (experiment
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

from tuning.config.cli import add_command, add_tracking_uri, new_parser, tunelab_command
from tuning.hardware.corpus import at_most, load_corpus, one_backend
from tuning.store import display_location, is_store_url, store_argument
from tuning.value.net import complete_errors, fit, kernels_of, log_value, shape_tag, split


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = new_parser("python -m tuning.tools.value", __doc__.split("\n\n")[0], prog)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     help="train (a new V) or improve (an existing V)")
    add_train(add_command(commands, "train", help="train V on measurement stores and register it"))
    add_improve(add_command(commands, "improve", help="the paper's Algorithm 2: V's own schedules measured, V refit",
                            description=improve_doc()))
    return parser


def add_train(train_cmd) -> None:
    train_cmd.add_argument("--store", action="append", required=True, type=store_argument,
                           help="a measurement store: a file or a postgresql:// URL (repeatable)")
    train_cmd.add_argument("--name", default="tunelab-value", help="registered model name")
    train_cmd.add_argument("--hardware", default=None,
                           help="keep rows of this hardware fingerprint (a prefix); default: every row (the stores "
                                "must then hold one hardware)")
    train_cmd.add_argument("--holdout", nargs="+", default=[], metavar="PATTERN",
                           help="kernels (by name, shell patterns) left out of training and reported apart")
    train_cmd.add_argument("--holdout-store", action="append", default=[], type=store_argument, metavar="STORE",
                           help="a store whose kernels are only evaluated, never trained on: a network left out "
                                "(repeatable)")
    train_cmd.add_argument("--val-fraction", type=float, default=0.2, help="each kernel's configs held out")
    train_cmd.add_argument("--min-configs", type=int, default=20, help="kernels with fewer measured configs are skipped")
    train_cmd.add_argument("--configs-per-kernel", type=int, default=None, metavar="N",
                           help="each kernel's configs cut to N at most, drawn with --seed (corpora of one size; "
                                "default: all)")
    train_cmd.add_argument("--hidden", type=int, default=64, help="hidden units of V's LSTM")
    train_cmd.add_argument("--layers", type=int, default=1, help="V's LSTM layers")
    train_cmd.add_argument("--epochs", type=int, default=40, help="passes over the training prefixes")
    train_cmd.add_argument("--lr", type=float, default=3e-3, help="the optimiser's learning rate")
    train_cmd.add_argument("--batch", type=int, default=256, help="prefixes per optimiser step")
    train_cmd.add_argument("--seed", type=int, default=0,
                           help="seeds the validation split, V's weights and the batches")
    add_tracking_uri(train_cmd, help="the MLflow store V is logged and registered in", dest="registry")
    train_cmd.add_argument("--experiment", default="value", help="the MLflow experiment of the training run")


def add_improve(improve_cmd) -> None:
    improve_cmd.add_argument("--model", required=True, help="the V to start from (models:/<name>/<version>)")
    improve_cmd.add_argument("--store", required=True, type=store_argument,
                             help="the measurement store the rounds measure into (a file or a postgresql:// URL)")
    improve_cmd.add_argument("--network", nargs="+", required=True, metavar="MODEL",
                             help="model config names whose kernels are scheduled (resnet18, squeezenet1_0, conv_l8, ...)")
    improve_cmd.add_argument("--rounds", type=int, default=2, help="rounds of Alg. 2 (the paper: 2)")
    improve_cmd.add_argument("--schedules", type=int, default=4,
                             help="noisy greedy schedules per kernel a round (the paper: 100 per network)")
    improve_cmd.add_argument("--noise", type=float, default=0.1, help="Alg. 2's epsilon (log-normal on V's seconds)")
    improve_cmd.add_argument("--beam", type=int, default=4, help="the beam that completes each prefix")
    improve_cmd.add_argument("--name", default="tunelab-value", help="registered model name of the improved V")
    improve_cmd.add_argument("--out", type=Path, default=Path("outputs") / "value_improve",
                             help="where the rounds done are kept (the same --out continues a killed loop)")
    improve_cmd.add_argument("--val-fraction", type=float, default=0.2,
                             help="each kernel's configs held out of every refit (the same configs in every round)")
    improve_cmd.add_argument("--holdout", nargs="+", default=[], metavar="PATTERN",
                             help="kernels (by name, shell patterns) never trained on in any round, reported apart")
    improve_cmd.add_argument("--min-configs", type=int, default=2,
                             help="kernels with fewer measured configs are skipped")
    improve_cmd.add_argument("--epochs", type=int, default=20, help="refit epochs a round, from V's weights")
    improve_cmd.add_argument("--lr", type=float, default=3e-3, help="the refit's learning rate")
    improve_cmd.add_argument("--batch", type=int, default=256, help="prefixes per optimiser step")
    improve_cmd.add_argument("--seed", type=int, default=0, help="seeds the schedules' noise, the split and the refits")
    add_tracking_uri(improve_cmd, help="the MLflow store --model is read from and the improved V registered in",
                     dest="registry")
    improve_cmd.add_argument("--override", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                             help="a Hydra override of the hardware or evaluator (hardware.num_threads=2); repeatable")


def parse_args(argv=None, prog: str | None = None):
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    check(parser, args)
    return args


LOWEST = {"min_configs": 2, "configs_per_kernel": 2, "hidden": 1, "layers": 1, "epochs": 1, "batch": 1, "rounds": 1, "schedules": 1, "beam": 1}


def check(parser, args) -> None:
    """Every number in range (NaN and infinities rejected), named as typed."""
    for key, low in LOWEST.items():
        if getattr(args, key, None) is not None and getattr(args, key) < low:
            parser.error(f"--{key.replace('_', '-')}: must be >= {low}")
    if not 0.0 <= args.val_fraction < 1.0:
        parser.error(f"--val-fraction: expected in [0, 1), got {args.val_fraction}")
    if not (np.isfinite(args.lr) and args.lr > 0):
        parser.error(f"--lr: expected a positive finite number, got {args.lr}")
    if args.command == "train":
        for option, stores in (("--store", args.store), ("--holdout-store", args.holdout_store)):
            for store in stores:
                if not is_store_url(store) and not store.is_file():
                    parser.error(f"{option}: {store} is not a file")
        return
    if not (np.isfinite(args.noise) and args.noise >= 0):
        parser.error(f"--noise: expected a non-negative finite number, got {args.noise}")
    unknown = [o for o in args.overrides if "=" not in o or o.split("=")[0].lstrip("+~").split(".")[0]
               not in ("hardware", "evaluator")]
    if unknown:
        parser.error(f"--override: only hardware.* and evaluator.* (or hardware=/evaluator=) are used here, got {unknown}")


def train(args) -> None:
    corpus = at_most(load_corpus([*args.store, *args.holdout_store], args.hardware, args.min_configs),
                     args.configs_per_kernel, args.seed)
    backend, fingerprint = one_backend(corpus)
    kernels = kernels_of(corpus, backend)
    origin = [(t.store, t.task_key) for t in corpus.tasks]  # aligned with kernels (kernels_of prunes both)
    for reason in corpus.skipped:
        print(f"tunelab: skipped {reason}", file=sys.stderr)
    unmatched = [p for p in args.holdout if not any(fnmatch.fnmatchcase(k.name, p) for k in kernels)]
    if unmatched:
        raise SystemExit(f"tunelab: --holdout: no kernel matches {', '.join(unmatched)} (kernels: "
                         f"{', '.join(sorted(k.name for k in kernels))})")
    held_stores = {str(p) for p in args.holdout_store}
    out = [store in held_stores or any(fnmatch.fnmatchcase(k.name, p) for p in args.holdout)
           for k, (store, _) in zip(kernels, origin)]
    outside = [k for k, o in zip(kernels, out) if o]
    inside = [k for k, o in zip(kernels, out) if not o]
    if not inside:
        raise SystemExit("tunelab: --holdout/--holdout-store leave no kernel to train on")
    shared = {key for (_, key), o in zip(origin, out) if o} & {key for (_, key), o in zip(origin, out) if not o}
    if shared:
        print(f"tunelab: {len(shared)} held-out kernel(s) are also in the training stores (the same computation "
              f"in two networks): V has seen their configs", file=sys.stderr)
    cut = split(inside, args.val_fraction, args.seed)
    seen, held = cut.train, cut.held
    with tqdm(total=args.epochs, desc="training V", unit="epoch", disable=None) as bar:
        net, losses = fit(seen, args.hidden, args.layers, args.epochs, args.lr, args.batch, args.seed,
                          progress=lambda epoch, loss: (bar.update(), bar.set_postfix(loss=f"{loss:.4f}")))
    results = {"train": complete_errors(net, seen), "heldout_configs": complete_errors(net, held),
               "heldout_kernels": complete_errors(net, outside)}
    if cut.near:
        print(f"tunelab: {cut.near} training configs one decision from a held-out config were left out of training")
    reference = register_value(net, args, fingerprint, seen, outside, losses, results)
    print(f"trained on {len(seen)} kernels, {sum(len(k.configs) for k in seen)} measured configs "
          f"(final loss {losses[-1]:.4f})")
    for part, numbers in results.items():
        if numbers:
            print(f"  {part.replace('_', ' ')}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                             for k, v in numbers.items()))
    print(f"registered {reference} in {args.registry}\nuse it: "
          f"{tunelab_command('run', 'search=value', f'search.model={reference}')}")


def register_value(net, args, fingerprint, seen, outside, losses, results) -> str:
    from tuning.tracking.registry import register

    tasks = [{"name": k.name, "configs": len(k.configs)} for k in seen]
    metrics = {f"{part}/{key}": value for part, numbers in results.items() for key, value in numbers.items()}
    return register(
        lambda mlflow: log_value(mlflow, net, args.name),
        args.name, args.registry, args.experiment,
        params={"stores": ",".join(map(display_location, args.store)), "holdout": ",".join(args.holdout) or "none",
                "holdout_stores": ",".join(map(display_location, args.holdout_store)) or "none",
                "val_fraction": args.val_fraction, "configs_per_kernel": args.configs_per_kernel or "all",
                "configs": sum(len(k.configs) for k in seen), "hidden": args.hidden, "layers": args.layers,
                "epochs": args.epochs, "lr": args.lr, "batch": args.batch, "seed": args.seed,
                "kernels": len(seen), "hardware": fingerprint},
        metrics={**metrics, "final_loss": losses[-1]},
        tags={**shape_tag(net), "tunelab.tasks": json.dumps(tasks), "tunelab.hardware": fingerprint,
              "tunelab.heldout_kernels": json.dumps([k.name for k in outside]),
              "tunelab.errors": json.dumps(results)})


def improve_doc() -> str:
    from tuning.tools import value_improve as improve

    return improve.__doc__.split("\n\n")[0]


def main(argv=None, prog: str | None = None) -> None:
    args = parse_args(argv, prog)
    if args.command == "train":
        train(args)
    else:
        from tuning.tools.value_improve import improve

        improve(args)


if __name__ == "__main__":
    main()
