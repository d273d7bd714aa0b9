"""Hostile GPU packs: what their manifests, readings and tar headers may say.

A pack's manifest lists each kernel and each config of a task once; a reading is measured between
the pack's making and now and holds plausible costs, else it is skipped and counted; a pack over its
caps on members and unpacked bytes is refused from its tar headers before anything is written, and a
refusal leaves no scratch behind. The packs here are made by hand for
the synthetic backend: no TVM build."""
from __future__ import annotations

import io
import json
import re
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from tuning.hardware.gpu_pack import PACK_FORMAT, PackError
from tuning.store import MeasurementStore, connect_store
from tuning.tools.gpu_batch import import_pack, read_manifest

GPU = "Test GPU (readings written by this test)"
DAY = 24 * 3600.0


# ---- a pack of the synthetic backend's gemm_64 ------------------------------------------------------------
@pytest.fixture(scope="module")
def gemm():
    """gemm_64's task key on the synthetic backend and four of its configs."""
    from hydra.utils import instantiate

    from tuning.tools.run_config import compose, model_tasks

    cfg = compose(["model=gemm_64", "hardware=synthetic"])
    hardware = instantiate(cfg.hardware)
    [task] = model_tasks(cfg, hardware)
    space, rng = hardware.space(task), np.random.default_rng(0)
    configs = list(dict.fromkeys(space.canonical(space.sample(rng)) for _ in range(40)))[:4]
    return task.key, [list(c) for c in configs]


