"""The paper's Algorithm 2: V improved from its own schedules, measured.

    python -m tuning.tools.value improve --model models:/tunelab-value/1 --store stores/lab.sqlite \\
        --network resnet18 --rounds 2

Each round, for every kernel of every --network (a whole model or a single operator):
 1. `--schedules` schedules by greedy search under V with Alg. 2's noise (the first without noise:
    Alg. 1's own schedule, whose measured time is the round's "greedy" latency);
 2. from every prefix s_j of each, V's beam-search completion (`--beam`);
 3. all of them measured into the store (configs it already holds are read, not measured again);
then V is trained again, from its own weights, on every kernel the store holds for this hardware:
each prefix's target is its best measured completion, Alg. 2's V(s) = min(r, V(s)). The new V is
registered as the next version of --name. Each round is one MLflow run (experiment `value-improve`):
V's error on the round's measurements before the refit (`before_refit/*`: configs V has not trained
on), the greedy schedules' latency per network (the sum over kernels of weight x seconds), the
measurements, and V's error after the refit on its training configs, on held-out configs and on the
kernels `--holdout` names. What is held out is the same in every round: the kernels by name, the
configs by a hash of (seed, kernel, the config's first decisions) that does not depend on how large
the store has grown (tuning/value/net.py `split`), so no round trains on a config or kernel an
earlier or later round reports as held out; training configs one decision from a held-out config
are left out of the refit (`split/near_duplicates_left_out`).
`--out` records the rounds done: the same command continues a killed loop, and a killed round
proposes the same configs again (seeded), the store answering those already measured.
"""
from __future__ import annotations

import fnmatch
import json
import zlib
from pathlib import Path

import numpy as np
from tqdm import tqdm

from tuning.value.beam import beam_search, first_legitimate
from tuning.value.encoding import order, prefix_of
from tuning.value.net import prediction_metrics


def proposals(space, value, schedules: int, noise: float, beam: int, rng) -> tuple[tuple | None, list[tuple]]:
    """(Alg. 1's greedy schedule, every config the round measures for this kernel): the noisy greedy
    schedules and V's beam completion of each of their prefixes, legitimate ones only, canonical (as
    the store keeps them), in order."""
    chosen: dict = {}

    def canonical_best(found):
        best = first_legitimate(space, found)
        return None if best is None else space.canonical(best[1])

    greedy = canonical_best(beam_search(space, value, 1))
    for k in range(schedules):
        schedule = greedy if k == 0 else canonical_best(beam_search(space, value, 1, noise=noise, rng=rng))
        if schedule is None:
            continue
        chosen.setdefault(schedule, None)
        for length in range(1, len(order(space, schedule[0]))):
            completion = canonical_best(beam_search(space, value, beam, prefix=prefix_of(space, schedule, length)))
            if completion is not None:
                chosen.setdefault(completion, None)
    return greedy, list(chosen)


def prediction_errors(predicted: list[np.ndarray], measured: list[np.ndarray]) -> dict:
    """V's error on one round's measurements, before it learns from them."""
    metrics = prediction_metrics(predicted, measured)
    return {f"before_refit/{key}": metrics[key] for key in ("mean_relative_error", "spearman_within_kernel")
            if key in metrics}


def run_round(round_index: int, args, net, hardware, spec, store, networks) -> dict:
    """Propose, measure into the store; returns the round's metrics (before the refit)."""
    from tuning.store import TaskRows
    from tuning.tools.dataset import measure_into

    predicted, measured, metrics, new = [], [], {}, 0
    for network, tasks in networks:
        greedy_ms = 0.0
        for task in tqdm(tasks, desc=f"round {round_index} {network}", unit="kernel", disable=None):
            space = hardware.space(task)
            if space.size <= 1:
                continue
            rng = np.random.default_rng([args.seed, round_index, zlib.crc32(task.key.encode())])
            greedy, configs = proposals(space, net.value, args.schedules, args.noise, args.beam, rng)
            table = TaskRows(store, hardware, spec, task, space)
            table.register()
            have = set(table.configs())
            todo = [c for c in configs if c not in have]
            if todo:
                measure_into(table, hardware, spec, todo, source="value")
            new += len(todo)
            truths = {c: table.truth(c) for c in configs}
            ran = [c for c in configs if truths[c] is not None]
            if ran:
                predicted.append(net.seconds(space, [prefix_of(space, c, len(order(space, c[0]))) for c in ran]))
                measured.append(np.array([truths[c] for c in ran]))
            if greedy is not None and truths.get(greedy) is not None:
                greedy_ms += task.weight * truths[greedy] * 1e3
        metrics[f"greedy_latency_ms/{network}"] = greedy_ms
    return {**metrics, **prediction_errors(predicted, measured), "measured": new}


def matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def check_holdout(patterns, names: list[str]) -> None:
    """Before any round: every --holdout pattern names a kernel, and some kernel is left to train on."""
    unmatched = [p for p in patterns if not any(matches(name, [p]) for name in names)]
    if unmatched:
        raise SystemExit(f"tunelab: --holdout: no kernel matches {', '.join(unmatched)} (kernels: "
                         f"{', '.join(sorted(set(names)))})")
    if patterns and all(matches(name, patterns) for name in names):
        raise SystemExit("tunelab: --holdout leaves no kernel to train on")


def improve(args) -> None:
    from hydra.utils import instantiate

    from tuning.hardware.corpus import load_corpus
    from tuning.store import connect_store, display_location, fingerprint
    from tuning.tools.dataset import compose, full_readings, model_tasks
    from tuning.tracking.registry import register, resolve
    from tuning.value.net import complete_errors, fit, kernels_of, load_value, log_value, shape_tag, split

    args.out.mkdir(parents=True, exist_ok=True)
    progress = read_progress(args.out / "progress.json", args)
    cfgs = [compose([f"model={name}", *args.overrides]) for name in args.network]
    hardware, spec = instantiate(cfgs[0].hardware), full_readings(instantiate(cfgs[0].evaluator).spec)
    reference = progress["model"]
    net = load_value(reference, args.registry)
    with hardware:
        networks = [(name, model_tasks(cfg, hardware)) for name, cfg in zip(args.network, cfgs)]
        check_holdout(args.holdout, [task.name for _, tasks in networks for task in tasks])
        store = connect_store(args.store)
        key, _ = fingerprint(hardware, spec)
        for round_index in range(progress["rounds_done"] + 1, args.rounds + 1):
            metrics = run_round(round_index, args, net, hardware, spec, store, networks)
            kernels = kernels_of(load_corpus([args.store], key, args.min_configs), hardware)
            outside = [k for k in kernels if matches(k.name, args.holdout)]
            cut = split([k for k in kernels if not matches(k.name, args.holdout)], args.val_fraction, args.seed)
            with tqdm(total=args.epochs, desc=f"round {round_index}: refitting V", unit="epoch", disable=None) as bar:
                net, losses = fit(cut.train, net.hidden, net.layers, args.epochs, args.lr, args.batch,
                                  args.seed + round_index, progress=lambda *_: bar.update(), start=net)
            errors = {f"after_refit/{part}/{k}": v for part, numbers in
                      (("train", complete_errors(net, cut.train)), ("heldout_configs", complete_errors(net, cut.held)),
                       ("heldout_kernels", complete_errors(net, outside)))
                      for k, v in numbers.items()}
            errors["split/near_duplicates_left_out"] = cut.near
            version = resolve(reference, args.registry)
            reference = register(
                lambda mlflow: log_value(mlflow, net, args.name), args.name, args.registry, "value-improve",
                params={"round": round_index, "from_model": f"models:/{version.name}/{version.version}",
                        "networks": ",".join(args.network), "schedules": args.schedules, "noise": args.noise,
                        "beam": args.beam, "epochs": args.epochs, "seed": args.seed,
                        "holdout": ",".join(args.holdout) or "none", "val_fraction": args.val_fraction,
                        "store": display_location(args.store)},
                metrics={**metrics, **errors, "final_loss": losses[-1]},
                tags={**shape_tag(net), "tunelab.hardware": key, "tunelab.round": str(round_index),
                      "tunelab.tasks": json.dumps([{"name": k.name, "configs": len(k.configs)} for k in cut.train]),
                      "tunelab.heldout_kernels": json.dumps(sorted({k.name for k in outside}))})
            progress = {"rounds_done": round_index, "model": reference, "start_model": progress["start_model"]}
            (args.out / "progress.json").write_text(json.dumps(progress))
            print(f"round {round_index}: {metrics['measured']} new measurements; "
                  + ", ".join(f"{k} {v:.3f}" for k, v in {**metrics, **errors}.items() if k != "measured")
                  + f"; registered {reference}", flush=True)
    store.close()
    print(f"done: {progress['rounds_done']} rounds; V is {progress['model']}")


def read_progress(path: Path, args) -> dict:
    """The rounds done by an earlier run of this command in --out (untrusted: checked), else round 0."""
    fresh = {"rounds_done": 0, "model": args.model, "start_model": args.model}
    if not path.exists():
        return fresh
    try:
        progress = json.loads(path.read_text())
        done, model, start = int(progress["rounds_done"]), str(progress["model"]), str(progress["start_model"])
    except (ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"tunelab: {path}: unreadable ({error!r}); remove it to start the loop again") from None
    if start != args.model:
        raise SystemExit(f"tunelab: {path.parent} holds a loop started from {start}, not --model {args.model}; "
                         f"give another --out")
    if done < 0:
        raise SystemExit(f"tunelab: {path}: rounds_done {done} < 0")
    print(f"continuing from {path}: {done} rounds done, V is {model}")
    return {"rounds_done": done, "model": model, "start_model": start}
