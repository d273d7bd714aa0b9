"""The runner contract: where a TVM backend's candidates are built and timed (no TVM import here).

TVMHardware (tuning/hardware/tvm_backend.py) owns spaces and schedules; everything that touches a
device goes through its runner. A runner is a config group nested in the hardware's
(conf/hardware/runner/*.yaml, chosen with `hardware/runner=local`); the hardware validates the node
(`check_node`) and hands the instantiated runner what to build for (`Setup`) before first use.
"""
from __future__ import annotations

import collections.abc
import importlib
import queue
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuning.core.component import Component
from tuning.core.records import MeasureResult

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from tuning.core.measure import MeasureSpec
    from tuning.core.space import Config
    from tuning.core.task import Task

    OnResult = Callable[[int, MeasureResult], None]  # on_result(index, result)
    Gauge = float | dict[str, float | None] | None  # one reading, one per device, or none


@dataclass(frozen=True)
class Setup:
    """What a hardware hands its runner: what to build for, and how the timing processes run."""
    target: dict  # the TVM target dict kernels are built for
    device: str  # the device kind the target runs on ("cpu", "cuda"); the runner picks the index
    env: dict = field(default_factory=dict)  # environment of the processes that time kernels
    build_env: dict = field(default_factory=dict)  # environment of the build processes
    build_workers: int = 1  # parallel build processes
    num_threads: int | None = None  # runtime threads (also torch's in the whole-model comparison)
    weight_prepack: bool = False  # whole models: schedules may re-lay-out the constant weights


class DeviceLost(RuntimeError):
    """Raised by `run_one` when its device is gone (a board unplugged, an RPC server that died)."""


class NoDeviceLeft(RuntimeError):
    """Raised when a runner has no device to time on and none came back: the run stops, every
    measurement so far is kept, and `resume=` continues it."""


