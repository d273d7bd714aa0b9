"""The hardware contract.

Only this package imports TVM. A backend turns tasks into knob spaces and
builds and runs candidates in isolated, long-lived worker processes, so a
crashing or hanging kernel becomes an error record, not a dead run.

Backends: synthetic.py (analytic, for tests) and TVMHardware (tvm_backend.py),
the generic backend for TVM-built kernels, which takes its target and device
kind from a small device subclass (cpu.py: CPUHardware) and reaches the device
through its runner (runners/: the contract in base.py, this host in local.py),
a config group nested in the hardware's (`hardware/runner=local`); an RPC or
multi-device runner is one module there and one YAML in conf/hardware/runner/.
A new device is a subclass, not a copy; a new way to reach it is a runner.

Every backend provides:

    space(task) -> Space
        The task's knob space (tuning.core.space.Space), with `canonicalize` set if
        the backend repairs decisions.
    measure(task, configs, spec, on_result=None) -> list[MeasureResult]
        Build the whole batch first, then time it with nothing compiling
        (compiling beside a measurement nearly doubles it). One result per
        config, in order, each carrying the effective config in `.config`.
        `on_result(i, result)` is called in index order, each as soon as it and
        every earlier one exist, so the caller can write it down before the next
        one is measured. `result.device` names the device that timed it when the
        backend has several; a device lost mid-batch makes `device_lost` results.
    export(task, config, out_dir) -> list of written paths
        The schedule as TVMScript (best schedules artifact).
    export_database(records_by_task, out_dir, unmeasured=(), chosen=None) -> list of written paths
        A MetaSchedule JSON database TVM can compile from (optional). `unmeasured`: (task, config,
        predicted seconds) chosen with no measurement (budget.trials=0), committed with the
        prediction as their run seconds. `chosen`: {task name: (config, seconds)}, the best the run
        reports; the database must rank it first, so a model compiled from it runs that kernel.
    check_export(task, script_path) -> dict
        Compile an exported schedule, check its answer, time it: {"correct", "max_abs_error",
        "reference_max", "seconds"} (optional; tuning.tools.apply on a single operator).
    model_tasks(model_cfg, seed) -> list[Task]
        A whole model's distinct kernels (model.kind network / onnx) with weights.
    evaluate_model(model_cfg, seed, database_dir, out_dir, timing) -> dict
        Compile the model with the exported database, check its output, and time
        it against the untuned build and torch (keys: latency_ms, match, ...).
    unreachable() -> str | None
                             why its devices cannot be used (no tracker, no server of the key, a
                             target they cannot run), naming the key; checked before any work
    unnamed() -> str | None  why it cannot describe itself without its devices (a GPU whose name is
                             read from the device), naming the key: what a replay of its readings,
                             which never measures, must still be told (default None)
    describe() -> dict       target, device, versions: logged as tags.
    fingerprint() -> dict    what makes this hardware's readings comparable (default: describe());
                             with the measurement settings it keys the measurement store
    store_key(task) -> str   the task's key in the store (default task.key; TVM: the TIR's
                             structural hash)
    simulated_clock          True when build_s/run_s are stored seconds, not this run's (replay):
                             record times then count those seconds, so replays are reproducible
    close()                  stop the workers.
    model_kinds              the model.kind values it can tune (config validation
                             rejects the others before any work).
    model_spaces             the model.space values whose spaces it builds from the workload
                             (full, and e.g. tiling; store is the replay's); validation as above.
    schedules_programs       True when its spaces give TVM's per-store features of the scheduled
                             program (Space.store_features, packed by tuning/core/features.py):
                             cost_model.features=per_store|both.
    default_prior            the first-round prior `tuning.prior=auto` means on this hardware: a
                             shipped one (package:NAME, tuning/cost_model/priors/), or None

A measuring backend takes `store` (a measurement store file every reading is written to) and
`reuse` (answer configs the store holds from it instead of measuring them again): run.py adds the
StoreWriter callback and wraps the backend in ReplayHardware (replay.py) for reuse.

__init__ stores settings only; workers start on first use.
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from tuning.core.component import Component

if TYPE_CHECKING:
    import os

    from tuning.core.measure import MeasureSpec
    from tuning.core.records import MeasureResult, Record
    from tuning.core.space import Config, Space
    from tuning.core.task import Task

    PathLike = str | os.PathLike[str]


class Hardware(Component):
    model_kinds = ("gemm", "batch_matmul", "conv2d", "network", "onnx")
    model_spaces = ("full", "tiling")
    schedules_programs = False
    default_prior: str | None = None

    @abstractmethod
    def space(self, task: Task) -> Space:
        """The task's knob Space."""

    @abstractmethod
    def measure(self, task: Task, configs: Sequence[Config], spec: MeasureSpec,
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """One MeasureResult per config, in order."""

    def export(self, task: Task, config: Config, out_dir: PathLike) -> list[str]:
        return []

    def export_database(self, records_by_task: Sequence[tuple[Task, list[Record]]], out_dir: PathLike,
                        unmeasured: Iterable[tuple[Task, Config, float]] = (),
                        chosen: Mapping[str, tuple[Config, float]] | None = None) -> list[str]:
        return []

    def check_export(self, task: Task, script_path: PathLike) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} exports no schedule to check")

    def export_library(self, task: Task, config: Config, out_dir: PathLike) -> dict[str, Any]:
        """The config built into a shared library in out_dir, with a Python file that calls it;
        checked and timed (python -m tuning.tools.export)."""
        raise NotImplementedError(f"{type(self).__name__} builds no library")

    def model_tasks(self, model_cfg: Mapping[str, Any], seed: int) -> list[Task]:
        raise NotImplementedError(f"{type(self).__name__} cannot tune whole models")

    def evaluate_model(self, model_cfg: Mapping[str, Any], seed: int, database_dir: PathLike, out_dir: PathLike,
                       timing: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} cannot run whole models")

    def time_in_model(self, model_cfg: Mapping[str, Any], seed: int, database_dir: PathLike,
                      candidates: Mapping[str, list[list[int]]],
                      timing: Mapping[str, Any]) -> list[dict[str, list[list[float]]]]:
        """[{task name: [[seconds per call] per candidate config]}, one per reading process]: each
        named task's candidates timed inside the model compiled with the database."""
        raise NotImplementedError(f"{type(self).__name__} cannot time kernels inside a model")

    simulated_clock = False

    @classmethod
    def check(cls, params: dict[str, Any], group: str) -> list[str]:
        if params.get("reuse") and not params.get("store"):
            return [f"{group}.reuse: needs {group}.store=FILE (the measurement store whose readings are reused)"]
        return []

    def unreachable(self) -> str | None:
        """Why its devices cannot be reached or cannot run what it builds, naming the key; checked
        before the run folder is written (a remote device: seconds, not a hang)."""
        return None

    def unnamed(self) -> str | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {}

    def fingerprint(self) -> dict[str, Any]:
        return self.describe()

    def store_key(self, task: Task) -> str:
        return task.key

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
