"""`tunelab dataset gpu-batch export` and the import of a pack's readings (docs/gpus.md).

    tunelab dataset gpu-batch export --model conv_l8 --configs 500 --out packs hardware.arch=sm_90
    tunelab dataset gpu-batch export --preset chameleon --configs 500 --out packs hardware.arch=sm_90
    # on the GPU host:  tar xzf packs/conv_l8.tar.gz && python conv_l8/run_pack.py
    tunelab dataset import --store stores/h100.sqlite conv_l8        # the folder, with its readings.jsonl

`export` plans and builds here (tuning/hardware/gpu_pack.py) with the hardware and evaluator a run
would use (Hydra overrides after `export`; `hardware=cuda` unless another is named), and writes one
or more .tar.gz packs of at most --max-mib. Importing a pack's folder adds its readings to a
measurement store under the GPU the readings name (`hardware.gpu`), with the configs GPU
verification rejected as `invalid` rows: a replay then reads them on any host
(`hardware=replay hardware@hardware.backend=cuda hardware.backend.arch=... hardware.backend.gpu=...`).
The pack folder and its readings are untrusted: a reading that is not one of the pack's kernels, or
whose values no reader would accept, is skipped and counted.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from tqdm import tqdm

from tuning.core.records import ERROR_KINDS, MeasureResult
from tuning.store import TaskRows

# The seed papers' layers as they ran them on GPUs (docs/gpus.md §Presets).
PRESETS = {
    "chameleon": [f"conv_l{i}" for i in range(1, 9)],  # Chameleon Table 5's L1-L8: AlexNet, VGG-16, ResNet-18
    "gemm-tiling": ["gemm_512", "gemm_1024", "gemm_2048"],  # the GEMM-tiling paper's square GEMMs
}


def model_names(args) -> list[str]:
    names = list(args.model or [])
    for preset in args.preset or []:
        names += [n for n in PRESETS[preset] if n not in names]
    if not names:
        raise SystemExit("tunelab: gpu-batch export: --model or --preset: name what to build")
    return names


def with_default_hardware(overrides: list[str]) -> list[str]:
    named = any(o.split("=", 1)[0].lstrip("+~") == "hardware" for o in overrides)
    return overrides if named else ["hardware=cuda", *overrides]


def export(args) -> None:
    from hydra.utils import instantiate

    from tuning.hardware.gpu_pack import PackSettings, existing_packs, export_packs, kernel_count, plan_task
    from tuning.tools.run_config import compose, full_readings, model_tasks

    overrides = with_default_hardware(list(args.overrides))
    names = model_names(args)
    settings = PackSettings(out=Path(args.out), name=args.name or "-".join(args.preset or names[:1]),
                            per_library=args.per_library, max_mib=args.max_mib, python=args.python,
                            ffi_wheel=args.ffi_wheel)
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]{0,99}", settings.name):
        raise SystemExit(f"tunelab: --name: {settings.name!r} is not a plain file name (letters, digits, . _ -)")
    if not re.fullmatch(r"3\.\d{1,2}", settings.python):
        raise SystemExit(f"tunelab: --python: expected a Python version such as 3.12, got {settings.python!r}")
    if existing_packs(settings):
        raise SystemExit(f"tunelab: --name: {existing_packs(settings)[0]} exists; an export never writes over a "
                         f"pack (another --name, or remove it)")
    cfgs = {name: compose([f"model={name}", *overrides]) for name in names}
    first = cfgs[names[0]]
    hardware, spec = instantiate(first.hardware), full_readings(instantiate(first.evaluator).spec)
    if not hasattr(hardware, "schedules"):
        raise SystemExit(f"tunelab: gpu-batch export: hardware={first.hardware._target_} builds no TVM kernels")
    problem = hardware.unbuildable()
    if problem:
        raise SystemExit(f"tunelab: {problem}")
    plans = []
    for name, cfg in cfgs.items():
        for task in model_tasks(cfg, hardware):
            plan = plan_task(task, name, hardware.space(task), hardware.schedules(task), args.configs, args.seed,
                             args.attempts)
            short = (f"; only {len(plan.legitimate):,} of {args.configs:,} found in {args.attempts} x {args.configs:,} "
                     f"draws (raise --attempts)" if len(plan.legitimate) < args.configs else "")
            print(f"{task.name}: {len(plan.legitimate):,} configs to build ({len(plan.invalid):,} drawn and "
                  f"rejected by the postprocessors, GPU verification included){short}")
            plans.append(plan)
    settings.out.mkdir(parents=True, exist_ok=True)
    total = sum(len(p.legitimate) for p in plans)
    with tqdm(total=total, unit="kernel", dynamic_ncols=True, disable=None) as bar:
        archives, manifest = export_packs(hardware, spec, plans, overrides, settings, progress=bar.update)
    hardware.close()
    for archive in archives:
        print(f"{archive}: {archive.stat().st_size / 2**20:.1f} MiB")
    failed = len(manifest["build_errors"])
    print(f"{kernel_count(manifest):,} kernels in {len(archives)} pack(s){f' ({failed} did not build)' if failed else ''}"
          f"; on the GPU host: tar xzf PACK.tar.gz && "
          f"python PACK/run_pack.py; then: tunelab dataset import --store STORE PACK (the folder, with its "
          f"readings.jsonl)")


# ---- import ------------------------------------------------------------------------------------------
def is_pack(path: Path) -> bool:
    return path.is_dir() and (path / "manifest.json").is_file() and (path / "run_pack.py").is_file()


def import_pack(store, folder: Path, readings: Path | None = None) -> int:
    """A pack folder's readings (readings.jsonl, or `readings`) into the store; returns rows added."""
    manifest = read_manifest(folder)
    readings = readings or folder / "readings.jsonl"
    if not readings.is_file():
        print(f"skip {folder}: no readings ({readings}); run the pack first (python {folder}/run_pack.py)")
        return 0
    kernels = {k["name"]: k for library in manifest["libraries"] for k in library["kernels"]}
    by_gpu, skipped = {}, 0
    for line in readings.read_text(errors="replace").splitlines():
        reading = valid_reading(line, kernels)
        if reading is None:
            skipped += 1
            continue
        by_gpu.setdefault(reading["device"]["name"], []).append(reading)
    added = sum(_import_gpu(store, manifest, name, rows, kernels) for name, rows in by_gpu.items())
    print(f"{folder}: {sum(len(r) for r in by_gpu.values())} readings on {', '.join(by_gpu) or 'no device'}, "
          f"{added} rows added{f', {skipped} unreadable lines skipped' if skipped else ''}")
    return added