class Runner(Component):
    """Builds a TVM backend's candidates and times them on its devices.

    The core a transport implements (abstract): `devices`, `build` and `run_one`. Everything else
    has a default that suits a runner on this host. The hardware calls:

        attach(setup)            first: what to build for (Setup); `devices` is known from here on
        devices -> list[str]     (abstract) the devices it times on now, "kind:index" ("cpu:0",
                                 "cuda:1") or a transport's names ("local@10.0.0.2:9091")
        unreachable() -> str | None
                                 before attach and any work: why its devices cannot be reached at all
                                 (a remote runner: no tracker, no server of the key), naming the key
        unusable() -> str | None after attach: why its devices cannot run what the Setup builds
        missing_device(kind) -> str | None
                                 before attach, from the config alone: why it has no device of that
                                 kind at all (this host without a GPU), said before the keys' problems
        identity() -> dict       what its devices say of themselves ({}: this host's CPU, the hardware
                                 knows it; a remote runner: the remote CPU's "cpu_model", "mcpu",
                                 "triple"), read before attach: `mcpu: auto` takes the device's;
                                 after attach to a GPU kind, its "gpu" name where the device is there
        describe() -> dict       tags that make its readings comparable, merged into the hardware's
                                 describe() and so into the store's fingerprint ({} for this host)
        measure(task, configs, spec, on_result=None) -> list[MeasureResult]
                                 Hardware.measure: prepare, build, gauge, run_batch, in that order
                                 (not overridden); every result carries the gauge reading. A runner
                                 whose devices are not this host's cores says so (`overlaps_builds()`):
                                 its batch is built by `build_each` in a thread of its own while
                                 run_batch times what is built so far (`built[i]` waits for the i-th)

    which is made of:

        prepare(task)            the task's correctness reference (the untuned kernel's output),
                                 computed once per task; later calls cost nothing
        build(task, configs, spec) -> list[built]
                                 (abstract) the whole batch, in order: one `built` per config, opaque
                                 to the hardware (a library file, its arguments, or a build error)
        build_each(task, configs, spec, on_built, stopped)
                                 the same, each `built` handed on as on_built(i, built) as soon as it
                                 is ready, in any order, no new build begun once stopped() is true
                                 (default: `build`, then each in order)
        gauge() -> seconds | {device: seconds} | None
                                 the drift gauge kernel's reading now (per device where it has
                                 several); None when it could not run
        run_batch(task, configs, built, spec, on_result=None) -> list[MeasureResult]
                                 time the built batch with nothing compiling: one result per config,
                                 in order, each carrying the effective config in `.config`. A runner
                                 with several devices times them in parallel and every result names
                                 the device that timed it in `.device` (a runner that only ever has
                                 one may leave it None: its records read as before). `on_result(i,
                                 result)` is called on the caller's thread in index order, for each
                                 result as soon as it and every earlier one are known: the loop
                                 numbers records by position and writes each down at once, so a
                                 kill leaves no hole. A device that disappears mid-batch costs the
                                 config it was timing a `device_lost` result; the rest go to the
                                 devices left (with none left, they are `device_lost` too) and the
                                 run goes on.
        close()                  stop whatever it started; the next call starts it again (a second
                                 close does nothing)

    A measurement's failure is a value (MeasureResult.failed), never an exception: a build that
    failed is an error record, a crashed or hung worker is a `run` or `timeout` result. The default
    `run_batch` calls `run_one(task, config, built, spec, device) -> MeasureResult` (abstract; naming
    `device` in `.device`, as above) for each config, one thread per device (the caller's own when
    there is one), and turns DeviceLost into `device_lost` results: a transport implements
    `run_one`, and seldom `run_batch`.

    What a runner can do beyond measuring are capabilities it declares by deriving from them
    (below): `Exports` (check_export, export_library), `RunsWholeModels` (evaluate_model),
    `TimesInModel` (time_in_model). `runner_can(runner, Exports)` asks; `require(runner, Exports,
    "cannot build a library")` is the runner as one that has it, or NotImplementedError naming the
    runner and what it cannot do. tuning.testing.runner_contract is the suite a runner passes.
    Hyperparameters are the constructor's (tuning/core/component.py); `__init__` stores them and starts
    nothing.
    """

    setup: Setup | None = None

    # ---- the core a transport implements --------------------------------------------------------
    @property
    @abstractmethod
    def devices(self) -> list[str]:
        """The devices it times on now (known once attached)."""

    @abstractmethod
    def build(self, task: Task, configs: Sequence[Config], spec: MeasureSpec) -> list[Any]:
        """The whole batch built, one opaque `built` per config, in order; a failed build is a value."""

    @abstractmethod
    def run_one(self, task: Task, config: Config, built: Any, spec: MeasureSpec, device: str) -> MeasureResult:
        """Time one built candidate on `device`; DeviceLost when the device is gone."""

    # ---- the rest of the core, with defaults -----------------------------------------------------
    def attach(self, setup: Setup) -> None:
        self.setup = setup

    def unreachable(self) -> str | None:
        return None

    def unusable(self) -> str | None:
        return None

    def missing_device(self, kind: str, key: str = "hardware.runner") -> str | None:
        """Before attach: why this runner has no device of `kind` to time on (a GPU kind on a host
        without one), naming the key under `key`; None when it may have one or cannot tell here."""
        return None

    def identity(self) -> dict[str, Any]:
        return {}

    def describe(self) -> dict[str, Any]:
        return {}

    def prepare(self, task: Task) -> None:
        pass

    def gauge(self) -> Gauge:
        return None

    def close(self) -> None:
        pass

    def measure(self, task: Task, configs: Sequence[Config], spec: MeasureSpec,
                on_result: OnResult | None = None) -> list[MeasureResult]:
        """Build the whole batch, then time it with nothing compiling (a compile beside a
        measurement nearly doubles it on a 2-core host); with `overlaps_builds`, time each
        candidate as soon as it is built, the rest building meanwhile."""
        self.prepare(task)
        if self.overlaps_builds():
            return self._measure_while_building(task, configs, spec, on_result)
        built = self.build(task, configs, spec)
        gauge = self.gauge()  # read with the batch, after building, before timing
        return self.run_batch(task, configs, built, spec, _with_gauge(gauge, on_result))

    def overlaps_builds(self) -> bool:
        """Whether its devices time while the batch builds: only where they are not this host's cores
        (a compile beside a measurement nearly doubles it on a 2-core host). False here."""
        return False

    def build_each(self, task: Task, configs: Sequence[Config], spec: MeasureSpec,
                   on_built: Callable[[int, Any], None], stopped: Callable[[], bool] = lambda: False) -> None:
        """The batch built, each `built` handed on as on_built(i, built) as soon as it is ready."""
        for i, built in enumerate(self.build(task, configs, spec)):
            on_built(i, built)

    def _measure_while_building(self, task: Task, configs: Sequence[Config], spec: MeasureSpec,
                                on_result: OnResult | None) -> list[MeasureResult]:
        """run_batch while `build_each` builds in a thread of its own; whatever stops the timing
        (a device gone for good, an interrupt) stops the building too, before this returns."""
        built = Arriving(len(configs))
        building = threading.Thread(target=built.fill, args=(self.build_each, task, configs, spec),
                                    name="builds", daemon=True)
        building.start()
        try:
            gauge = self.gauge()  # on the devices, not beside the builds on this host
            return self.run_batch(task, configs, built, spec, _with_gauge(gauge, on_result))
        finally:
            built.cancel()  # no new build begins; the one in flight ends within its build timeout
            building.join(timeout=spec.build_timeout_s + 30)

    def run_batch(self, task: Task, configs: Sequence[Config], built: Sequence[Any], spec: MeasureSpec,
                  on_result: OnResult | None = None) -> list[MeasureResult]:
        batch = _Batch(configs, on_result)
        devices = list(self.devices)
        if len(devices) == 1:
            self._serve(devices[0], task, built, spec, batch, batch.deliver)
        else:
            self._serve_in_parallel(devices, task, built, spec, batch)
        return batch.finish()

    def _serve(self, device: str, task: Task, built: Sequence[Any], spec: MeasureSpec, batch: _Batch,
               deliver: OnResult) -> None:
        """Time the batch's next configs on `device` until none is left or the device is lost."""
        for i in iter(batch.take, None):
            try:
                result = self.run_one(task, batch.configs[i], built[i], spec, device)
            except DeviceLost as error:
                deliver(i, device_lost(batch.configs[i], device, str(error)))
                return
            deliver(i, result)

    def _serve_in_parallel(self, devices: list[str], task: Task, built: Sequence[Any], spec: MeasureSpec,
                           batch: _Batch) -> None:
        """One thread per device; results come back to this thread, which hands them on."""
        done: queue.SimpleQueue[tuple[int | None, Any]] = queue.SimpleQueue()

        def serve(device: str) -> None:
            try:
                self._serve(device, task, built, spec, batch, lambda i, r: done.put((i, r)))
                done.put((None, None))
            except BaseException as error:  # noqa: BLE001 - re-raised on the caller's thread
                done.put((None, error))

        threads = [threading.Thread(target=serve, args=(d,), name=f"runner {d}", daemon=True) for d in devices]
        for thread in threads:
            thread.start()
        running, failure = len(threads), None
        try:
            while running:
                i, item = done.get()
                if i is None:
                    running, failure = running - 1, failure or item
                else:
                    batch.deliver(i, item)
        finally:
            batch.stop()  # an interrupted caller: the devices take nothing more
        if failure is not None:
            raise failure


