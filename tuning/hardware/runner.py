"""The runner seam: where a TVM backend's candidates are built and timed (no TVM import here).

TVMHardware (tvm_backend.py) holds one runner and asks it to

    prepare(task)                          the untuned kernel's output, once per task (the reference)
    build(task, configs, spec) -> built    the whole batch, in order (one dict per config)
    run(task, config, built, spec)         one candidate -> MeasureResult
    gauge() -> seconds | None              the drift gauge kernel's reading now
    close()                                stop whatever it started

LocalRunner does this on this host: `build_workers` long-lived build processes
and one run process (workers.py), running tvm_worker.py's functions on
`tvm.device(device, 0)`. A worker that hangs or crashes is restarted, and a
restarted run worker gets its references again. Other ways to reach a device
plug in here with the same methods: an RPC runner (build here, upload the
library and time it through TVM's RPC tracker) for boards and remote GPUs.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from tuning.hardware.workers import Worker
from tuning.records import MeasureResult

WORKER = "tuning.hardware.tvm_worker"


class LocalRunner:
    """Build workers and one run worker on this host; processes start on first use.

    target   the TVM target dict the kernels are built for
    device   the device name the run worker times on (tvm.device(device, 0))
    env      environment of the run worker (e.g. TVM_NUM_THREADS)
    build_env  environment of the build workers
    """

    def __init__(self, target: dict, device: str, env: dict, build_env: dict | None = None, build_workers: int = 1):
        self.target = target
        self.device = device
        self.env = dict(env)
        self.build_env = dict(build_env or {})
        self.build_workers = build_workers
        self.builders: list[Worker] = []
        self.run_worker: Worker | None = None
        self.libs: str | None = None
        self._prepared: set = set()

    def start(self) -> None:
        if self.run_worker is not None:
            return
        init = f"{WORKER}:init"
        self.builders = [Worker(self.build_env, init, init_args=(self.target,)) for _ in range(self.build_workers)]
        self.run_worker = Worker(self.env, init, init_args=(self.target,))
        self.libs = tempfile.mkdtemp(prefix="tunelab-libs-")
        with ThreadPoolExecutor(len(self.builders) + 1) as pool:
            list(pool.map(lambda w: w.ensure_started(), [*self.builders, self.run_worker]))

    def prepare(self, task) -> None:
        """Compute the untuned kernel's output once per task (the correctness reference)."""
        self.start()
        if task.key in self._prepared:
            return
        status, value = self.run_worker.call(f"{WORKER}:reference", task.workload, self.target, self.device,
                                             timeout=600)
        if status != "ok":
            raise RuntimeError(f"could not run the untuned kernel of {task.name}: {value}")
        self._prepared.add(task.key)

    def build(self, task, configs, spec) -> list[dict]:
        """Build every config (builders in parallel, each serving one call at a time); one dict per
        config, in order: {"error", "message", "build_s", "config", "args", "path"}."""
        self.start()
        paths = [os.path.join(self.libs, f"{task.key}-{i}-{time.time_ns()}.so") for i in range(len(configs))]
        jobs = list(zip(configs, paths))

        def build_shard(worker, shard):
            return {path: self._build_one(worker, task, config, path, spec) for config, path in shard}

        built = {}
        n = len(self.builders)
        with ThreadPoolExecutor(n) as pool:
            for part in pool.map(build_shard, self.builders, [jobs[i::n] for i in range(n)]):
                built.update(part)
        return [{**built[path], "path": path} for path in paths]

    def _build_one(self, worker, task, config, path, spec) -> dict:
        status, value = worker.call(f"{WORKER}:build", task.workload, self.target, list(config), path,
                                    timeout=spec.build_timeout_s)
        if status == "ok":
            return value
        kind = "timeout" if status == "timeout" else "build"
        return {"error": kind, "message": str(value), "build_s": spec.build_timeout_s if kind == "timeout" else 0.0}

    def run(self, task, config, built: dict, spec) -> MeasureResult:
        """Time one built candidate; its library file is removed afterwards."""
        try:
            return self._run_one(task, config, built, spec)
        finally:
            Path(built["path"]).unlink(missing_ok=True)

    def _run_one(self, task, config, built: dict, spec) -> MeasureResult:
        effective = tuple(built.get("config") or config)
        if built["error"]:
            return MeasureResult.failed(built["error"], built["message"], build_s=built["build_s"], config=effective)
        start = time.perf_counter()
        status, value = self.run_worker.call(f"{WORKER}:run", task.workload, self.target, self.device, built["path"],
                                             built["args"], asdict(spec), timeout=spec.timeout_s + 30)
        timings = {"build_s": built["build_s"], "config": effective}
        if status != "ok":
            self._prepared.discard(task.key)  # a restarted run worker has lost its references
            self.prepare(task)
            kind = {"timeout": "timeout", "crash": "run"}.get(status, "run")
            return MeasureResult.failed(kind, str(value), run_s=time.perf_counter() - start, **timings)
        if value["error"]:
            return MeasureResult.failed(value["error"], value["message"], run_s=value["run_s"], **timings)
        return MeasureResult(costs=value["costs"], run_s=value["run_s"], message=value.get("message", ""), **timings)

    def gauge(self) -> float | None:
        """The drift gauge (tvm_worker.gauge) on the run worker; None if it could not run."""
        self.start()
        status, value = self.run_worker.call(f"{WORKER}:gauge", self.target, self.device, timeout=120)
        return float(value) if status == "ok" else None

    def close(self) -> None:
        for worker in [*self.builders, *([self.run_worker] if self.run_worker else [])]:
            worker.close()
        self.builders, self.run_worker = [], None
        self._prepared.clear()
        if self.libs:
            shutil.rmtree(self.libs, ignore_errors=True)
            self.libs = None
