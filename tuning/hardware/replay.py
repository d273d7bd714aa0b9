"""hardware=replay: answer measurements from the measurement store (tuning/store/; docs/store.md).

Wraps the backend that made the readings (`backend`, by default hardware=cpu), which gives spaces,
exports, whole models and the fingerprint, and measures what the store lacks when `on_miss: measure` (the
run's StoreWriter callback adds those rows). With `on_miss: error` a miss is a record with error
kind `not_in_store` and the run goes on; such a replay only reads the store (opened read-only, so it
works from read-only media), while one that may measure needs the store writable.

A hit answers with the config's earliest row (so rows added later never change a replay): the
first `repeat` readings, or, for an early-stop evaluator, the readings up to where its rule stops
(the row holds every micro-batch in order, so the rule is applied by truncation). The result
carries the stored build seconds and the stored run seconds in proportion to the readings used:
the simulated clock. With `simulated_clock` true the loop stamps records with those seconds, not
the wall clock, so the same seed replays to identical records. `normalise` scales a row's
readings by (the store's median gauge reading / the row's gauge reading), taking the host's
drift out.

hardware=cpu with `store` set and `reuse: true` is this wrapper without the simulated clock (the
memoised real run, made by `with_store`): measured configs are answered from the store, new
ones are measured.

Only measuring is replayed. Every other member of the Hardware contract (base.py) that the replay
does not define itself is its backend's, forwarded by `_forwarding_the_rest`, so a member the
contract gains later reaches the backend with no edit here. So a whole model's tasks come from the
backend, and its end-to-end timing (evaluate_model) is always a real measurement on the backend,
never replayed.
"""
from __future__ import annotations

import json
import math
from abc import update_abstractmethods
from dataclasses import replace
from pathlib import Path

from tuning.core.component import external_checks, import_class
from tuning.core.records import MeasureResult
from tuning.core.task import WHOLE_MODEL_KINDS, WORKLOAD_SPACES
from tuning.hardware.base import Hardware
from tuning.store import (
    MeasurementStore,
    TaskRows,
    connect_store,
    display_location,
    is_store_url,
    reading_settings,
    unwritable,
)

ON_MISS = ("measure", "error")


class _FromBackend:
    """A Hardware contract member the replay leaves to its backend: on an instance the backend's (a
    method bound to the backend, or its value); on the class `on_class`, since config validation
    reads class attributes before any backend exists."""

    def __init__(self, on_class):
        self.on_class = on_class

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self.on_class
        return getattr(instance.backend, self.name)


def _contract_members() -> list[str]:
    """The Hardware contract's public members: what the Hardware class itself declares, less its
    class-level config checks (Component's validation is the class's, not the device's)."""
    return [name for name, value in vars(Hardware).items()
            if not name.startswith("_") and not isinstance(value, (classmethod, staticmethod))]


def _forwarding_the_rest(cls):
    """Every contract member `cls` does not define itself becomes its backend's."""
    for name in _contract_members():
        if name not in vars(cls):
            forwarded = _FromBackend(vars(Hardware)[name])
            forwarded.__set_name__(cls, name)
            setattr(cls, name, forwarded)
    return update_abstractmethods(cls)  # an abstract member the contract gains is forwarded too


