"""Who may write a measurement store, and how one that cannot be read or written is reported.

Readers (compare, `dataset stats`/`export`, `build --dry-run`, replay with on_miss=error) never
create or change a file; a writer whose store cannot be written is refused before any work, naming
its option; read-only media and a full disk are said in those words; one builder per store; a
run folder's saved config is untrusted when `dataset import` reads it. Read-only media are a
read-only bind mount and a full disk a tiny tmpfs (the tests run as root, for whom chmod
changes nothing); those tests skip where mounting is not permitted."""
from __future__ import annotations

import fcntl
import hashlib
import os
import sqlite3
import subprocess
from itertools import islice
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from tuning.core.measure import MeasureSpec
from tuning.core.task import gemm_task
from tuning.hardware.replay import ReplayHardware
from tuning.hardware.synthetic import SyntheticHardware
from tuning.store import StoreError, TaskRows, connect_store

TASK = gemm_task("gemm_64", 64, 64, 64)
SPEC = MeasureSpec(repeat=3)
BUILD = ["--model", "gemm_64", "--configs", "6", "hardware=synthetic"]


def filled(path: Path, count: int = 8) -> list[tuple]:
    """A closed store holding `count` configs of TASK on the synthetic backend; their configs."""
    backend = SyntheticHardware()
    store = connect_store(path)
    table = TaskRows(store, backend, SPEC, TASK, backend.space(TASK))
    configs = list(dict.fromkeys(table.space.canonical(c) for c in islice(table.space.enumerate(), 64 * count)))[:count]
    for config, result in zip(configs, backend.measure(TASK, configs, SPEC)):
        table.add(config, result, "dataset")
    store.close()
    return configs


def foreign_database(path: Path, journal: str = "DELETE") -> Path:
    """Another program's sqlite file (a rollback journal or WAL, a table of its own)."""
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.execute("CREATE TABLE notes(id INTEGER PRIMARY KEY, text TEXT)")
    conn.execute("INSERT INTO notes(text) VALUES ('mine')")
    conn.commit()
    conn.close()
    return path


def snapshot(path: Path) -> tuple:
    """The file's sha256 and its folder's listing."""
    return hashlib.sha256(path.read_bytes()).hexdigest(), sorted(os.listdir(path.parent))


def unmount(folder: Path) -> None:
    if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(folder)], check=True)  # a failed test left a connection open


def mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting is not permitted here ({done.stderr.strip() or done.returncode})")


