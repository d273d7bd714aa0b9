"""The measurement store in PostgreSQL (tuning/store/postgres.py) and copying stores between backends.

The checks that need a server run on a throwaway PostgreSQL (tuning/cluster/hosts.py, one for the
module, a fresh database per test) and are in the slow set; they skip where PostgreSQL or psycopg
is not installed. The rest (naming a store by URL, an unreachable server, psycopg missing, copying
between two sqlite files) need no server and run by default.
"""
from __future__ import annotations

import importlib.util
import itertools
import multiprocessing
import os
import signal
import socket
import sys
import time
from dataclasses import replace
from itertools import islice
from pathlib import Path

import pytest

from tuning.core.measure import MeasureSpec
from tuning.core.records import MeasureResult
from tuning.core.task import gemm_task
from tuning.hardware.replay import ReplayHardware
from tuning.hardware.synthetic import SyntheticHardware
from tuning.store import (
    READING_COLUMNS,
    MeasurementStore,
    SqliteStore,
    StoreError,
    TaskRows,
    connect_store,
    copy_store,
    is_store_url,
    open_store,
)
from tuning.testing.store_contract import answers
from tuning.tools import dataset

TASK = gemm_task("gemm_64", 64, 64, 64)
OTHER = gemm_task("gemm_32", 32, 32, 32)
SPEC = MeasureSpec(repeat=3)
SECRET = "s3cr3t-pw"


HAVE_PSYCOPG = importlib.util.find_spec("psycopg") is not None


def _server_available() -> str:
    """Why the server tests cannot run here ('' when they can)."""
    if not HAVE_PSYCOPG:
        return "psycopg is not installed (pip install 'tunelab[cluster]')"
    from tuning.cluster.hosts import postgres_bin

    try:
        postgres_bin()
    except RuntimeError as error:
        return str(error)
    return ""


SKIP_REASON = _server_available()


def needs_server(test):
    """A test on the module's PostgreSQL: slow, skipped without PostgreSQL or psycopg."""
    return pytest.mark.slow(pytest.mark.skipif(bool(SKIP_REASON), reason=SKIP_REASON or "-")(test))


needs_psycopg = pytest.mark.skipif(not HAVE_PSYCOPG, reason="psycopg is not installed")


# ---- what is written ---------------------------------------------------------------------------
def readings(task=TASK, count: int = 12, start: float = 1.7e9) -> list[tuple]:
    """(task, config, MeasureResult, measured_at) of `count` configs measured on the synthetic
    backend, each config twice, plus an error row: the same list every call."""
    backend = SyntheticHardware(noise=0.2)
    space = backend.space(task)
    configs = list(dict.fromkeys(space.canonical(c) for c in islice(space.enumerate(), 64 * count)))[:count]
    results = backend.measure(task, configs, SPEC) + backend.measure(task, configs, SPEC)
    written = [(task, c, replace(r, gauge_s=1e-3 * (1 + i % 7 / 50)), start + i)
               for i, (c, r) in enumerate(zip(configs + configs, results))]
    written.append((task, configs[0], MeasureResult.failed("build", "no such intrinsic"), start + len(written)))
    return written


def write(store, items) -> dict:
    """Each item added through TaskRows (as a run writes); the tables by task."""
    backend, tables = SyntheticHardware(noise=0.2), {}
    for task, config, result, measured_at in items:
        if task.key not in tables:
            tables[task.key] = TaskRows(store, backend, SPEC, task, backend.space(task))
        tables[task.key].add(config, result, "dataset", measured_at=measured_at)
    return tables


def raw_rows(store) -> dict:
    """Every table's rows as they are (readings without their ids, in id order)."""
    return {"readings": store._fetch(f"SELECT {', '.join(READING_COLUMNS)} FROM readings ORDER BY id"),
            "hardware": sorted(store._fetch("SELECT hash, description FROM hardware")),
            "tasks": sorted(store._fetch("SELECT key, name, flops, workload FROM tasks")),
            "spaces": sorted(store._fetch("SELECT key, size FROM spaces")),
            "meta": sorted(store._fetch("SELECT key, value FROM meta"))}


