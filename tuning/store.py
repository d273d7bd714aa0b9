"""The measurement store: every reading of every (hardware, kernel, config), kept in one sqlite file
or one PostgreSQL database (tuning/store_postgres.py).

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

A store is named by a path (sqlite) or a URL `postgresql://user@host:port/db` (also
`postgresql+psycopg://`): `MeasurementStore(location)`, `connect_store` and `open_store` give the
backend that location names. Both backends hold the same tables, columns, keys and format row and
answer every query the same way: the reading and parsing is `MeasurementStore`'s, one
implementation; a backend (`SqliteStore` below, `PostgresStore`) connects, checks or creates its
schema, runs statements (placeholders, `INSERT OR IGNORE`, `instr`) and says what went wrong in
words. `copy_store` copies one store into another, either backend to either (`dataset copy`). What
follows is the sqlite backend; tuning/store_postgres.py says how PostgreSQL connects, creates,
reads only and fails.

sqlite in WAL mode: readers never block the writer; writers from several processes (sweep trials,
joblib workers) queue on the lock (busy timeout) and each row is one transaction, so a killed
writer loses at most the row it was writing and leaves the file readable. WAL needs a local disk
(not NFS). Everything read back is untrusted: a row whose costs are not plausible seconds (finite,
within the physical bounds of tuning/core/plausible.py for its task and hardware) is skipped and counted
in `stats`.

Opening is explicit about writing. A writer (`read_only=False`: runs, builds, imports, the target of
a copy) creates the file and its schema, and is refused (StoreError) when the file or its folder
cannot be written ("cannot be written: read-only file system"), when the disk is full ("disk full"),
or when the file is another program's database. A reader (`read_only=True`: compare, `dataset
stats`/`export`, `dataset build --dry-run`, the source of a copy, replay with on_miss=error, the
training corpus) never creates, migrates or writes the file: sqlite's `mode=ro` (which, on a WAL
store in a writable folder, may still add the `-wal`/`-shm` files beside it); in a folder that
cannot be written (read-only media), where no sqlite writer can work either, `immutable=1`, which
needs no `-shm` file. A file without the meta table and format row is "not a tunelab measurement
store". `open_store(path, key)` opens at once, so a command refuses a bad store before any work,
naming its option (`hardware.store`, `--store`).
"""
from __future__ import annotations

import errno
import hashlib
import importlib
import json
import math
import os
import sqlite3
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tuning.core import plausible

