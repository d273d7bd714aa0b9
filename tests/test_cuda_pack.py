"""GPU batch packs without a GPU: a CUDA batch built into packs (size, contents, cubins), the runner script
run on this host with an llvm pack as the GPU's stand-in and only TVM's runtime importable, its
readings imported into a store and replayed by a tuning run, and the untrusted parts refused."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from helpers import tune_run

pytestmark = pytest.mark.tvm

REPO = Path(__file__).resolve().parents[1]
GPU_NAME = "Test GPU (readings written by this test)"


def dataset(*args: str) -> None:
    from tuning.tools.dataset import main

    main(list(args))


def unpack(archive: Path, into: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(into)
    return into / archive.name.removesuffix(".tar.gz")


def run_pack(folder: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """The pack's script, in a Python where `import tvm` fails: only TVM's runtime (the pack's) is there."""
    poison = tmp / "no_tvm"
    poison.mkdir(exist_ok=True)
    (poison / "sitecustomize.py").write_text("import sys\nsys.modules['tvm'] = None\n")
    return subprocess.run([sys.executable, str(folder / "run_pack.py"), *args], capture_output=True, text=True,
                          timeout=600, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(poison)})


def readings(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "readings.jsonl").read_text().splitlines()]


# ---- the llvm stand-in: the whole path on this host -------------------------------------------------------
@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """A pack of 8 gemm_64 kernels for this host's CPU (hardware=cpu), timed by its script."""
    tmp = tmp_path_factory.mktemp("stand_in")
    dataset("gpu-batch", "export", "--model", "gemm_64", "--configs", "8", "--per-library", "4",
            "--out", str(tmp / "packs"), "hardware=cpu")
    folder = unpack(tmp / "packs" / "gemm_64.tar.gz", tmp / "host")
    done = run_pack(folder, tmp)
    assert done.returncode == 0, done.stderr
    return tmp, folder, done


def test_the_pack_holds_runtime_libraries_kernels_checks_and_its_script(stand_in):
    tmp, folder, _ = stand_in
    manifest = json.loads((folder / "manifest.json").read_text())
    assert (folder / "lib" / "libtvm_runtime.so").is_file() and not (folder / "lib" / "libtvm_compiler.so").exists()
    assert list((folder / "site" / "tvm_ffi").glob("core.*.so")) and not (folder / "site" / "tvm_ffi" / "include").exists()
    assert (folder / "run_pack.py").read_text() == (REPO / "tuning" / "hardware" / "gpu_pack_runner.py").read_text()
    assert [len(lib["kernels"]) for lib in manifest["libraries"]] == [4, 4]
    assert all((folder / lib["file"]).is_file() for lib in manifest["libraries"])
    assert manifest["device"] == "cpu" and manifest["evaluator"]["repeat"] >= 1
    task = next(iter(manifest["tasks"].values()))
    assert task["args"] == [[[64, 64], "float32"]] * 3 and (folder / task["check"]).is_file()
    assert not (tmp / "packs" / "gemm_64").exists()  # the staging folder is gone; the archive is the pack


def test_the_script_times_every_kernel_with_only_tvms_runtime(stand_in):
    _, folder, done = stand_in
    rows = readings(folder)
    assert len(rows) == 8 and "8 kernels timed now on cpu:0" in done.stdout
    assert all(r["error"] is None and len(r["costs"]) >= 1 and all(c > 0 for c in r["costs"]) for r in rows)
    assert all(r["gauge_s"] and r["device"]["name"] and r["pack"] == "gemm_64" for r in rows)