def _import_gpu(store, manifest: dict, gpu: str, readings: list, kernels: dict) -> int:
    from hydra.utils import instantiate

    from tuning.tools.run_config import compose, full_readings, model_tasks

    models = sorted({task["model"] for task in manifest["tasks"].values()})
    added = 0
    for model in models:
        cfg = compose([f"model={model}", *manifest["overrides"]])
        with instantiate(cfg.hardware) as hardware:
            if manifest["device"] != "cpu":
                hardware.gpu = gpu
            spec = full_readings(instantiate(cfg.evaluator).spec)
            tables = {}
            for task in model_tasks(cfg, hardware):
                if task.key in manifest["tasks"]:
                    tables[task.key] = TaskRows(store, hardware, spec, task, hardware.space(task))
                    tables[task.key].register()
            for reading in readings:
                kernel = kernels[reading["kernel"]]
                added += _add(tables.get(kernel["task"]), kernel["config"], _result(reading, kernel),
                              reading["measured_at"])
            for entry in manifest["invalid"] + manifest["build_errors"]:
                result = MeasureResult.failed(entry["error"] if entry.get("error") in ERROR_KINDS else "invalid",
                                              str(entry.get("message", "")), build_s=float(entry.get("build_s", 0.0)))
                added += _add(tables.get(entry["task"]), entry["config"], result, manifest["made_on"]["time"])
    return added


def _add(table, config, result: MeasureResult, measured_at: float) -> int:
    config = tuple(int(c) for c in config)
    if table is None or not table.space.is_valid(config) or table.holds(config, result):
        return 0
    table.add(config, result, "import", measured_at=measured_at)
    return 1


def _result(reading: dict, kernel: dict) -> MeasureResult:
    timings = {"build_s": float(kernel.get("build_s", 0.0)), "run_s": reading["run_s"], "gauge_s": reading["gauge_s"]}
    if reading["error"]:
        return MeasureResult.failed(reading["error"], reading["message"], **timings)
    return MeasureResult(costs=reading["costs"], message=reading["message"], **timings)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def valid_reading(line: str, kernels: dict) -> dict | None:
    """A readings.jsonl line as a reading of one of the pack's kernels, or None."""
    try:
        reading = json.loads(line)
    except ValueError:
        return None
    if not isinstance(reading, dict) or reading.get("kernel") not in kernels:
        return None
    device = reading.get("device")
    error, costs = reading.get("error"), reading.get("costs", [])
    ok = (isinstance(device, dict) and isinstance(device.get("name"), str) and 0 < len(device["name"]) <= 200
          and (error is None or error in ERROR_KINDS) and isinstance(reading.get("message", ""), str)
          and _number(reading.get("run_s", 0.0)) and _number(reading.get("measured_at"))
          and (reading.get("gauge_s") is None or (_number(reading["gauge_s"]) and reading["gauge_s"] > 0))
          and isinstance(costs, list) and all(_number(c) and c > 0 for c in costs) and (error or costs))
    if not ok:
        return None
    return {"kernel": reading["kernel"], "device": device, "error": error, "costs": [float(c) for c in costs],
            "message": reading.get("message", "")[-2000:], "run_s": float(reading.get("run_s", 0.0)),
            "gauge_s": reading.get("gauge_s"), "measured_at": float(reading["measured_at"])}


