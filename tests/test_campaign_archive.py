"""A campaign carried between machines (tuning/tools/campaign_archive.py): what is packed, what comes
back, that another host's archive is never restored, and that a hostile archive extracts nothing."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from test_store import filled
from tuning.store import connect_store
from tuning.tools.campaign import DONE, Job
from tuning.tools.campaign_archive import (
    NEUTRAL_FLAGS,
    ArchiveError,
    archive_path,
    archived,
    equivalent_identities,
    host_identity,
    host_key,
    open_view,
    pack,
    restore,
    view_for_tables,
)

HOST = {"cpu_model": "Test CPU @ 1 GHz", "cores": 2, "flags": "abc"}
OTHER = {**HOST, "flags": "abd"}


def finished_run(folder: Path, status: str = "FINISHED") -> Job:
    (folder / "state").mkdir(parents=True)
    (folder / "state" / "task.json").write_text("{}")
    (folder / "status").write_text(status)
    (folder / "records.jsonl").write_text('{"x": 1}\n')
    (folder / ".tunelab.lock").write_text("1")
    (folder / "e2e.json").write_text('{"latencies_ms": {}}')
    return Job(folder, ("seed=0",))


def step(folder: Path, archived_step: bool = True) -> Job:
    folder.mkdir(parents=True)
    (folder / DONE).write_text("python -m x\n")
    return Job(folder, command=("-m", "x"), archived=archived_step)


def campaign(root: Path) -> list[Job]:
    return [finished_run(root / "net" / "row" / "seed0"), finished_run(root / "net" / "row" / "seed1", "KILLED"),
            step(root / "net" / "corpus"), step(root / "net" / "training", archived_step=False)]


ZEN = "model name\t: AMD EPYC\nflags\t\t: fpu sse avx2 avx512f{}\n"


def test_hosts_that_differ_only_in_flags_of_control_are_of_one_kind():
    assert "cpuid_fault" in NEUTRAL_FLAGS
    plain, faulting = ZEN.format(""), ZEN.format(" cpuid_fault")
    assert host_identity(plain, cores=2) != host_identity(faulting, cores=2)  # each host's own key is unchanged
    assert equivalent_identities(faulting, cores=2) == [host_identity(faulting, cores=2), host_identity(plain, cores=2)]
    assert equivalent_identities(plain, cores=2) == [host_identity(plain, cores=2), host_identity(faulting, cores=2)]
    assert host_identity(ZEN.format(" avx512_bf16"), cores=2) not in equivalent_identities(plain, cores=2)


def on_host(monkeypatch, cpuinfo: str):
    import tuning.cluster.host_identity as module

    real = module._cpu_fields
    monkeypatch.setattr(module, "_cpu_fields", lambda text=None: real(cpuinfo if text is None else text))
    monkeypatch.setattr(module.os, "cpu_count", lambda: 2)


def test_a_host_of_the_archives_kind_continues_it_and_another_starts_its_own(tmp_path, monkeypatch, capsys):
    root, archives = tmp_path / "campaign", tmp_path / "archives"
    on_host(monkeypatch, ZEN.format(""))
    archived(archives, [finished_run(root / "gemm_512" / "gbfs" / "seed0")], root, [], None, lambda: None)
    first = archive_path(archives, host_identity(ZEN.format(""), cores=2))

    on_host(monkeypatch, ZEN.format(" cpuid_fault"))  # the next sitting: a host whose kernel lets CPUID fault
    jobs = [finished_run(tmp_path / "next" / "gemm_2048" / "gbfs" / "seed0")]
    archived(archives, jobs, tmp_path / "next", [], None, lambda: None)
    said = capsys.readouterr().out
    assert "only in flags that do not change how code runs (cpuid_fault): it continues that archive" in said
    assert "restored 1 finished folders" in said
    assert sorted(p.name for p in archives.iterdir()) == [first.name]  # one file: the campaign goes on in it
    with tarfile.open(first) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    assert manifest["host"] == host_identity(ZEN.format(""), cores=2)
    assert "cpuid_fault" in manifest["packed_on"]["flag_names"]
    assert manifest["folders"] == ["gemm_2048/gbfs/seed0", "gemm_512/gbfs/seed0"]

    on_host(monkeypatch, ZEN.format(" avx512_bf16"))  # a flag that changes what code can run: a replicate of its own
    archived(archives, [finished_run(tmp_path / "third" / "gemm_512" / "gbfs" / "seed0")], tmp_path / "third", [], None,
             lambda: None)
    said = capsys.readouterr().out
    assert f"{first.name}: the same CPU model and cores as this host" in said and "none for this host yet" in said
    assert len(list(archives.iterdir())) == 2


def test_finished_work_and_the_stores_come_back_on_a_new_machine(tmp_path):
    root, stores = tmp_path / "a" / "campaign", tmp_path / "a" / "stores"
    stores.mkdir(parents=True)
    filled(stores / "net.sqlite", count=20)
    jobs = campaign(root)
    path = pack(jobs, root, [stores / "net.sqlite", stores / "missing.sqlite"], tmp_path / "archives", HOST)
    assert path == archive_path(tmp_path / "archives", HOST)

    new_root, new_stores = tmp_path / "b" / "campaign", tmp_path / "b" / "stores"
    restored = restore(new_root, new_stores, tmp_path / "archives", None, HOST)
    assert sorted(restored.folders) == ["net/corpus", "net/row/seed0"] and restored.readings == 20
    run = new_root / "net" / "row" / "seed0"
    assert sorted(p.name for p in run.iterdir()) == ["e2e.json", "records.jsonl", "status"]  # no lock, no state
    assert (new_root / "net" / "corpus" / DONE).is_file()
    assert not (new_root / "net" / "row" / "seed1").exists()  # unfinished: the campaign runs it again
    assert not (new_root / "net" / "training").exists()  # its output lives elsewhere: runs again
    assert connect_store(new_stores / "net.sqlite", read_only=True).count() == 20
    assert not (new_stores / "missing.sqlite").exists()

    (run / "e2e.json").write_text("local")  # a second restore keeps what is here and adds no reading twice
    again = restore(new_root, new_stores, tmp_path / "archives", None, HOST)
    assert again.folders == [] and again.kept_local == 2 and again.readings == 0
    assert (run / "e2e.json").read_text() == "local"


def test_another_hosts_archive_is_never_restored(tmp_path):
    root = tmp_path / "campaign"
    path = pack(campaign(root), root, [], tmp_path / "archives", OTHER)
    assert restore(tmp_path / "new", tmp_path / "stores", tmp_path / "archives", None, HOST) is None
    path.rename(archive_path(tmp_path / "archives", HOST))  # renamed to pass for this host: its manifest says no
    with pytest.raises(ArchiveError, match="made on another host"):
        restore(tmp_path / "new", tmp_path / "stores", tmp_path / "archives", None, HOST)
    assert not (tmp_path / "new").exists()


def test_any_hosts_archive_is_read_for_tables_apart_from_this_hosts_work(tmp_path):
    root, stores = tmp_path / "a" / "campaign", tmp_path / "a" / "stores"
    stores.mkdir(parents=True)
    filled(stores / "net.sqlite", count=20)[0].close()  # no -wal or -shm file left to vanish later
    path = pack(campaign(root), root, [stores / "net.sqlite"], tmp_path / "campaigns" / "grid", OTHER)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    view = open_view(path, tmp_path / "views")
    assert view.root == tmp_path / "views" / "grid" / host_key(OTHER) / "runs" and view.host == OTHER
    assert sorted(view.restored.folders) == ["net/corpus", "net/row/seed0"] and view.restored.readings == 20
    assert (view.root / "net" / "row" / "seed0" / "records.jsonl").is_file()
    assert connect_store(view.store("net.sqlite"), read_only=True).count() == 20
    assert view.tracking_uri == f"sqlite:///{(view.root.parent / 'mlflow.db').resolve()}"
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "views" not in p.parts) == before
    with pytest.raises(ArchiveError, match="holds no store 'lab.sqlite' \\(it holds net.sqlite\\)"):
        view.store("/anywhere/lab.sqlite")
    again = open_view(path, tmp_path / "views")  # read again: nothing twice
    assert again.restored.folders == [] and again.restored.readings == 0


def test_a_viewed_archive_must_be_named_by_its_own_host_and_is_never_continued(tmp_path, capsys):
    root = tmp_path / "campaign"
    path = pack(campaign(root), root, [], tmp_path / "campaigns" / "grid", OTHER)
    with pytest.raises(SystemExit, match="read for its tables only \\(add --table-only\\)"):
        view_for_tables(path, False, tmp_path / "views")
    assert not (tmp_path / "views").exists()
    assert view_for_tables(tmp_path / "campaigns" / "grid", False, tmp_path / "views") is None  # a folder: carried
    assert view_for_tables(None, True, tmp_path / "views") is None
    with pytest.raises(ArchiveError, match="read by view_for_tables"):
        archived(path, [], root, [], None, lambda: None)

    forged = path.rename(archive_path(path.parent, HOST))  # another host's readings passed off as HOST's
    with pytest.raises(SystemExit, match=f"its manifest's host is {host_key(OTHER)}, not the host its name says"):
        view_for_tables(forged, True, tmp_path / "views")
    with pytest.raises(SystemExit, match="no such archive"):
        view_for_tables(path, True, tmp_path / "views")
    (tmp_path / "junk.tar.xz").write_bytes(b"not xz")
    with pytest.raises(SystemExit, match="not a readable archive"):
        view_for_tables(tmp_path / "junk.tar.xz", True, tmp_path / "views")
    assert not (tmp_path / "views").exists()

    forged.rename(path)
    view = view_for_tables(path, True, tmp_path / "views")
    assert view.restored.folders and f"(host {host_key(OTHER)}), read into" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="holds no store 'lab.sqlite' \\(it holds none\\)"):  # the table's store
        view_for_tables(path, True, tmp_path / "views", stores=("/here/stores/lab.sqlite",))


def test_a_view_tries_a_run_not_re_logged_again_and_a_new_archive_starts_it_afresh(tmp_path, monkeypatch, capsys):
    import tuning.tools.sync as sync_module

    root = tmp_path / "campaign"
    jobs = campaign(root)
    for job in jobs[:2]:
        (job.folder / "config.yaml").write_text("{}")
    path = pack(jobs, root, [], tmp_path / "campaigns" / "grid", OTHER)
    logged, broken = [], {"on": True}

    def fake_sync(folder, uri):
        if broken["on"]:
            raise RuntimeError("MLflow is down")
        logged.append((Path(folder).relative_to(tmp_path / "views" / "grid" / host_key(OTHER) / "runs"), uri))

    monkeypatch.setattr(sync_module, "sync", fake_sync)
    with pytest.raises(SystemExit, match="1 run\\(s\\) not re-logged into the view"):
        view_for_tables(path, True, tmp_path / "views")
    assert "net/row/seed0: not re-logged to MLflow (RuntimeError: MLflow is down)" in capsys.readouterr().out
    broken["on"] = False
    view = view_for_tables(path, True, tmp_path / "views")  # the folder is back: its run is tried again
    assert logged == [(Path("net/row/seed0"), view.tracking_uri)] and view.restored.folders == []
    view_for_tables(path, True, tmp_path / "views")
    assert len(logged) == 1  # re-logged once

    (jobs[2].folder / "more.txt").write_text("a later sitting")
    pack(jobs, root, [], tmp_path / "campaigns" / "grid", OTHER)
    again = view_for_tables(path, True, tmp_path / "views")
    assert "net/corpus" in again.restored.folders and (again.root / "net" / "corpus" / "more.txt").is_file()
    assert len(logged) == 2


def hostile(tmp_path, folders, members, files=None) -> Path:
    """A hand-made archive: the first format's layout, or the second's when `files` is given."""
    version = 1 if files is None else 2
    path = archive_path(tmp_path / "archives", HOST, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    manifest = {"format": version, "host": HOST, "folders": folders, "stores": []}
    if files is not None:
        manifest["files"] = files
    with tarfile.open(path, "w:gz" if version == 1 else "w:xz") as tar:
        entries = [("manifest.json", json.dumps(manifest))]
        for name, data in entries + members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            else:
                info.size = len(data.encode())
            tar.addfile(info, io.BytesIO(data.encode()) if data is not None else None)
    return path


@pytest.mark.parametrize("folders, members, said", [
    (["../out"], [("runs/../out/status", "FINISHED")], "relative paths inside the campaign"),
    (["/abs"], [], "relative paths inside the campaign"),
    (["run"], [("runs/run/status", "FINISHED"), ("runs/run/link", None)], "not a plain file"),
    (["run"], [("runs/run/status", "FINISHED"), ("runs/run/../../escape", "x")], "not a plain file"),
])
def test_a_hostile_archive_extracts_nothing(tmp_path, folders, members, said):
    hostile(tmp_path, folders, members)
    with pytest.raises(ArchiveError, match=said):
        restore(tmp_path / "new" / "c", tmp_path / "stores", tmp_path / "archives", None, HOST)
    assert not (tmp_path / "new" / "c" / "run").exists() and not (tmp_path / "escape").exists()


DIGEST = hashlib.sha256(b"FINISHED").hexdigest()
OTHER_DIGEST = hashlib.sha256(b"KILLED").hexdigest()


@pytest.mark.parametrize("folders, files, members, said", [
    (["run"], {"run": {"status": DIGEST}}, [(f"blobs/{DIGEST}", "KILLED")], "does not match its hash"),
    (["run"], {"run": {"status": DIGEST}}, [], "missing"),
    (["run"], {"run": {"../../escape": DIGEST}}, [(f"blobs/{DIGEST}", "FINISHED")], "files must map"),
    (["run"], {"run": {"status": "../../etc/passwd"}}, [], "files must map"),
    (["run"], {}, [], "files must map"),
    (["run"], {"run": {"link": DIGEST}}, [(f"blobs/{DIGEST}", None)], "not a plain file"),
    (["good", "run"], {"good": {"status": DIGEST}, "run": {"status": OTHER_DIGEST}},
     [(f"blobs/{DIGEST}", "FINISHED"), (f"blobs/{OTHER_DIGEST}", "tampered")],
     "does not match"),  # one bad file: no folder is put in place, not even the good one before it
])
def test_a_hostile_deduplicated_archive_extracts_nothing(tmp_path, folders, files, members, said):
    hostile(tmp_path, folders, members, files)
    with pytest.raises(ArchiveError, match=said):
        restore(tmp_path / "new" / "c", tmp_path / "stores", tmp_path / "archives", None, HOST)
    assert not (tmp_path / "new" / "c").exists() and not (tmp_path / "escape").exists()


def test_a_file_held_by_many_runs_is_packed_once(tmp_path):
    root = tmp_path / "campaign"
    jobs = campaign(root)
    database = b"workload database " * 10_000
    for job in jobs[:2]:
        (job.folder / "database").mkdir()
        (job.folder / "database" / "workload.json").write_bytes(database)
    (jobs[0].folder / "status").write_text("FINISHED")
    (jobs[1].folder / "status").write_text("FINISHED")
    path = pack(jobs, root, [], tmp_path / "archives", HOST)
    with tarfile.open(path) as tar:
        blobs = [m for m in tar.getmembers() if m.name.startswith("blobs/")]
    assert hashlib.sha256(database).hexdigest() in {m.name.removeprefix("blobs/") for m in blobs}
    assert len(blobs) == 5  # status, records, e2e, the database once, the corpus step's marker

    new_root = tmp_path / "new"
    restored = restore(new_root, tmp_path / "stores", tmp_path / "archives", None, HOST)
    assert sorted(restored.folders) == ["net/corpus", "net/row/seed0", "net/row/seed1"]
    for seed in ("seed0", "seed1"):
        assert (new_root / "net" / "row" / seed / "database" / "workload.json").read_bytes() == database


def test_an_archive_of_the_first_format_is_restored_and_the_next_pack_replaces_it(tmp_path):
    old = hostile(tmp_path, ["net/row/seed0"], [("runs/net/row/seed0/status", "FINISHED"),
                                                ("runs/net/row/seed0/records.jsonl", '{"x": 1}\n')])
    root = tmp_path / "campaign"
    restored = restore(root, tmp_path / "stores", tmp_path / "archives", None, HOST)
    assert restored.folders == ["net/row/seed0"] and old.suffix == ".gz"
    assert (root / "net" / "row" / "seed0" / "records.jsonl").read_text() == '{"x": 1}\n'

    new = pack([Job(root / "net" / "row" / "seed0", ("seed=0",))], root, [], tmp_path / "archives", HOST)
    assert new.name.endswith(".tar.xz") and not old.exists()
    again = restore(tmp_path / "elsewhere", tmp_path / "stores", tmp_path / "archives", None, HOST)
    assert again.folders == ["net/row/seed0"]


def test_a_broken_archive_is_a_clear_error(tmp_path):
    path = archive_path(tmp_path / "archives", HOST)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a tarball")
    with pytest.raises(ArchiveError, match="not a readable archive"):
        restore(tmp_path / "c", tmp_path / "stores", tmp_path / "archives", None, HOST)


def test_the_work_is_packed_even_when_it_stops_with_an_error(tmp_path, monkeypatch):
    import tuning.tools.campaign_archive as module

    monkeypatch.setattr(module, "equivalent_identities", lambda: [HOST])
    root = tmp_path / "campaign"
    jobs = campaign(root)

    def failing():
        raise SystemExit("a run exited 1")

    with pytest.raises(SystemExit):
        archived(tmp_path / "archives", jobs, root, [tmp_path / "stores" / "s.sqlite"], None, failing)
    assert archive_path(tmp_path / "archives", HOST).is_file()
    assert archived(None, jobs, root, [], None, lambda: "ran") == "ran"  # no folder: no archive work at all


def test_a_call_that_runs_part_of_the_campaign_keeps_the_other_parts_in_the_archive(tmp_path, monkeypatch):
    """A grid called with --blocks size2048 after a size512 call: its pack holds both blocks' runs."""
    import tuning.tools.campaign_archive as module

    monkeypatch.setattr(module, "equivalent_identities", lambda: [HOST])
    root, archives = tmp_path / "campaign", tmp_path / "archives"
    first = [finished_run(root / "gemm_512" / "gbfs" / "seed0")]
    archived(archives, first, root, [], None, lambda: None)
    second = [finished_run(root / "gemm_2048" / "gbfs" / "seed0"), finished_run(root / "gemm_2048" / "a2c" / "seed0", "KILLED")]
    archived(archives, second, root, [], None, lambda: None)
    restored = restore(tmp_path / "new", tmp_path / "new-stores", archives, None, HOST)
    assert sorted(restored.folders) == ["gemm_2048/gbfs/seed0", "gemm_512/gbfs/seed0"]

    (root / "gemm_2048" / "gbfs" / "seed0" / "status").write_text("KILLED")  # a job of the call no longer finished
    archived(archives, second, root, [], None, lambda: None)
    assert restore(tmp_path / "newer", tmp_path / "newer-stores", archives, None, HOST).folders == ["gemm_512/gbfs/seed0"]


