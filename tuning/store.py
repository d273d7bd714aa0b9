"""The measurement store: every reading of every (hardware, kernel, config), kept in one sqlite file.

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
    measured_at (unix time), source (run, remeasure, dataset, import)

sqlite in WAL mode: readers never block the writer; writers from several processes (sweep trials,
joblib workers) queue on the lock (busy timeout) and each row is one transaction, so a killed
writer loses at most the row it was writing and leaves the file readable. WAL needs a local disk
(not NFS). Everything read back is untrusted: a row whose costs are not finite positive seconds
is skipped and counted in `stats`.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

FORMAT = 1
SOURCES = ("run", "remeasure", "dataset", "import", "value")  # value: the value function's improvement loop

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS hardware(hash TEXT PRIMARY KEY, description TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks(key TEXT PRIMARY KEY, name TEXT NOT NULL, flops REAL NOT NULL,
                                 workload TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS spaces(key TEXT PRIMARY KEY, size REAL NOT NULL);
CREATE TABLE IF NOT EXISTS readings(
    id INTEGER PRIMARY KEY,
    hardware TEXT NOT NULL, task TEXT NOT NULL, space TEXT NOT NULL, config TEXT NOT NULL,
    decisions TEXT NOT NULL, costs TEXT NOT NULL, error TEXT, message TEXT NOT NULL DEFAULT '',
    build_s REAL NOT NULL, run_s REAL NOT NULL, gauge_s REAL, measured_at REAL NOT NULL,
    source TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS readings_key ON readings(hardware, task, space, config);
"""


class StoreError(ValueError):
    """The file is not a measurement store this version can read."""


def digest(value) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def reading_settings(spec) -> dict:
    """The MeasureSpec fields that change what one reading means (not how many are taken)."""
    cv = spec.cv_stop
    return {"number": cv.micro_batch if cv else spec.number, "min_repeat_ms": 0 if cv else spec.min_repeat_ms,
            "cache_flush": bool(spec.cache_flush)}


def fingerprint(hardware, spec) -> tuple[str, dict]:
    """(hash, description) of a backend's readings under a MeasureSpec: the store's hardware key."""
    description = {**hardware.fingerprint(), **reading_settings(spec)}
    return digest(description), description


def space_signature(space) -> str:
    """A hash of the knob space (a restricted space's is its full space's)."""
    space = getattr(space, "base", space)
    return digest([[k.name, k.kind, [list(c) if isinstance(c, tuple) else c for c in k.choices]]
                   for k in space.knobs] + [list(a) for a in space.active])


@dataclass(frozen=True)
class Row:
    """One stored measurement."""

    config: tuple
    costs: list
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


