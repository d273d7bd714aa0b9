"""GPU batch packs: candidates built here, timed on a GPU host that has only TVM's runtime (docs/gpus.md).

`export_packs` plans each task's configs (a seeded uniform sample of the space, as `dataset build`
draws, until `count` of them pass MetaSchedule's postprocessors and GPU verification; the rejected
ones are kept as `invalid` readings that need no GPU), builds the legitimate ones in the host's
build processes into shared libraries of `per_library` kernels each (one nvcc run a library for a
cuda target), and writes a pack folder: the libraries, each task's output check, the drift gauge
kernel, TVM's runtime libraries, tvm_ffi for the GPU host's Python, the runner script
(gpu_pack_runner.py as run_pack.py) and manifest.json. The folder is split into packs of at most
`max_mib` compressed, each a .tar.gz with everything but its share of the libraries; `unpack`
extracts one (untrusted) for `dataset import`.

The work that needs TVM runs in the build processes (`build_library`, `write_task_check`,
`build_gauge`); this module imports no TVM at module level.
"""
from __future__ import annotations

import importlib.util
import io
import json
import lzma
import os
import platform
import queue
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np

from tuning.hardware.gpu_pack_runner import GAUGE_NAME, check_points, find_cudart, pack_input
from tuning.hardware.workers import Worker

WORKER = "tuning.hardware.tvm_worker"
PACK_FORMAT = 1
RUNNER_SCRIPT = Path(__file__).with_name("gpu_pack_runner.py")
FFI_DISTRIBUTION = "apache-tvm-ffi"
FFI_KEPT = ("*.py", "*.so", "*.pyi", "py.typed")  # tvm_ffi at run time: no headers, sources or stubs
WHEEL_CACHE = Path(os.environ.get("TUNELAB_WHEEL_CACHE", Path.home() / ".cache" / "tunelab" / "wheels"))


class PackError(ValueError):
    """A pack that cannot be made or read (the message names the option or file)."""


# ---- in the build processes (TVM) -------------------------------------------------------------------
def build_library(workload: dict, target: dict, jobs: list, lib_path: str) -> list[dict]:
    """Build `jobs` ([kernel name, config]) into one library: each config scheduled, renamed to its
    kernel name and built together (one nvcc run for a cuda target). When that fails, the kernels
    TVM cannot lower are found one by one (no nvcc), then, if the rest still fail, the ones nvcc
    refuses, each compiled alone; those are `build` outcomes and the library holds the others.
    One dict per job: {"name", "config", "error", "message", "args", "build_s"}."""
    from tuning.hardware.tvm_worker import as_built, task_schedules

    start = time.perf_counter()
    schedules = task_schedules(workload, target)
    outcomes, funcs = {}, {}
    for name, config in jobs:
        try:
            sch, effective = schedules.schedule(tuple(config))
        except Exception as error:  # noqa: BLE001 - a config the postprocessors reject: an invalid reading
            outcomes[name] = {"name": name, "config": list(config), "error": "invalid",
                              "message": f"{type(error).__name__}: {error}"}
            continue
        mod, args = as_built(sch)
        funcs[name] = mod["main"].with_attr("global_symbol", name)
        outcomes[name] = {"name": name, "config": list(effective), "error": None, "message": "", "args": args}
    failed = _build_together(funcs, target, lib_path)
    if failed:  # lowering is cheap: the kernels TVM cannot lower are found one by one first
        failed = _without_failures(funcs, outcomes, lambda name: _lowering_problem(funcs[name], target),
                                   lambda: _build_together(funcs, target, lib_path))
    if failed:  # then the ones nvcc refuses, each compiled alone
        alone = f"{lib_path}.alone"
        failed = _without_failures(funcs, outcomes, lambda name: _build_together({name: funcs[name]}, target, alone),
                                   lambda: _build_together(funcs, target, lib_path))
        Path(alone).unlink(missing_ok=True)
    if failed:
        for name in funcs:
            outcomes[name].update(error="build", message=failed)
    share = (time.perf_counter() - start) / max(1, len(jobs))
    return [{**outcomes[name], "build_s": share} for name, _ in jobs]


def _without_failures(funcs: dict, outcomes: dict, problem_of, build_the_rest) -> str | None:
    """Drop from `funcs` each kernel `problem_of` finds a problem with (a `build` outcome), then
    build the rest together; None once they are built, else why not."""
    for name in list(funcs):
        problem = problem_of(name)
        if problem:
            outcomes[name].update(error="build", message=problem)
            del funcs[name]
    return build_the_rest()


