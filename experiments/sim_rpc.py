"""The remote runner's scheduling with 64 and 256 simulated devices: device utilisation and the build workers
needed to keep them busy.

    python experiments/sim_rpc.py --readings outputs/bench_rpc/readings.json
    python experiments/sim_rpc.py --readings R.json --devices 64 256 --workers 1 4 16 64 --upload-s 0.05

Real code, simulated devices: `Runner.measure` and `Runner.run_batch` (tuning/hardware/runners/base.py,
what the RPC runner runs: build the whole batch, read the gauge on every device, spread the batch
over the devices, one thread per device, results handed on in order) drive a runner whose devices
sleep instead of timing, in real time, so the runner's own overhead (threads, hand-offs) is real.
Each candidate draws a (build_s, run_s) pair from real readings (experiments/bench_rpc.py --out, or
any run's records.jsonl); a device spends upload_s + 2 x latency_s + run_s on it, and gauge_s on the
gauge. The build phase is not slept: for each number of build workers its wall time is the makespan
of the batch's drawn build seconds sharded as HostBuilds shards them (jobs[i::workers]), added to
the run phase's measured wall time.

With `--overlap` each grid point is also run as the RPC runner runs it now (Runner.overlaps_builds):
the builds slept for real, sharded over `workers` threads, each candidate handed to the devices as
soon as it is built, so the devices time while the rest of the batch builds; its utilisation is
measured, not added up, and set beside the build-then-time figure.

Utilisation = the devices' busy seconds / (devices x wall seconds). A batch is `--batch` configs
(default: the tuner's plan_size, 64) or `--batch-per-device` x devices: with fewer configs in a
batch than devices, the other devices have nothing to take. The build workers needed: the fewest
of `--workers` whose utilisation is within 10% of the best the grid reached.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np

from tuning.core.measure import MeasureSpec
from tuning.core.records import MeasureResult
from tuning.core.task import gemm_task
from tuning.hardware.runners.base import Runner

TASK = gemm_task("gemm_64", 64, 64, 64)


class SimulatedDevices(Runner):
    """`count` devices that sleep the readings' run seconds; `build` only draws the readings."""

    def __init__(self, count: int, readings: np.ndarray, upload_s: float, latency_s: float, gauge_s: float,
                 rng: np.random.Generator, build_workers: int | None = None):
        self.count, self.readings = count, readings
        self.upload_s, self.latency_s, self.gauge_s, self.rng = upload_s, latency_s, gauge_s, rng
        self.build_workers = build_workers  # None: builds not slept (added up after); else slept, overlapped
        self.busy_s = 0.0
        self.drawn_builds: list[np.ndarray] = []  # each batch's build seconds, in config order
        self._lock = threading.Lock()

    @property
    def devices(self) -> list[str]:
        return [f"sim:{i}" for i in range(self.count)]

    def build(self, task, configs, spec) -> list:
        drawn = self.readings[self.rng.integers(len(self.readings), size=len(configs))]
        self.drawn_builds.append(drawn[:, 0])
        return [{"build_s": b, "run_s": r} for b, r in drawn]

    def overlaps_builds(self) -> bool:
        return self.build_workers is not None

    def build_each(self, task, configs, spec, on_built, stopped=lambda: False) -> None:
        """The drawn builds slept for real, HostBuilds' sharding over `build_workers` threads."""
        built = self.build(task, configs, spec)
        workers = min(self.build_workers or 1, len(built))

        def shard(k: int) -> None:
            for i in range(k, len(built), workers):
                if stopped():
                    return
                time.sleep(built[i]["build_s"])
                on_built(i, built[i])

        threads = [threading.Thread(target=shard, args=(k,)) for k in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def gauge(self) -> None:
        time.sleep(self.gauge_s)  # every device reads it at once

    def run_one(self, task, config, built, spec, device) -> MeasureResult:
        seconds = self.upload_s + 2 * self.latency_s + built["run_s"]
        time.sleep(seconds)
        with self._lock:
            self.busy_s += seconds
        return MeasureResult(costs=[1e-3], run_s=built["run_s"], build_s=built["build_s"], config=tuple(config),
                             device=device)


def overlapped(devices: int, batch: int, batches: int, workers: int, readings, args) -> float:
    """The devices' utilisation with the builds overlapped (slept in `workers` threads), measured."""
    runner = SimulatedDevices(devices, readings, args.upload_s, args.latency_s, args.gauge_s,
                              np.random.default_rng(args.seed), build_workers=workers)
    configs = [(i,) for i in range(batch)]
    started = time.perf_counter()
    for _ in range(batches):
        runner.measure(TASK, configs, MeasureSpec())
    return runner.busy_s / (devices * (time.perf_counter() - started))


def build_makespan(build_s: np.ndarray, workers: int) -> float:
    """The build phase's wall seconds: HostBuilds gives worker i the jobs i, i+workers, ..."""
    return max(build_s[i::workers].sum() for i in range(min(workers, len(build_s))))


def load_readings(path: Path) -> np.ndarray:
    """(build_s, run_s) pairs from bench_rpc.py's JSON or a records.jsonl."""
    text = path.read_text()
    if path.suffix == ".json":
        pairs = [(r["build_s"], r["run_s"]) for block in json.loads(text)["blocks"] for r in block["readings"]]
    else:
        results = [json.loads(line)["result"] for line in text.splitlines() if line.strip()]
        pairs = [(r["build_s"], r["run_s"]) for r in results if r.get("error") is None]
    if not pairs:
        raise SystemExit(f"{path}: no readings")
    return np.array(pairs, dtype=float)


def simulate(devices: int, batch: int, batches: int, readings, args) -> tuple[float, float, list]:
    """The run phases measured: (their wall seconds, the devices' busy seconds, each batch's builds)."""
    runner = SimulatedDevices(devices, readings, args.upload_s, args.latency_s, args.gauge_s,
                              np.random.default_rng(args.seed))
    configs = [(i,) for i in range(batch)]
    started = time.perf_counter()
    for _ in range(batches):
        runner.measure(TASK, configs, MeasureSpec())
    return time.perf_counter() - started, runner.busy_s, runner.drawn_builds


def with_workers(devices: int, batch: int, batches: int, workers: int, measured: tuple) -> dict:
    run_wall, busy, builds = measured
    build_wall = sum(build_makespan(b, workers) for b in builds)
    wall = run_wall + build_wall
    return {"workers": workers, "utilisation": busy / (devices * wall), "build_share": build_wall / wall,
            "per_minute": 60 * batch * batches / wall}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readings", required=True, type=Path, help="bench_rpc.py --out JSON, or a records.jsonl")
    parser.add_argument("--devices", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--batch", type=int, default=64, help="configs per batch (the tuner's plan_size)")
    parser.add_argument("--batch-per-device", type=int, default=4, help="also simulate batches of this x devices")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--upload-s", type=float, default=None, help="default: the readings' mean upload, else 0.005")
    parser.add_argument("--latency-s", type=float, default=0.001, help="one-way network latency per call")
    parser.add_argument("--gauge-s", type=float, default=0.07, help="the drift gauge's seconds on a device")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overlap", action="store_true", help="also run each point with the builds overlapped "
                                                               "(slept for real: minutes)")
    args = parser.parse_args(argv)
    readings = load_readings(args.readings)
    if args.upload_s is None:
        args.upload_s = measured_upload(args.readings)
    print(f"readings: {len(readings)} from {args.readings}; build_s mean {readings[:, 0].mean():.3f}, run_s mean "
          f"{readings[:, 1].mean():.3f}; upload {args.upload_s:.4f} s, latency {args.latency_s:.4f} s, "
          f"gauge {args.gauge_s:.3f} s")
    for devices in args.devices:
        for batch in dict.fromkeys([args.batch, args.batch_per_device * devices]):
            measured = simulate(devices, batch, args.batches, readings, args)
            rows = [with_workers(devices, batch, args.batches, w, measured) for w in args.workers]
            best = max(r["utilisation"] for r in rows)
            needed = next(r["workers"] for r in rows if r["utilisation"] >= 0.9 * best)
            print(f"\n{devices} devices, batches of {batch}: workers needed {needed} "
                  f"(utilisation within 10% of the grid's best, {best:.0%})")
            print(f"{'workers':>8} {'utilisation':>12} {'build share':>12} {'cand/min':>10}"
                  + (f" {'overlapped':>11}" if args.overlap else ""))
            for r in rows:
                extra = f" {overlapped(devices, batch, args.batches, r['workers'], readings, args):>11.1%}" \
                    if args.overlap else ""
                print(f"{r['workers']:>8} {r['utilisation']:>12.1%} {r['build_share']:>12.1%} {r['per_minute']:>10.0f}"
                      + extra, flush=True)


def measured_upload(path: Path) -> float:
    if path.suffix != ".json":
        return 0.005
    blocks = json.loads(path.read_text())["blocks"]
    timed = sum(b["stats"]["timed"] for b in blocks)
    return sum(b["stats"]["upload_s"] for b in blocks) / timed if timed else 0.005


if __name__ == "__main__":
    main()