class MeasurementStore:
    """One sqlite file; a connection per process, opened on first use (safe to pass to workers)."""

    def __init__(self, path: str | os.PathLike, busy_timeout_s: float = 120.0):
        self.path = Path(path).expanduser()
        self.busy_timeout_s = busy_timeout_s
        self._conn: sqlite3.Connection | None = None
        self._pid: int | None = None

    # ---- connection ---------------------------------------------------------------------------
    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SCHEMA)
                self._check_format(conn)
            except sqlite3.DatabaseError as error:
                conn.close()
                raise StoreError(f"{self.path}: not a tunelab measurement store ({error})") from error
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    def _check_format(self, conn) -> None:
        conn.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (str(FORMAT),))
        found = conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()[0]
        if found != str(FORMAT):
            raise StoreError(f"{self.path}: store format {found}, this tunelab reads format {FORMAT}")

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None

    def __getstate__(self):
        return {**self.__dict__, "_conn": None, "_pid": None}

    # ---- writing ------------------------------------------------------------------------------
    def register(self, hardware: str, description: dict, task_key: str, task, space: str | None = None,
                 space_size: float | None = None) -> None:
        with self.conn:
            if space is not None and space_size is not None:
                self.conn.execute("INSERT OR IGNORE INTO spaces VALUES (?, ?)", (space, float(space_size)))
            self.conn.execute("INSERT OR IGNORE INTO hardware VALUES (?, ?)",
                              (hardware, json.dumps(description, sort_keys=True, default=str)))
            workload = json.dumps(task.workload, sort_keys=True)
            self.conn.execute("INSERT OR IGNORE INTO tasks VALUES (?, ?, ?, ?)",
                              (task_key, task.name, float(task.flops), workload))
            if "mod" in task.workload:  # a network kernel registered by an older tunelab without its TIR
                self.conn.execute("UPDATE tasks SET workload = ? WHERE key = ? AND instr(workload, '\"mod\"') = 0",
                                  (workload, task_key))

    def add(self, hardware: str, task_key: str, space: str, config, decisions: dict, result,
            source: str = "run", measured_at: float | None = None) -> None:
        """One MeasureResult as one row, in its own transaction."""
        assert source in SOURCES, source
        row = (hardware, task_key, space, _config_text(config), json.dumps(decisions, default=list),
               json.dumps([float(c) for c in result.costs]), result.error, result.message or "",
               float(result.build_s), float(result.run_s), result.gauge_s,
               time.time() if measured_at is None else measured_at, source)
        with self.conn:
            self.conn.execute("INSERT INTO readings(hardware, task, space, config, decisions, costs, error, message,"
                              " build_s, run_s, gauge_s, measured_at, source) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", row)

    # ---- reading ------------------------------------------------------------------------------
    def rows(self, hardware: str, task_key: str, space: str, config=None) -> list[Row]:
        """Rows in the order they were written (one config's, or the whole task's)."""
        query = ("SELECT config, costs, error, message, build_s, run_s, gauge_s, measured_at, source FROM readings "
                 "WHERE hardware = ? AND task = ? AND space = ?")
        args = [hardware, task_key, space]
        if config is not None:
            query += " AND config = ?"
            args.append(_config_text(config))
        return [row for row in map(_parse_row, self.conn.execute(query + " ORDER BY id", args)) if row is not None]

    def first(self, hardware: str, task_key: str, space: str, config) -> Row | None:
        """The earliest row of a config: what a replay answers, whatever was added since."""
        rows = self.rows(hardware, task_key, space, config)
        return rows[0] if rows else None

    def configs(self, hardware: str, task_key: str, space: str) -> list[tuple]:
        """Every config with a row, in first-measured order."""
        seen: dict = {}
        for (text,) in self.conn.execute("SELECT config FROM readings WHERE hardware = ? AND task = ? AND space = ? "
                                         "ORDER BY id", (hardware, task_key, space)):
            config = _parse_config(text)
            if config is not None:
                seen.setdefault(config, None)
        return list(seen)

    def truth(self, hardware: str, task_key: str, space: str, config, min_readings: int = 3) -> float | None:
        """The median of every reading of a config (seconds), or None with fewer than `min_readings`."""
        readings = [c for row in self.rows(hardware, task_key, space, config) if row.ok for c in row.costs]
        return statistics.median(readings) if len(readings) >= min_readings else None

    def truths(self, hardware: str, task_key: str, space: str, min_readings: int = 3) -> dict[tuple, float]:
        """`truth` of every config of a task at once (configs with fewer readings are left out)."""
        readings: dict = {}
        for row in self.rows(hardware, task_key, space):
            if row.ok:
                readings.setdefault(row.config, []).extend(row.costs)
        return {c: statistics.median(r) for c, r in readings.items() if len(r) >= min_readings}

    def decisions(self, hardware: str, task_key: str, space: str) -> dict[tuple, dict]:
        """Each config's stored decisions (rows whose config or decisions do not parse are left out)."""
        found: dict = {}
        for config_text, decisions_text in self.conn.execute(
                "SELECT config, decisions FROM readings WHERE hardware = ? AND task = ? AND space = ?",
                (hardware, task_key, space)):
            config = _parse_config(config_text)
            try:
                decisions = json.loads(decisions_text)
            except (TypeError, ValueError):
                continue
            if config is not None and isinstance(decisions, dict):
                found.setdefault(config, decisions)
        return found

    def gauge_median(self, hardware: str) -> float | None:
        values = self.gauge_readings(hardware)
        return statistics.median(values) if values else None

    def keys(self) -> list[tuple[str, str, str]]:
        """(hardware, task, space) triples that have rows."""
        return list(self.conn.execute("SELECT DISTINCT hardware, task, space FROM readings"))

    def task_info(self, task_key: str) -> dict | None:
        row = self.conn.execute("SELECT name, flops, workload FROM tasks WHERE key = ?", (task_key,)).fetchone()
        if row is None:
            return None
        try:
            workload = json.loads(row[2])
        except (TypeError, ValueError):
            workload = {}
        return {"name": str(row[0]), "flops": row[1] if isinstance(row[1], (int, float)) else 0.0,
                "workload": workload if isinstance(workload, dict) else {}}

    def space_size(self, space: str) -> float | None:
        row = self.conn.execute("SELECT size FROM spaces WHERE key = ?", (space,)).fetchone()
        return row[0] if row and isinstance(row[0], (int, float)) and row[0] > 0 else None

    def gauge_readings(self, hardware: str) -> list[float]:
        return [v for (v,) in self.conn.execute("SELECT gauge_s FROM readings WHERE hardware = ? AND gauge_s > 0",
                                                (hardware,)) if isinstance(v, float) and math.isfinite(v)]

    def hardware_info(self, hardware: str) -> dict:
        row = self.conn.execute("SELECT description FROM hardware WHERE hash = ?", (hardware,)).fetchone()
        return json.loads(row[0]) if row else {}

    def count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM readings").fetchone()[0]

    def unreadable(self) -> int:
        """Rows skipped because their values are not valid."""
        return sum(_parse_row(r) is None for r in self.conn.execute(
            "SELECT config, costs, error, message, build_s, run_s, gauge_s, measured_at, source FROM readings"))