def add_garbage(conn, hardware: str, task: str, space: str, placeholder: str = "?") -> int:
    """Rows no reader accepts, written past the store (an untrusted store); how many."""
    bad = [("[1, 2]", "[NaN]", 0.1), ("[1, 2]", "[-1.0]", 0.1), ("[1, 2]", "[1e9]", 0.1), ("\"x\"", "[0.001]", 0.1),
           ("[1, -2]", "[0.001]", 0.1), ("[1, 2]", "{\"a\": 1}", 0.1), ("[1, 2]", "[]", 0.1),
           ("[1, 2]", "[0.001]", float("inf")), ("[1, 2]", "[0.001]", -1.0)]
    for config, costs, build_s in bad:
        conn.execute("INSERT INTO readings(hardware, task, space, config, decisions, costs, error, message, build_s, "
                     "run_s, gauge_s, measured_at, source) VALUES "
                     f"({', '.join([placeholder] * 13)})",
                     (hardware, task, space, config, "{}", costs, None, "", build_s, 0.1, None, 1.0, "dataset"))
    return len(bad)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---- no server -----------------------------------------------------------------------------------
def test_a_store_is_named_by_a_path_or_a_postgresql_url(tmp_path):
    from tuning.store.postgres import PostgresStore, without_password

    assert is_store_url("postgresql://u@h/db") and is_store_url("postgresql+psycopg://u@h/db")
    assert not is_store_url(str(tmp_path / "store.sqlite")) and not is_store_url(tmp_path / "x")
    assert type(connect_store(tmp_path / "store.sqlite")) is SqliteStore
    store = connect_store(f"postgresql+psycopg://lab:{SECRET}@db.example:5433/runs?sslmode=prefer", read_only=True)
    assert isinstance(store, PostgresStore) and isinstance(store, MeasurementStore) and store.read_only
    assert store.url.startswith("postgresql://") and store._conn is None  # nothing connects before first use
    assert store.location == store.address == "postgresql://lab@db.example:5433/runs?sslmode=prefer"
    assert without_password(f"postgresql://lab@h/db?password={SECRET}&connect_timeout=3") == \
        "postgresql://lab@h/db?connect_timeout=3"
    import pickle

    again = pickle.loads(pickle.dumps(store))
    assert type(again) is PostgresStore and again.url == store.url and again._conn is None


@needs_psycopg
def test_an_unreachable_server_is_a_store_error_naming_the_key_without_the_password():
    port = closed_port()
    started = time.monotonic()
    with pytest.raises(StoreError) as refused:
        open_store(f"postgresql://lab:{SECRET}@127.0.0.1:{port}/runs?connect_timeout=2", "hardware.store")
    message = str(refused.value)
    assert time.monotonic() - started < 5
    assert message.startswith(f"hardware.store: postgresql://lab@127.0.0.1:{port}/runs")
    assert "cannot reach the PostgreSQL server" in message and SECRET not in message


