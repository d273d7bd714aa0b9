"""The contract suite of a measurement store backend (tuning/store/base.py), for pytest.

A backend passes it by subclassing `StoreContract` in a test module and saying how to make an empty
store of its kind:

    from tuning.testing.store_contract import StoreContract

    class TestMyStore(StoreContract):
        def make_store(self, tmp_path, read_only=False):
            return MyStore(f"mine://{tmp_path}/db", read_only=read_only)

Every test compares the backend with the sqlite backend on the same writes: what each public reader
answers, the raw rows, the rows no reader accepts, copying both ways, and the behaviour every backend
keeps (nothing connects before first use, a reader writes nothing, pickling drops the connection,
every failure a StoreError). `make_store(tmp_path, read_only=True)` opens the same location as the
writer made by `make_store(tmp_path)`.
"""
from __future__ import annotations

import pickle
from dataclasses import replace
from itertools import islice

import pytest

from tuning.core.measure import MeasureSpec
from tuning.core.records import MeasureResult
from tuning.core.task import gemm_task
from tuning.hardware.synthetic import SyntheticHardware
from tuning.store import READING_COLUMNS, MeasurementStore, SqliteStore, StoreError, TaskRows, copy_store

SPEC = MeasureSpec(repeat=3)
TASKS = (gemm_task("gemm_64", 64, 64, 64), gemm_task("gemm_32", 32, 32, 32))
# rows no reader accepts (config, costs, build_s): NaN, negative, an hour, a config that is no list, a
# negative choice, costs that are no list, none at all, an infinite and a negative build time
UNREADABLE = (("[1, 2]", "[NaN]", 0.1), ("[1, 2]", "[-1.0]", 0.1), ("[1, 2]", "[1e9]", 0.1), ("\"x\"", "[0.001]", 0.1),
              ("[1, -2]", "[0.001]", 0.1), ("[1, 2]", "{\"a\": 1}", 0.1), ("[1, 2]", "[]", 0.1),
              ("[1, 2]", "[0.001]", float("inf")), ("[1, 2]", "[0.001]", -1.0))


def measured(task, count: int = 8, start: float = 1.7e9) -> list[tuple]:
    """(task, config, MeasureResult, measured_at): `count` configs measured twice on the synthetic
    backend, and an error row; the same list every call."""
    backend = SyntheticHardware(noise=0.2)
    space = backend.space(task)
    configs = list(dict.fromkeys(space.canonical(c) for c in islice(space.enumerate(), 64 * count)))[:count]
    results = backend.measure(task, configs, SPEC) + backend.measure(task, configs, SPEC)
    written = [(task, c, replace(r, gauge_s=1e-3 * (1 + i % 7 / 50)), start + i)
               for i, (c, r) in enumerate(zip(configs + configs, results))]
    return written + [(task, configs[0], MeasureResult.failed("build", "no such intrinsic"), start + len(written))]


def write(store: MeasurementStore, items) -> None:
    """Each item added through TaskRows, as a run writes it."""
    backend, tables = SyntheticHardware(noise=0.2), {}
    for task, config, result, measured_at in items:
        if task.key not in tables:
            tables[task.key] = TaskRows(store, backend, SPEC, task, backend.space(task))
        tables[task.key].add(config, result, "dataset", measured_at=measured_at)


def answers(store: MeasurementStore) -> dict:
    """What every public reader of the store answers, for every key it holds."""
    found: dict = {"keys": sorted(store.keys()), "count": store.count(), "unreadable": store.unreadable()}
    for hardware, task, space in store.keys():
        configs = store.configs(hardware, task, space)
        found[hardware, task, space] = {
            "rows": store.rows(hardware, task, space), "configs": configs,
            "first": [store.first(hardware, task, space, c) for c in configs],
            "rows(config)": [store.rows(hardware, task, space, c) for c in configs],
            "truth": [store.truth(hardware, task, space, c, 1) for c in configs],
            "truths": store.truths(hardware, task, space), "readings": store.readings(hardware, task, space, 1),
            "decisions": store.decisions(hardware, task, space), "gauge_median": store.gauge_median(hardware),
            "gauge_readings": sorted(store.gauge_readings(hardware)), "task_info": store.task_info(task),
            "space_size": store.space_size(space), "hardware_info": store.hardware_info(hardware),
            "bounds": store.bounds(hardware, task), "seconds": sorted(store.measurement_seconds(hardware))}
    return found