def _with_gauge(gauge: Gauge, on_result: OnResult | None) -> OnResult:
    """on_result with the batch's gauge reading (the device's own, where there is one per device)
    set on each result first."""
    def with_gauge(i: int, result: MeasureResult) -> None:
        if isinstance(gauge, dict):
            result.gauge_s = gauge.get(result.device) if result.device is not None else None
        else:
            result.gauge_s = gauge
        if on_result:
            on_result(i, result)

    return with_gauge


_UNBUILT = object()  # a place no build has filled (a runner's `built` is opaque: it may be anything)


class Arriving(collections.abc.Sequence):
    """A batch's builds as they arrive from another thread: `built[i]` waits until the i-th is
    built; a building that failed or was cancelled raises there (on the device's thread, then the
    caller's) instead of leaving a device waiting."""

    def __init__(self, count: int):
        self._items: list[Any] = [_UNBUILT] * count
        self._ready = [threading.Event() for _ in range(count)]
        self._error: BaseException | None = None
        self._cancelled = threading.Event()

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> Any:  # type: ignore[override]  # an int index only, no slices
        self._ready[i].wait()
        if self._items[i] is _UNBUILT:
            why = repr(self._error) if self._error is not None else "stopped"
            raise RuntimeError(f"building the batch failed before its candidate {i}: {why}")
        return self._items[i]

    def put(self, i: int, built: Any) -> None:
        self._items[i] = built
        self._ready[i].set()

    def cancel(self) -> None:
        self._cancelled.set()

    def fill(self, build_each: Callable, task: Task, configs: Sequence[Config], spec: MeasureSpec) -> None:
        try:
            build_each(task, configs, spec, self.put, self._cancelled.is_set)
        except BaseException as error:  # noqa: BLE001 - said by __getitem__ on the threads that wait
            self._error = error
        finally:
            for ready in self._ready:
                ready.set()