def test_without_psycopg_a_postgresql_store_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` raises ImportError
    with pytest.raises(StoreError, match=r"--store: postgresql://lab@h/db: .*pip install 'tunelab\[cluster\]'"):
        open_store(f"postgresql://lab:{SECRET}@h/db", "--store")


def test_a_replay_of_a_postgresql_store_is_not_checked_as_a_file():
    params = {"store": "postgresql://lab@db/runs", "create": False, "on_miss": "measure",
              "backend": {"_target_": "tuning.hardware.synthetic.SyntheticHardware"}}
    assert not any("no such file" in problem or "cannot be written" in problem
                   for problem in ReplayHardware.check(params, "hardware"))
    args = dataset.parse_args(["copy", "--store", "postgresql://lab@db/runs", "--to", "x.sqlite"])
    assert args.store == "postgresql://lab@db/runs" and args.to == "x.sqlite"


def test_copy_between_two_sqlite_files_skips_garbage_and_what_the_target_holds(tmp_path, capsys):
    source, target = tmp_path / "source.sqlite", tmp_path / "target.sqlite"
    store = connect_store(source)
    tables = write(store, readings())
    bad = add_garbage(store.conn, *tables[TASK.key].key)
    store.close()
    dataset.main(["copy", "--store", str(source), "--to", str(target)])
    assert "copied 25 readings" in capsys.readouterr().out
    copied = connect_store(target, read_only=True)
    original = connect_store(source, read_only=True)
    assert original.unreadable() == bad and copied.unreadable() == 0
    clean = connect_store(tmp_path / "clean.sqlite")
    write(clean, readings())
    assert answers(copied) == answers(clean) and raw_rows(copied) == raw_rows(clean)
    dataset.main(["copy", "--store", str(source), "--to", str(target)])
    out = capsys.readouterr().out
    assert "copied 0 readings" in out and f"skipped 25 it held already and {bad} unreadable" in out
    with pytest.raises(SystemExit):
        dataset.main(["copy", "--store", str(source), "--to", str(source)])
    assert "is the store copied from" in capsys.readouterr().err


# ---- a PostgreSQL server -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pg(tmp_path_factory):
    from tuning.cluster.hosts import Postgres

    folder = tmp_path_factory.mktemp("pg")
    if os.geteuid() == 0:  # the server runs as the postgres user, which must reach its folder
        base = tmp_path_factory.getbasetemp().parent
        for parent in [folder.parent, *folder.parent.parents]:
            if parent == base.parent:
                break
            parent.chmod(parent.stat().st_mode | 0o001)
    server = Postgres(folder).start()
    yield server
    server.stop()


_numbers = itertools.count()


@pytest.fixture
def url(pg):
    """A fresh, empty database."""
    return pg.create_database(f"store{next(_numbers)}")


def with_password(url: str) -> str:
    return url.replace("tunelab@", f"tunelab:{SECRET}@", 1)


@needs_server
def test_the_same_writes_give_the_same_rows_and_keys_as_sqlite(url, tmp_path):
    items = readings() + readings(OTHER, 5, start=1.8e9)
    sqlite_store, pg_store = connect_store(tmp_path / "store.sqlite"), open_store(url, "--store")
    for store in (sqlite_store, pg_store):
        write(store, items)
    assert answers(pg_store) == answers(sqlite_store)
    assert raw_rows(pg_store) == raw_rows(sqlite_store)
    reader = open_store(url, "--store", read_only=True)
    assert answers(reader) == answers(pg_store)
    # PostgreSQL's text holds no NUL: stored with U+FFFD in its place
    hardware, task, space = sorted(pg_store.keys())[0]
    pg_store.add(hardware, task, space, pg_store.configs(hardware, task, space)[0], {},
                 MeasureResult.failed("build", "no\x00such intrinsic"), "run")
    assert reader.rows(hardware, task, space)[-1].message == "no\ufffdsuch intrinsic"
    # a replay answers from it as from the sqlite file
    configs = [config for task, config, _, _ in items if task is TASK][:6]
    replies = [ReplayHardware(SyntheticHardware(noise=0.2), location, on_miss="error").measure(TASK, configs, SPEC)
               for location in (str(tmp_path / "store.sqlite"), with_password(url))]
    assert replies[0] == replies[1] and all(a.reused for a in replies[1])
    assert "s3cr3t" not in str(ReplayHardware(SyntheticHardware(), with_password(url)).describe())


def _writer(url: str, worker: int, count: int, start, done) -> None:
    start.wait()
    store = open_store(url, "hardware.store")
    backend = SyntheticHardware()
    table = TaskRows(store, backend, SPEC, TASK, backend.space(TASK))
    configs = list(dict.fromkeys(table.space.canonical(c) for c in islice(table.space.enumerate(), 256)))[:4]
    for i in range(count):
        table.add(configs[i % 4],
                  MeasureResult(costs=[1e-3 + worker * 1e-5], message=f"{worker}/{i}", build_s=0.1, run_s=0.1), "run")
    done.put(worker)


@needs_server
def test_concurrent_writers_on_a_new_database_lose_no_row(url):
    context = multiprocessing.get_context("fork")
    start, done = context.Event(), context.Queue()
    workers = [context.Process(target=_writer, args=(url, w, 50, start, done)) for w in range(8)]
    for worker in workers:
        worker.start()
    start.set()  # all of them open the new database at once
    for worker in workers:
        worker.join(60)
    assert [w.exitcode for w in workers] == [0] * 8
    store = open_store(url, "--store", read_only=True)
    assert store.count() == 400
    messages = [r.message for key in store.keys() for r in store.rows(*key)]
    assert sorted(messages) == sorted(f"{w}/{i}" for w in range(8) for i in range(50))
    assert store._fetch("SELECT COUNT(*) FROM meta")[0][0] == 1


@needs_server
def test_a_reader_never_creates_and_refuses_what_is_not_a_store(url, pg):
    import psycopg

    with pytest.raises(StoreError, match="not a tunelab measurement store \\(no format row\\)"):
        open_store(url, "--store", read_only=True)
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0] == 0
    write(open_store(url, "--store"), readings(count=2))
    reader = open_store(url, "--store", read_only=True)
    assert reader.count() == 5
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        reader.conn.execute("DELETE FROM readings")
    foreign = pg.create_database(f"foreign{next(_numbers)}")
    with psycopg.connect(foreign, autocommit=True) as conn:
        conn.execute("CREATE TABLE notes(id SERIAL PRIMARY KEY, text TEXT)")
        conn.execute("INSERT INTO notes(text) VALUES ('mine')")
    with pytest.raises(StoreError, match="not a tunelab measurement store"):
        open_store(with_password(foreign), "--store", read_only=True)
    with pytest.raises(StoreError) as refused:
        open_store(with_password(foreign), "hardware.store")
    assert "not a tunelab measurement store" in str(refused.value) and "nothing was written" in str(refused.value)
    assert SECRET not in str(refused.value) and foreign.rpartition("/")[2] in str(refused.value)
    with psycopg.connect(foreign, autocommit=True) as conn:
        assert [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")] == ["notes"]
        conn.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('format', '1')")
    with pytest.raises(StoreError, match="table hardware lacks the table itself"):
        open_store(foreign, "--store", read_only=True)
    # a trigger would run on the lab's writes: refused, to readers and writers alike
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION nothing() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'")
        conn.execute("CREATE TRIGGER sneaky BEFORE INSERT ON readings FOR EACH ROW EXECUTE FUNCTION nothing()")
    for read_only in (True, False):
        with pytest.raises(StoreError, match="triggers or rules.*sneaky"):
            open_store(url, "--store", read_only=read_only)


@needs_server
def test_implausible_and_garbage_rows_are_skipped_and_counted(url, tmp_path, capsys):
    store = open_store(url, "--store")
    tables = write(store, readings())
    before = answers(store)
    bad = add_garbage(store.conn, *tables[TASK.key].key, placeholder="%s")
    reader = open_store(url, "--store", read_only=True)
    assert reader.unreadable() == bad and reader.count() == before["count"] + bad
    after = answers(reader)
    for key in reader.keys():
        for answer in ("rows", "truths", "gauge_readings", "task_info", "bounds"):
            assert after[key][answer] == before[key][answer]
    dataset.main(["stats", "--store", with_password(url)])
    out = capsys.readouterr().out
    assert f"{bad} unreadable rows skipped" in out and "gemm_64" in out and SECRET not in out
    dataset.main(["copy", "--store", url, "--to", str(tmp_path / "copy.sqlite")])
    assert f"and {bad} unreadable" in capsys.readouterr().out
    assert connect_store(tmp_path / "copy.sqlite").unreadable() == 0


@needs_server
def test_copy_sqlite_to_postgresql_and_back_gives_identical_rows_and_resumes(url, tmp_path, capsys):
    first, last = tmp_path / "first.sqlite", tmp_path / "last.sqlite"
    original = connect_store(first)
    write(original, readings() + readings(OTHER, 5, start=1.8e9))
    count = original.count()
    dataset.main(["copy", "--store", str(first), "--to", with_password(url)])
    out = capsys.readouterr().out
    assert f"copied {count} readings" in out and SECRET not in out
    dataset.main(["copy", "--store", url, "--to", str(last)])
    assert f"copied {count} readings" in capsys.readouterr().out
    back = connect_store(last, read_only=True)
    assert raw_rows(back) == raw_rows(original) and answers(back) == answers(original)
    for source, target in ((first, url), (url, last)):
        dataset.main(["copy", "--store", str(source), "--to", str(target)])
        assert f"copied 0 readings from {source} to {target}; skipped {count} it held already" in \
            capsys.readouterr().out
    # a copy killed halfway: the rows it wrote are skipped, the rest copied, in order
    middle = open_store(url, "--store")
    middle.conn.execute("DELETE FROM readings WHERE id > (SELECT MIN(id) + 9 FROM readings)")
    counts = copy_store(connect_store(first, read_only=True), middle)
    assert (counts.copied, counts.held, counts.unreadable) == (count - 10, 10, 0)
    assert raw_rows(middle)["readings"] == raw_rows(open_store(str(last), "--store"))["readings"]


@needs_server
def test_a_postgresql_restart_mid_run_loses_no_reading(url, pg):
    store = open_store(url, "hardware.store")
    backend = SyntheticHardware()
    table = TaskRows(store, backend, SPEC, TASK, backend.space(TASK))
    configs = list(dict.fromkeys(table.space.canonical(c) for c in islice(table.space.enumerate(), 4000)))[:60]
    results = backend.measure(TASK, configs, SPEC)
    context = multiprocessing.get_context("fork")
    written = context.Value("i", 0)

    def writer():
        for config, result in zip(configs, results):
            table.add(config, result, "run")
            written.value += 1
            time.sleep(0.03)

    process = context.Process(target=writer)
    process.start()
    while written.value < 15:
        time.sleep(0.01)
    pg.restart(down_s=2)  # the writer's connection is ended; it reconnects when the server is back
    process.join(60)
    assert process.exitcode == 0 and written.value == 60
    reader = open_store(url, "--store", read_only=True)
    assert [r.config for r in reader.rows(*table.key)] == configs  # each once, in order
    assert store.count() == 60  # this process's connection died too: it reconnects


@needs_server
def test_one_builder_per_postgresql_store(url, capsys):
    import psycopg

    first, second = open_store(url, "--store"), open_store(with_password(url), "--store")
    with dataset.sole_builder(first):
        with pytest.raises(StoreError) as refused:
            with dataset.sole_builder(second):
                pass
        message = str(refused.value)
        assert "is being filled by another build" in message and f"pid {os.getpid()}" in message
        assert SECRET not in message
    with dataset.sole_builder(second):  # released when the build ends
        pass
    # a builder that dies (kill -9) holds it no more: the server drops a closed connection's locks
    context = multiprocessing.get_context("fork")
    holding = context.Event()

    def hold():
        with dataset.sole_builder(open_store(url, "--store")):
            holding.set()
            time.sleep(60)

    process = context.Process(target=hold)
    process.start()
    assert holding.wait(30)
    with pytest.raises(StoreError, match=f"pid {process.pid}"):
        with dataset.sole_builder(second):
            pass
    os.kill(process.pid, signal.SIGKILL)
    process.join(10)
    deadline = time.monotonic() + 10
    while True:
        try:
            with dataset.sole_builder(second):
                break
        except StoreError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    with psycopg.connect(url, autocommit=True) as conn:  # the lock is the builder's, not a table's
        assert conn.execute("SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()[0] == 0


@needs_server
def test_a_password_never_appears_in_a_message(pg, url, tmp_path):
    missing = with_password(pg.url("no_such_database"))
    for read_only in (True, False):
        with pytest.raises(StoreError) as refused:
            open_store(missing, "hardware.store", read_only=read_only)
        assert "no such database" in str(refused.value) and SECRET not in str(refused.value)
    store = open_store(with_password(url), "--store")
    assert SECRET not in store.location + store.address
    write(store, readings(count=2))
    store.busy_timeout_s = 1.0
    pg.stop()
    try:
        with pytest.raises(StoreError) as lost:
            write(store, readings(count=1, start=2e9))
        assert "did not answer again within 1 s" in str(lost.value) and SECRET not in str(lost.value)
    finally:
        pg.start()
    assert open_store(with_password(url), "--store", read_only=True).count() == 5


@needs_server
def test_a_run_writes_its_readings_to_postgresql_and_a_replay_reads_them(url, tmp_path):
    import json
    import subprocess

    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp_path / "outputs")}
    common = ("model=gemm_64", "tracking=none", "budget.trials=16", f"hardware.store={with_password(url)}")
    backend = ("~hardware.backend", "+hardware.backend={_target_:tuning.hardware.synthetic.SyntheticHardware}")
    for name, overrides in (("run", ("hardware=synthetic",)),
                            ("replay", ("hardware=replay", *backend, "hardware.on_miss=error", "model.space=store"))):
        done = subprocess.run([sys.executable, "run.py", *common, *overrides, f"hydra.run.dir={tmp_path / name}"],
                              cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert SECRET not in done.stdout + done.stderr
    [task] = json.loads((tmp_path / "run" / "tasks.json").read_text())
    assert task["store"] == url  # where compare finds the store: the URL without its password
    store = open_store(url, "--store", read_only=True)
    stored = set(store.configs(*task["store_key"]))
    assert len(stored) == 16 and store.count() > 16  # and the best few re-measured at the end
    replayed = [json.loads(line) for line in (tmp_path / "replay" / "records.jsonl").read_text().splitlines()]
    assert replayed and all(tuple(r["config"]) in stored and r["result"]["error"] is None for r in replayed)
