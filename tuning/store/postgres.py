"""The measurement store in a PostgreSQL database: many writers on many nodes, one store (docs/store.md).

`MeasurementStore(url)` (or `connect_store`/`open_store`) with `postgresql://user@host:port/db`
(also `postgresql+psycopg://`, libpq's parameters after `?`) gives a `PostgresStore`. Its tables,
columns, keys, format row and index are the sqlite store's, and every query and check of what is
read back is `MeasurementStore`'s (tuning/store/base.py): the same writes give the same rows and keys.
What differs is how it connects and fails:

- psycopg 3 is an optional dependency (`pip install 'tunelab[cluster]'`), imported on first use.
- One connection per process, opened on first use, in autocommit: each `add` and `register` is one
  short transaction; a reader's every query is its own statement and sees its own consistent
  snapshot (two queries may see different rows when a writer adds rows between them).
  `readings.id` is a BIGSERIAL: rows are ordered by when their insert ran.
- A writer creates the tables and format row of an empty database under a transaction-level
  advisory lock, so writers opening a new database at once never see half a store; a database
  holding other tables but no format row is another program's and is refused, untouched. A store
  that is complete already is only checked (a writer needs no CREATE privilege then).
- A reader (`read_only=True`) makes its connection read-only (`SET default_transaction_read_only =
  on`: a write fails) and never creates or changes anything; a database without the format row
  is "not a tunelab measurement store". The tables, the columns the lab reads and the absence of
  triggers and rules are checked as for sqlite; the rows are untrusted and parsed the same way.
- It asks libpq for SCRAM or no authentication (`require_auth`, unless the URL sets it): a server
  that asks for the password in clear text or as an MD5 hash is refused before it is sent.
- A server that cannot be reached, a database that does not exist or a refused login is a
  StoreError naming the URL without its password. Once this store reached its server, a lost
  connection (a restart, a failover) is retried with backoff for `busy_timeout_s`: a write that
  was under way is written once (if the lost attempt committed, the row is found and not written
  again), so a server restart mid-run loses no reading. After that it is a StoreError.
- Text holding NUL characters (which PostgreSQL's text cannot hold) is stored with U+FFFD in
  their place.
- `builder_lock()` is `dataset build`'s one-builder lock: an advisory lock (pg_advisory_lock, held by
  a connection until it is released or that connection ends) on a key derived from the store,
  refused at once naming the holder (tuning/tools/dataset.py).
"""
from __future__ import annotations

import hashlib
import os
import socket
import time
from contextlib import contextmanager
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from tuning.store.base import COLUMNS, FORMAT, OWN_TABLES, MeasurementStore, StoreError

