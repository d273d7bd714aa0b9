"""hardware/runner=local: build and time on this host (no TVM import at module level).

The host's build processes (host_builds.py) and one run process (tuning/hardware/workers.py) run
tvm_worker.py's functions; the run process times on the device "<kind>:<device_index>" of this
host. A worker that hangs or crashes is restarted, and a restarted run worker gets its references
again. Exported schedules are checked, and libraries built, in this process; whole models in
e2e.py's workers: it declares every capability of base.py (Exports, RunsWholeModels,
TimesInModel). The only module that knows the default device index.
"""
from __future__ import annotations

import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from tuning.core.records import MeasureResult
from tuning.hardware.runners.base import Exports, Runner, RunsWholeModels, TimesInModel
from tuning.hardware.runners.host_builds import HostBuilds, then_removed
from tuning.hardware.workers import Worker

WORKER = "tuning.hardware.tvm_worker"


class LocalRunner(Runner, Exports, RunsWholeModels, TimesInModel):
    """Hyperparameters:
    device_index  which of this host's devices of the hardware's kind times the kernels ("cpu:0", "cuda:1")
    """

    ranges = {"device_index": (0, 1023)}

    def __init__(self, device_index: int = 0):
        self.device_index = device_index
        self.builds: HostBuilds | None = None
        self.run_worker: Worker | None = None
        self._prepared: set = set()

    @property
    def device(self) -> str:
        return f"{self.setup.device}:{self.device_index}"

    @property
    def devices(self) -> list[str]:
        return [self.device]

    def identity(self) -> dict:
        """{} for this host's CPU (the hardware knows it); once attached to another device kind, the
        name that device reports ({"gpu": ...}), if this host has it."""
        if self.setup is None or self.setup.device == "cpu":
            return {}
        from tuning.hardware.tvm_device import device_name

        name = device_name(self.device)
        return {"gpu": name} if name else {}

    def unusable(self) -> str | None:
        """A device kind other than this host's CPU must exist here (a GPU and its driver)."""
        return self.missing_device(self.setup.device)

    def missing_device(self, kind: str, key: str = "hardware.runner") -> str | None:
        if kind == "cpu":
            return None
        from tuning.hardware.tvm_device import device_name

        device = f"{kind}:{self.device_index}"
        if device_name(device) is None:
            return (f"{key}.device_index: this host has no {device} that TVM can use (no such "
                    f"device, driver or CUDA runtime); a GPU elsewhere: the offline pack, docs/gpus.md")
        return None

    def start(self) -> None:
        if self.run_worker is not None:
            return
        self.builds = HostBuilds(self.setup.target, self.setup.build_env, self.setup.build_workers)
        self.run_worker = Worker(self.setup.env, f"{WORKER}:init", init_args=(self.setup.target,))
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda start: start(), [self.builds.start, self.run_worker.ensure_started]))

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
        """The host's build processes (host_builds.py), in parallel."""
        self.start()
        return self.builds.build(task, configs, spec)

    def run_one(self, task, config, built: dict, spec, device: str) -> MeasureResult:
        """Time one built candidate; its library file is removed afterwards."""
        return then_removed(built, lambda: self._time(task, config, built, spec, device))

    def _time(self, task, config, built: dict, spec, device: str) -> MeasureResult:
        effective = tuple(built.get("config") or config)
        if built["error"]:
            return MeasureResult.failed(built["error"], built["message"], build_s=built["build_s"], config=effective)
        start = time.perf_counter()
        status, value = self.run_worker.call(f"{WORKER}:run", task.workload, self.setup.target, device,
                                             built["path"], built["args"], asdict(spec), timeout=spec.timeout_s + 30)
        timings = {"build_s": built["build_s"], "config": effective}
        if status != "ok":
            self._restart_run_worker(task)
            hung = "device_hang" if self.setup.device != "cpu" else "timeout"
            kind = {"timeout": hung, "crash": "run"}.get(status, "run")
            return MeasureResult.failed(kind, str(value), run_s=time.perf_counter() - start, **timings)
        if value["error"]:
            if value.get("restart"):  # a GPU error: its CUDA context is unusable
                self._restart_run_worker(task)
            return MeasureResult.failed(value["error"], value["message"], run_s=value["run_s"], **timings)
        return MeasureResult(costs=value["costs"], run_s=value["run_s"], message=value.get("message", ""),
                             screened=bool(value.get("screened")), **timings)

    def _restart_run_worker(self, task) -> None:
        """A fresh run worker (the next call starts it), with the task's reference computed again."""
        self.run_worker.kill()
        self._prepared.clear()
        self.prepare(task)

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

    def time_in_model(self, model_cfg, seed, database_dir, candidates: dict, timing: dict) -> list[dict]:
        """The model and every candidate built once, in one process, into a folder of their own beside
        the database (in the run folder, not a RAM-backed /tmp: a model's build holds its weights), removed
        after (in_context.prepare_reading); then one fresh process per reading (`timing["processes"]`)
        loads them and reads: each lays the model's buffers out anew, and a kernel's time inside the
        model differs between processes by more than between rounds of one."""
        with tempfile.TemporaryDirectory(prefix="in-model-builds-", dir=Path(database_dir).parent) as folder:
            manifest = self._in_model_call("prepare_reading", model_cfg, seed, self.setup.target, self.device,
                                           str(database_dir), self.setup.weight_prepack, candidates, folder,
                                           timeout=timing["timeout_s"])
            return [self._in_model_call("time_candidates", manifest, self.device, timing["rounds"], timing["runs"],
                                        timeout=timing["timeout_s"])
                    for _ in range(timing["processes"])]

    def _in_model_call(self, function: str, *args, timeout: float):
        """in_context.`function`(*args) in a process of its own, closed after it."""
        worker = Worker(self.setup.env, "tuning.hardware.e2e_worker:init_tvm", init_args=(self.setup.target,))
        try:
            status, value = worker.call(f"tuning.hardware.in_context:{function}", *args, timeout=timeout)
        finally:
            worker.close()
        if status != "ok":
            raise RuntimeError(f"timing kernels inside the model failed ({status}): {value}")
        return value

    def close(self) -> None:
        if self.builds:
            self.builds.close()
        if self.run_worker:
            self.run_worker.close()
        self.builds, self.run_worker = None, None
        self._prepared.clear()


def this_host() -> LocalRunner:
    """The runner of a hardware config that names none (saved before runners were a config group)."""
    return LocalRunner()
