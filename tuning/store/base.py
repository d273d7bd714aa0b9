"""The measurement store's contract and its shared readers (docs/store.md §Backends).

`MeasurementStore` holds every query and every check of what is read back, written once with `?`
placeholders; a backend subclasses it and provides the abstract primitives below: how it connects,
checks or creates its schema, runs statements and says what went wrong in words. The backends the
lab ships are `tuning/store/sqlite.py` and `tuning/store/postgres.py`; `tuning/store/open.py` gives
the backend a location names (a path, or a URL by its scheme; `register_backend` adds one), and
`tuning.testing.store_contract` is the suite every backend passes.

Measure once, compare many (docs/store.md). A row is one measurement of one config:

    hardware   fingerprint hash: the backend's description (target incl. CPU name, threads, TVM
               version) plus the measurement settings that change what one reading means
               (number, min_repeat_ms, cache flush, micro-batch size); `repeat` is not in it, since
               a replay takes the first `repeat` readings of a row
    task       the kernel's store key: a structural hash of its TIR, so the same computation shares
               rows whichever model it came from
    space      a hash of the task's knob space (knob names and choices): a row's config indices
               mean nothing in another space
    config     the canonical config (choice indices, JSON) and its decisions (for people and exports)
    costs      every reading in seconds (each repeat, or each micro-batch of an adaptive evaluator,
               in the order measured, so a replayed early-stop rule can truncate them)
    error, message, build_s, run_s, gauge_s (the drift gauge read with the row's batch),
    measured_at (unix time), source (run, remeasure, dataset, import, value, reread)
"""
from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuning.core import plausible

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from contextlib import AbstractContextManager
    from typing import Protocol

    from tuning.core.measure import MeasureSpec
    from tuning.core.records import MeasureResult
    from tuning.core.space import Config, Space
    from tuning.core.task import Task

    class Fingerprinted(Protocol):
        """What the store reads of a hardware backend (tuning/hardware/base.py's `Hardware`, a layer
        above the store, which does not import it)."""

        def fingerprint(self) -> dict[str, Any]: ...

    Statement = tuple[str, Sequence[Any]]  # (query with `?` placeholders, its arguments)

FORMAT = 1
SOURCES = ("run", "remeasure", "dataset", "import", "value", "reread")  # value: the value function's improvement loop

COLUMNS = {  # what the lab reads of each table
    "meta": {"key", "value"},
    "hardware": {"hash", "description"},
    "tasks": {"key", "name", "flops", "workload"},
    "spaces": {"key", "size"},
    "readings": {"id", "hardware", "task", "space", "config", "decisions", "costs", "error", "message", "build_s",
                 "run_s", "gauge_s", "measured_at", "source"},
}
OWN_TABLES = set(COLUMNS)
READING_COLUMNS = ("hardware", "task", "space", "config", "decisions", "costs", "error", "message", "build_s",
                   "run_s", "gauge_s", "measured_at", "source")  # a reading's columns but its id, in write order


class StoreError(ValueError):
    """The file is not a measurement store this version can read, or it cannot be written."""


def digest(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def reading_settings(spec: MeasureSpec) -> dict[str, Any]:
    """The MeasureSpec fields that change what one reading means (not how many are taken)."""
    cv = spec.cv_stop
    return {"number": cv.micro_batch if cv else spec.number, "min_repeat_ms": 0 if cv else spec.min_repeat_ms,
            "cache_flush": bool(spec.cache_flush)}


def fingerprint(hardware: Fingerprinted, spec: MeasureSpec) -> tuple[str, dict[str, Any]]:
    """(hash, description) of a backend's readings under a MeasureSpec: the store's hardware key."""
    description = {**hardware.fingerprint(), **reading_settings(spec)}
    return digest(description), description


def space_signature(space: Space) -> str:
    """A hash of the knob space (a restricted space's is its full space's)."""
    space = getattr(space, "base", space)
    return digest([[k.name, k.kind, [list(c) if isinstance(c, tuple) else c for c in k.choices]]
                   for k in space.knobs] + [list(a) for a in space.active])


@dataclass(frozen=True)
class Row:
    """One stored measurement."""

    config: Config
    costs: list[float]
    error: str | None
    message: str
    build_s: float
    run_s: float
    gauge_s: float | None
    measured_at: float
    source: str

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.costs)