class Picked(collections.abc.Sequence):
    """`built[todo[j]]` for each j, read when asked (a list of them would wait for every build)."""

    def __init__(self, built: Sequence[Any], todo: list[int]):
        self.built, self.todo = built, todo

    def __len__(self) -> int:
        return len(self.todo)

    def __getitem__(self, j: int) -> Any:  # type: ignore[override]  # an int index only, no slices
        return self.built[self.todo[j]]


# ---- capabilities: what a runner can do beyond measuring, declared by deriving from them ---------
class Capability(ABC):
    """A capability a runner declares by deriving from it (`class MyRunner(Runner, Exports)`): its
    methods are abstract, so a runner that declares it and lacks one cannot be made."""


class Exports(Capability):
    """Exported best schedules checked and libraries built, on the runner's device."""

    @abstractmethod
    def check_export(self, task: Task, script_text: str) -> dict[str, Any]:
        """Compile an exported TVMScript schedule, check its answer and time it on the device:
        {"correct", "max_abs_error", "reference_max", "seconds"}."""

    @abstractmethod
    def export_library(self, task: Task, scheduled_mod: Any, library_path: Path) -> dict[str, Any]:
        """The scheduled module built into library_path, checked and timed beside the untuned
        kernel and torch (tuning/hardware/tvm_export.py's dict, with the call's "args")."""


class RunsWholeModels(Capability):
    """Whole models compiled with a tuned database and timed on the runner's device."""

    @abstractmethod
    def evaluate_model(self, model_cfg: Any, seed: int, database_dir: Path, out_dir: Path,
                       timing: dict[str, Any]) -> dict[str, Any]:
        """The whole model compiled with the tuned database, checked against torch and both timed
        (tuning/hardware/e2e.py's dict: latency_ms, match, ...)."""


class TimesInModel(Capability):
    """Candidate kernels timed inside the whole model (tuning/hardware/in_context.py)."""

    @abstractmethod
    def time_in_model(self, model_cfg: Any, seed: int, database_dir: Path, candidates: dict[str, list[list[int]]],
                      timing: dict[str, Any]) -> list[dict[str, list[list[float]]]]:
        """Each candidate config of each named task timed inside the model compiled with the
        database: one {task: [[seconds] per config]} per reading process."""


CAPABILITIES: tuple[type[Capability], ...] = (Exports, RunsWholeModels, TimesInModel)  # the lab's


