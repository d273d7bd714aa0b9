"""Remote measuring with 1 and 2 real RPC servers, side by side: candidates per minute and where the time goes.

    python experiments/bench_rpc.py                                  # gemm_64, 8 blocks of 2 x 16 candidates
    python experiments/bench_rpc.py --model conv_l8 --batch 8 --blocks 2
    python experiments/bench_rpc.py --out outputs/bench_rpc/readings.json   # readings for sim_rpc.py

Starts TVM's tracker and two of the lab's RPC servers on loopback (tuning.hardware.rpc_hosts; each
server pinned to its own core with one thread), then measures fresh random configs of one task
through hardware=cpu with hardware/runner=rpc holding 1 or 2 of the servers, in blocks ordered
1-2-2-1 so the host's drift falls on both alike. Each block measures `--batches` batches of
`--batch` configs the way a tuning round does (build the batch on this host, read the drift gauge,
time the batch on the held servers). Prints candidates per minute per block and their ratio (2
servers over 1, paired by block: mean and range), and per candidate the seconds spent building (the
build phase's wall time over its candidates), queued (built, waiting for a server), uploading, and
running on the device.

On a 2-core host the builder, this process and both servers share the two cores: this measures the
runner's orchestration (how much of a candidate's time is not the device's), not how far remote
measuring scales. `experiments/sim_rpc.py` takes the readings written with `--out` to 64 and 256
simulated devices. Run it alone on the host.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from hydra.utils import instantiate

from tuning.core.task import build_tasks
from tuning.hardware.rpc_hosts import Cluster
from tuning.tools.dataset import compose

KEY = "bench"


def job(model: str, evaluator: str, tracker: str, devices: int):
    """The run config: hardware=cpu (one thread, one build process) timing through hardware/runner=rpc."""
    return compose([f"model={model}", f"evaluator={evaluator}", "hardware=cpu", "hardware/runner=rpc",
                    "hardware.num_threads=1", "hardware.build_workers=1", f"hardware.runner.tracker={tracker}",
                    f"hardware.runner.key={KEY}", f"hardware.runner.devices={devices}"])


def fresh_configs(space, rng, count: int, seen: set) -> list[tuple]:
    configs = []
    while len(configs) < count:
        config = space.canonical(space.sample(rng))
        if config not in seen:
            seen.add(config)
            configs.append(config)
    return configs


def measure_block(cluster: Cluster, args, devices: int, rng, seen) -> dict:
    """One block: `batches` batches measured on `devices` held servers; wall seconds, the runner's
    stats and each candidate's (build_s, run_s, device)."""
    cfg = job(args.model, args.evaluator, cluster.tracker, devices)
    task, spec = build_tasks(cfg.model)[0], instantiate(cfg.evaluator).spec
    hardware = instantiate(cfg.hardware)
    batch, batches = args.batch, args.batches
    try:
        problem = hardware.unreachable()
        if problem:
            raise SystemExit(problem)
        space = hardware.space(task)
        hardware.measure(task, fresh_configs(space, rng, 2, seen), spec)  # warm: workers, sessions, references
        runner = hardware.runner
        before = dict(runner.stats)
        started = time.perf_counter()
        results = []
        for _ in range(batches):
            results += hardware.measure(task, fresh_configs(space, rng, batch, seen), spec)
        wall = time.perf_counter() - started
        stats = {k: runner.stats[k] - before[k] for k in before}
        held = len(runner.devices)
    finally:
        hardware.close()
    return {"devices": devices, "held": held, "wall_s": wall, "candidates": len(results), "stats": stats,
            "errors": sum(1 for r in results if not r.ok),
            "readings": [{"build_s": r.build_s, "run_s": r.run_s, "device": r.device} for r in results]}


def summarize(blocks: list[dict]) -> None:
    print(f"\n{'block':>5} {'servers':>7} {'cand/min':>9} {'build':>7} {'queue':>7} {'upload':>7} {'run':>7}  "
          f"(seconds per candidate)")
    per_minute = {1: [], 2: []}
    for i, block in enumerate(blocks):
        n, stats = block["candidates"], block["stats"]
        rate = 60 * n / block["wall_s"]
        per_minute[block["devices"]].append(rate)
        print(f"{i:>5} {block['held']:>7} {rate:>9.1f} {stats['build_wall_s'] / n:>7.3f} {stats['queue_s'] / n:>7.3f} "
              f"{stats['upload_s'] / n:>7.3f} {stats['run_s'] / n:>7.3f}"
              + (f"  {block['errors']} errors" if block["errors"] else ""))
    one, two = np.array(per_minute[1]), np.array(per_minute[2])
    ratios = two / one  # paired: the blocks run 1-2-2-1, so block pairs (0,1), (3,2), ...
    print(f"\ncandidates per minute: 1 server {one.mean():.1f} ({one.min():.1f}-{one.max():.1f}), "
          f"2 servers {two.mean():.1f} ({two.min():.1f}-{two.max():.1f}); "
          f"2 over 1: {ratios.mean():.2f}x (range {ratios.min():.2f}-{ratios.max():.2f}, {len(ratios)} pairs)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemm_64", help="a single-operator model (conf/model/)")
    parser.add_argument("--blocks", type=int, default=8, help="blocks, in 1-2-2-1 order (an even number)")
    parser.add_argument("--batches", type=int, default=2, help="batches per block")
    parser.add_argument("--batch", type=int, default=16, help="configs per batch (a tuning round's plan_size)")
    parser.add_argument("--evaluator", default="fixed", help="the evaluator whose settings time each candidate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write every block's readings here (JSON) for sim_rpc.py")
    args = parser.parse_args(argv)
    rng, seen = np.random.default_rng(args.seed), set()
    order = ([1, 2, 2, 1] * -(-args.blocks // 4))[:max(2, args.blocks - args.blocks % 2)]
    with Cluster(KEY, servers=2, log_dir=Path(tempfile.mkdtemp(prefix="bench-rpc-"))) as cluster:
        blocks = []
        for devices in order:
            blocks.append(measure_block(cluster, args, devices, rng, seen))
            cluster.wait_registered(2)  # both servers free again before the next block
    spec = instantiate(job(args.model, args.evaluator, "127.0.0.1:9190", 1).evaluator).spec
    print(f"{args.model}: {args.batch} configs a batch, {args.batches} batches a block, seed {args.seed}; "
          f"evaluator={args.evaluator} (repeat {spec.repeat}, min_repeat_ms {spec.min_repeat_ms})")
    summarize(blocks)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"model": args.model, "blocks": blocks}, indent=1))
        print(f"readings: {args.out}")


if __name__ == "__main__":
    main()