def _lowering_problem(func, target: dict) -> str | None:
    import tvm

    from tuning.hardware.tvm_worker import _compile

    return _failure(lambda: _compile(tvm.IRModule({func.attrs["global_symbol"]: func}), target))


def _build_together(funcs: dict, target: dict, lib_path: str) -> str | None:
    """None once `funcs` are built into lib_path, else why not."""
    import tvm

    from tuning.hardware.tvm_worker import _compile, export

    if not funcs:
        return None
    return _failure(lambda: export(_compile(tvm.IRModule(funcs), target), target, lib_path))


def _failure(action) -> str | None:
    """None once `action()` ran, else its traceback (the end of it)."""
    try:
        action()
    except Exception:  # noqa: BLE001 - a kernel that does not build is a `build` outcome, not a crash
        return traceback.format_exc(limit=3)[-4000:]
    return None


def write_task_check(workload: dict, target: dict, path: str) -> list:
    """The task's check in an .npz (gpu_pack_runner.output_matches): its untuned kernel's output on
    the pack's inputs (gpu_pack_runner.pack_input), run on this host's CPU, at the checked
    positions, with the output's largest magnitude, sum and sum of magnitudes; returns the
    arguments' [shape, dtype]."""
    import tvm

    from tuning.hardware.tvm_device import tvm_device
    from tuning.hardware.tvm_space import HOST_TARGET, arguments, untuned_runs_on, workload_module
    from tuning.hardware.tvm_worker import _compile

    mod = workload_module(workload)
    args = arguments(mod["main"])
    *inputs, (out_shape, out_dtype) = args
    lib = _compile(mod, target if untuned_runs_on(target) else HOST_TARGET)
    dev = tvm_device("cpu")  # this host's CPU: the untuned kernel runs here, whatever the target
    tensors = [tvm.runtime.tensor(pack_input(shape, dtype, i), dev) for i, (shape, dtype) in enumerate(inputs)]
    tensors.append(tvm.runtime.tensor(np.zeros(out_shape, dtype=out_dtype), dev))
    lib[lib.entry_name](*tensors)
    out = tensors[-1].numpy().reshape(-1)
    indices = check_points(out.size)
    np.savez_compressed(path, indices=indices, values=out[indices], scale=np.abs(out).max(),
                        sum=out.astype(np.float64).sum(), abs_sum=np.abs(out.astype(np.float64)).sum())
    return args


def build_gauge(target: dict, lib_path: str) -> list:
    """The drift gauge kernel (tvm_worker.gauge_module) as `gauge` in a library; its arguments."""
    import tvm

    from tuning.hardware.tvm_space import arguments
    from tuning.hardware.tvm_worker import _compile, export, gauge_module

    mod = gauge_module(target)
    func = mod["main"].with_attr("global_symbol", GAUGE_NAME)
    export(_compile(tvm.IRModule({GAUGE_NAME: func}), target), target, lib_path)
    return arguments(mod["main"])


# ---- planning (this process) -----------------------------------------------------------------------
@dataclass
class TaskPlan:
    task: object
    model: str
    legitimate: list = field(default_factory=list)
    invalid: list = field(default_factory=list)  # (config, message)


def plan_task(task, model: str, space, schedules, count: int, seed: int, attempts: int) -> TaskPlan:
    """`count` distinct legitimate configs of a seeded uniform sample (the rejected ones kept), or
    fewer when `attempts` x count draws find no more."""
    rng = np.random.default_rng(seed)
    plan, seen = TaskPlan(task, model), set()
    for _ in range(count * attempts):
        if len(plan.legitimate) >= count:
            break
        config = space.canonical(space.sample(rng))
        if config in seen:
            continue
        seen.add(config)
        try:
            schedules.schedule(config)
            plan.legitimate.append(config)
        except Exception as error:  # noqa: BLE001 - rejected by a postprocessor (GPU verification, ...)
            plan.invalid.append((config, f"{type(error).__name__}: {error}"[:500]))
    return plan