def runner_can(runner: Runner | type[Runner], capability: type[Capability]) -> bool:
    """Whether the runner (or runner class) declares `capability`."""
    return issubclass(runner if isinstance(runner, type) else type(runner), capability)


def require(runner: Runner, capability: type[Capability], cannot: str) -> Any:
    """The runner, as one with `capability` (typed Any: a capability class is abstract, and mypy takes
    no abstract class for a type variable); NotImplementedError naming it and what it `cannot` do
    ("cannot build a library") when it does not declare it."""
    if not isinstance(runner, capability):
        raise NotImplementedError(f"{type(runner).__name__} {cannot}")
    return runner


def capabilities_of(runner: Runner | type[Runner]) -> list[type[Capability]]:
    """The capabilities a runner (or runner class) declares, most derived first."""
    cls = runner if isinstance(runner, type) else type(runner)
    return [c for c in cls.__mro__ if Capability in c.__bases__]


class _Batch:
    """A batch being timed: hands out its indices and passes results on in index order."""

    def __init__(self, configs: Sequence[Config], on_result: OnResult | None) -> None:
        self.configs: list[Config] = [tuple(c) for c in configs]
        self.results: list[MeasureResult | None] = [None] * len(self.configs)
        self.on_result = on_result
        self._next, self._emitted = 0, 0
        self._lock = threading.Lock()

    def take(self) -> int | None:
        with self._lock:
            if self._next >= len(self.configs):
                return None
            self._next += 1
            return self._next - 1

    def stop(self) -> None:
        with self._lock:
            self._next = len(self.configs)

    def deliver(self, i: int, result: MeasureResult) -> None:
        self.results[i] = result
        while self._emitted < len(self.results):
            ready = self.results[self._emitted]
            if ready is None:
                break
            if self.on_result:
                self.on_result(self._emitted, ready)
            self._emitted += 1

    def finish(self) -> list[MeasureResult]:
        """The results; configs no device was left to time are `device_lost`."""
        for i, result in enumerate(self.results):
            if result is None:
                self.deliver(i, device_lost(self.configs[i], None, "no device left to time it"))
        return [result for result in self.results if result is not None]


def device_lost(config: Config, device: str | None, why: str) -> MeasureResult:
    return MeasureResult.failed("device_lost", f"{device}: {why}" if device else why, config=tuple(config),
                                device=device)


def check_node(node: object, key: str) -> list[str]:
    """Problems with a hardware's `runner` config node, each naming its key (`key.device_index`);
    None is the default runner."""
    if node is None or isinstance(node, Runner):
        return []
    cls, problems = _runner_class(node, key)
    if cls is None:
        return problems
    return cls.check_params(_params(node), key)


def runner_from_node(node: object, key: str) -> Runner | None:
    """The runner a config node check_node accepts, made (a constructor starts nothing); None otherwise."""
    cls, problems = _runner_class(node, key)
    if cls is None or cls.check_params(_params(node), key):
        return None
    return cls(**_params(node))


def _runner_class(node: object, key: str) -> tuple[type[Runner] | None, list[str]]:
    """The Runner class a config node names, or None and why not (naming `key`)."""
    if not isinstance(node, dict) or not node.get("_target_"):
        return None, [f"{key}: expected a runner config node with _target_ (conf/hardware/runner/*.yaml), got {node!r}"]
    target = node["_target_"]
    from tuning.config.untrusted import is_registered_target, unregistered

    if not is_registered_target(target):  # asked before the import: importing a module runs it
        return None, [unregistered(target, f"{key}._target_")]
    try:
        module, _, name = str(target).rpartition(".")
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as error:
        return None, [f"{key}._target_: cannot import {target!r} ({error})"]
    if not (isinstance(cls, type) and issubclass(cls, Runner)):
        return None, [f"{key}._target_: {target} is not a runner (tuning/hardware/runners/base.py)"]
    return cls, []


def _params(node: object) -> dict[str, Any]:
    return {str(k): v for k, v in node.items() if not str(k).startswith("_")} if isinstance(node, dict) else {}