FORMAT = 1
SOURCES = ("run", "remeasure", "dataset", "import", "value", "reread")  # value: the value function's improvement loop

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
    """A measurement store: the queries and their untrusted-input checks, whatever holds the rows.

    `MeasurementStore(location, busy_timeout_s, read_only)` gives the backend the location names: a
    `SqliteStore` for a path, a `PostgresStore` (tuning/store_postgres.py) for a postgresql:// URL.
    Either opens one connection per process on first use (safe to pass to workers: pickling drops
    it). A backend provides `_fetch`, `_stream`, `_write`, `_insert_many`, `_insert_ignore`, `_FIND`,
    `location`, `address`, `size_bytes`, `builder_lock`, `close`, and for `_check_format` `_format` and
    `_refuse_triggers`; queries here are written with `?` placeholders."""

    backend = ""
    _FIND = "instr"  # the SQL function giving a substring's position (0: absent)

    def __new__(cls, location=None, *args, **kwargs):
        if cls is MeasurementStore:
            named = location if location is not None else kwargs.get("path", kwargs.get("url"))
            cls = _postgres_class() if is_store_url(named) else SqliteStore
        return super().__new__(cls)

    def _start(self, busy_timeout_s: float, read_only: bool) -> None:
        """What every backend's __init__ sets: no connection yet (one per process, on first use)."""
        self.busy_timeout_s = busy_timeout_s
        self.read_only = read_only
        self._conn = None
        self._pid: int | None = None
        self._bounds: dict = {}  # (hardware, task) -> plausible.Bounds

    def __getstate__(self):
        return {**self.__dict__, "_conn": None, "_pid": None}

    def _check_format(self, conn) -> None:
        """No trigger (or rule), and this version's format row: the first checks of an untrusted store."""
        self._refuse_triggers(conn)
        found = self._format(conn)
        if found is None:
            raise StoreError(f"{self.location}: not a tunelab measurement store (no format row)")
        if found != str(FORMAT):
            raise StoreError(f"{self.location}: store format {found}, this tunelab reads format {FORMAT}")

    # ---- what a backend provides ----------------------------------------------------------------
    @property
    def location(self) -> str:
        """The store's name in messages (a URL without its password)."""
        raise NotImplementedError

    @property
    def address(self) -> str:
        """Where another process finds the store: a file's absolute path, a URL without its password."""
        raise NotImplementedError

    def _fetch(self, query: str, args=()) -> list:
        """Every row of a query; a damaged store is a StoreError in words."""
        raise NotImplementedError

    def _stream(self, query: str, args=(), size: int = 5000):
        """A query's rows in lists of at most `size`, read as they are consumed."""
        raise NotImplementedError

    def _write(self, statements: list, done=None) -> None:
        """(query, args) statements in one transaction. `done`, a (query, args) that finds the
        write's row, tells a backend that retries a write after a lost connection whether the
        lost attempt committed."""
        raise NotImplementedError

    def _insert_many(self, table: str, columns: tuple, rows: list, ignore: bool = False) -> None:
        """Rows into a table in one transaction (`ignore`: rows whose key is held are left out)."""
        raise NotImplementedError

    def _insert_ignore(self, table: str, columns: tuple) -> str:
        raise NotImplementedError

    def _stored(self, value):
        """A text value as this backend can store it."""
        return value

    def size_bytes(self) -> int:
        raise NotImplementedError

    def builder_lock(self, key: str = "--store"):
        """A context holding the store's one-builder lock (`dataset build`, `import`, `copy`): refused
        at once, naming the holder, while another builder holds it; freed however the builder ends."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # ---- writing ------------------------------------------------------------------------------
    def register(self, hardware: str, description: dict, task_key: str, task, space: str | None = None,
                 space_size: float | None = None) -> None:
        statements = []
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

    def add(self, hardware: str, task_key: str, space: str, config, decisions: dict, result,
            source: str = "run", measured_at: float | None = None) -> None:
        """One MeasureResult as one row, in its own transaction."""
        assert source in SOURCES, source
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
    def rows(self, hardware: str, task_key: str, space: str, config=None) -> list[Row]:
        """Rows in the order they were written (one config's, or the whole task's)."""
        query = ("SELECT config, costs, error, message, build_s, run_s, gauge_s, measured_at, source FROM readings "
                 "WHERE hardware = ? AND task = ? AND space = ?")
        args = [hardware, task_key, space]
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

    def first(self, hardware: str, task_key: str, space: str, config) -> Row | None:
        """The earliest row of a config: what a replay answers, whatever was added since."""
        rows = self.rows(hardware, task_key, space, config)
        return rows[0] if rows else None

    def configs(self, hardware: str, task_key: str, space: str) -> list[tuple]:
        """Every config with a row, in first-measured order."""
        seen: dict = {}
        for (text,) in self._fetch("SELECT config FROM readings WHERE hardware = ? AND task = ? AND space = ? "
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
        return {c: statistics.median(r) for c, r in self.readings(hardware, task_key, space, min_readings).items()}

    def readings(self, hardware: str, task_key: str, space: str, min_readings: int = 3) -> dict[tuple, list[float]]:
        """Every valid reading of each config of a task (configs with fewer are left out): what a
        truth is the median of, for intervals that count the store's own noise."""
        readings: dict = {}
        for row in self.rows(hardware, task_key, space):
            if row.ok:
                readings.setdefault(row.config, []).extend(row.costs)
        return {c: r for c, r in readings.items() if len(r) >= min_readings}

    def decisions(self, hardware: str, task_key: str, space: str) -> dict[tuple, dict]:
        """Each config's stored decisions, from its earliest row whose decisions parse (rows whose
        config or decisions do not parse are left out)."""
        found: dict = {}
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
        return [tuple(map(str, key)) for key in self._fetch("SELECT DISTINCT hardware, task, space FROM readings")]

    def task_info(self, task_key: str) -> dict | None:
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

    def hardware_info(self, hardware: str) -> dict:
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

    def measurement_seconds(self, hardware: str, limit: int = 500) -> list:
        """build_s + run_s of the hardware's latest `limit` rows (what a build estimates its time from)."""
        return [seconds for (seconds,) in self._fetch(
            "SELECT build_s + run_s FROM readings WHERE hardware = ? ORDER BY id DESC LIMIT ?", (hardware, limit))]