def write_pack(folder: Path, task: str, kernels: list, readings=(), invalid=(), made_at: float | None = None) -> Path:
    """A pack folder as an export leaves it and a GPU host's run fills it: kernels are (name, config)."""
    folder.mkdir(parents=True)
    manifest = {"format": PACK_FORMAT, "id": folder.name, "device": "cpu", "overrides": ["hardware=synthetic"],
                "made_on": {"host": "test", "time": time.time() - 600 if made_at is None else made_at},
                "tasks": {task: {"name": "gemm_64", "model": "gemm_64"}},
                "libraries": [{"file": "kernels/lib0000.so", "kernels": [
                    {"name": name, "task": task, "config": config, "build_s": 0.1} for name, config in kernels]}],
                "invalid": [{"task": task, "config": config, "message": "rejected"} for config in invalid],
                "build_errors": []}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "run_pack.py").write_text("")
    (folder / "readings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in readings))
    return folder


def reading(kernel: str, measured_at: float | None = None, costs=(1e-4, 1.1e-4, 1.2e-4)) -> dict:
    return {"kernel": kernel, "error": None, "costs": list(costs), "message": "", "run_s": 0.01, "gauge_s": 2e-5,
            "measured_at": time.time() - 60 if measured_at is None else measured_at,
            "device": {"kind": "cpu", "name": GPU}}


def stored_rows(store: MeasurementStore) -> list:
    return [row for key in store.keys() for row in store.rows(*key)]


def test_a_manifest_naming_one_kernel_twice_is_refused(gemm, tmp_path):
    task, configs = gemm
    folder = write_pack(tmp_path / "pack", task, [("dupe", configs[0]), ("dupe", configs[1])],
                        readings=[reading("dupe")])
    with pytest.raises(PackError, match=rf"^{folder}/manifest.json: libraries: kernel 'dupe' listed 2 times"):
        read_manifest(folder)
    store = connect_store(tmp_path / "store.sqlite")
    with pytest.raises(PackError, match="'dupe'"):
        import_pack(store, folder)
    assert store.count() == 0


@pytest.mark.parametrize("kernels, invalid", [
    ([("k0_0", 0), ("k0_1", 0)], []),  # two kernels of one config
    ([("k0_0", 0), ("k0_1", 1)], [1]),  # a kernel's config also among the configs GPU verification rejected
])
def test_a_manifest_listing_one_config_of_a_task_twice_is_refused(gemm, tmp_path, kernels, invalid):
    task, configs = gemm
    folder = write_pack(tmp_path / "pack", task, [(name, configs[i]) for name, i in kernels],
                        invalid=[configs[i] for i in invalid])
    twice = configs[kernels[1][1]]
    with pytest.raises(PackError, match=rf"^{folder}/manifest.json: .*config {re.escape(str(twice))} of task '{task}' "
                                        "listed 2 times"):
        read_manifest(folder)


def test_readings_not_measured_between_the_packs_making_and_now_are_skipped(gemm, tmp_path, capsys):
    task, configs = gemm
    made = time.time() - DAY
    kernels = [(f"k0_{i}", config) for i, config in enumerate(configs)]
    good = made + 3600
    folder = write_pack(tmp_path / "pack", task, kernels, made_at=made, readings=[
        reading("k0_0", good), reading("k0_1", 1e300), reading("k0_2", made - 10 * DAY),
        reading("k0_3", time.time() + 10 * DAY)])
    store = connect_store(tmp_path / "store.sqlite")
    assert import_pack(store, folder) == 1
    assert "1 rows added, 3 unreadable lines skipped" in capsys.readouterr().out
    assert [row.measured_at for row in stored_rows(store)] == [good]

    made_later = write_pack(tmp_path / "later", task, kernels, made_at=1e300)  # so no reading is ever too early
    with pytest.raises(PackError, match=rf"^{made_later}/manifest.json: .*made_on"):
        read_manifest(made_later)


def test_readings_of_implausible_costs_are_counted_and_not_stored(gemm, tmp_path, capsys):
    """gemm_64 on the synthetic backend (100 GFLOP/s): no run takes under 1.3 us, none an hour or more."""
    task, configs = gemm
    kernels = [(f"k0_{i}", config) for i, config in enumerate(configs[:3])]
    folder = write_pack(tmp_path / "pack", task, kernels, readings=[
        reading("k0_0"), reading("k0_1", costs=[2e-9] * 3), reading("k0_2", costs=[1e-4, 7200.0])])
    store = connect_store(tmp_path / "store.sqlite")
    assert import_pack(store, folder) == 1
    assert "1 rows added, 2 implausible readings skipped" in capsys.readouterr().out
    assert store.count() == 1 and store.unreadable() == 0
    assert [tuple(row.config) for row in stored_rows(store)] == [tuple(configs[0])]


# ---- tar headers ---------------------------------------------------------------------------------------------
def header_only_tar(path: Path, members: list) -> Path:
    """An uncompressed tar of (name, bytes) members and (name, size) ones whose data is a hole: their
    headers declare `size` bytes, the file takes almost no disk. tarfile reads any format by its bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data) if isinstance(data, bytes) else data
            out.write(info.tobuf())
            if isinstance(data, bytes):
                out.write(data)
            else:
                out.seek(info.size, io.SEEK_CUR)
            out.seek(-out.tell() % tarfile.BLOCKSIZE, io.SEEK_CUR)
        out.write(b"\0" * 2 * tarfile.BLOCKSIZE)
    return path


def nothing_left(*folders: Path) -> bool:
    return all(not folder.exists() or not any(folder.iterdir()) for folder in folders)


# ---- gpu_pack.unpack ----------------------------------------------------------------------------------------
@pytest.fixture
def no_extraction(monkeypatch):
    def extractall(self, *args, **kwargs):
        raise AssertionError("extracting before the pack's caps were checked")

    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)


def test_a_pack_whose_headers_declare_more_than_its_cap_is_refused_before_any_write(tmp_path, no_extraction):
    from tuning.hardware.gpu_pack import PACK_MAX_BYTES, unpack

    half = PACK_MAX_BYTES // 2 + 1
    path = header_only_tar(tmp_path / "pack.tar.gz", [("pack/manifest.json", b"{}"), ("pack/kernels/lib0000.so", half),
                                                      ("pack/kernels/lib0001.so", half)])
    with pytest.raises(PackError, match=rf"^{path}: .*over {PACK_MAX_BYTES >> 20} MiB"):
        unpack(path, tmp_path / "into")
    assert nothing_left(tmp_path / "into")


def test_a_pack_of_too_many_members_is_refused_before_any_write(tmp_path, no_extraction):
    from tuning.hardware.gpu_pack import PACK_MAX_MEMBERS, unpack

    path = header_only_tar(tmp_path / "pack.tar.gz", [(f"pack/checks/task{i}.npz", b"")
                                                      for i in range(PACK_MAX_MEMBERS + 1)])
    with pytest.raises(PackError, match=rf"^{path}: more than {PACK_MAX_MEMBERS:,} members"):
        unpack(path, tmp_path / "into")
    assert nothing_left(tmp_path / "into")


def test_a_pack_that_fails_half_way_through_its_extraction_leaves_nothing(tmp_path):
    from tuning.hardware.gpu_pack import unpack

    path = header_only_tar(tmp_path / "pack.tar.gz", [("pack/manifest.json", b"{}"), ("pack/run_pack.py", b""),
                                                      ("pack/manifest.json/inside", b"x")])
    with pytest.raises(PackError, match=rf"^{path}: "):
        unpack(path, tmp_path / "into")
    assert nothing_left(tmp_path / "into")


@pytest.mark.parametrize("member", ["pack/../../escaped", "/pack/x", "pack/link", "pack/device"])
def test_a_pack_member_that_is_not_a_plain_file_inside_its_folder_is_refused(tmp_path, member):
    from tuning.hardware.gpu_pack import unpack

    path = tmp_path / "pack.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(member)
        if member.endswith("link"):
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        elif member.endswith("device"):
            info.type = tarfile.CHRTYPE
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(PackError, match="not a tunelab GPU pack"):
        unpack(path, tmp_path / "into")
    assert nothing_left(tmp_path / "into") and not (tmp_path.parent / "escaped").exists()