@_forwarding_the_rest
class ReplayHardware(Hardware):
    """Measurements from the store; the rest of the Hardware contract is the backend's (a whole
    model's end-to-end timing included: always measured, never replayed).

    Hyperparameters:
    backend          the hardware whose readings the store holds (a hardware config node)
    store            the measurement store file, or a PostgreSQL store's postgresql:// URL (required)
    on_miss          measure (on the backend; the row is added) | error (a `not_in_store` record)
    normalise        scale readings to the drift gauge (see the module docstring)
    simulated_clock  record times count stored seconds, not the wall clock (reproducible replays)
    create           start a new store file when `store` does not exist (on_miss=measure only; off by
                     default so a mistyped path is an error, not a silent fresh store). A PostgreSQL
                     store is checked when the run opens it, not here: its database must exist (an
                     empty one becomes a store when a run may measure into it)
    """

    options = {"on_miss": ON_MISS}
    # an instance tunes and gives what its backend does; the class, read by config validation before
    # any backend exists, claims all of it (tuning/config.py's feature check then reads the backend's)
    model_kinds = _FromBackend(Hardware.model_kinds)
    model_spaces = _FromBackend(("full", *WORKLOAD_SPACES))
    schedules_programs = _FromBackend(True)
    simulated_clock = True  # its own: a hyperparameter, set per instance

    def __init__(self, backend: Hardware | None = None, store: str = "", on_miss: str = "measure",
                 normalise: bool = False, simulated_clock: bool = True, create: bool = False):
        self.backend = backend
        self.store = store
        self.create = create
        self.on_miss = on_miss
        self.normalise = normalise
        self.simulated_clock = simulated_clock
        self._store: MeasurementStore | None = None
        self._gauge_reference: dict = {}
        self._restrict = None  # model.space=store: the MeasureSpec whose readings define the space
        self._restricted: dict = {}
        self._tables: dict = {}

    @classmethod
    def check(cls, params, group):
        if not params["store"]:
            return [f"{group}.store: hardware=replay needs a measurement store file "
                    f"(e.g. {group}.store=stores/lab.sqlite)"]
        if params["create"] and params["on_miss"] != "measure":
            return [f"{group}.create: a new store can only fill up with on_miss=measure, got on_miss={params['on_miss']}"]
        # a database is reached and checked when the run opens it (store_wiring.wire_store); a re-logged
        # run (local_checks_only) opens no store, and a restored one's may have stayed on its machine
        local = is_store_url(str(params["store"])) or not external_checks()
        problem = None if local else _file_problem(params, group)
        if problem:
            return [problem]
        backend = params["backend"]
        if not isinstance(backend, dict) or "_target_" not in backend:
            return [f"{group}.backend: expected a hardware config node with _target_, got {backend!r}"]
        return _check_backend(backend, f"{group}.backend")

    @property
    def readings(self) -> MeasurementStore:
        if self._store is None:
            self._store = connect_store(self.store, read_only=not writes_store(self))
        return self._store

    def restrict_to_store(self, spec) -> None:
        """model.space=store: each task's space becomes the configs the store holds for readings
        under `spec` (a RestrictedSpace); empty when it holds none."""
        self._restrict = spec

    # ---- what the backend answers (the rest of the contract: _forwarding_the_rest) ----------
    def space(self, task):
        space = self.backend.space(task)
        if self._restrict is None:
            return space
        if task.key not in self._restricted:
            from tuning.core.space import RestrictedSpace

            configs = [c for c in self._table(task, self._restrict).configs() if space.is_valid(c)]
            self._restricted[task.key] = RestrictedSpace(space, configs) if configs else _EMPTY
        return self._restricted[task.key]

    def unreachable(self) -> str | None:
        """The backend's devices, and its name for itself (its fingerprint keys the store's rows). A
        replay that never measures (on_miss=error) on a backend that runs no whole model (whose
        end-to-end timing is always real) needs only the name: GPU readings replay on any host."""
        if self.on_miss == "error" and not set(self.backend.model_kinds) & set(WHOLE_MODEL_KINDS):
            return self.backend.unnamed()
        return self.backend.unreachable() or self.backend.unnamed()

    def describe(self) -> dict:
        return {**self.backend.describe(), "replay_store": display_location(self.store), "on_miss": self.on_miss,
                "normalise": self.normalise}

    def close(self) -> None:
        self.backend.close()
        if self._store is not None:
            self._store.close()

    # ---- measuring ------------------------------------------------------------------------------
    def _table(self, task, spec) -> TaskRows:
        """The task's rows under `spec`'s reading settings (keys computed once: the fingerprint
        reads the host's description, the task key hashes its TIR)."""
        key = (task.key, json.dumps(reading_settings(spec), sort_keys=True))
        if key not in self._tables:
            table = TaskRows(self.readings, self, spec, task, self.backend.space(task))
            table.space.mark_canonical(table.configs())  # a lookup needs no TVM replay for a stored config
            self._tables[key] = table
        return self._tables[key]

    def measure(self, task, configs, spec, on_result=None):
        """One result per config, in order, handed to `on_result` as soon as every earlier one is known."""
        table = self._table(task, spec)
        canonical = [table.space.canonical(c) for c in configs]
        rows = {c: table.first(c) for c in canonical}
        misses = [c for c in rows if rows[c] is None]
        if misses and self.on_miss == "measure" and self.simulated_clock:
            rows.update(self._fill(task, misses, spec, table))
        results: list = [None] * len(configs)
        for i, config in enumerate(canonical):
            if rows[config] is not None:
                results[i] = self._answer(rows[config], spec, table.hardware_key, config)
            elif self.on_miss == "error":
                results[i] = MeasureResult.failed("not_in_store",
                                                  f"no reading of {list(config)} in {display_location(self.store)}",
                                                  config=config)
        return self._stream(task, configs, spec, results, on_result)

    def _stream(self, task, configs, spec, results, on_result) -> list:
        """Hand results to `on_result` in order, measuring the unknown ones (None) on the backend
        (hardware.reuse: a memoised real run) as they come."""
        emitted = 0

        def emit_ready():
            nonlocal emitted
            while emitted < len(results) and results[emitted] is not None:
                if on_result:
                    on_result(emitted, results[emitted])
                emitted += 1

        emit_ready()
        unknown = [i for i, r in enumerate(results) if r is None]
        if unknown:
            def measured(j, result):
                results[unknown[j]] = result
                emit_ready()

            self.backend.measure(task, [configs[i] for i in unknown], spec, measured)
        emit_ready()
        return results

    def _fill(self, task, configs, spec, table) -> dict:
        """Replay's misses: measured on the backend (every micro-batch, whatever the stop rule, and
        never screened) and added to the store, then answered from their rows like any hit, so a later replay of the
        same seed gives the same records."""
        full = replace(spec, cv_stop=None, screen_above_s=None)  # the store holds full readings only

        def add(i, result):
            table.add(configs[i], result, "run")

        self.backend.measure(task, configs, full, add)
        return {config: table.first(config) for config in configs}

    def _answer(self, row, spec, key: str, config) -> MeasureResult:
        if not row.ok:
            return MeasureResult(error=row.error, message=row.message, build_s=row.build_s, run_s=row.run_s,
                                 config=config, reused=True, gauge_s=row.gauge_s)
        costs = _truncate(row.costs, spec)
        scale = self._scale(key, row.gauge_s)
        return MeasureResult(costs=[c * scale for c in costs], message=row.message, build_s=row.build_s,
                             run_s=row.run_s * len(costs) / len(row.costs), config=config, reused=True,
                             gauge_s=row.gauge_s)

    def _scale(self, key: str, gauge_s) -> float:
        if not self.normalise or not gauge_s:
            return 1.0
        if key not in self._gauge_reference:
            self._gauge_reference[key] = self.readings.gauge_median(key)
        reference = self._gauge_reference[key]
        return reference / gauge_s if reference and math.isfinite(reference) else 1.0