class SqliteStore(MeasurementStore):
    """One sqlite file; a connection per process, opened on first use (safe to pass to workers).
    `read_only` never creates, migrates or writes the file (see the module docstring)."""

    backend = "sqlite"

    def __init__(self, path: str | os.PathLike, busy_timeout_s: float = 120.0, read_only: bool = False):
        self.path = Path(path).expanduser()
        self._start(busy_timeout_s, read_only)

    @property
    def location(self) -> str:
        return str(self.path)

    @property
    def address(self) -> str:
        return str(self.path.resolve())

    def size_bytes(self) -> int:
        return self.path.stat().st_size

    @contextmanager
    def builder_lock(self, key: str = "--store"):
        """An OS lock on `<file>.build.lock`, beside the file itself (two paths to one store, a link,
        share it), holding the holder's pid for whoever is refused."""
        from tuning.run_folder import take_lock, write_holder  # the run folder's lock, not imported with every store

        resolved = self.path.resolve()
        lock = resolved.with_name(resolved.name + ".build.lock")
        try:
            handle, owner = take_lock(lock)
        except OSError as error:
            raise StoreError(f"{key}: cannot use the build lock {lock} ({error.strerror})") from None
        if owner is not None:
            raise StoreError(f"{key}: {self.path} is being filled by another build (pid {owner}); wait for it "
                             "to end (running the same build again then measures only what it did not)")
        try:
            write_holder(handle)
            yield
        finally:
            handle.close()  # closing the file drops the lock; the file stays (removing it would race a new build)

    # ---- connection ---------------------------------------------------------------------------
    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            self._conn = self._open_for_reading() if self.read_only else self._open_for_writing()
            self._pid = os.getpid()
        return self._conn

    def _open_for_writing(self) -> sqlite3.Connection:
        reason = unwritable(self.path)
        if reason:
            raise StoreError(f"{self.path} cannot be written: {reason}")
        if self.path.is_dir():
            raise StoreError(f"{self.path} is a folder, not a store file (e.g. {self.path / 'store.sqlite'})")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        except (OSError, sqlite3.Error) as error:
            raise self._failure(error) from None
        try:
            self._refuse_foreign(conn)  # before WAL: another program's database is left as it is
            self._use_wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            self._create_or_check(conn)
        except (sqlite3.Error, StoreError) as error:
            conn.close()
            raise (error if isinstance(error, StoreError) else self._failure(error)) from None
        return conn

    def _refuse_foreign(self, conn) -> None:
        """A file holding tables of its own and no format row is another program's database; a
        trigger (tunelab makes none) would run on the lab's writes."""
        if self._format(conn) is None and _tables(conn) - OWN_TABLES:
            raise StoreError(f"{self.path}: not a tunelab measurement store (a database without tunelab's "
                             "format row); nothing was written to it")
        self._refuse_triggers(conn)

    def _refuse_triggers(self, conn) -> None:
        triggers = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")]
        if triggers:
            raise StoreError(f"{self.path}: not a tunelab measurement store (it holds triggers, which tunelab "
                             f"never makes: {', '.join(map(str, triggers))}); nothing was written to it")

    def _use_wal(self, conn) -> None:
        """Switch a new file to WAL. Writers that open a new file at once race for it, and sqlite
        answers the losers "locked" at once rather than through the busy timeout: they try again."""
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as error:
                if getattr(error, "sqlite_errorname", "") != "SQLITE_BUSY" or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _create_or_check(self, conn) -> None:
        """The schema and format row of a new (empty) file, in one transaction so that a second
        writer opening the file meanwhile never sees half a store."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in filter(str.strip, _SCHEMA.split(";")):
                conn.execute(statement)
            if self._format(conn) is None:
                conn.execute("INSERT INTO meta VALUES ('format', ?)", (str(FORMAT),))
            self._check_store(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # sqlite may have rolled back already (a full disk)
                conn.execute("ROLLBACK")
            raise

    def _open_for_reading(self) -> sqlite3.Connection:
        if not self.path.is_file():
            what = ("a folder, not a store file" if self.path.is_dir() else
                    "not a regular file" if self.path.exists() else "no such file")
            raise StoreError(f"{self.path}: {what}")
        if not Path(f"{self.path}-wal").exists():
            self._check_untouched()
        try:
            return self._connect_read_only(immutable=False)
        except sqlite3.Error as error:
            if unwritable(self.path) is None:
                raise self._failure(error) from None
        try:  # read-only media: no -shm file can be made, and nothing can write the file either
            return self._connect_read_only(immutable=True)
        except sqlite3.Error as error:
            raise self._failure(error) from None

    def _check_untouched(self) -> None:
        """A file that no sqlite connection has open (no -wal beside it) is checked without adding
        anything beside it: `mode=ro` on another program's WAL database would create its -wal and
        -shm files before the check could refuse it."""
        try:
            self._connect_read_only(immutable=True).close()
        except sqlite3.Error as error:
            raise self._failure(error) from None

    def _connect_read_only(self, immutable: bool) -> sqlite3.Connection:
        uri = self.path.resolve().as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro")
        conn = sqlite3.connect(uri, uri=True, timeout=self.busy_timeout_s, isolation_level=None)
        try:
            self._check_store(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _format(self, conn) -> str | None:
        if "meta" not in _tables(conn):
            return None
        found = conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        return None if found is None else str(found[0])

    def _check_store(self, conn) -> None:
        """The format row, every table with the columns the lab reads, and no trigger (the file is
        untrusted)."""
        self._check_format(conn)
        tables = _tables(conn)
        for table, columns in COLUMNS.items():
            missing = (columns - {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
                       if table in tables else {"the table itself"})
            if missing:
                raise StoreError(f"{self.path}: not a tunelab measurement store (table {table} lacks "
                                 f"{', '.join(sorted(missing))})")

    def _failure(self, error: Exception) -> StoreError:
        """What went wrong with the file, in words: a full disk or a file that cannot be written is
        not "not a store"."""
        name = getattr(error, "sqlite_errorname", "") or ""
        if (name == "SQLITE_FULL" or getattr(error, "errno", None) == errno.ENOSPC
                or (name.startswith("SQLITE_IOERR") and _disk_full(self.path))):
            return StoreError(f"{self.path}: disk full ({error})")
        reason = unwritable(self.path)
        if reason and (not self.read_only or name.startswith("SQLITE_READONLY")):
            return StoreError(f"{self.path} cannot be written: {reason}")
        if isinstance(error, OSError) or name.startswith(("SQLITE_CANTOPEN", "SQLITE_IOERR", "SQLITE_PERM")):
            return StoreError(f"{self.path}: cannot open the store ({error})")
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            return StoreError(f"{self.path}: locked by another process for longer than {self.busy_timeout_s:g} s")
        return StoreError(f"{self.path}: not a tunelab measurement store ({error})")

    @contextmanager
    def _transaction(self):
        """One write transaction; a disk that fills up or a file that becomes read-only meanwhile is a
        StoreError in words, not sqlite's."""
        try:
            with self.conn:
                yield
        except sqlite3.Error as error:
            raise self._failure(error) from None

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None


    def _fetch(self, query: str, args=()) -> list:
        """Every row of a query; a damaged file (a corrupt page, a changed table) is a StoreError."""
        try:
            return self.conn.execute(query, args).fetchall()
        except sqlite3.Error as error:
            raise self._failure(error) from None

    def _stream(self, query: str, args=(), size: int = 5000):
        try:
            cursor = self.conn.execute(query, args)
            while rows := cursor.fetchmany(size):
                yield rows
        except sqlite3.Error as error:
            raise self._failure(error) from None

    def _write(self, statements: list, done=None) -> None:
        with self._transaction():
            for query, args in statements:
                self.conn.execute(query, args)

    def _insert_ignore(self, table: str, columns: tuple) -> str:
        return f"INSERT OR IGNORE INTO {table}({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"

    def _insert_many(self, table: str, columns: tuple, rows: list, ignore: bool = False) -> None:
        verb = "INSERT OR IGNORE" if ignore else "INSERT"
        with self._transaction():
            self.conn.executemany(f"{verb} INTO {table}({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                                  rows)


URL_SCHEMES = ("postgresql://", "postgresql+psycopg://", "postgres://")


def is_store_url(location) -> bool:
    """Whether `location` names a PostgreSQL store (a postgresql:// URL) rather than a sqlite file."""
    return isinstance(location, str) and location.strip().lower().startswith(URL_SCHEMES)


def display_location(location) -> str:
    """A store's location as messages and saved files may show it: a URL without its password."""
    if is_store_url(location):
        return _server_backend().without_password(location)
    return str(location)


def store_argument(text: str):
    """A command-line store option: a postgresql:// URL as it is, else a Path."""
    return text if is_store_url(text) else Path(text)


SERVER_BACKEND = "tuning.store_postgres"  # imported by name: that module builds on this one


def _server_backend():
    """The PostgreSQL backend's module, imported when a URL is first named."""
    return importlib.import_module(SERVER_BACKEND)


def _postgres_class():
    return _server_backend().PostgresStore


def connect_store(location, read_only: bool = False, busy_timeout_s: float = 120.0) -> MeasurementStore:
    """The store a path (sqlite) or a postgresql:// URL names; it connects on first use (open_store
    connects at once)."""
    return MeasurementStore(location, busy_timeout_s=busy_timeout_s, read_only=read_only)


def open_store(path, key: str, read_only: bool = False) -> MeasurementStore:
    """The store at `path` (a file, or a postgresql:// URL), opened now: a store that cannot be read
    (or, for a writer, written) is refused before any work, by a StoreError naming the option `key`
    it came from."""
    store = connect_store(path, read_only=read_only)
    try:
        store.conn
    except StoreError as error:
        raise StoreError(f"{key}: {error}") from None
    return store


@dataclass
class CopyCounts:
    """What `copy_store` did: readings copied, readings the target held already, readings no reader
    would accept (left behind), and the new rows of the describing tables (hardware, tasks, spaces,
    meta) with those that were not valid."""

    copied: int = 0
    held: int = 0
    unreadable: int = 0
    described: int = 0
    invalid: int = 0


def _text(value) -> bool:
    return isinstance(value, str)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_DESCRIBING = (  # table, columns, what a valid row holds
    ("meta", ("key", "value"), lambda r: _text(r[0]) and _text(r[1]) and r[0] != "format"),
    ("hardware", ("hash", "description"), lambda r: _text(r[0]) and _text(r[1])),
    ("tasks", ("key", "name", "flops", "workload"), lambda r: _text(r[0]) and _text(r[1]) and _number(r[2])
     and _text(r[3])),
    ("spaces", ("key", "size"), lambda r: _text(r[0]) and _number(r[1])),
)


def copy_store(source: MeasurementStore, target: MeasurementStore, chunk: int = 5000, progress=None) -> CopyCounts:
    """Every row of `source` that `target` lacks, into `target` (either backend to either).

    The describing tables first (a key the target holds keeps its row), then the readings in id
    order, as they are (not re-parsed, the target gives them new ids in the same order), `chunk` rows
    per transaction. The source is untrusted: only readings `_parse_row` accepts are copied (the
    rest count as unreadable), and a reading the target holds already (the same hardware, task,
    space, config, costs, error, message, measured_at and source) is skipped, so a copy that was
    killed resumes when run again. `progress(n)` is called after each chunk of n source rows."""
    counts = CopyCounts()
    for table, columns, valid in _DESCRIBING:
        rows = []
        for raw in source._fetch(f"SELECT {', '.join(columns)} FROM {table}"):
            row = tuple(map(target._stored, raw))
            if valid(row):
                rows.append(row)
            elif not (table == "meta" and row[0] == "format"):  # the target has its own
                counts.invalid += 1
        before = target._fetch(f"SELECT COUNT(*) FROM {table}")[0][0]
        target._insert_many(table, columns, rows, ignore=True)
        counts.described += target._fetch(f"SELECT COUNT(*) FROM {table}")[0][0] - before
    held: dict = {}  # (hardware, task, space) -> the target's readings of it, as identities
    for batch in source._stream(f"SELECT {', '.join(READING_COLUMNS)} FROM readings ORDER BY id", size=chunk):
        new = []
        for raw in batch:
            row = _copyable(tuple(map(target._stored, raw)), source)
            if row is None:
                counts.unreadable += 1
                continue
            key = row[:3]
            if key not in held:
                held[key] = set(map(tuple, target._fetch(
                    "SELECT config, costs, error, message, measured_at, source FROM readings "
                    "WHERE hardware = ? AND task = ? AND space = ?", key)))
            identity = (row[3], row[5], row[6], row[7], row[11], row[12])
            if identity in held[key]:
                counts.held += 1
                continue
            held[key].add(identity)
            new.append(row)
        if new:
            target._insert_many("readings", READING_COLUMNS, new)
        counts.copied += len(new)
        if progress:
            progress(len(batch))
    return counts


def _copyable(row: tuple, source: MeasurementStore) -> tuple | None:
    """A source reading as the target stores it (a missing message is ''), or None when a reader
    would skip it (or no store could hold it: a key or text that is not text)."""
    hardware, task, space, config, decisions, costs, error, message, build_s, run_s, gauge_s, measured_at, what = row
    if not (all(map(_text, (hardware, task, space, config, decisions, costs, what)))
            and (error is None or _text(error)) and (message is None or _text(message))):
        return None
    if _parse_row((config, costs, error, message, build_s, run_s, gauge_s, measured_at, what),
                  source.bounds(hardware, task)) is None:
        return None
    return (*row[:7], message or "", *row[8:])


def unwritable(path: Path) -> str | None:
    """Why a store at `path` cannot be written (its folder is needed too, for sqlite's -wal and
    -shm files), or None. Root passes every permission check but not a read-only file system."""
    folder = _existing_folder(path)
    if os.access(folder, os.W_OK) and (not path.exists() or os.access(path, os.W_OK)):
        return None
    try:
        read_only_media = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only_media = False
    return "read-only file system" if read_only_media else "permission denied"


def _disk_full(path: Path) -> bool:
    try:
        return os.statvfs(_existing_folder(path)).f_bavail == 0
    except OSError:
        return False


def _existing_folder(path: Path) -> Path:
    """The store's folder, or its nearest ancestor that exists (a writer makes the rest)."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _tables(conn) -> set[str]:
    return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if not name.startswith("sqlite_")}


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

    def holds(self, config, result) -> bool:
        """Whether this reading of `config` is stored already: the same costs, error and message (a
        run writes its rows with the store's clock, not its records', so the time cannot tell)."""
        return any(row.costs == list(result.costs) and row.error == result.error
                   and row.message == (result.message or "") for row in self.store.rows(*self.key, tuple(config)))


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
    except (TypeError, ValueError, RecursionError):  # RecursionError: a nesting bomb
        return None
    if not isinstance(value, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                              for c in value):
        return None
    return tuple(value)


def _parse_row(raw, limits: plausible.Bounds = plausible.ABSOLUTE) -> Row | None:
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
