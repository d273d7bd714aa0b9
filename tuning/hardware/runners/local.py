"""hardware/runner=local: build and time on this host (no TVM import at module level).

`build_workers` long-lived build processes and one run process (tuning/hardware/workers.py) run
tvm_worker.py's functions; the run process times on the device "<kind>:<device_index>" of this
host. A worker that hangs or crashes is restarted, and a restarted run worker gets its references
again. Exported schedules are checked, and libraries built, in this process; whole models in
e2e.py's workers. The only module that knows the default device index.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from tuning.hardware.runners.base import Runner
from tuning.hardware.workers import Worker
from tuning.core.records import MeasureResult

WORKER = "tuning.hardware.tvm_worker"


class LocalRunner(Runner):
    """Hyperparameters:
    device_index  which of this host's devices of the hardware's kind times the kernels ("cpu:0", "cuda:1")
    """

    ranges = {"device_index": (0, 1023)}

    def __init__(self, device_index: int = 0):
        self.device_index = device_index
        self.builders: list[Worker] = []
        self.run_worker: Worker | None = None
        self.libs: str | None = None
        self._prepared: set = set()

    @property
    def device(self) -> str:
        return f"{self.setup.device}:{self.device_index}"

    @property
    def devices(self) -> list[str]:
        return [self.device]

    def start(self) -> None:
        if self.run_worker is not None:
            return
        init, target = f"{WORKER}:init", self.setup.target
        self.builders = [Worker(self.setup.build_env, init, init_args=(target,))
                         for _ in range(self.setup.build_workers)]
        self.run_worker = Worker(self.setup.env, init, init_args=(target,))
        self.libs = tempfile.mkdtemp(prefix="tunelab-libs-")
        with ThreadPoolExecutor(len(self.builders) + 1) as pool:
            list(pool.map(lambda w: w.ensure_started(), [*self.builders, self.run_worker]))

    def prepare(self, task) -> None:
        self.start()
        if task.key in self._prepared:
            return
        status, value = self.run_worker.call(f"{WORKER}:reference", task.workload, self.setup.target, self.device,
                                             timeout=600)
        if status != "ok":
            raise RuntimeError(f"could not run the untuned kernel of {task.name}: {value}")
        self._prepared.add(task.key)

    def build(self, task, configs, spec) -> list[dict]:
        """Builders in parallel, each serving one call at a time; one dict per config, in order:
        {"error", "message", "build_s", "config", "args", "path"}."""
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
        status, value = worker.call(f"{WORKER}:build", task.workload, self.setup.target, list(config), path,
                                    timeout=spec.build_timeout_s)
        if status == "ok":
            return value
        kind = "timeout" if status == "timeout" else "build"
        return {"error": kind, "message": str(value), "build_s": spec.build_timeout_s if kind == "timeout" else 0.0}

    def run_one(self, task, config, built: dict, spec, device: str) -> MeasureResult:
        """Time one built candidate; its library file is removed afterwards."""
        try:
            return self._time(task, config, built, spec, device)
        finally:
            Path(built["path"]).unlink(missing_ok=True)

    def _time(self, task, config, built: dict, spec, device: str) -> MeasureResult:
        effective = tuple(built.get("config") or config)
        if built["error"]:
            return MeasureResult.failed(built["error"], built["message"], build_s=built["build_s"], config=effective)
        start = time.perf_counter()
        status, value = self.run_worker.call(f"{WORKER}:run", task.workload, self.setup.target, device,
                                             built["path"], built["args"], asdict(spec), timeout=spec.timeout_s + 30)
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
        status, value = self.run_worker.call(f"{WORKER}:gauge", self.setup.target, self.device, timeout=120)
        return float(value) if status == "ok" else None

    # ---- in this process: exported schedules and libraries ---------------------------------------
    def check_export(self, task, script_text: str) -> dict:
        """The timing uses the measuring thread count."""
        from tuning.hardware.tvm_export import check_script

        self._measuring_threads()
        return check_script(task.workload, self.setup.target, script_text, self.device)

    def export_library(self, task, scheduled_mod, library_path) -> dict:
        from tuning.hardware.tvm_export import export_library

        self._measuring_threads()
        return export_library(task.workload, self.setup.target, scheduled_mod, library_path, self.device,
                              self.setup.num_threads)

    def _measuring_threads(self) -> None:
        os.environ.update({k: str(v) for k, v in self.setup.env.items()})  # read when TVM's pool starts

    def evaluate_model(self, model_cfg, seed, database_dir, out_dir, timing) -> dict:
        from tuning.hardware.e2e import evaluate_model

        return evaluate_model(model_cfg, seed, database_dir, out_dir, timing, target=self.setup.target,
                              device=self.device, env=self.setup.env, num_threads=self.setup.num_threads,
                              weight_prepack=self.setup.weight_prepack)

    def close(self) -> None:
        for worker in [*self.builders, *([self.run_worker] if self.run_worker else [])]:
            worker.close()
        self.builders, self.run_worker = [], None
        self._prepared.clear()
        if self.libs:
            shutil.rmtree(self.libs, ignore_errors=True)
            self.libs = None


def this_host() -> LocalRunner:
    """The runner of a hardware config that names none (saved before runners were a config group)."""
    return LocalRunner()
