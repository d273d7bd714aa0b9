"""TVMHardware: the backend for kernels built by TVM, whatever the device (no TVM import at module level).

Spaces and schedules come from MetaSchedule's design spaces (tvm_space.py);
measuring builds a whole batch, then times it, through a runner (runner.py:
LocalRunner today); the best schedules export as TVMScript and a MetaSchedule
database (tvm_database.py); whole models go through Relax (relax_models.py,
e2e.py). A device is a small subclass (cpu.py) that supplies:

    target          property: the TVM target dict, e.g. {"kind": "llvm", "mcpu": ..., "num-cores": 2}
    device          class attribute: the runtime device name, tvm.device(device, 0) ("cpu", "cuda")
    name            class attribute: the hardware option's name (the "hardware" tag)
    worker_env()    environment of the measuring process (e.g. TVM_NUM_THREADS)
    build_env()     environment of the build processes (default: none)
    describe()      extend super().describe() with the device's own tags

and may set `build_workers`, `num_threads` (runtime threads, also torch's in
the whole-model comparison) and `weight_prepack` (whole models).
"""
from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import ClassVar

from tuning.hardware.base import Hardware
from tuning.hardware.runner import LocalRunner


class TVMHardware(Hardware):
    schedules_programs = True
    device: ClassVar[str]
    name: ClassVar[str]
    build_workers: int = 1
    num_threads: int | None = None
    weight_prepack: bool = False

    def __init__(self):
        for attr in ("device", "name"):
            if not isinstance(getattr(type(self), attr, None), str):
                raise TypeError(f"{type(self).__name__} must set the class attribute `{attr}`")
        self._schedules: dict = {}
        self._runner: LocalRunner | None = None  # made on first measure: __init__ starts nothing

    # ---- what a device supplies ---------------------------------------------------------------
    @property
    @abstractmethod
    def target(self) -> dict:
        """The TVM target as a dict (tvm.target.Target(dict) builds it)."""

    @abstractmethod
    def worker_env(self) -> dict:
        """Environment variables of the process that times kernels."""

    def build_env(self) -> dict:
        """Environment variables of the build processes."""
        return {}

    def make_runner(self) -> LocalRunner:
        """The runner seam: an RPC or other remote runner is returned here instead."""
        return LocalRunner(self.target, self.device, self.worker_env(), self.build_env(), self.build_workers)

    # ---- the runner (started lazily) --------------------------------------------------------------
    @property
    def runner(self) -> LocalRunner:
        if self._runner is None:
            self._runner = self.make_runner()
        return self._runner

    @property
    def _builders(self) -> list:
        """The runner's build workers ([] until the first measure)."""
        return self._runner.builders if self._runner is not None else []

    # ---- spaces ---------------------------------------------------------------------------------
    def schedules(self, task):
        if task.key not in self._schedules:
            from tuning.hardware.tvm_space import TaskSchedules

            self._schedules[task.key] = TaskSchedules(task.workload, self.target)
        return self._schedules[task.key]

    def space(self, task):
        return self.schedules(task).space

    # ---- measuring ------------------------------------------------------------------------------
    def measure(self, task, configs, spec, on_result=None):
        """Build the whole batch, then time it with nothing compiling (a compile beside a
        measurement nearly doubles it on a 2-core host)."""
        runner = self.runner
        runner.prepare(task)
        built = runner.build(task, configs, spec)
        gauge = runner.gauge()  # read with the batch, after building, before timing
        results = []
        for i, (config, candidate) in enumerate(zip(configs, built)):
            results.append(runner.run(task, config, candidate, spec))
            results[-1].gauge_s = gauge
            if on_result:
                on_result(i, results[-1])
        return results

    def store_key(self, task) -> str:
        """A single operator's key is the structural hash of its TIR, as a network kernel's is, so
        the same computation shares store rows whichever model it came from."""
        if task.workload["op"] == "tir":
            return task.key
        keys = self.__dict__.setdefault("_store_keys", {})  # building and hashing the TIR: once per task
        if task.key not in keys:
            from tuning.hardware.relax_models import workload_key
            from tuning.hardware.tvm_space import workload_module

            keys[task.key] = f"tir-{workload_key(workload_module(task.workload))}"
        return keys[task.key]

    # ---- whole models ---------------------------------------------------------------------------
    def model_tasks(self, model_cfg, seed):
        from tuning.hardware.relax_models import as_tuning_tasks, extract_tasks, load_model
        from tuning.hardware.tvm_space import interrupts_noticed

        with interrupts_noticed():  # FoldConstant, in both steps, would swallow a Ctrl-C
            mod = load_model(model_cfg, seed, self.target).mod
        with interrupts_noticed():
            return as_tuning_tasks(extract_tasks(mod, self.target, self.weight_prepack))

    def evaluate_model(self, model_cfg, seed, database_dir, out_dir, timing):
        from tuning.hardware.e2e import evaluate_model

        return evaluate_model(model_cfg, seed, database_dir, out_dir, timing, target=self.target,
                              device=self.device, env=self.worker_env(), num_threads=self.num_threads,
                              weight_prepack=self.weight_prepack)

    # ---- outputs: out_dir is a run folder's best_schedules/, export/ or database/ ---------------------
    def export(self, task, config, out_dir):
        from tuning.run_folder import write_inside

        sch, _ = self.schedules(task).schedule(tuple(config))
        out_dir = Path(out_dir)
        return [str(write_inside(out_dir.parent, Path(out_dir.name) / f"{task.name}.py", sch.mod.script()))]

    def check_export(self, task, script_path) -> dict:
        """Compile an exported best schedule, check its answer and time it (tuning.apply on a single
        operator); the timing uses the measuring thread count."""
        import os

        from tuning.hardware.tvm_export import check_script

        os.environ.update({k: str(v) for k, v in self.worker_env().items()})  # read when TVM's pool starts
        return check_script(task.workload, self.target, Path(script_path).read_text(), self.device)

    def export_library(self, task, config, out_dir) -> dict:
        """The best schedule as `<task>.so` plus `run_<task>.py`, which loads and calls it; checked
        and timed beside the untuned kernel and torch (tuning/hardware/tvm_export.py)."""
        import os

        from tuning.hardware.tvm_export import export_library, snippet
        from tuning.run_folder import inside, write_inside

        run_dir, script = Path(out_dir).parent, Path(Path(out_dir).name) / f"run_{task.name}.py"
        library = inside(run_dir, script.with_name(f"{task.name}.so"))
        inside(run_dir, script)  # both refused before anything is built
        os.environ.update({k: str(v) for k, v in self.worker_env().items()})  # read when TVM's pool starts
        sch, _ = self.schedules(task).schedule(tuple(config))
        result = export_library(task.workload, self.target, sch.mod, library, self.device, self.num_threads)
        written = write_inside(run_dir, script, snippet(task.workload, library, result["args"]))
        return {**result, "snippet": str(written)}

    def export_database(self, records_by_task, out_dir, unmeasured=()):
        from tuning.hardware.tvm_database import DATABASE_FILES, write_database
        from tuning.run_folder import inside

        out_dir = Path(out_dir)
        for name in DATABASE_FILES:
            inside(out_dir.parent, Path(out_dir.name) / name)
        return write_database(self, records_by_task, out_dir, unmeasured)

    def describe(self) -> dict:
        import tvm

        return {"hardware": self.name, "target": str(self.target), "device": self.device,
                "tvm_version": tvm.__version__}

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None