class MeasurementStore(ABC):
    """A measurement store: the queries and their untrusted-input checks, whatever holds the rows.

    The contract a backend keeps (`tuning.testing.store_contract` checks it):
    - `__init__(location, busy_timeout_s=120.0, read_only=False)`, calling `_start`; nothing connects
      before first use, and one connection is opened per process (pickling drops it: a store is safe
      to pass to workers).
    - `read_only=True` never creates, migrates or writes anything; a writer creates the schema of an
      empty location and refuses another program's data, untouched.
    - The abstract members below: statements run as written here (`?` placeholders; a backend
      translates them), `_FIND` names the SQL function giving a substring's position (0: absent),
      and every failure is a StoreError in words naming `location`, never a driver's exception.
    - The same writes give the same rows and keys as every other backend (`copy_store` copies
      between any two).
    `schemes` lists the URL schemes a backend serves (`postgresql`, ...); the sqlite backend serves
    paths. `display(location)` is a location as messages show it (no password)."""

    backend = ""
    schemes: tuple[str, ...] = ()
    _FIND = "instr"  # the SQL function giving a substring's position (0: absent)

    if TYPE_CHECKING:  # what every backend defines (the contract above), for the type checker
        def __init__(self, location: Any, busy_timeout_s: float = 120.0, read_only: bool = False) -> None: ...
        def _refuse_triggers(self, conn: Any) -> None: ...
        def _format(self, conn: Any) -> str | None: ...

    @classmethod
    def display(cls, location: Any) -> str:
        return str(location)

    def _start(self, busy_timeout_s: float, read_only: bool) -> None:
        """What every backend's __init__ sets: no connection yet (one per process, on first use)."""
        self.busy_timeout_s = busy_timeout_s
        self.read_only = read_only
        self._conn: Any = None
        self._pid: int | None = None
        self._bounds: dict = {}  # (hardware, task) -> plausible.Bounds

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_conn": None, "_pid": None}

    def _check_format(self, conn: Any) -> None:
        """No trigger (or rule), and this version's format row: the first checks of an untrusted store."""
        self._refuse_triggers(conn)
        found = self._format(conn)
        if found is None:
            raise StoreError(f"{self.location}: not a tunelab measurement store (no format row)")
        if found != str(FORMAT):
            raise StoreError(f"{self.location}: store format {found}, this tunelab reads format {FORMAT}")

    # ---- what a backend provides ----------------------------------------------------------------
    @property
    @abstractmethod
    def location(self) -> str:
        """The store's name in messages (a URL without its password)."""
        raise NotImplementedError

    @property
    @abstractmethod
    def address(self) -> str:
        """Where another process finds the store: a file's absolute path, a URL without its password."""
        raise NotImplementedError

    @property
    @abstractmethod
    def conn(self) -> Any:
        """This process's connection, opened (the store checked or created) on first use; a store
        that cannot be opened is a StoreError naming `location`."""
        raise NotImplementedError

    @abstractmethod
    def _fetch(self, query: str, args: Sequence[Any] = ()) -> list[Any]:
        """Every row of a query; a damaged store is a StoreError in words."""
        raise NotImplementedError

    @abstractmethod
    def _stream(self, query: str, args: Sequence[Any] = (), size: int = 5000) -> Iterator[list[Any]]:
        """A query's rows in lists of at most `size`, read as they are consumed."""
        raise NotImplementedError

    @abstractmethod
    def _write(self, statements: list[Statement], done: Statement | None = None) -> None:
        """(query, args) statements in one transaction. `done`, a (query, args) that finds the
        write's row, tells a backend that retries a write after a lost connection whether the
        lost attempt committed."""
        raise NotImplementedError

    @abstractmethod
    def _insert_many(self, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]],
                     ignore: bool = False) -> None:
        """Rows into a table in one transaction (`ignore`: rows whose key is held are left out)."""
        raise NotImplementedError

    @abstractmethod
    def _insert_ignore(self, table: str, columns: tuple[str, ...]) -> str:
        raise NotImplementedError

    def _stored(self, value: Any) -> Any:
        """A text value as this backend can store it."""
        return value

    @abstractmethod
    def size_bytes(self) -> int:
        raise NotImplementedError

    @abstractmethod
    def builder_lock(self, key: str = "--store") -> AbstractContextManager[object]:
        """A context holding the store's one-builder lock (`dataset build`, `import`, `copy`): refused
        at once, naming the holder, while another builder holds it; freed however the builder ends."""
        raise NotImplementedError

    @abstractmethod
    def close(self) -> None:
        raise NotImplementedError

    # ---- writing ------------------------------------------------------------------------------
    def register(self, hardware: str, description: dict[str, Any], task_key: str, task: Task, space: str | None = None,
                 space_size: float | None = None) -> None:
        statements: list[Statement] = []
        if space is not None and space_size is not None:
            statements.append((self._insert_ignore("spaces", ("key", "size")), (space, float(space_size))))
        statements.append((self._insert_ignore("hardware", ("hash", "description")),
                           (hardware, json.dumps(description, sort_keys=True, default=str))))
        workload = json.dumps(task.workload, sort_keys=True)
        statements.append((self._insert_ignore("tasks", ("key", "name", "flops", "workload")),
                           (task_key, task.name, float(task.flops), workload)))
        if "mod" in task.workload:  # a network kernel registered by an older tunelab without its TIR
            statements.append((f"UPDATE tasks SET workload = ? WHERE key = ? AND {self._FIND}(workload, '\"mod\"') = 0",
                               (workload, task_key)))
        self._write(statements)

    def add(self, hardware: str, task_key: str, space: str, config: Sequence[int], decisions: dict[str, Any],
            result: MeasureResult, source: str = "run", measured_at: float | None = None) -> None:
        """One MeasureResult as one row, in its own transaction (never a screened one: one run is not
        the reading the store's key names)."""
        assert source in SOURCES, source
        assert not result.screened, "a screened reading is not a store's reading"
        row = (hardware, task_key, space, _config_text(config), json.dumps(decisions, default=list),
               json.dumps([float(c) for c in result.costs]), result.error, result.message or "",
               float(result.build_s), float(result.run_s), result.gauge_s,
               time.time() if measured_at is None else measured_at, source)
        written = ("SELECT 1 FROM readings WHERE hardware = ? AND task = ? AND space = ? AND config = ? AND costs = ? "
                   "AND message = ? AND measured_at = ? AND source = ? LIMIT 1",
                   (*row[:4], row[5], row[7], row[11], row[12]))
        self._write([(f"INSERT INTO readings({', '.join(READING_COLUMNS)}) VALUES ({', '.join('?' * len(row))})",
                      row)], done=written)

    # ---- reading ------------------------------------------------------------------------------
    def rows(self, hardware: str, task_key: str, space: str, config: Sequence[int] | None = None) -> list[Row]:
        """Rows in the order they were written (one config's, or the whole task's)."""
        query = ("SELECT config, costs, error, message, build_s, run_s, gauge_s, measured_at, source FROM readings "
                 "WHERE hardware = ? AND task = ? AND space = ?")
        args: list[Any] = [hardware, task_key, space]
        if config is not None:
            query += " AND config = ?"
            args.append(_config_text(config))
        limits = self.bounds(hardware, task_key)
        return [row for row in (_parse_row(raw, limits) for raw in self._fetch(query + " ORDER BY id", args))
                if row is not None]

    def bounds(self, hardware: str, task_key: str) -> plausible.Bounds:
        """The plausible costs of the task's readings on this hardware (tuning/core/plausible.py), read
        once per (hardware, task) a process asks for: a registered task's flops never change."""
        if (hardware, task_key) not in self._bounds:
            flops = next(iter(self._fetch("SELECT flops FROM tasks WHERE key = ?", (task_key,))), None)
            if flops is None:
                return plausible.bounds(None, {})  # not registered yet: nothing to remember
            self._bounds[hardware, task_key] = plausible.bounds(flops[0], self.hardware_info(hardware))
        return self._bounds[hardware, task_key]

    def first(self, hardware: str, task_key: str, space: str, config: Sequence[int]) -> Row | None:
        """The earliest row of a config: what a replay answers, whatever was added since."""
        rows = self.rows(hardware, task_key, space, config)
        return rows[0] if rows else None

    def configs(self, hardware: str, task_key: str, space: str) -> list[Config]:
        """Every config with a row, in first-measured order."""
        seen: dict[Config, None] = {}
        for (text,) in self._fetch("SELECT config FROM readings WHERE hardware = ? AND task = ? AND space = ? "
                                   "ORDER BY id", (hardware, task_key, space)):
            config = _parse_config(text)
            if config is not None:
                seen.setdefault(config, None)
        return list(seen)

    def truth(self, hardware: str, task_key: str, space: str, config: Sequence[int],
              min_readings: int = 3) -> float | None:
        """The median of every reading of a config (seconds), or None with fewer than `min_readings`."""
        readings = [c for row in self.rows(hardware, task_key, space, config) if row.ok for c in row.costs]
        return statistics.median(readings) if len(readings) >= min_readings else None

    def truths(self, hardware: str, task_key: str, space: str, min_readings: int = 3) -> dict[Config, float]:
        """`truth` of every config of a task at once (configs with fewer readings are left out)."""
        return {c: statistics.median(r) for c, r in self.readings(hardware, task_key, space, min_readings).items()}

    def readings(self, hardware: str, task_key: str, space: str, min_readings: int = 3) -> dict[Config, list[float]]:
        """Every valid reading of each config of a task (configs with fewer are left out): what a
        truth is the median of, for intervals that count the store's own noise."""
        readings: dict[Config, list[float]] = {}
        for row in self.rows(hardware, task_key, space):
            if row.ok:
                readings.setdefault(row.config, []).extend(row.costs)
        return {c: r for c, r in readings.items() if len(r) >= min_readings}

    def decisions(self, hardware: str, task_key: str, space: str) -> dict[Config, dict[str, Any]]:
        """Each config's stored decisions, from its earliest row whose decisions parse (rows whose
        config or decisions do not parse are left out)."""
        found: dict[Config, dict[str, Any]] = {}
        for config_text, decisions_text in self._fetch(
                "SELECT config, decisions FROM readings WHERE hardware = ? AND task = ? AND space = ? ORDER BY id",
                (hardware, task_key, space)):
            config = _parse_config(config_text)
            try:
                decisions = json.loads(decisions_text)
            except (TypeError, ValueError, RecursionError):
                continue
            if config is not None and isinstance(decisions, dict):
                found.setdefault(config, decisions)
        return found

    def gauge_median(self, hardware: str) -> float | None:
        values = self.gauge_readings(hardware)
        return statistics.median(values) if values else None

    def keys(self) -> list[tuple[str, str, str]]:
        """(hardware, task, space) triples that have rows."""
        found = self._fetch("SELECT DISTINCT hardware, task, space FROM readings")
        return [(str(hardware), str(task), str(space)) for hardware, task, space in found]

    def task_info(self, task_key: str) -> dict[str, Any] | None:
        found = self._fetch("SELECT name, flops, workload FROM tasks WHERE key = ?", (task_key,))
        if not found:
            return None
        row = found[0]
        try:
            workload = json.loads(row[2])
        except (TypeError, ValueError, RecursionError):  # RecursionError: a nesting bomb
            workload = {}
        flops = row[1] if isinstance(row[1], (int, float)) and math.isfinite(row[1]) and row[1] >= 0 else 0.0
        return {"name": str(row[0]), "flops": flops,
                "workload": workload if isinstance(workload, dict) else {}}

    def space_size(self, space: str) -> float | None:
        row = next(iter(self._fetch("SELECT size FROM spaces WHERE key = ?", (space,))), None)
        return row[0] if row and isinstance(row[0], (int, float)) and row[0] > 0 else None

    def gauge_readings(self, hardware: str) -> list[float]:
        return [v for (v,) in self._fetch("SELECT gauge_s FROM readings WHERE hardware = ? AND gauge_s > 0",
                                          (hardware,)) if isinstance(v, float) and math.isfinite(v)]

    def hardware_info(self, hardware: str) -> dict[str, Any]:
        """The hardware's stored description ({} when absent or not a JSON object)."""
        row = self._fetch("SELECT description FROM hardware WHERE hash = ?", (hardware,))
        try:
            description = json.loads(row[0][0]) if row else {}
        except (TypeError, ValueError, RecursionError):
            return {}
        return description if isinstance(description, dict) else {}

    def count(self) -> int:
        return self._fetch("SELECT COUNT(*) FROM readings")[0][0]

    def unreadable(self) -> int:
        """Rows skipped because their values are not valid or their costs not plausible."""
        return sum(_parse_row(raw, self.bounds(hardware, task_key)) is None for hardware, task_key, *raw in self._fetch(
            "SELECT hardware, task, config, costs, error, message, build_s, run_s, gauge_s, measured_at, source "
            "FROM readings"))

    def measurement_seconds(self, hardware: str, limit: int = 500) -> list[float]:
        """build_s + run_s of the hardware's latest `limit` rows (what a build estimates its time from)."""
        return [seconds for (seconds,) in self._fetch(
            "SELECT build_s + run_s FROM readings WHERE hardware = ? ORDER BY id DESC LIMIT ?", (hardware, limit))]



def jsonable(value: Any) -> Any:
    """Decisions (tuples inside dicts) as JSON-ready lists."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def _config_text(config: Sequence[int]) -> str:
    return json.dumps([int(c) for c in config])


def _parse_config(text: Any) -> Config | None:
    try:
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError):  # RecursionError: a nesting bomb
        return None
    if not isinstance(value, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                              for c in value):
        return None
    return tuple(value)


def _parse_row(raw: Sequence[Any], limits: plausible.Bounds = plausible.ABSOLUTE) -> Row | None:
    """The row, or None when a value is not valid or a cost is outside `limits`."""
    config_text, costs_text, error, message, build_s, run_s, gauge_s, measured_at, source = raw
    config = _parse_config(config_text)
    try:
        costs = json.loads(costs_text)
    except (TypeError, ValueError, RecursionError):
        return None
    finite = [build_s, run_s, measured_at] + ([gauge_s] if gauge_s is not None else [])
    if (config is None or not isinstance(costs, list)
            or not all(map(limits.accepts, costs))
            or not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in finite)
            or (error is None and not costs)):
        return None
    return Row(config, [float(c) for c in costs], error, message or "", float(build_s), float(run_s),
               None if gauge_s is None else float(gauge_s), float(measured_at), source)