CONNECT_TIMEOUT_S = 10  # libpq's connect_timeout unless the URL sets one
INSTALL = "pip install 'tunelab[cluster]'"

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS hardware(hash TEXT PRIMARY KEY, description TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS tasks(key TEXT PRIMARY KEY, name TEXT NOT NULL, flops DOUBLE PRECISION NOT NULL, "
    "workload TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS spaces(key TEXT PRIMARY KEY, size DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS readings("
    " id BIGSERIAL PRIMARY KEY,"
    " hardware TEXT NOT NULL, task TEXT NOT NULL, space TEXT NOT NULL, config TEXT NOT NULL,"
    " decisions TEXT NOT NULL, costs TEXT NOT NULL, error TEXT, message TEXT NOT NULL DEFAULT '',"
    " build_s DOUBLE PRECISION NOT NULL, run_s DOUBLE PRECISION NOT NULL, gauge_s DOUBLE PRECISION,"
    " measured_at DOUBLE PRECISION NOT NULL, source TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS readings_key ON readings(hardware, task, space, config)",
)
TABLE_KINDS = ("r", "p")  # pg_class.relkind of a table (plain, partitioned)
RELATION_KINDS = ("r", "p", "v", "m", "f")  # ... and of views and foreign tables: what a database "holds"
LOST = ("57P01", "57P02", "57P03", "40001", "40P01", "53300")  # shutdown, starting up, retry, too many clients


def _lock_key(text: str) -> int:
    """A positive 60-bit advisory lock key."""
    return int(hashlib.sha1(text.encode()).hexdigest()[:15], 16)


SCHEMA_LOCK = _lock_key("tunelab measurement store: creating the schema")


def _psycopg(location: str):
    try:
        import psycopg
    except ImportError:
        raise StoreError(f"{location}: a PostgreSQL store needs psycopg 3, which is not installed "
                         f"({INSTALL})") from None
    return psycopg


# libpq's require_auth unless the URL sets it: a server that asks for the password in clear text or as
# an MD5 hash gets nothing (SCRAM proves the password without sending it); `none` still lets in a server
# that asks for no password (trust, peer). libpq reads it from version 16 on.
REQUIRE_AUTH = "scram-sha-256,none"
_warned_old_libpq: list = []


def _auth_setting(psycopg) -> dict:
    if psycopg.pq.version() >= 160000:
        return {"require_auth": REQUIRE_AUTH}
    if not _warned_old_libpq:
        _warned_old_libpq.append(True)
        import warnings

        warnings.warn(f"libpq {psycopg.pq.version()} cannot refuse a server that asks for a clear-text password "
                      "(require_auth needs libpq 16): pip install 'psycopg[binary]' brings one that can", stacklevel=3)
    return {}


def auth_connect_args(url: str) -> dict:
    """The same require_auth for a SQLAlchemy URL's connections (Optuna's studies), where its driver's
    libpq reads it: psycopg (`postgresql+psycopg://`) or psycopg2 (plain `postgresql://`)."""
    driver = url.split("://", 1)[0].partition("+")[2] or "psycopg2"
    try:
        if driver == "psycopg":
            import psycopg
            version = psycopg.pq.version()
        else:
            import psycopg2.extensions
            version = psycopg2.extensions.libpq_version()
    except ImportError:  # the driver's own error says so when SQLAlchemy loads it
        return {}
    return {"require_auth": REQUIRE_AUTH} if version >= 160000 else {}


def _libpq_url(url: str) -> str:
    """The URL libpq reads: SQLAlchemy's postgresql+psycopg:// is postgresql://."""
    url = url.strip()
    scheme, _, rest = url.partition("://")
    return f"postgresql://{rest}" if scheme.lower() in ("postgresql+psycopg", "postgres") else url


def without_password(url: str) -> str:
    """The URL as messages and saved files show it: no password (in the user part or a parameter)."""
    parts = urlsplit(_libpq_url(url))
    userinfo, at, hosts = parts.netloc.rpartition("@")
    netloc = f"{userinfo.partition(':')[0]}@{hosts}" if at else hosts
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "password"])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _secrets(url: str) -> list[str]:
    parts = urlsplit(_libpq_url(url))
    userinfo = parts.netloc.rpartition("@")[0]
    found = [userinfo.partition(":")[2]] if ":" in userinfo else []
    found += [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "password"]
    return [s for secret in found for s in {secret, unquote(secret)} if s]


def _sql(query: str) -> str:
    """A query written with sqlite's `?` placeholders in psycopg's `%s` style (the lab's queries hold
    no other `?` or `%`)."""
    assert "%" not in query, query
    return query.replace("?", "%s")