class _Empty:
    size = 0


_EMPTY = _Empty()


def _truncate(costs: list, spec) -> list:
    """The readings a live measurement under `spec` would have taken from the stored sequence."""
    if spec.cv_stop is None:
        return list(costs[:spec.repeat])
    taken: list = []
    for cost in costs:
        if spec.cv_stop.finished(taken) or len(taken) >= spec.repeat:
            break
        taken.append(cost)
    return taken


def _file_problem(params, group: str) -> str | None:
    """What is wrong with a replay's store file, before any work: missing, or not writable by a
    replay that may measure."""
    path = Path(str(params["store"])).expanduser()
    if not params["create"] and not path.is_file():
        return (f"{group}.store: no such file {params['store']!r} (build one: tunelab dataset build; "
                f"or start one with {group}.create=true)")
    reason = unwritable(path)
    if reason and params["on_miss"] == "measure":
        return (f"{group}.store: {params['store']} cannot be written: {reason} (a replay that only reads the "
                f"store: {group}.on_miss=error)")
    return None


def _check_backend(node: dict, group: str) -> list[str]:
    from tuning.config.untrusted import is_registered_target, unregistered

    if not is_registered_target(node["_target_"]):  # asked before the import: importing a module runs it
        return [unregistered(node["_target_"], f"{group}._target_")]
    try:
        cls = import_class(node["_target_"])
    except (ImportError, AttributeError, ValueError) as error:
        return [f"{group}._target_: cannot import {node['_target_']!r} ({error})"]
    if not (isinstance(cls, type) and issubclass(cls, Hardware)) or issubclass(cls, ReplayHardware):
        return [f"{group}._target_: {node['_target_']} is not a hardware backend that measures"]
    return cls.check_params({k: v for k, v in node.items() if not k.startswith("_")}, group)


def with_store(hardware: Hardware, memoise: bool = False) -> Hardware:
    """hardware=cpu (or any backend) with `store` and `reuse: true` (or `memoise`, without setting
    reuse on it): the memoised real run."""
    if isinstance(hardware, ReplayHardware) or not (memoise or getattr(hardware, "reuse", False)):
        return hardware
    memoised = ReplayHardware(hardware, hardware.store, on_miss="measure", simulated_clock=False)
    memoised.default_prior = hardware.default_prior  # a real run still: its hardware's (a replay's is none)
    return memoised


def store_path(hardware: Hardware) -> str | None:
    """The store a run writes its measurements to, if any."""
    return getattr(hardware, "store", None) or None


def writes_store(hardware: Hardware) -> bool:
    """Whether a run on `hardware` may add rows to its store: all but a replay with on_miss=error,
    which only reads it (and so works from a store on read-only media)."""
    return not (isinstance(hardware, ReplayHardware) and hardware.on_miss == "error")