def test_a_killed_run_resumes_and_a_wrong_output_is_caught(stand_in, tmp_path):
    _, folder, _ = stand_in
    copy = tmp_path / "pack"
    shutil.copytree(folder, copy)
    lines = (copy / "readings.jsonl").read_text().splitlines()
    (copy / "readings.jsonl").write_text("\n".join(lines[:5]) + "\n" + lines[5][:40])  # killed mid-line
    import numpy as np

    check = next((copy / "checks").glob("*.npz"))
    with np.load(check) as saved:
        changed = {k: saved[k] for k in saved.files}
    changed["values"] = changed["values"] + 1.0
    np.savez(check, **changed)
    done = run_pack(copy, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "3 kernels timed now" in done.stdout
    fresh = [json.loads(line) for line in (copy / "readings.jsonl").read_text().splitlines()[6:]]
    assert [r["error"] for r in fresh] == ["wrong_answer"] * 3


def test_a_library_that_does_not_load_is_a_reading_per_kernel(stand_in, tmp_path):
    _, folder, _ = stand_in
    copy = tmp_path / "pack"
    shutil.copytree(folder, copy)
    (copy / "readings.jsonl").unlink()
    (copy / "kernels" / "lib0001.so").write_bytes(b"not a library")
    done = run_pack(copy, tmp_path)
    assert done.returncode == 0, done.stderr
    errors = [r["error"] for r in readings(copy)]
    assert errors[:4] == [None] * 4 and errors[4:] == ["run"] * 4
    assert "did not load" in readings(copy)[-1]["message"]


def test_readings_import_into_a_store_and_a_run_replays_them(stand_in, tmp_path, capsys, monkeypatch):
    _, original, _ = stand_in
    folder = tmp_path / "pack"
    shutil.copytree(original, folder)
    with (folder / "readings.jsonl").open("a") as out:
        out.write("not json\n{\"kernel\": \"k9_9\"}\n")
    store = tmp_path / "stand_in.sqlite"
    dataset("import", "--store", str(store), str(folder))
    said = capsys.readouterr().out
    assert "8 rows added, 2 unreadable lines skipped" in said
    dataset("import", "--store", str(store), str(folder))
    assert "0 rows added" in capsys.readouterr().out  # what the store holds is not added twice
    tune_run(tmp_path, monkeypatch, "hardware=replay", f"hardware.store={store}", "hardware.on_miss=error",
             "model=gemm_64", "model.space=store", "search=random", "budget.trials=8", "tracking=none")
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(r["result"]["reused"] and not r["result"]["error"] for r in records)


def test_the_archive_itself_imports_with_the_readings_brought_back(stand_in, tmp_path, capsys):
    tmp, folder, _ = stand_in
    store = tmp_path / "from_archive.sqlite"
    dataset("import", "--store", str(store), str(tmp / "packs" / "gemm_64.tar.gz"), "--readings",
            str(folder / "readings.jsonl"))
    assert "8 readings on" in capsys.readouterr().out
    dataset("stats", "--store", str(store))
    assert "gemm_64                         8       8       0" in capsys.readouterr().out


# ---- a CUDA batch built for sm_90: 2 kernels in the default suite, the full 32 in make test-full ----------
@pytest.fixture(scope="module", params=[2, pytest.param(32, marks=pytest.mark.slow)])
def cuda_pack(tmp_path_factory, request):
    from tuning.hardware.cuda_compile import uncompilable

    problem = uncompilable("sm_90")
    if problem:
        pytest.skip(problem)
    tmp = tmp_path_factory.mktemp("cuda")
    size = request.param
    dataset("gpu-batch", "export", "--model", "gemm_1024", "--configs", str(size), "--per-library", str(size // 2),
            "--out", str(tmp / "packs"), "hardware.arch=sm_90", "hardware.build_workers=2")
    archive = tmp / "packs" / "gemm_1024.tar.gz"
    return size, archive, unpack(archive, tmp / "host")


def test_a_cuda_batch_is_verified_built_to_cubins_and_packed_under_60_mib(cuda_pack):
    from tuning.hardware.cuda_compile import blob_of_library, cuda_formats

    size, archive, folder = cuda_pack
    manifest = json.loads((folder / "manifest.json").read_text())
    assert archive.stat().st_size < 60 * 2**20
    kernels = [k for lib in manifest["libraries"] for k in lib["kernels"]]
    assert len(kernels) == size and not manifest["build_errors"]
    assert len({tuple(k["config"]) for k in kernels}) == size
    assert manifest["invalid"] and all("VerifyGPUCode" in e["message"] for e in manifest["invalid"][:20])
    for library in manifest["libraries"]:
        assert cuda_formats(blob_of_library(folder / library["file"])) == ["cubin"]
    assert manifest["device"] == "cuda" and manifest["target"]["arch"] == "sm_90"
    for name in ("libtvm_runtime.so", "libtvm_runtime_cuda.so"):
        assert (folder / "lib" / name).is_file()


def test_gpu_readings_replay_on_a_host_without_the_gpu(cuda_pack, tmp_path, capsys, monkeypatch):
    """Readings as a GPU host's script writes them (made up here: there is no GPU), imported under the
    GPU's name and replayed by a run on this CPU host, with GPU verification's rejects as invalid rows."""
    size, _, folder = cuda_pack
    manifest = json.loads((folder / "manifest.json").read_text())
    kernels = [k for lib in manifest["libraries"] for k in lib["kernels"]]
    lines = [json.dumps({"kernel": k["name"], "error": None, "costs": [1e-4 * (1 + i % 7)] * 3, "message": "",
                         "run_s": 0.01, "gauge_s": 2e-5, "measured_at": manifest["made_on"]["time"] + 60, "pack": manifest["id"],
                         "device": {"kind": "cuda", "name": GPU_NAME, "compute_version": "9.0"}})
             for i, k in enumerate(kernels)]
    copy = tmp_path / "pack"
    shutil.copytree(folder, copy)
    (copy / "readings.jsonl").write_text("\n".join(lines) + "\n")
    store, rows = tmp_path / "gpu.sqlite", size + len(manifest["invalid"])
    dataset("import", "--store", str(store), str(copy))
    assert f"{size} readings on {GPU_NAME}, {rows} rows added" in capsys.readouterr().out
    dataset("stats", "--store", str(store))
    assert f"cuda GPU '{GPU_NAME}'" in capsys.readouterr().out  # what a replay must name
    tune_run(tmp_path, monkeypatch, "hardware=replay", "hardware@hardware.backend=cuda", "hardware.backend.arch=sm_90",
             f"hardware.backend.gpu='{GPU_NAME}'", f"hardware.store={store}", "hardware.on_miss=error",
             "model=gemm_1024", "model.space=store", "search=random", f"budget.trials={rows}", "tracking=none")
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(records) == rows and all(r["result"]["reused"] for r in records)  # every stored row, once
    ok = [r for r in records if not r["result"]["error"]]
    assert len(ok) == size and {r["result"]["error"] for r in records} <= {None, "invalid"}


# ---- untrusted packs -------------------------------------------------------------------------------------------
def test_a_manifest_that_is_not_a_packs_is_refused_naming_what(stand_in, tmp_path):
    from tuning.hardware.gpu_pack import PackError
    from tuning.tools.gpu_batch import read_manifest

    _, folder, _ = stand_in
    copy = tmp_path / "pack"
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["libraries"][0]["kernels"][0]["config"] = ["x"]
    manifest["overrides"] = "hardware=cpu"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackError, match="unreadable overrides, libraries"):
        read_manifest(copy)
    (copy / "manifest.json").write_text("[]")
    with pytest.raises(PackError, match="not a tunelab GPU pack"):
        read_manifest(copy)


def test_an_archive_reaching_outside_its_folder_is_refused(tmp_path):
    from tuning.hardware.gpu_pack import PackError
    from tuning.hardware.gpu_pack import unpack as unpack_pack

    archive = tmp_path / "evil.tar.gz"
    (tmp_path / "x").write_text("x")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "x", arcname="pack/../../escaped")
    with pytest.raises(PackError, match="not a tunelab GPU pack"):
        unpack_pack(archive, tmp_path / "into")
    assert not (tmp_path.parent / "escaped").exists()


