"""The adaptive evaluator's saving on the real host, interleaved: what replay cannot answer.

    python experiments/bench_adaptive_saving.py --model conv_l8 --configs 40 --passes 3
    python experiments/bench_adaptive_saving.py --model conv_l8 --pick best --store stores/lab.sqlite
    python experiments/bench_adaptive_saving.py --hardware hardware=cpu hardware.num_threads=4

A replay charges evaluator=adaptive the stored seconds of the micro-batches its rule keeps; the
real saving also depends on what a measurement costs besides its timed runs. This script times the
same configs with evaluator=adaptive, evaluator=adatune_de (all 10 micro-batches of 50 runs) and
evaluator=adatune_de150 (3 of them) on this host, in blocks of `--block` configs, each block
measured by the three evaluators one after the other in a rotated order, so the host's drift falls
on all three alike. Prints, per evaluator, the run seconds (the results' run_s: what time/run_s
counts in a run) and the micro-batches taken, and, paired by config, the ratio of each fixed
evaluator's run seconds to the adaptive one's with a bootstrap 95% CI over configs, and the ratio
of the readings (adaptive's median of its batches / the fixed evaluator's): the bias a shorter
measurement puts into a tuner's best-so-far.

Configs: `--pick random` (a seeded sample of the task's space: what a tuner's first rounds measure)
or `--pick best` (the store's fastest configs for the task under adatune_de readings: what a tuner's
late rounds measure). The hardware is conf/hardware's (`--hardware`: Hydra overrides, default
hardware=cpu with 2 build workers). Real hardware only; run it alone on the host.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

EVALUATORS = ("adaptive", "adatune_de", "adatune_de150")


def evaluators() -> dict:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    return {name: instantiate(OmegaConf.load(REPO / "conf" / "evaluator" / f"{name}.yaml")) for name in EVALUATORS}


def pick_configs(args, hardware, task, spec) -> list[tuple]:
    space = hardware.space(task)
    if args.pick == "best":
        from tuning.store import TaskRows, connect_store

        table = TaskRows(connect_store(args.store), hardware, spec, task, space)
        truths = sorted((t, c) for c, t in table.store.truths(*table.key).items())
        if not truths:
            raise SystemExit(f"{args.store}: no adatune_de readings of {task.name} (build the store first)")
        return [c for _, c in truths[:args.configs]]
    rng = np.random.default_rng(args.seed)
    chosen: dict = {}
    while len(chosen) < args.configs:
        chosen.setdefault(space.canonical(space.sample(rng)), None)
    return list(chosen)


def measure(args) -> dict:
    """{evaluator: {config: [(run_s, cost, batches) per pass]}}."""
    from hydra.utils import instantiate

    from tuning.core.task import build_tasks
    from tuning.tools.dataset import compose

    cfg = compose([f"model={args.model}", *args.hardware])
    [task] = build_tasks(cfg.model)
    chosen = evaluators()
    found = {name: {} for name in EVALUATORS}
    with instantiate(cfg.hardware) as hardware:
        configs = pick_configs(args, hardware, task, chosen["adatune_de"].spec)
        blocks = [configs[i:i + args.block] for i in range(0, len(configs), args.block)]
        turn = 0
        for index in range(args.passes):
            for block in blocks:
                order = EVALUATORS[turn % 3:] + EVALUATORS[:turn % 3]
                turn += 1
                for name in order:
                    for config, result in zip(block, chosen[name].measure(hardware, task, block)):
                        if result.ok:
                            found[name].setdefault(config, []).append((result.run_s, result.cost, len(result.costs)))
            print(f"pass {index + 1}/{args.passes} done", flush=True)
    return {"task": task.name, "configs": len(configs), "by_evaluator": found}


def summarise(found: dict, rng) -> list[str]:
    from tuning.tools.compare import stats

    by = found["by_evaluator"]
    common = sorted(set.intersection(*(set(by[name]) for name in EVALUATORS)))
    lines = [f"{found['task']}: {len(common)} configs valid under every evaluator (of {found['configs']})",
             "evaluator        run s per config (median)  micro-batches (mean)"]

    def per_config(name, index):
        return np.array([np.median([p[index] for p in by[name][c]]) for c in common])

    for name in EVALUATORS:
        lines.append(f"{name:<16} {np.median(per_config(name, 0)):>10.3f}  {np.mean(per_config(name, 2)):>26.2f}")
    adaptive_run, adaptive_cost = per_config("adaptive", 0), per_config("adaptive", 1)
    for name in ("adatune_de", "adatune_de150"):
        saving = stats.paired_ratio(per_config(name, 0), adaptive_run, rng)
        bias = stats.paired_ratio(adaptive_cost, per_config(name, 1), rng)
        lines.append(f"{name} / adaptive run seconds: {saving['ratio']:.2f}x [{saving['low']:.2f}, {saving['high']:.2f}]"
                     f"; adaptive / {name} reading: {bias['ratio']:.3f} [{bias['low']:.3f}, {bias['high']:.3f}]")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="conv_l8")
    parser.add_argument("--configs", type=int, default=40)
    parser.add_argument("--pick", choices=("random", "best"), default="random")
    parser.add_argument("--store", default="stores/lab.sqlite", help="for --pick best")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--block", type=int, default=10, help="configs measured by one evaluator before the next")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the raw timings here (JSON)")
    parser.add_argument("--hardware", nargs="+", default=["hardware=cpu", "hardware.build_workers=2"],
                        metavar="OVERRIDE", help="the hardware that measures, as Hydra overrides of conf/")
    args = parser.parse_args(argv)
    if args.configs < 2 or args.passes < 1 or args.block < 1:
        parser.error("--configs >= 2, --passes >= 1, --block >= 1")
    started = time.perf_counter()
    found = measure(args)
    lines = summarise(found, np.random.default_rng(args.seed))
    lines.append(f"({args.passes} interleaved passes, {(time.perf_counter() - started) / 60:.1f} min)")
    print("\n".join(lines))
    if args.out:
        raw = {name: {json.dumps(list(c)): v for c, v in by.items()} for name, by in found["by_evaluator"].items()}
        Path(args.out).write_text(json.dumps({"task": found["task"], "timings": raw}, indent=1))


if __name__ == "__main__":
    main()