# ---- the pack folder ---------------------------------------------------------------------------------
@dataclass
class PackSettings:
    out: Path
    name: str
    per_library: int = 32
    max_mib: float = 60.0
    python: str = f"{sys.version_info.major}.{sys.version_info.minor}"
    ffi_wheel: str | None = None  # a downloaded apache-tvm-ffi wheel for `python`
    cudart: bool = True  # carry this host's libcudart (CUDA targets)


def export_packs(hardware, spec, plans: list[TaskPlan], overrides: list[str], settings: PackSettings,
                 progress=None) -> tuple[list[Path], dict]:
    """Build every plan's legitimate configs and write the packs (.tar.gz, at most max_mib each);
    returns them and the whole batch's manifest. They are staged in a folder of their own under
    `settings.out`, removed however the export ends."""
    setup = hardware.setup()
    folder = Path(tempfile.mkdtemp(prefix=f".{settings.name}-staging-", dir=settings.out))
    try:
        return _export_into(folder, hardware, spec, plans, overrides, settings, setup, progress)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def existing_packs(settings: PackSettings) -> list[Path]:
    """Packs of this name already in the output folder (an export never writes over them)."""
    return sorted([*settings.out.glob(f"{settings.name}.tar.gz"), *settings.out.glob(f"{settings.name}-*of*.tar.gz")])


def _export_into(folder: Path, hardware, spec, plans, overrides, settings: PackSettings, setup, progress):
    (folder / "kernels").mkdir()
    (folder / "checks").mkdir()
    workers = [Worker(setup.build_env, f"{WORKER}:init", init_args=(setup.target,))
               for _ in range(max(1, setup.build_workers))]
    try:
        manifest = _manifest(hardware, spec, overrides, settings, setup)
        manifest["gauge"] = {"file": "gauge.so", "args": _call(workers[0], "build_gauge", setup.target,
                                                               str(folder / "gauge.so"))}
        for number, plan in enumerate(plans):
            manifest["tasks"][plan.task.key] = _task_entry(workers[0], plan, number, folder, setup.target,
                                                           hardware.store_key(plan.task))
            manifest["invalid"] += [{"task": plan.task.key, "config": list(c), "message": m} for c, m in plan.invalid]
        jobs = [(plan, chunk) for plan in plans for chunk in _chunks(plan.legitimate, settings.per_library)]
        manifest["libraries"], manifest["build_errors"] = _build_all(workers, jobs, setup.target, folder, progress)
    finally:
        for worker in workers:
            worker.close()
    _carry_runtime(folder, setup.device, settings)
    shutil.copyfile(RUNNER_SCRIPT, folder / "run_pack.py")
    return _split_and_compress(folder, manifest, settings), manifest


def _call(worker: Worker, function: str, *args):
    status, value = worker.call(f"tuning.hardware.gpu_pack:{function}", *args, timeout=3600)
    if status != "ok":
        raise PackError(f"{function} failed in a build process: {value}")
    return value


def _manifest(hardware, spec, overrides, settings: PackSettings, setup) -> dict:
    return {"format": PACK_FORMAT, "id": settings.name, "device": setup.device, "target": setup.target,
            "overrides": list(overrides), "hardware": hardware.name,
            "tvm": _version("apache-tvm"), "tvm_ffi": _version(FFI_DISTRIBUTION),
            "evaluator": {"number": spec.number, "repeat": spec.repeat, "min_repeat_ms": spec.min_repeat_ms,
                          "timeout_s": spec.timeout_s, "check_correctness": spec.check_correctness},
            "python": settings.python, "made_on": {"host": platform.node(), "time": time.time()},
            "tasks": {}, "libraries": [], "invalid": [], "build_errors": []}


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def _task_entry(worker, plan: TaskPlan, number: int, folder: Path, target: dict, store_key: str) -> dict:
    check = f"checks/task{number}.npz"
    args = _call(worker, "write_task_check", plan.task.workload, target, str(folder / check))
    return {"name": plan.task.name, "model": plan.model, "store_key": store_key, "check": check, "args": args,
            "planned": len(plan.legitimate), "rejected": len(plan.invalid)}


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _build_all(workers, jobs, target, folder: Path, progress) -> tuple[list, list]:
    """Each job (a task plan and its chunk of configs) built into kernels/libNNNN.so, in parallel."""
    free = queue.SimpleQueue()  # a job takes a worker no other job is using, and gives it back
    for worker in workers:
        free.put(worker)

    def build(job_number):
        plan, chunk = jobs[job_number]
        file = f"kernels/lib{job_number:04d}.so"
        named = [[f"k{job_number}_{i}", list(c)] for i, c in enumerate(chunk)]
        worker = free.get()
        try:
            status, value = worker.call("tuning.hardware.gpu_pack:build_library", plan.task.workload, target,
                                        named, str(folder / file), timeout=3600)
        finally:
            free.put(worker)
        if status != "ok":
            value = [{"name": n, "config": c, "error": "build", "message": str(value), "build_s": 0.0}
                     for n, c in named]
        if progress:
            progress(len(chunk))
        return plan, file, value

    libraries, errors = [], []
    slots = len(workers)
    with ThreadPoolExecutor(slots) as pool:
        futures = [pool.submit(build, n) for n in range(len(jobs))]
        for future in futures:
            plan, file, outcomes = future.result()
            built = [o for o in outcomes if o["error"] is None]
            errors += [{**o, "task": plan.task.key} for o in outcomes if o["error"] is not None]
            if built:
                libraries.append({"file": file, "kernels": [
                    {"name": o["name"], "task": plan.task.key, "config": o["config"], "args": o["args"],
                     "build_s": o["build_s"]} for o in built]})
    return libraries, errors