def raw_rows(store: MeasurementStore) -> dict:
    """Every table's rows as they are (readings without their ids, in the order written)."""
    return {"readings": [tuple(r) for r in store._fetch(f"SELECT {', '.join(READING_COLUMNS)} FROM readings ORDER BY id")],
            "hardware": sorted(map(tuple, store._fetch("SELECT hash, description FROM hardware"))),
            "tasks": sorted(map(tuple, store._fetch("SELECT key, name, flops, workload FROM tasks"))),
            "spaces": sorted(map(tuple, store._fetch("SELECT key, size FROM spaces"))),
            "meta": sorted(map(tuple, store._fetch("SELECT key, value FROM meta")))}


def add_unreadable(store: MeasurementStore) -> int:
    """Rows no reader accepts, written past the checks (as an untrusted store holds them); how many."""
    hardware, task, space = store.keys()[0]
    rows = [(hardware, task, space, config, "{}", costs, None, "", build_s, 0.1, None, 1.0, "dataset")
            for config, costs, build_s in UNREADABLE]
    store._insert_many("readings", READING_COLUMNS, rows)
    return len(rows)


class StoreContract:
    """Subclass it with `make_store(tmp_path, read_only=False)`; pytest collects the tests below."""

    def make_store(self, tmp_path, read_only: bool = False) -> MeasurementStore:
        raise NotImplementedError("a backend's contract test says how to make its store")

    @pytest.fixture
    def pair(self, tmp_path):
        """(the backend's store, a sqlite store), each given the same writes."""
        (tmp_path / "backend").mkdir()
        store, reference = self.make_store(tmp_path / "backend"), SqliteStore(tmp_path / "reference.sqlite")
        for each in (store, reference):
            write(each, measured(TASKS[0]) + measured(TASKS[1], 5, start=1.8e9))
        yield store, reference
        store.close()
        reference.close()

    def test_it_is_a_measurement_store_that_connects_on_first_use(self, tmp_path):
        store = self.make_store(tmp_path)
        assert isinstance(store, MeasurementStore) and store.backend
        assert store._conn is None  # nothing connects before first use
        assert store.count() == 0 and store.keys() == []

    def test_the_same_writes_give_the_same_answers_as_sqlite(self, pair):
        store, reference = pair
        assert answers(store) == answers(reference)

    def test_the_same_writes_give_the_same_raw_rows_as_sqlite(self, pair):
        store, reference = pair
        assert raw_rows(store) == raw_rows(reference)

    def test_rows_no_reader_accepts_are_skipped_and_counted(self, pair):
        store, reference = pair
        before = answers(store)
        assert add_unreadable(store) == add_unreadable(reference)
        after = answers(store)
        assert after["unreadable"] == before["unreadable"] + len(UNREADABLE)
        assert after == answers(reference)

    def test_a_reader_writes_nothing_and_a_write_through_it_is_a_store_error(self, pair, tmp_path):
        store, _ = pair
        reader = self.make_store(tmp_path / "backend", read_only=True)
        assert answers(reader) == answers(store)
        with pytest.raises(StoreError):
            write(reader, measured(TASKS[0], 2, start=1.9e9))
        assert reader.count() == store.count()
        reader.close()

    def test_a_reader_of_an_empty_location_is_refused_and_creates_nothing(self, tmp_path):
        with pytest.raises(StoreError):
            self.make_store(tmp_path, read_only=True).count()
        writer = self.make_store(tmp_path)
        assert writer.count() == 0  # the location was left as it was: a writer still starts it
        writer.close()

    def test_a_pickled_store_drops_its_connection_and_reads_the_same(self, pair):
        store, _ = pair
        store.count()
        copy = pickle.loads(pickle.dumps(store))
        assert copy._conn is None and answers(copy) == answers(store)
        copy.close()

    def test_copying_to_sqlite_and_back_gives_the_same_rows(self, pair, tmp_path):
        store, reference = pair
        there = SqliteStore(tmp_path / "there.sqlite")
        copy_store(store, there)
        assert raw_rows(there) == raw_rows(reference)
        (tmp_path / "back").mkdir()
        back = self.make_store(tmp_path / "back")
        copy_store(there, back)
        assert answers(back) == answers(store)
        for each in (there, back):
            each.close()

    def test_its_location_names_no_password(self, tmp_path):
        store = self.make_store(tmp_path)
        for shown in (store.location, store.address, type(store).display(store.location)):
            assert isinstance(shown, str) and ":secret@" not in shown
