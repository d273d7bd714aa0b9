"""hardware=cpu: real kernels built by TVM (llvm) and timed on this host's CPU.

Builds run in `build_workers` long-lived processes, measurements in one run
process with TVM_NUM_THREADS set explicitly. A batch is built completely
before any of it is measured (a compile beside a measurement nearly
doubles the measured time on a 2-core host). A candidate that hangs or
crashes its worker is recorded as a timeout/run error and the worker is
restarted.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from tuning.hardware.base import Hardware
from tuning.records import MeasureResult
from tuning.hardware.workers import Worker

WORKER = "tuning.hardware.cpu_worker"


class CPUHardware(Hardware):
    """Hyperparameters:
    mcpu           LLVM cpu name; "auto" asks LLVM for the host's (e.g. znver3)
    num_threads    runtime threads for measuring (TVM_NUM_THREADS); also the target's num-cores
    build_workers  parallel build processes
    weight_prepack whole models: let schedules choose the (constant) weights' layout; the rewrite is
                   folded into the weights when the model is compiled (MetaSchedule's
                   cpu_weight_prepack). Kernels whose weight layout changed are timed on zeros and
                   not checked one by one; the whole model's output is checked against torch.
    """

    ranges = {"num_threads": (1, 256), "build_workers": (1, 64)}

    def __init__(self, mcpu: str = "auto", num_threads: int = 2, build_workers: int = 1,
                 weight_prepack: bool = True):
        self.mcpu = mcpu
        self.weight_prepack = weight_prepack
        self.num_threads = num_threads
        self.build_workers = build_workers
        self._schedules: dict = {}
        self._builders: list[Worker] = []
        self._runner: Worker | None = None
        self._libs: str | None = None
        self._prepared: set = set()

    # ---- setup ----------------------------------------------------------------------
    @property
    def target(self) -> dict:
        if self.mcpu == "auto":
            from tvm.target.codegen import llvm_get_system_cpu

            self.mcpu = str(llvm_get_system_cpu())
        return {"kind": "llvm", "mcpu": self.mcpu, "num-cores": self.num_threads}

    def _workers(self) -> tuple[list[Worker], Worker]:
        if self._runner is None:
            env = {"TVM_NUM_THREADS": self.num_threads}
            build_env = {"TVM_NUM_THREADS": 1}  # a compile must not steal the measuring cores' threads
            self._builders = [Worker(build_env, f"{WORKER}:init") for _ in range(self.build_workers)]
            self._runner = Worker(env, f"{WORKER}:init")
            self._libs = tempfile.mkdtemp(prefix="tunelab-libs-")
            with ThreadPoolExecutor(len(self._builders) + 1) as pool:
                list(pool.map(lambda w: w.ensure_started(), [*self._builders, self._runner]))
        return self._builders, self._runner

    def schedules(self, task):
        if task.key not in self._schedules:
            from tuning.hardware.tvm_space import TaskSchedules

            self._schedules[task.key] = TaskSchedules(task.workload, self.target)
        return self._schedules[task.key]

    def space(self, task):
        return self.schedules(task).space

    # ---- measuring --------------------------------------------------------------------
    def measure(self, task, configs, spec, on_result=None):
        builders, runner = self._workers()
        self._prepare(task, runner)
        paths = [os.path.join(self._libs, f"{task.key}-{i}-{time.time_ns()}.so") for i in range(len(configs))]
        jobs = list(zip(configs, paths))

        def build_shard(worker, shard):  # one thread per worker: a worker serves one call at a time
            return {path: self._build(worker, task, config, path, spec) for config, path in shard}

        built = {}
        with ThreadPoolExecutor(len(builders)) as pool:
            for part in pool.map(build_shard, builders, [jobs[i::len(builders)] for i in range(len(builders))]):
                built.update(part)
        results = []
        for i, (config, path) in enumerate(jobs):
            results.append(self._run(runner, task, config, path, built[path], spec))
            Path(path).unlink(missing_ok=True)
            if on_result:
                on_result(i, results[-1])
        return results

    def _prepare(self, task, runner) -> None:
        """Compute the untuned kernel's output once per task (the correctness reference)."""
        if task.key in self._prepared:
            return
        status, value = runner.call(f"{WORKER}:reference", task.workload, self.target, timeout=600)
        if status != "ok":
            raise RuntimeError(f"could not run the untuned kernel of {task.name}: {value}")
        self._prepared.add(task.key)

    def _build(self, worker, task, config, path, spec) -> dict:
        status, value = worker.call(f"{WORKER}:build", task.workload, self.target, list(config), path,
                                    timeout=spec.build_timeout_s)
        if status == "ok":
            return value
        kind = "timeout" if status == "timeout" else "build"
        return {"error": kind, "message": str(value), "build_s": spec.build_timeout_s if kind == "timeout" else 0.0}

    def _run(self, runner, task, config, path, built, spec) -> MeasureResult:
        effective = tuple(built.get("config") or config)
        if built["error"]:
            return MeasureResult.failed(built["error"], built["message"], build_s=built["build_s"], config=effective)
        start = time.perf_counter()
        status, value = runner.call(f"{WORKER}:run", task.workload, self.target, path, built["args"],
                                    asdict(spec), timeout=spec.timeout_s + 30)
        timings = {"build_s": built["build_s"], "config": effective}
        if status != "ok":
            self._prepared.discard(task.key)  # a restarted runner has lost its references
            self._prepare(task, runner)
            kind = {"timeout": "timeout", "crash": "run"}.get(status, "run")
            return MeasureResult.failed(kind, str(value), run_s=time.perf_counter() - start, **timings)
        if value["error"]:
            return MeasureResult.failed(value["error"], value["message"], run_s=value["run_s"], **timings)
        return MeasureResult(costs=value["costs"], run_s=value["run_s"], **timings)

    # ---- whole models ---------------------------------------------------------------------
    def model_tasks(self, model_cfg, seed):
        from tuning.hardware.relax_models import as_tuning_tasks, extract_tasks, load_model

        mod = load_model(model_cfg, seed, self.target).mod
        return as_tuning_tasks(extract_tasks(mod, self.target, self.weight_prepack))

    def evaluate_model(self, model_cfg, seed, database_dir, out_dir, timing):
        from tuning.hardware.e2e import evaluate_model

        return evaluate_model(model_cfg, seed, self.target, database_dir, out_dir, timing, self.num_threads,
                              self.weight_prepack)

    # ---- outputs --------------------------------------------------------------------------
    def export(self, task, config, out_dir):
        sch, _ = self.schedules(task).schedule(tuple(config))
        path = Path(out_dir) / f"{task.name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(sch.mod.script())
        return [str(path)]

    def export_database(self, records_by_task, out_dir):
        from tuning.hardware.tvm_database import write_database

        return write_database(self, records_by_task, out_dir)

    def describe(self) -> dict:
        import tvm

        return {"hardware": "cpu", "target": str(self.target), "num_threads": self.num_threads,
                "tvm_version": tvm.__version__, "cpu_model": _cpu_model()}

    def close(self) -> None:
        for worker in [*self._builders, *([self._runner] if self._runner else [])]:
            worker.close()
        self._builders, self._runner = [], None
        if self._libs:
            shutil.rmtree(self._libs, ignore_errors=True)
            self._libs = None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"