# ---- what travels with the kernels -----------------------------------------------------------------
def _carry_runtime(folder: Path, device: str, settings: PackSettings) -> None:
    lib = folder / "lib"
    lib.mkdir()
    runtime = _tvm_lib_dir()
    names = ["libtvm_runtime.so"] + (["libtvm_runtime_cuda.so"] if device == "cuda" else [])
    for name in names:
        shutil.copyfile(runtime / name, lib / name)
    if device == "cuda" and settings.cudart:
        found = find_cudart()
        if found:
            shutil.copyfile(Path(found).resolve(), lib / "libcudart.so.13")
    _carry_ffi(folder / "site", settings)


def _tvm_lib_dir() -> Path:
    spec = importlib.util.find_spec("tvm")
    if spec is None or not spec.submodule_search_locations:
        raise PackError("the TVM package is not installed here")
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def _carry_ffi(site: Path, settings: PackSettings) -> None:
    """tvm_ffi for the GPU host's Python: this interpreter's copy when the versions match, else the
    package from an apache-tvm-ffi wheel for that Python (--ffi-wheel, or one pip downloads)."""
    version = metadata.version(FFI_DISTRIBUTION)
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    if settings.ffi_wheel is None and settings.python == this:
        spec = importlib.util.find_spec("tvm_ffi")
        _copy_kept(Path(list(spec.submodule_search_locations)[0]), site / "tvm_ffi")
        return
    wheel = Path(settings.ffi_wheel) if settings.ffi_wheel else _download_ffi(version, settings.python)
    unpacked = site.parent / "wheel"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    _copy_kept(unpacked / "tvm_ffi", site / "tvm_ffi")
    shutil.rmtree(unpacked)


def _copy_kept(source: Path, target: Path) -> None:
    for path in source.rglob("*"):
        relative = path.relative_to(source)
        if path.is_file() and relative.parts[0] not in ("include", "src", "3rdparty", "share") \
                and any(path.match(pattern) for pattern in FFI_KEPT) and "__pycache__" not in relative.parts:
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / relative)