class PostgresStore(MeasurementStore):
    """One PostgreSQL database (its current schema, normally `public`); see the module docstring."""

    backend = "postgresql"
    schemes = ("postgresql", "postgresql+psycopg", "postgres")
    _FIND = "strpos"

    def __init__(self, url: str, busy_timeout_s: float = 120.0, read_only: bool = False):
        self.url = _libpq_url(str(url))
        self._start(busy_timeout_s, read_only)
        self._reached = False  # a connection was made once: losing one later is waited out

    @classmethod
    def display(cls, location) -> str:
        return without_password(str(location))

    @property
    def location(self) -> str:
        return without_password(self.url)

    @property
    def address(self) -> str:
        return self.location

    # ---- connection ---------------------------------------------------------------------------
    @property
    def conn(self):
        """This process's connection (opened, and the store checked or created, on first use)."""
        psycopg = _psycopg(self.location)
        try:
            return self._connection()
        except psycopg.Error as error:
            raise self._failure(error) from None

    def _connection(self):
        if self._conn is None or self._pid != os.getpid() or self._conn.closed:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None  # another process's connection is left to it
            self._conn = self._open()
            self._pid = os.getpid()
            self._reached = True
        return self._conn

    def _connect(self, **settings):
        """A new autocommit connection (psycopg errors propagate)."""
        psycopg = _psycopg(self.location)
        try:
            given = psycopg.conninfo.conninfo_to_dict(self.url)
        except psycopg.ProgrammingError as error:
            raise StoreError(f"{self.location}: not a PostgreSQL URL ({self._words(error)})") from None
        defaults = {"connect_timeout": CONNECT_TIMEOUT_S, "application_name": "tunelab", **_auth_setting(psycopg)}
        extra = {k: v for k, v in defaults.items() if k not in given}
        return psycopg.connect(self.url, autocommit=True, **{**extra, **settings})

    def _open(self):
        conn = self._connect()
        try:
            if self.read_only:
                conn.execute("SET default_transaction_read_only = on")
                self._check_store(conn)
            else:
                self._create_or_check(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _create_or_check(self, conn) -> None:
        """A complete store is only checked; else its schema and format row are made under an
        advisory lock, in one transaction, so that writers opening a new database at once never see
        half a store (and never race CREATE TABLE, which PostgreSQL does not make safe by itself)."""
        psycopg = _psycopg(self.location)
        unfinished = (StoreError, psycopg.errors.UndefinedColumn, psycopg.errors.UndefinedTable)
        try:
            self._check_store(conn)
            return
        except unfinished:
            pass
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            try:  # another writer may have made it meanwhile (a savepoint: a failed check leaves the lock held)
                with conn.transaction():
                    self._check_store(conn)
                return
            except unfinished:
                pass
            self._refuse_foreign(conn)
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute("INSERT INTO meta(key, value) VALUES ('format', %s) ON CONFLICT DO NOTHING", (str(FORMAT),))
            self._check_store(conn)

    def _relations(self, conn) -> dict[str, str]:
        """The current schema's tables, views and foreign tables: name -> pg_class.relkind."""
        return dict(conn.execute(
            "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind::text = ANY(%s)", (list(RELATION_KINDS),)).fetchall())

    def _format(self, conn) -> str | None:
        if self._relations(conn).get("meta") not in TABLE_KINDS:
            return None
        found = conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        return None if found is None else str(found[0])

    def _refuse_foreign(self, conn) -> None:
        """A database holding tables of its own and no format row is another program's."""
        if self._format(conn) is None and set(self._relations(conn)) - OWN_TABLES:
            raise StoreError(f"{self.location}: not a tunelab measurement store (a database without tunelab's "
                             "format row); nothing was written to it")
        self._refuse_triggers(conn)

    def _refuse_triggers(self, conn) -> None:
        found = [name for (name,) in conn.execute(
            "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND NOT t.tgisinternal AND c.relname::text = ANY(%s) "
            "UNION ALL SELECT rulename::text FROM pg_rules WHERE schemaname = current_schema() "
            "AND tablename::text = ANY(%s)",
            (sorted(OWN_TABLES), sorted(OWN_TABLES))).fetchall()]
        if found:
            raise StoreError(f"{self.location}: not a tunelab measurement store (it holds triggers or rules, which "
                             f"tunelab never makes: {', '.join(map(str, found))}); nothing was written to it")

    def _check_store(self, conn) -> None:
        """The format row, every table with the columns the lab reads, and no trigger or rule (the
        database is untrusted)."""
        self._check_format(conn)
        relations = self._relations(conn)
        have: dict = {}
        for table, column in conn.execute("SELECT table_name, column_name FROM information_schema.columns "
                                          "WHERE table_schema = current_schema()").fetchall():
            have.setdefault(table, set()).add(column)
        for table, columns in COLUMNS.items():
            missing = (columns - have.get(table, set()) if relations.get(table) in TABLE_KINDS
                       else {"the table itself"})
            if missing:
                raise StoreError(f"{self.location}: not a tunelab measurement store (table {table} lacks "
                                 f"{', '.join(sorted(missing))})")

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None

    def _drop(self) -> None:
        try:
            self.close()
        except Exception:  # a broken connection may fail to close; it is gone either way
            self._conn = None

    # ---- failures -----------------------------------------------------------------------------
    def _words(self, error: Exception) -> str:
        """An error's message on one line, without the URL's password."""
        words = " ".join(str(error).split())
        for secret in _secrets(self.url):
            words = words.replace(secret, "***")
        return words

    def _lost(self, error: Exception) -> bool:
        """Whether the error is the connection's (the server went away or is not back yet), not the
        statement's."""
        psycopg = _psycopg(self.location)
        state = getattr(error, "sqlstate", None) or ""
        if state.startswith("08") or state in LOST:
            return True
        if state:
            return False
        return isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError))

    def _failure(self, error: Exception) -> StoreError:
        """What went wrong, in words, naming the store without its password."""
        psycopg = _psycopg(self.location)
        words, where = self._words(error), self.location
        state = getattr(error, "sqlstate", None) or ""
        if state == "53100":
            return StoreError(f"{where}: disk full ({words})")
        if state == "42501":
            return StoreError(f"{where}{':' if self.read_only else ' cannot be written:'} permission denied ({words})")
        if state == "25006":
            return StoreError(f"{where} cannot be written: a read-only connection ({words})")
        if state.startswith(("42", "22", "23")):
            return StoreError(f"{where}: not a tunelab measurement store ({words})")
        if not state and isinstance(error, psycopg.OperationalError):
            if "does not exist" in words and "database" in words:
                return StoreError(f"{where}: no such database ({words})")
            if "authentication failed" in words or ("role" in words and "does not exist" in words):
                return StoreError(f"{where}: login refused ({words})")
            return StoreError(f"{where}: cannot reach the PostgreSQL server ({words})")
        return StoreError(f"{where}: {words}")

    def _retrying(self, work, retry: bool = True):
        """work(connection, retried) -> its value. A lost connection (once the server was reached)
        is reopened with backoff until `busy_timeout_s` has passed, then it is a StoreError."""
        psycopg = _psycopg(self.location)
        deadline, delay, retried = None, 0.05, False
        while True:
            try:
                return work(self._connection(), retried)
            except psycopg.Error as error:
                if not (retry and self._reached and self._lost(error)):
                    raise self._failure(error) from None
                self._drop()
                now = time.monotonic()
                deadline = deadline or now + self.busy_timeout_s
                if now >= deadline:
                    raise StoreError(f"{self.location}: lost the PostgreSQL server, which did not answer again "
                                     f"within {self.busy_timeout_s:g} s ({self._words(error)})") from None
                time.sleep(min(delay, deadline - now))
                delay, retried = min(2 * delay, 1.0), True

    # ---- statements ---------------------------------------------------------------------------
    def _stored(self, value):
        if not isinstance(value, str):
            return value
        if "\x00" in value:
            value = value.replace("\x00", "\ufffd")
        try:
            value.encode()
        except UnicodeEncodeError:  # lone surrogates
            value = value.encode(errors="replace").decode()
        return value

    def _values(self, args) -> tuple:
        return tuple(map(self._stored, args))

    def _fetch(self, query: str, args=()) -> list:
        return self._retrying(lambda conn, _: conn.execute(_sql(query), self._values(args)).fetchall())

    def _stream(self, query: str, args=(), size: int = 5000):
        """A server-side cursor in one transaction: one snapshot, read `size` rows at a time."""
        psycopg = _psycopg(self.location)
        conn = self.conn
        try:
            with conn.transaction(), conn.cursor(name=f"tunelab_stream_{os.getpid()}") as cursor:
                cursor.execute(_sql(query), self._values(args))
                while rows := cursor.fetchmany(size):
                    yield rows
        except psycopg.Error as error:
            raise self._failure(error) from None

    def _write(self, statements: list, done=None) -> None:
        def work(conn, retried):
            if retried and done is not None and conn.execute(_sql(done[0]), self._values(done[1])).fetchone():
                return  # the lost attempt had committed
            with conn.transaction():
                for query, args in statements:
                    conn.execute(_sql(query), self._values(args))

        self._retrying(work)

    def _insert_ignore(self, table: str, columns: tuple) -> str:
        return (f"INSERT INTO {table}({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
                "ON CONFLICT DO NOTHING")

    def _insert_many(self, table: str, columns: tuple, rows: list, ignore: bool = False) -> None:
        """`ignore`: executemany (pipelined), retried like any write (it is idempotent); else COPY,
        not retried (a copy that fails is run again: it skips what was written)."""
        rows = [self._values(row) for row in rows]

        def work(conn, _):
            with conn.transaction(), conn.cursor() as cursor:
                if ignore:
                    cursor.executemany(_sql(self._insert_ignore(table, columns)), rows)
                    return
                with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)

        self._retrying(work, retry=ignore)

    def size_bytes(self) -> int:
        (size,) = self._fetch("SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                              "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() "
                              "AND c.relkind = 'r' AND c.relname::text = ANY(?)", (sorted(OWN_TABLES),))[0]
        return int(size)

    # ---- one builder ---------------------------------------------------------------------------
    @contextmanager
    def builder_lock(self, key: str = "--store"):
        """Hold the store's build lock: an advisory lock held by a connection of its own, dropped
        when the build ends or its process dies (the server drops a closed connection's locks).
        Refused at once while another builder holds it, naming it (its pid and host when the server
        shows them)."""
        psycopg = _psycopg(self.location)
        me = f"tunelab build (pid {os.getpid()} on {socket.gethostname()})"
        try:
            conn = self._connect(application_name=me[:63])
        except psycopg.Error as error:
            raise StoreError(f"{key}: {self._failure(error)}") from None
        try:
            (where,) = conn.execute("SELECT current_database() || '.' || current_schema()").fetchone()
            lock = _lock_key(f"tunelab build lock: {where}")
            (got,) = conn.execute("SELECT pg_try_advisory_lock(%s)", (lock,)).fetchone()
            if not got:
                holder = self._holder(conn, lock)
                raise StoreError(f"{key}: {self.location} is being filled by another build ({holder}); wait for it "
                                 "to end (running the same build again then measures only what it did not)")
        except psycopg.Error as error:
            conn.close()
            raise StoreError(f"{key}: {self._failure(error)}") from None
        except BaseException:
            conn.close()
            raise
        try:
            yield
        finally:
            try:
                conn.execute("SELECT pg_advisory_unlock(%s)", (lock,))
                conn.close()
            except psycopg.Error:  # a lost connection has dropped the lock already
                pass

    @staticmethod
    def _holder(conn, lock: int) -> str:
        """Who holds the lock, as pg_stat_activity shows it (another role's connection may be hidden)."""
        found = conn.execute(
            "SELECT a.application_name, a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND l.classid::bigint = %s AND l.objid::bigint = %s AND l.objsubid = 1",
            (lock >> 32, lock & 0xFFFFFFFF)).fetchone()
        if found is None:
            return "another builder"
        name, backend = found
        name = str(name or "")
        if name.startswith("tunelab build (") and name.endswith(")"):
            return name[len("tunelab build ("):-1]
        return f"another builder: PostgreSQL backend pid {backend}{f', {name}' if name else ''}"

