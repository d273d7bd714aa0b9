"""Every measurement store backend passes the shipped contract suite (tuning.testing.store_contract):
the sqlite one here, PostgreSQL on a throwaway server (slow), and a backend written outside the
repository, run by pytest from another folder against the installed package, registered by its URL
scheme without an edit to any lab file."""
from __future__ import annotations

import itertools
import textwrap

import pytest

from helpers import write_and_run
from test_store_postgres import SKIP_REASON, pg  # noqa: F401 - pg: its throwaway server, a fixture
from tuning.store import SqliteStore, StoreError, backend_for, connect_store, register_backend
from tuning.testing.store_contract import StoreContract


class TestSqliteStore(StoreContract):
    def make_store(self, tmp_path, read_only=False):
        return SqliteStore(tmp_path / "store.sqlite", read_only=read_only)


_databases = itertools.count()


@pytest.mark.slow
@pytest.mark.skipif(bool(SKIP_REASON), reason=SKIP_REASON or "-")
class TestPostgresStore(StoreContract):
    """On the module's throwaway server (tests/test_store_postgres.py), a fresh database per test."""

    @pytest.fixture(autouse=True)
    def _server(self, pg):  # noqa: F811 - the imported fixture, asked for by name
        self.pg, self.urls = pg, {}

    def make_store(self, tmp_path, read_only=False):
        from tuning.store.postgres import PostgresStore

        url = self.urls.setdefault(tmp_path, self.pg.create_database(f"contract{next(_databases)}"))
        return PostgresStore(url, read_only=read_only)


# ---- a backend of the user's own ----------------------------------------------------------------
TOY_BACKEND = '''
"""A toy backend: one sqlite database in this process's memory per `memory://NAME`."""
import sqlite3
from contextlib import contextmanager

from tuning.store import MeasurementStore, StoreError
from tuning.store.base import FORMAT
from tuning.store.sqlite import SCHEMA

_KEEP = {}  # name -> a connection that keeps the shared in-memory database alive


class MemoryStore(MeasurementStore):
    backend = "memory"
    schemes = ("memory",)

    def __init__(self, location, busy_timeout_s=120.0, read_only=False):
        self.name = str(location).split("://", 1)[1]
        self._start(busy_timeout_s, read_only)

    @property
    def location(self):
        return f"memory://{self.name}"

    @property
    def address(self):
        return self.location

    @property
    def conn(self):
        if self._conn is None:
            uri = f"file:{self.name}?mode=memory&cache=shared"
            _KEEP.setdefault(self.name, sqlite3.connect(uri, uri=True))
            self._conn = sqlite3.connect(uri, uri=True)
            tables = {n for (n,) in self._conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if self.read_only:
                if "meta" not in tables:
                    raise StoreError(f"{self.location}: not a tunelab measurement store (no format row)")
                self._conn.execute("PRAGMA query_only = ON")
            elif not tables:
                self._conn.executescript(SCHEMA)
                self._conn.execute("INSERT INTO meta(key, value) VALUES ('format', ?)", (str(FORMAT),))
                self._conn.commit()
        return self._conn

    def _fetch(self, query, args=()):
        try:
            return self.conn.execute(query, args).fetchall()
        except sqlite3.Error as error:
            raise StoreError(f"{self.location}: {error}") from None

    def _stream(self, query, args=(), size=5000):
        yield self._fetch(query, args)

    def _write(self, statements, done=None):
        try:
            with self.conn:
                for query, args in statements:
                    self.conn.execute(query, args)
        except sqlite3.Error as error:
            raise StoreError(f"{self.location} cannot be written ({error})") from None

    def _insert_ignore(self, table, columns):
        return f"INSERT OR IGNORE INTO {table}({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"

    def _insert_many(self, table, columns, rows, ignore=False):
        verb = "INSERT OR IGNORE" if ignore else "INSERT"
        try:
            with self.conn:
                self.conn.executemany(f"{verb} INTO {table}({', '.join(columns)}) VALUES "
                                      f"({', '.join('?' * len(columns))})", rows)
        except sqlite3.Error as error:
            raise StoreError(f"{self.location} cannot be written ({error})") from None

    def size_bytes(self):
        return 0

    @contextmanager
    def builder_lock(self, key="--store"):
        yield

    def close(self):
        if self._conn is not None:
            self._conn.close()
        self._conn = None
'''

TOY_TEST = '''
import itertools

from memory_store import MemoryStore
from tuning.store import connect_store, register_backend
from tuning.testing.store_contract import StoreContract

register_backend("memory", MemoryStore)
_names = itertools.count()


class TestMemoryStore(StoreContract):
    def make_store(self, tmp_path, read_only=False):
        return connect_store(f"memory://{tmp_path.name}-{tmp_path.parent.name}", read_only=read_only)
'''


def test_a_backend_written_elsewhere_passes_the_shipped_suite(tmp_path):
    (tmp_path / "memory_store.py").write_text(textwrap.dedent(TOY_BACKEND))
    run = write_and_run(tmp_path, "test_memory_store.py", TOY_TEST, pythonpath=[tmp_path])
    assert run.returncode == 0, run.tail(3000)
    assert f"{len([n for n in dir(StoreContract) if n.startswith('test_')])} passed" in run.stdout, run.stdout[-500:]


def test_a_location_names_its_backend_by_scheme_and_an_unknown_one_is_refused(monkeypatch, tmp_path):
    assert backend_for(tmp_path / "s.sqlite") is SqliteStore
    assert backend_for("postgresql://lab@db/x").__name__ == "PostgresStore"
    with pytest.raises(StoreError, match=r"no store backend for nosuch://"):
        connect_store("nosuch://x")
    monkeypatch.setattr("tuning.store.open.BACKENDS", {})
    register_backend("nosuch", "tuning.store.sqlite:SqliteStore")
    assert backend_for("nosuch://x") is SqliteStore


def test_the_suite_fails_a_backend_that_breaks_the_contract(tmp_path):
    """The suite can fail: a backend whose readers drop a column's value is caught."""

    class Forgetful(SqliteStore):
        def _fetch(self, query, args=()):
            return [tuple(None if isinstance(v, float) and v > 1e8 else v for v in row)
                    for row in super()._fetch(query, args)]

    class Check(StoreContract):
        def make_store(self, tmp_path, read_only=False):
            return Forgetful(tmp_path / "store.sqlite", read_only=read_only)

    check = Check()
    store, reference = check.make_store(tmp_path), SqliteStore(tmp_path / "reference.sqlite")
    from tuning.testing.store_contract import TASKS, measured, raw_rows, write

    for each in (store, reference):
        write(each, measured(TASKS[0], 3))
    assert raw_rows(store) != raw_rows(reference)
