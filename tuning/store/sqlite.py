"""The sqlite backend of the measurement store: one file (the contract and the shared readers:
tuning/store/base.py; the same store in PostgreSQL: tuning/store/postgres.py).

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
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path

from tuning.store.base import COLUMNS, FORMAT, OWN_TABLES, MeasurementStore, StoreError

SCHEMA = """
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
        from tuning.config.files import take_lock, write_holder  # the run folder's lock, not imported with every store

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
            for statement in filter(str.strip, SCHEMA.split(";")):
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