class TaskRows:
    """One task's rows for one backend under one MeasureSpec: the (hardware, task, space) key, read
    and written by config. The task is registered with the first write."""

    def __init__(self, store: MeasurementStore, hardware, spec, task, space):
        self.store, self.task, self.space = store, task, space
        self.hardware_key, self.description = fingerprint(hardware, spec)
        self.task_key, self.space_key = hardware.store_key(task), space_signature(space)
        self._registered = False

    @property
    def key(self) -> tuple[str, str, str]:
        return self.hardware_key, self.task_key, self.space_key

    def register(self) -> None:
        if not self._registered:
            self.store.register(self.hardware_key, self.description, self.task_key, self.task, self.space_key,
                                getattr(self.space, "base", self.space).size)
            self._registered = True

    def add(self, config, result, source: str, measured_at: float | None = None) -> None:
        self.register()
        config = tuple(config)
        self.store.add(*self.key, config, jsonable(self.space.decisions(config)), result, source, measured_at)

    def first(self, config) -> Row | None:
        return self.store.first(*self.key, config)

    def configs(self) -> list[tuple]:
        return self.store.configs(*self.key)

    def truth(self, config) -> float | None:
        return self.store.truth(*self.key, config)


def jsonable(value):
    """Decisions (tuples inside dicts) as JSON-ready lists."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def _config_text(config) -> str:
    return json.dumps([int(c) for c in config])


def _parse_config(text) -> tuple | None:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    if not isinstance(value, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                              for c in value):
        return None
    return tuple(value)


def _parse_row(raw) -> Row | None:
    config_text, costs_text, error, message, build_s, run_s, gauge_s, measured_at, source = raw
    config = _parse_config(config_text)
    try:
        costs = json.loads(costs_text)
    except (TypeError, ValueError):
        return None
    finite = [build_s, run_s, measured_at] + ([gauge_s] if gauge_s is not None else [])
    if (config is None or not isinstance(costs, list)
            or not all(isinstance(c, (int, float)) and math.isfinite(c) and c > 0 for c in costs)
            or not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in finite)
            or (error is None and not costs)):
        return None
    return Row(config, [float(c) for c in costs], error, message or "", float(build_s), float(run_s),
               None if gauge_s is None else float(gauge_s), float(measured_at), source)