def read_manifest(folder: Path) -> dict:
    """A pack's manifest.json, checked for what import reads (untrusted)."""
    from tuning.hardware.gpu_pack import PACK_FORMAT, PackError

    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError) as error:
        raise PackError(f"{folder}/manifest.json: {error}") from None
    problems = []
    if not isinstance(manifest, dict) or manifest.get("format") != PACK_FORMAT:
        raise PackError(f"{folder}/manifest.json: not a tunelab GPU pack of format {PACK_FORMAT}")
    if not (isinstance(manifest.get("overrides"), list) and all(isinstance(o, str) for o in manifest["overrides"])):
        problems.append("overrides")
    if not isinstance(manifest.get("tasks"), dict) or not all(
            isinstance(t, dict) and isinstance(t.get("model"), str) for t in manifest["tasks"].values()):
        problems.append("tasks")
    if not _kernels_ok(manifest.get("libraries")):
        problems.append("libraries")
    for key in ("invalid", "build_errors"):
        if not (isinstance(manifest.get(key), list) and all(
                isinstance(e, dict) and _config_ok(e.get("config")) and e.get("task") in manifest.get("tasks", {})
                for e in manifest[key])):
            problems.append(key)
    if manifest.get("device") not in ("cpu", "cuda") or not _number((manifest.get("made_on") or {}).get("time")):
        problems.append("device/made_on")
    if problems:
        raise PackError(f"{folder}/manifest.json: unreadable {', '.join(problems)}")
    return manifest


def _config_ok(config) -> bool:
    return isinstance(config, list) and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in config)


def _kernels_ok(libraries) -> bool:
    if not isinstance(libraries, list):
        return False
    return all(isinstance(lib, dict) and isinstance(lib.get("kernels"), list) and all(
        isinstance(k, dict) and isinstance(k.get("name"), str) and _config_ok(k.get("config"))
        and isinstance(k.get("task"), str) and _number(k.get("build_s", 0.0)) for k in lib["kernels"])
        for lib in libraries)


def unpacked(path: Path, into: Path) -> Path:
    """A pack folder, or an archive extracted into the folder `into`."""
    from tuning.hardware.gpu_pack import unpack

    return unpack(path, into) if path.is_file() else path


# ---- command line ----------------------------------------------------------------------------------------
def add_gpu_batch(command) -> None:
    actions = command.add_subparsers(dest="action", required=True, metavar="ACTION",
                                     help="export (the readings come back with `dataset import`)")
    from tuning.tools.cli_common import add_command

    export_cmd = add_command(actions, "export", help="build a batch of candidates into packs a GPU host times")
    export_cmd.add_argument("--model", nargs="+", default=[], metavar="NAME", help="model config names, e.g. conv_l8")
    export_cmd.add_argument("--preset", nargs="+", choices=sorted(PRESETS), default=[],
                            help="the seed papers' layers: " + "; ".join(f"{k}: {' '.join(v)}" for k, v in PRESETS.items()))
    export_cmd.add_argument("--configs", type=int, default=500, help="legitimate configs per task")
    export_cmd.add_argument("--out", required=True, help="the folder the packs are written to")
    export_cmd.add_argument("--name", default=None, help="the pack's name (default: the preset or first model)")
    export_cmd.add_argument("--seed", type=int, default=0, help="seeds the sample")
    export_cmd.add_argument("--attempts", type=int, default=200,
                            help="draw at most this many x --configs configs a task to find legitimate ones")
    export_cmd.add_argument("--per-library", type=int, default=32, help="kernels a shared library")
    export_cmd.add_argument("--max-mib", type=float, default=60.0, help="largest pack, compressed")
    export_cmd.add_argument("--python", default=None, help="the GPU host's Python, e.g. 3.12 (default: this one's)")
    export_cmd.add_argument("--ffi-wheel", default=None, help="an apache-tvm-ffi wheel for that Python "
                                                              "(default: this one's tvm_ffi, or pip download)")
    export_cmd.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                            help="Hydra overrides, e.g. hardware.arch=sm_90 hardware.build_workers=2 (hardware=cuda "
                                 "unless another is named)")