def _download_ffi(version: str, python: str) -> Path:
    cache = WHEEL_CACHE / f"cp{python.replace('.', '')}"
    found = sorted(cache.glob(f"apache_tvm_ffi-{version}-*.whl"))
    if found:
        return found[0]
    command = [sys.executable, "-m", "pip", "download", f"{FFI_DISTRIBUTION}=={version}", "--python-version",
               python, "--only-binary=:all:", "--no-deps", "--platform", "manylinux_2_28_x86_64", "-d", str(cache),
               "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True)
    found = sorted(cache.glob(f"apache_tvm_ffi-{version}-*.whl"))
    if done.returncode != 0 or not found:
        raise PackError(f"--python {python}: could not download {FFI_DISTRIBUTION}=={version} for it "
                        f"({(done.stderr or done.stdout).strip()[-500:]}); pass one with --ffi-wheel")
    return found[0]


# ---- packs: split and compressed ---------------------------------------------------------------------
def _split_and_compress(folder: Path, manifest: dict, settings: PackSettings) -> list[Path]:
    """One .tar.gz per share of the libraries; each share's compressed size, with the common files,
    at most max_mib (a library's compressed size is measured one by one)."""
    libraries = manifest["libraries"]
    common = [p for p in folder.rglob("*") if p.is_file() and p.parent.name != "kernels"]
    common_bytes = sum(_compressed_size(p) for p in common)
    budget = settings.max_mib * 2**20 - common_bytes - 2**20  # a MiB for the manifest and tar headers
    if budget <= 0:
        raise PackError(f"--max-mib {settings.max_mib}: the runtime and checks alone take "
                        f"{common_bytes / 2**20:.1f} MiB compressed")
    shares, share, used = [], [], 0.0
    for library in libraries:
        size = _compressed_size(folder / library["file"])
        if share and used + size > budget:
            shares.append(share)
            share, used = [], 0.0
        share.append(library)
        used += size
    shares.append(share)
    archives = []
    for number, share in enumerate(shares, 1):  # a pack's folder inside its archive is named by its id
        pack_id = manifest["id"] if len(shares) == 1 else f"{manifest['id']}-{number}of{len(shares)}"
        own = {**manifest, "id": pack_id, "libraries": share,
               "invalid": manifest["invalid"] if number == 1 else [],
               "build_errors": manifest["build_errors"] if number == 1 else []}
        archives.append(_write_archive(folder, own, [l["file"] for l in share], common, settings.out / pack_id))
    return archives


def _compressed_size(path: Path) -> int:
    return len(zlib.compress(path.read_bytes(), 6))


def _write_archive(folder: Path, manifest: dict, kernel_files: list, common: list, stem: Path) -> Path:
    archive = stem.with_name(stem.name + ".tar.gz")
    text = json.dumps(manifest, indent=1).encode()
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo(f"{manifest['id']}/manifest.json")
        info.size, info.mtime = len(text), int(time.time())
        tar.addfile(info, io.BytesIO(text))
        for path in [*common, *(folder / f for f in kernel_files)]:
            tar.add(path, arcname=f"{manifest['id']}/{path.relative_to(folder)}")
    return archive


# Caps on an unpacked pack (untrusted), read from its tar headers before anything is written.
PACK_MAX_BYTES = 2 << 30  # a pack is --max-mib compressed (60 by default); its libraries unpack to a few times that
PACK_MAX_MEMBERS = 10_000  # a pack holds a few hundred files: its libraries, checks, TVM's runtime and tvm_ffi
EXTRACTION_FILTER = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # 3.11.4+: no setuid or odd modes


def unpack(archive: Path, into: Path) -> Path:
    """A pack archive (untrusted) extracted into a new folder under `into`; the pack's folder. Its
    members are checked from their headers before anything is written (plain files and folders under
    one folder, PACK_MAX_MEMBERS and PACK_MAX_BYTES at most), and a failed extraction leaves nothing."""
    try:
        with tarfile.open(archive) as tar:
            members = _pack_members(tar, archive)
            into.mkdir(parents=True, exist_ok=True)
            folder = Path(tempfile.mkdtemp(prefix="pack-", dir=into))
            try:
                tar.extractall(folder, members=members, **EXTRACTION_FILTER)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
    except (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError) as error:
        raise PackError(f"{archive}: not a readable pack archive ({type(error).__name__}: {error})") from None
    return folder / Path(members[0].name).parts[0]


def _pack_members(tar: tarfile.TarFile, archive: Path) -> list[tarfile.TarInfo]:
    """The archive's members, read one header at a time (the scan stops at the first over a cap)."""
    members, total = [], 0
    for member in tar:
        members.append(member)
        total += member.size
        if len(members) > PACK_MAX_MEMBERS:
            raise PackError(f"{archive}: more than {PACK_MAX_MEMBERS:,} members (a pack holds a few hundred)")
        if total > PACK_MAX_BYTES:
            raise PackError(f"{archive}: its members unpack to over {PACK_MAX_BYTES >> 20} MiB")
    roots = {Path(m.name).parts[0] if Path(m.name).parts else "" for m in members}
    if len(roots) != 1 or "" in roots or any(not (m.isfile() or m.isdir()) or ".." in Path(m.name).parts
                                             or m.name.startswith("/") for m in members):
        raise PackError(f"{archive}: not a tunelab GPU pack (one folder of plain files)")
    return members


def kernel_count(manifest: dict) -> int:
    return sum(len(library["kernels"]) for library in manifest["libraries"])