def test_a_store_in_the_archive_that_is_not_one_is_named(tmp_path, monkeypatch):
    import tuning.tools.campaign_archive as module

    path = archive_path(tmp_path / "archives", HOST)
    path.parent.mkdir(parents=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (("manifest.json", json.dumps({"format": 1, "host": HOST, "folders": [],
                                                          "stores": ["s.sqlite"]})), ("stores/s.sqlite", "junk")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data.encode()))
    with pytest.raises(ArchiveError, match="stores/s.sqlite"):
        restore(tmp_path / "c", tmp_path / "stores", tmp_path / "archives", None, HOST)
    monkeypatch.setattr(module, "equivalent_identities", lambda: [HOST])  # the experiments' option: one clear line
    with pytest.raises(SystemExit, match="tunelab: --archive: .*stores/s.sqlite"):
        archived(tmp_path / "archives", [], tmp_path / "c", [tmp_path / "stores" / "s.sqlite"], None, lambda: None)


def test_forgotten_runs_leave_the_archive_and_this_machine_and_the_readings_stay(tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    import tuning.tools.campaign_archive as module

    monkeypatch.setattr(module, "equivalent_identities", lambda: [HOST])
    root, archives, stores = tmp_path / "campaign", tmp_path / "archives", tmp_path / "stores"
    stores.mkdir()
    filled(stores / "s.sqlite", count=20)[0].close()
    jobs = [finished_run(root / "g" / row / "seed0") for row in ("bad", "good", "copied")]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("grid")
    made_here, kept = (client.create_run(experiment).info.run_id for _ in range(2))
    copy = client.create_run(experiment, tags={"tunelab.copy_of": "f" * 32}).info.run_id
    (root / "g" / "bad" / "seed0" / "mlflow_run_id").write_text(made_here)
    (root / "g" / "copied" / "seed0" / "mlflow_run_id").write_text("f" * 32)
    (root / "g" / "good" / "seed0" / "mlflow_run_id").write_text(kept)
    archived(archives, jobs, root, [stores / "s.sqlite"], None, lambda: None)
    path = archive_path(archives, HOST)
    before = path.read_bytes()

    with pytest.raises(SystemExit, match=r"holds no folder 'g/bad/seed9'"):
        module.main(["forget", str(archives), "g/bad/seed0", "g/bad/seed9", "--campaign", str(root), "--tracking-uri", uri])
    assert path.read_bytes() == before and (root / "g" / "bad" / "seed0").is_dir()  # refused before any work

    module.main(["forget", str(archives), "g/bad/seed0", "g/copied/seed0", "--campaign", str(root), "--tracking-uri", uri])
    assert "removed, with 1 MLflow run(s)" in capsys.readouterr().out
    assert not (root / "g" / "bad" / "seed0").exists() and not (root / "g" / "copied" / "seed0").exists()
    assert [client.get_run(r).info.lifecycle_stage for r in (made_here, copy, kept)] == ["deleted", "deleted", "active"]
    restored = restore(tmp_path / "new", tmp_path / "new-stores", archives, None, HOST)
    assert restored.folders == ["g/good/seed0"] and restored.readings == 20
