"""The host's build processes: a batch's configs compiled in parallel into library files (no TVM import).

Every runner builds on this host, wherever it times: `build_workers` long-lived processes
(tuning/hardware/workers.py) run tvm_worker.build, each serving one call at a time. A build that
hangs or crashes its process is a `timeout` or `build` result; the process is restarted.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tuning.hardware.workers import Worker

WORKER = "tuning.hardware.tvm_worker"


class HostBuilds:
    def __init__(self, target: dict, env: dict, workers: int):
        self.target = target
        self.workers = [Worker(env, f"{WORKER}:init", init_args=(target,)) for _ in range(workers)]
        self.libs = tempfile.mkdtemp(prefix="tunelab-libs-")
        self.closed = False  # set by close(): no build begins after it (a thread still building stops)

    def start(self) -> None:
        with ThreadPoolExecutor(len(self.workers)) as pool:
            list(pool.map(lambda w: w.ensure_started(), self.workers))

    def build(self, task, configs, spec, on_built=None, stopped=None) -> list[dict]:
        """One dict per config, in order: {"error", "message", "build_s", "config", "args", "path",
        "built_at" (time.perf_counter() when it was done)}; `on_built(i, built)`, when given, is
        called with each as soon as it is built (from the build threads, in any order). Once
        `stopped()` is true, or the builds are closed, no build begins: the configs left have none."""
        paths = [os.path.join(self.libs, f"{task.key}-{i}-{time.time_ns()}.so") for i in range(len(configs))]
        jobs = list(enumerate(zip(configs, paths)))

        def build_shard(worker, shard):
            done = {}
            for i, (config, path) in shard:
                if self.closed or (stopped is not None and stopped()):
                    break
                done[i] = {**self._build_one(worker, task, config, path, spec), "path": path,
                           "built_at": time.perf_counter()}
                if on_built:
                    on_built(i, done[i])
            return done

        built: dict[int, dict] = {}
        n = len(self.workers)
        with ThreadPoolExecutor(n) as pool:
            for part in pool.map(build_shard, self.workers, [jobs[i::n] for i in range(n)]):
                built.update(part)
        return [built[i] for i in range(len(configs)) if i in built]

    def _build_one(self, worker, task, config, path, spec) -> dict:
        status, value = worker.call(f"{WORKER}:build", task.workload, self.target, list(config), path,
                                    timeout=spec.build_timeout_s)
        if status == "ok":
            return value
        kind = "timeout" if status == "timeout" else "build"
        return {"error": kind, "message": str(value), "build_s": spec.build_timeout_s if kind == "timeout" else 0.0}

    def close(self) -> None:
        self.closed = True
        for worker in self.workers:
            worker.close()
        shutil.rmtree(self.libs, ignore_errors=True)


def then_removed(built: dict, result_of):
    """`result_of()`, with the built library's file removed afterwards, whatever happens."""
    try:
        return result_of()
    finally:
        Path(built["path"]).unlink(missing_ok=True)
