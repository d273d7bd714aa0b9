"""The shared stores under many writers: the measurement store on PostgreSQL and on sqlite, and the
Optuna sweeper's ask/tell loop on PostgreSQL, side by side in one sitting.

    python experiments/bench_cluster_storage.py                        # 1, 8, 32 writers; 32 sweep workers
    python experiments/bench_cluster_storage.py --writers 1 8 --rows 200 --askers 8 --trials 20

Starts a throwaway PostgreSQL (tuning.cluster.hosts.Postgres, loopback). For each backend and writer
count, that many processes each add `--rows` readings to one store, one transaction per reading as a
run's StoreWriter does, and the script prints rows/s over all writers and each `add`'s p50/p99 latency;
then as many readers each read the whole task (`rows()`) `--reads` times: rows/s read. sqlite and
PostgreSQL alternate per writer count so the host's drift falls on both alike.

The sweep part runs `--askers` processes against one PostgreSQL study, each doing the sweeper's step
(under its advisory lock: ask) then telling a value, until the study has `--trials` trials per
process: trials/s and the step's p99. The sampler is Optuna's RandomSampler, so the rate is the
storage's and the lock's, not a model's fit.

On a 2-core host 32 writers and the database share two cores: these rates are what contention on
one machine allows, a lower bound for a database on a machine of its own. Run it alone on the host.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

HARDWARE, TASK, SPACE = "bench-hw", "bench-task", "bench-space"
TASK_INFO = SimpleNamespace(name="bench", flops=2.0 * 64 ** 3, workload={"kind": "gemm", "m": 64})


def _writer(location: str, rows: int, offset: int, start, out) -> None:
    from tuning.store import connect_store

    store = connect_store(location)
    store.register(HARDWARE, {"bench": True}, TASK, TASK_INFO, SPACE, 1e9)
    rng = np.random.default_rng(offset)
    latencies = []
    start.wait()
    for i in range(rows):
        result = SimpleNamespace(costs=list(rng.uniform(1e-5, 2e-5, 5)), error=None, message="", build_s=0.1,
                                 run_s=0.01, gauge_s=None)
        began = time.perf_counter()
        store.add(HARDWARE, TASK, SPACE, (offset + i, i % 7), {"tile": offset + i}, result)
        latencies.append(time.perf_counter() - began)
    out.put(latencies)


def _reader(location: str, reads: int, start, out) -> None:
    from tuning.store import connect_store

    store = connect_store(location, read_only=True)
    start.wait()
    began, count = time.perf_counter(), 0
    for _ in range(reads):
        count += len(store.rows(HARDWARE, TASK, SPACE))
    out.put((count, time.perf_counter() - began))


def _in_parallel(target, count: int, args_of) -> tuple[list, float]:
    context = mp.get_context("spawn")
    start, out = context.Barrier(count + 1), context.Queue()
    workers = [context.Process(target=target, args=(*args_of(i), start, out)) for i in range(count)]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    results = [out.get(timeout=1800) for _ in workers]
    wall = time.perf_counter() - began
    for worker in workers:
        worker.join(60)
    return results, wall


def store_rates(location: str, writers: int, rows: int, reads: int) -> dict:
    latencies, wall = _in_parallel(_writer, writers, lambda i: (location, rows, i * rows))
    every = sorted(x for part in latencies for x in part)
    read, read_wall = _in_parallel(_reader, writers, lambda i: (location, reads))
    return {"writers": writers, "rows": len(every), "write_rows_per_s": len(every) / wall,
            "add_p50_ms": 1e3 * every[len(every) // 2], "add_p99_ms": 1e3 * every[int(0.99 * (len(every) - 1))],
            "read_rows_per_s": sum(c for c, _ in read) / read_wall}


def _asker(url: str, study_name: str, trials: int, start, out) -> None:
    import optuna

    from hydra_plugins.tunelab_optuna_sweeper._sweeper import PG_CONNECT_ARGS, _study_lock

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True, "connect_args": PG_CONNECT_ARGS})
    study = optuna.load_study(study_name=study_name, storage=storage, sampler=optuna.samplers.RandomSampler())
    space = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    steps = []
    start.wait()
    for _ in range(trials):
        began = time.perf_counter()
        with _study_lock(url, study_name):
            len(study.get_trials(deepcopy=False))  # the sweeper counts the taken trials under the lock
            trial = study.ask(space)
        study.tell(trial, trial.params["x"])
        steps.append(time.perf_counter() - began)
    out.put(steps)


def sweep_rates(url: str, askers: int, trials: int) -> dict:
    import optuna

    name = f"bench-{askers}-{time.time_ns()}"
    optuna.create_study(study_name=name, storage=url)
    steps, wall = _in_parallel(_asker, askers, lambda i: (url, name, trials))
    every = sorted(x for part in steps for x in part)
    done = len(optuna.load_study(study_name=name, storage=url).trials)
    return {"askers": askers, "trials": done, "trials_per_s": done / wall,
            "step_p50_ms": 1e3 * every[len(every) // 2], "step_p99_ms": 1e3 * every[int(0.99 * (len(every) - 1))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rows", type=int, default=500, help="readings each writer adds")
    parser.add_argument("--reads", type=int, default=5, help="whole-task reads each reader makes")
    parser.add_argument("--askers", type=int, default=32)
    parser.add_argument("--trials", type=int, default=25, help="trials each sweep worker asks for")
    parser.add_argument("--out", type=Path, help="write the readings as JSON here")
    args = parser.parse_args()

    from tuning.cluster.hosts import Postgres

    folder = Path(tempfile.mkdtemp(prefix="tunelab-bench-"))
    folder.chmod(0o755)  # PostgreSQL runs as the postgres user when this runs as root
    results = {"store": [], "sweep": None}
    with Postgres(folder / "pg") as pg:
        for writers in args.writers:
            for backend in ("sqlite", "postgresql"):
                location = (str(folder / f"store-{writers}.sqlite") if backend == "sqlite"
                            else pg.create_database(f"store_{writers}"))
                row = {"backend": backend, **store_rates(location, writers, args.rows, args.reads)}
                results["store"].append(row)
                print(f"{backend:10s} {writers:3d} writers: {row['write_rows_per_s']:8.0f} rows/s written, "
                      f"add p50 {row['add_p50_ms']:6.1f} ms p99 {row['add_p99_ms']:7.1f} ms; "
                      f"{row['read_rows_per_s']:9.0f} rows/s read by {writers}", flush=True)
        url = pg.create_database("optuna")
        results["sweep"] = sweep_rates(url, args.askers, args.trials)
        sweep = results["sweep"]
        print(f"sweeper on PostgreSQL, {args.askers} workers: {sweep['trials']} trials, "
              f"{sweep['trials_per_s']:.1f} trials/s, lock+ask+tell p50 {sweep['step_p50_ms']:.0f} ms "
              f"p99 {sweep['step_p99_ms']:.0f} ms", flush=True)
    for writers in args.writers:
        pair = {r["backend"]: r for r in results["store"] if r["writers"] == writers}
        print(f"{writers:3d} writers: PostgreSQL / sqlite write rate "
              f"{pair['postgresql']['write_rows_per_s'] / pair['sqlite']['write_rows_per_s']:.2f}x, p99 "
              f"{pair['postgresql']['add_p99_ms']:.1f} vs {pair['sqlite']['add_p99_ms']:.1f} ms")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