@pytest.mark.parametrize("extra, says", [(["--name", "../up"], "--name: '../up' is not a plain file name"),
                                         (["--python", "three"], "--python: expected a Python version"),
                                         ([], "--name: .*gemm_64.tar.gz exists")])
def test_an_export_is_refused_before_any_work_naming_the_option(tmp_path, extra, says):
    (tmp_path / "gemm_64.tar.gz").write_bytes(b"a pack timed last week")
    with pytest.raises(SystemExit, match=says):
        dataset("gpu-batch", "export", "--model", "gemm_64", "--out", str(tmp_path), *extra, "hardware=cpu")
    assert (tmp_path / "gemm_64.tar.gz").read_bytes() == b"a pack timed last week"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemm_64.tar.gz"]


def test_parallel_builds_never_share_a_worker_and_each_library_lists_its_own_kernels(tmp_path):
    """A slow first library once sent a third job to the busy worker: two calls on one pipe took each
    other's answers, and the manifest listed another library's kernels under a file."""
    import threading
    import time
    from types import SimpleNamespace

    from tuning.hardware.gpu_pack import _build_all

    class OneCallAtATime:
        def __init__(self):
            self.busy = threading.Lock()

        def call(self, function, workload, target, named, path, timeout):
            assert self.busy.acquire(blocking=False), "two builds in flight on one worker"
            try:
                time.sleep(0.4 if path.endswith("lib0000.so") else 0.01)
                return "ok", [{"name": n, "config": c, "error": None, "args": [], "build_s": 0.0} for n, c in named]
            finally:
                self.busy.release()

    plan = SimpleNamespace(task=SimpleNamespace(workload="w", key="task"))
    jobs = [(plan, [[number, i] for i in range(3)]) for number in range(6)]
    libraries, errors = _build_all([OneCallAtATime(), OneCallAtATime()], jobs, {}, tmp_path, None)
    assert errors == []
    assert [library["file"] for library in libraries] == [f"kernels/lib{n:04d}.so" for n in range(6)]
    for number, library in enumerate(libraries):
        assert [k["name"] for k in library["kernels"]] == [f"k{number}_{i}" for i in range(3)]
        assert [k["config"] for k in library["kernels"]] == [[number, i] for i in range(3)]
