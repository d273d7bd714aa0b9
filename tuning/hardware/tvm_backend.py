"""TVMHardware: the backend for kernels built by TVM, whatever the device (no TVM import at module level).

Spaces and schedules come from MetaSchedule's design spaces (tvm_space.py); everything that touches
a device goes through the hardware's runner (tuning/hardware/runners/: the contract in base.py,
this host in local.py), a nested config group chosen with `hardware/runner=...`: measuring builds a
whole batch, then times it; exported schedules are checked and libraries built there; whole models
are compiled and timed there. The best schedules export as TVMScript and a MetaSchedule database
(tvm_database.py). A device is a small subclass (cpu.py) that supplies:

    target          property: the TVM target dict, e.g. {"kind": "llvm", "mcpu": ..., "num-cores": 2}
    device          class attribute: the device kind ("cpu", "cuda"); the runner picks the index
    name            class attribute: the hardware option's name (the "hardware" tag)
    worker_env()    environment of the measuring process (e.g. TVM_NUM_THREADS)
    build_env()     environment of the build processes (default: none)
    describe()      extend super().describe() with the device's own tags

and may set `build_workers`, `num_threads` (runtime threads, also torch's in the whole-model
comparison) and `weight_prepack` (whole models). Its constructor takes `runner` (the instantiated
runner node; None, as in configs saved before runners were a group: this host's).
"""
from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import ClassVar

from tuning.hardware.base import Hardware
from tuning.hardware.runners.base import (
    Exports,
    NoDeviceLeft,
    Runner,
    RunsWholeModels,
    Setup,
    TimesInModel,
    check_node,
    require,
    runner_from_node,
)
from tuning.hardware.runners.local import this_host

# What every kernel is timed on (tvm_worker.random_arguments). In the store's key: readings taken on
# zeros, as a kernel with a re-laid-out weight once was, read up to 100x fast on some CPUs.
TIMED_ON = "uniform(-1, 1) inputs"


class TVMHardware(Hardware):
    schedules_programs = True
    device: ClassVar[str]
    name: ClassVar[str]
    build_workers: int = 1
    num_threads: int | None = None
    weight_prepack: bool = False

    def __init__(self, runner: Runner | None = None):
        for attr in ("device", "name"):
            if not isinstance(getattr(type(self), attr, None), str):
                raise TypeError(f"{type(self).__name__} must set the class attribute `{attr}`")
        self._schedules: dict = {}
        self.runner = runner if runner is not None else this_host()  # starts nothing until first used

    @classmethod
    def check(cls, params, group):
        return super().check(params, group) + check_node(params.get("runner"), f"{group}.runner")

    @classmethod
    def missing_here(cls, params, group):
        """The runner's device of this hardware's kind (a GPU), when its config says where to look."""
        node, key = params.get("runner"), f"{group}.runner"
        runner = this_host() if node is None else runner_from_node(node, key)
        missing = runner.missing_device(cls.device, key) if runner is not None else None
        return super().missing_here(params, group) + ([missing] if missing else [])

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

    # ---- the runner -----------------------------------------------------------------------------
    def setup(self) -> Setup:
        """What the runner builds for and how it times (read on first use: `target` may ask LLVM)."""
        return Setup(target=self.target, device=self.device, env=self.worker_env(), build_env=self.build_env(),
                     build_workers=self.build_workers, num_threads=self.num_threads,
                     weight_prepack=self.weight_prepack)

    def unreachable(self) -> str | None:
        """The runner's devices reached, then checked against the target (which may be theirs)."""
        try:
            return self.runner.unreachable() or self.attached().unusable()
        except NoDeviceLeft as error:  # e.g. every server of the key busy with other clients
            return str(error)

    def unbuildable(self) -> str | None:
        """Why this host cannot build kernels for the target (a compiler it lacks), naming the key."""
        return None

    def attached(self) -> Runner:
        """The runner, handed this hardware's Setup on first use."""
        if self.runner.setup is None:
            self.runner.attach(self.setup())
        return self.runner

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
        return self.attached().measure(task, configs, spec, on_result)

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
        runner = require(self.runner, RunsWholeModels, "cannot run whole models")
        self.attached()
        return runner.evaluate_model(model_cfg, seed, database_dir, out_dir, timing)

    def time_in_model(self, model_cfg, seed, database_dir, candidates, timing):
        runner = require(self.runner, TimesInModel, "cannot time kernels inside a model")
        self.attached()
        return runner.time_in_model(model_cfg, seed, database_dir, candidates, timing)

    # ---- outputs: out_dir is a run folder's best_schedules/, export/ or database/ ---------------------
    def export(self, task, config, out_dir):
        from tuning.config.files import write_inside

        sch, _ = self.schedules(task).schedule(tuple(config))
        out_dir = Path(out_dir)
        return [str(write_inside(out_dir.parent, Path(out_dir.name) / f"{task.name}.py", sch.mod.script()))]

    def check_export(self, task, script_path) -> dict:
        """Compile an exported best schedule, check its answer and time it on the runner's device
        (tuning.tools.apply on a single operator)."""
        runner = require(self.runner, Exports, "cannot check an exported schedule")
        self.attached()
        return runner.check_export(task, Path(script_path).read_text())

    def export_library(self, task, config, out_dir) -> dict:
        """The best schedule as `<task>.so` plus `run_<task>.py`, which loads and calls it; checked
        and timed beside the untuned kernel and torch (tuning/hardware/tvm_export.py)."""
        from tuning.config.files import inside, write_inside
        from tuning.hardware.tvm_export import snippet

        runner = require(self.runner, Exports, "cannot build a library")
        run_dir, script = Path(out_dir).parent, Path(Path(out_dir).name) / f"run_{task.name}.py"
        library = inside(run_dir, script.with_name(f"{task.name}.so"))
        inside(run_dir, script)  # both refused before anything is built
        sch, _ = self.schedules(task).schedule(tuple(config))
        self.attached()
        result = runner.export_library(task, sch.mod, library)
        written = write_inside(run_dir, script, snippet(task.workload, library, result["args"]))
        return {**result, "snippet": str(written)}

    def export_database(self, records_by_task, out_dir, unmeasured=(), chosen=None):
        from tuning.config.files import inside
        from tuning.hardware.tvm_database import DATABASE_FILES, write_database

        out_dir = Path(out_dir)
        for name in DATABASE_FILES:
            inside(out_dir.parent, Path(out_dir.name) / name)
        return write_database(self, records_by_task, out_dir, unmeasured, chosen)

    def describe(self) -> dict:
        import tvm

        return {"hardware": self.name, "target": str(self.target), "device": self.device,
                "tvm_version": tvm.__version__, "timed_on": TIMED_ON, **self.runner.describe()}

    def close(self) -> None:
        self.runner.close()