@pytest.fixture
def read_only_copy(tmp_path):
    """A folder holding a filled store, seen through a read-only bind mount: (path there, configs)."""
    source, view = tmp_path / "source", tmp_path / "read-only"
    source.mkdir()
    view.mkdir()
    configs = filled(source / "store.sqlite")
    mount("--bind", str(source), str(view))
    try:
        mount("-o", "remount,bind,ro", str(view))
        yield view / "store.sqlite", configs
    finally:
        unmount(view)


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs filled up: the folder."""
    folder = tmp_path / "full"
    folder.mkdir()
    mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder))
    try:
        yield folder
    finally:
        unmount(folder)


def fill_up(folder: Path) -> None:
    with open(folder / "ballast", "wb") as handle:
        try:
            handle.write(b"x" * 2**20)
            handle.flush()
        except OSError:
            pass


def dataset_main(argv, capsys) -> tuple[int, str]:
    """(exit status, stdout + stderr) of `python -m tuning.tools.dataset argv`, in process."""
    from tuning.tools import dataset

    try:
        dataset.main(argv)
        status = 0
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
        message = "" if isinstance(exit_.code, int) or exit_.code is None else str(exit_.code)
    else:
        message = ""
    out = capsys.readouterr()
    return status, out.out + out.err + message


# ---- reading never changes a file -----------------------------------------------------------
@pytest.mark.parametrize("journal", ["DELETE", "WAL"])
def test_a_read_only_open_of_another_programs_database_refuses_and_changes_nothing(tmp_path, journal):
    path = foreign_database(tmp_path / "other.sqlite", journal)  # WAL: sqlite's mode=ro would add -wal/-shm
    before = snapshot(path)
    with pytest.raises(StoreError, match="not a tunelab measurement store"):
        connect_store(path, read_only=True).count()
    assert snapshot(path) == before


def test_a_writer_leaves_another_programs_database_as_it_is(tmp_path):
    path = foreign_database(tmp_path / "other.sqlite")
    before = snapshot(path)
    with pytest.raises(StoreError, match="not a tunelab measurement store"):
        connect_store(path).count()
    assert snapshot(path) == before


def test_a_store_with_a_trigger_or_a_changed_table_is_refused_before_anything_runs(tmp_path):
    path = tmp_path / "store.sqlite"
    filled(path, count=2)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TRIGGER wipe AFTER INSERT ON readings BEGIN DELETE FROM readings; END")
    conn.commit()
    conn.close()
    for read_only in (False, True):
        with pytest.raises(StoreError, match="triggers, which tunelab never makes: wipe"):
            connect_store(path, read_only=read_only).count()
    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER wipe")
    conn.execute("ALTER TABLE tasks RENAME COLUMN flops TO size")
    conn.commit()
    conn.close()
    for read_only in (False, True):
        with pytest.raises(StoreError, match="not a tunelab measurement store .table tasks lacks flops"):
            connect_store(path, read_only=read_only).count()


def test_compare_reads_the_store_a_tasks_json_names_without_changing_it(tmp_path):
    from tuning.tools.compare import task_truths

    path = foreign_database(tmp_path / "other.sqlite")
    before = snapshot(path)
    task = {"name": "gemm_64", "key": "k", "store": str(path), "store_key": ["hw", "task", "space"]}
    with pytest.raises(SystemExit, match="not a tunelab measurement store"):
        task_truths([SimpleNamespace(tasks=[task], records=[])], None)
    assert snapshot(path) == before
    for malformed in ({"store": 5}, {"store": [str(path)]}, {"store_key": 7}, {"store_key": ["hw", ["task"], "s"]}):
        truths, notes = task_truths([SimpleNamespace(tasks=[{**task, **malformed}], records=[])], None)
        assert truths["gemm_64"].source.startswith("readings") and "scored by the runs' own readings" in notes[0]


def test_stats_export_and_dry_run_read_a_store_and_write_nothing(tmp_path, capsys):
    path = tmp_path / "store.sqlite"
    filled(path)
    (tmp_path / "foreign").mkdir()
    foreign = foreign_database(tmp_path / "foreign" / "other.sqlite")
    before, foreign_before = snapshot(path), snapshot(foreign)
    for argv in (["stats", "--store", str(path)],
                 ["export", "--store", str(path), "--task", "gemm_64", "--out", str(tmp_path / "out" / "c.json")],
                 ["build", "--store", str(path), *BUILD, "--dry-run"]):
        (tmp_path / "out").mkdir(exist_ok=True)
        status, output = dataset_main(argv, capsys)
        assert status == 0, output
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before[0], argv
    assert "8 stored" in output
    for command in ("stats", "build"):
        argv = [command, "--store", str(foreign)] + (BUILD + ["--dry-run"] if command == "build" else [])
        status, output = dataset_main(argv, capsys)
        assert status == 2 and "not a tunelab measurement store" in output, output
        assert snapshot(foreign) == foreign_before


def test_a_dry_run_creates_no_store(tmp_path, capsys):
    path = tmp_path / "new" / "store.sqlite"
    status, output = dataset_main(["build", "--store", str(path), *BUILD, "--dry-run"], capsys)
    assert status == 0 and "6 to measure" in output, output
    assert not (tmp_path / "new").exists()


# ---- read-only media -------------------------------------------------------------------------
def test_replay_stats_and_a_read_only_run_work_from_read_only_media(read_only_copy, capsys):
    from tuning.engine.store_wiring import wire_store

    path, configs = read_only_copy
    replay = ReplayHardware(SyntheticHardware(), str(path), on_miss="error")
    assert ReplayHardware.check({"store": str(path), "create": False, "on_miss": "error",
                                 "backend": {"_target_": "tuning.hardware.synthetic.SyntheticHardware"}},
                                "hardware") == []
    results = replay.measure(TASK, configs, SPEC)
    assert all(r.reused and r.error != "not_in_store" for r in results), [r.message for r in results]
    replay.close()
    status, output = dataset_main(["stats", "--store", str(path)], capsys)
    assert status == 0 and "8 rows" in output, output
    parts = SimpleNamespace(hardware=ReplayHardware(SyntheticHardware(), str(path), on_miss="error"),
                            evaluator=SimpleNamespace(spec=SPEC))
    hardware, writer = wire_store("full", parts.hardware, parts.evaluator.spec)
    assert len(writer.table(TASK, hardware.space(TASK)).configs()) == len(configs)
    writer.store.close()
    assert sorted(os.listdir(path.parent)) == ["store.sqlite"]


def test_a_run_whose_store_cannot_be_written_is_refused_before_work(read_only_copy):
    from tuning.engine.store_wiring import wire_store

    path, _ = read_only_copy
    for hardware in (SyntheticHardware(store=str(path)), SyntheticHardware(store=str(path.parent / "new.sqlite"))):
        parts = SimpleNamespace(hardware=hardware, evaluator=SimpleNamespace(spec=SPEC))
        with pytest.raises(StoreError, match=r"^hardware.store: .* cannot be written: read-only file system"):
            wire_store("full", parts.hardware, parts.evaluator.spec)
    problems = ReplayHardware.check({"store": str(path), "create": False, "on_miss": "measure",
                                     "backend": {"_target_": "tuning.hardware.synthetic.SyntheticHardware"}},
                                    "hardware")
    assert problems and "read-only file system" in problems[0] and "on_miss=error" in problems[0]


def test_a_build_or_import_into_read_only_media_is_refused_before_work(read_only_copy, tmp_path, capsys):
    path, _ = read_only_copy
    for argv in (["build", "--store", str(path), *BUILD], ["import", "--store", str(path), str(tmp_path)]):
        status, output = dataset_main(argv, capsys)
        assert status == 2 and "--store" in output and "cannot be written: read-only file system" in output, output
        assert "to measure" not in output


def test_a_store_path_that_is_a_folder_is_refused_naming_the_option(tmp_path):
    from tuning.engine.store_wiring import wire_store

    parts = SimpleNamespace(hardware=SyntheticHardware(store=str(tmp_path)), evaluator=SimpleNamespace(spec=SPEC))
    with pytest.raises(StoreError, match=r"^hardware.store: .* is a folder, not a store file"):
        wire_store("full", parts.hardware, parts.evaluator.spec)
    with pytest.raises(StoreError, match="a folder, not a store file"):
        connect_store(tmp_path, read_only=True).conn


# ---- a full disk -----------------------------------------------------------------------------
def test_a_full_disk_is_reported_as_a_full_disk(full_disk, tmp_path):
    filled(tmp_path / "old.sqlite", count=1)
    existing = full_disk / "old.sqlite"
    existing.write_bytes((tmp_path / "old.sqlite").read_bytes())  # closed: its rows are all in the file
    fill_up(full_disk)
    for path in (full_disk / "new.sqlite", existing):
        store = connect_store(path)
        with pytest.raises(StoreError) as caught:
            store.count()
        assert "disk full" in str(caught.value) and str(path) in str(caught.value)
        assert "not a tunelab measurement store" not in str(caught.value)
        store.close()


# ---- one builder per store -------------------------------------------------------------------
def test_a_second_build_on_one_store_is_refused_at_once(tmp_path, capsys):
    path = tmp_path / "store.sqlite"
    with open(tmp_path / "store.sqlite.build.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242")
        held.flush()
        status, output = dataset_main(["build", "--store", str(path), *BUILD], capsys)
        assert status == 2 and "--store" in output and "another build (pid 4242)" in output, output
        assert "to measure" not in output
    status, output = dataset_main(["build", "--store", str(path), *BUILD], capsys)
    assert status == 0, output
    assert connect_store(path, read_only=True).count() == 6


def test_a_build_through_a_link_to_the_store_takes_the_stores_own_lock(tmp_path, capsys):
    path, alias = tmp_path / "store.sqlite", tmp_path / "alias" / "store.sqlite"
    alias.parent.mkdir()
    alias.symlink_to(path)
    with open(tmp_path / "store.sqlite.build.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        status, output = dataset_main(["build", "--store", str(alias), *BUILD], capsys)
        assert status == 2 and "another build" in output, output


# ---- import: a saved config is untrusted ----------------------------------------------------
def test_import_instantiates_nothing_a_saved_config_names_outside_the_lab(tmp_path, capsys, compose_cfg):
    run = tmp_path / "run"
    run.mkdir()
    canary = tmp_path / "canary"
    cfg = compose_cfg("model=gemm_64", "hardware=synthetic")
    OmegaConf.set_struct(cfg, False)
    del cfg["hydra"]  # what a run saves: its job config, resolved
    saved = OmegaConf.to_container(cfg, resolve=True)
    saved["hardware"]["store"] = {"_target_": "shutil.copyfile", "_args_": [str(run / "config.yaml"), str(canary)]}
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(saved)))
    (run / "records.jsonl").write_text("")
    status, output = dataset_main(["import", "--store", str(tmp_path / "store.sqlite"), str(run)], capsys)
    assert not canary.exists()
    assert status == 0 and f"skip {run}" in output and str(run / "config.yaml") in output, output
    assert "hardware.store._target_" in output and "'shutil.copyfile'" in output
