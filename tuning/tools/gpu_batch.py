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
The pack folder and its readings are untrusted: a manifest that lists a kernel, or a config of a
task, twice is refused; a reading that is not one of the pack's kernels, whose values no reader
would accept, or that was not measured between the pack's making and now, is skipped and counted,
and so is one whose costs are not plausible for its task (tuning/core/plausible.py), never stored.
"""
from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from tuning.config.cli import tunelab_command
from tuning.config.untrusted import override_problems, user_named_servers
from tuning.core.records import ERROR_KINDS, MeasureResult
from tuning.store import TaskRows

CLOCK_SLACK_S = 24 * 3600.0  # the exporting host's and the GPU host's clocks may disagree, not by days

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
    unimportable = override_problems(overrides, "gpu-batch export", PACK_GROUPS, user_named_servers(*overrides))
    if unimportable:  # the pack carries them, and its import takes only these
        raise SystemExit("tunelab: a pack's overrides set only the hardware and evaluator:\n  " + "\n  ".join(unimportable))
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
          f"python PACK/run_pack.py; then here: {tunelab_command('dataset', 'import', '--store', 'STORE', 'PACK')} "
          f"(the folder, with its readings.jsonl)")


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
    window = measuring_window(manifest)
    by_gpu, skipped = {}, 0
    for line in readings.read_text(errors="replace").splitlines():
        reading = valid_reading(line, kernels, window)
        if reading is None:
            skipped += 1
            continue
        by_gpu.setdefault(reading["device"]["name"], []).append(reading)
    counts = [_import_gpu(store, manifest, name, rows, kernels, folder) for name, rows in by_gpu.items()]
    added, implausible = sum(a for a, _ in counts), sum(i for _, i in counts)
    print(f"{folder}: {sum(len(r) for r in by_gpu.values())} readings on {', '.join(by_gpu) or 'no device'}, "
          f"{added} rows added{f', {implausible} implausible readings skipped' if implausible else ''}"
          f"{f', {skipped} unreadable lines skipped' if skipped else ''}")
    return added


def measuring_window(manifest: dict, now: float | None = None) -> tuple[float, float]:
    """When the pack's readings can have been measured: from its making to now, each with CLOCK_SLACK_S."""
    now = time.time() if now is None else now
    return manifest["made_on"]["time"] - CLOCK_SLACK_S, now + CLOCK_SLACK_S


def _import_gpu(store, manifest: dict, gpu: str, readings: list, kernels: dict, folder: Path) -> tuple[int, int]:
    """The readings of one GPU into the store: (rows added, readings skipped as implausible)."""
    from hydra.errors import HydraException
    from hydra.utils import instantiate

    from tuning.hardware.gpu_pack import PackError
    from tuning.tools.run_config import compose, full_readings, model_tasks

    models = sorted({task["model"] for task in manifest["tasks"].values()})
    added = implausible = 0
    for model in models:
        try:  # quoted: a name such as `nan` or `true` stays a name
            cfg = compose([f"model='{model}'", *manifest["overrides"]])
        except HydraException as error:
            raise PackError(f"{folder}/manifest.json: tasks: model {model!r} with its overrides: "
                            f"{str(error).splitlines()[0]}") from None
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
                table, result = tables.get(kernel["task"]), _result(reading, kernel)
                if table is not None and not _plausible(table, result):
                    implausible += 1
                    continue
                added += _add(table, kernel["config"], result, reading["measured_at"])
            for entry in manifest["invalid"] + manifest["build_errors"]:
                result = MeasureResult.failed(entry["error"] if entry.get("error") in ERROR_KINDS else "invalid",
                                              str(entry.get("message", "")), build_s=float(entry.get("build_s", 0.0)))
                added += _add(tables.get(entry["task"]), entry["config"], result, manifest["made_on"]["time"])
    return added, implausible


def _plausible(table: TaskRows, result: MeasureResult) -> bool:
    """Whether the store's readers would accept the result's costs (its task's bounds on this hardware)."""
    return table.store.bounds(table.hardware_key, table.task_key).first_problem(result.costs) is None


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
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and value >= 0
    except OverflowError:  # an int past any float
        return False


def valid_reading(line: str, kernels: dict, window: tuple[float, float]) -> dict | None:
    """A readings.jsonl line as a reading of one of the pack's kernels measured within `window`
    (`measuring_window`), or None."""
    try:
        reading = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: a nesting bomb
        return None
    if not isinstance(reading, dict) or not isinstance(reading.get("kernel"), str) or reading["kernel"] not in kernels:
        return None
    device = reading.get("device")
    error, costs = reading.get("error"), reading.get("costs", [])
    ok = (isinstance(device, dict) and isinstance(device.get("name"), str) and 0 < len(device["name"]) <= 200
          and (error is None or error in ERROR_KINDS) and isinstance(reading.get("message", ""), str)
          and _number(reading.get("run_s", 0.0)) and _number(reading.get("measured_at"))
          and window[0] <= reading["measured_at"] <= window[1]
          and (reading.get("gauge_s") is None or (_number(reading["gauge_s"]) and reading["gauge_s"] > 0))
          and isinstance(costs, list) and all(_number(c) and c > 0 for c in costs) and (error or costs))
    if not ok:
        return None
    return {"kernel": reading["kernel"], "device": device, "error": error, "costs": [float(c) for c in costs],
            "message": reading.get("message", "")[-2000:], "run_s": float(reading.get("run_s", 0.0)),
            "gauge_s": reading.get("gauge_s"), "measured_at": float(reading["measured_at"])}


# What a pack's overrides may set: the hardware and evaluator it was built for (`hardware=cuda`,
# `hardware.arch=sm_90`, `evaluator=adaptive`); the model comes from its tasks.
PACK_GROUPS = ("hardware", "evaluator")


def read_manifest(folder: Path) -> dict:
    """A pack's manifest.json, checked for what import reads (untrusted)."""
    from tuning.hardware.gpu_pack import PACK_FORMAT, PackError

    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError, RecursionError) as error:  # RecursionError: a nesting bomb
        raise PackError(f"{folder}/manifest.json: {type(error).__name__}: {str(error)[:200]}") from None
    problems = []
    if not isinstance(manifest, dict) or manifest.get("format") != PACK_FORMAT:
        raise PackError(f"{folder}/manifest.json: not a tunelab GPU pack of format {PACK_FORMAT}")
    if not isinstance(manifest.get("overrides"), list):
        problems.append("overrides")
    else:
        refused = override_problems(manifest["overrides"], f"{folder}/manifest.json", PACK_GROUPS, user_named_servers())
        if refused:  # before anything is composed from them: nothing a pack names is imported or connected to
            raise PackError("\n  ".join(["refused, nothing was run:", *refused]))
    tasks = manifest.get("tasks")
    if not isinstance(tasks, dict) or not all(isinstance(t, dict) and _model_name(t.get("model"))
                                              for t in tasks.values()):
        problems.append("tasks")
        tasks = {}
    if not _kernels_ok(manifest.get("libraries"), tasks):
        problems.append("libraries")
    for key in ("invalid", "build_errors"):
        if not (isinstance(manifest.get(key), list) and all(_failure_ok(e, tasks) for e in manifest[key])):
            problems.append(key)
    if manifest.get("device") not in ("cpu", "cuda"):
        problems.append("device")
    if not _made_ok(manifest.get("made_on")):
        problems.append("made_on (a time before now)")
    if problems:
        raise PackError(f"{folder}/manifest.json: unreadable {', '.join(problems)}")
    listed_twice = _listed_twice(manifest)
    if listed_twice:
        raise PackError(f"{folder}/manifest.json: {'; '.join(listed_twice)}")
    return manifest


def _listed_twice(manifest: dict) -> list[str]:
    """Kernel names, and configs of one task, the manifest lists more than once: a reading of such a
    kernel could be stored under either config, and a config under two outcomes."""
    kernels = [k for library in manifest["libraries"] for k in library["kernels"]]
    names = Counter(k["name"] for k in kernels)
    configs = Counter((e["task"], tuple(e["config"])) for e in [*kernels, *manifest["invalid"],
                                                                *manifest["build_errors"]])
    return ([f"libraries: kernel {name!r} listed {n} times" for name, n in names.items() if n > 1][:3]
            + [f"libraries, invalid, build_errors: config {list(config)} of task {task!r} listed {n} times"
               for (task, config), n in configs.items() if n > 1][:3])


def _model_name(name) -> bool:
    """A model config's plain name (composed as model=NAME): no path, interpolation or second override."""
    return isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9][\w.-]{0,99}", name) is not None


def _made_ok(made_on) -> bool:
    return isinstance(made_on, dict) and _number(made_on.get("time")) and made_on["time"] <= time.time() + CLOCK_SLACK_S


def _failure_ok(entry, tasks: dict) -> bool:
    """An `invalid` or `build_errors` entry: a config of one of the tasks, with numbers where import reads them."""
    return (isinstance(entry, dict) and _config_ok(entry.get("config")) and isinstance(entry.get("task"), str)
            and entry["task"] in tasks and _number(entry.get("build_s", 0.0)))


def _config_ok(config) -> bool:
    return isinstance(config, list) and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in config)


def _kernels_ok(libraries, tasks: dict) -> bool:
    if not isinstance(libraries, list):
        return False
    return all(isinstance(lib, dict) and isinstance(lib.get("kernels"), list) and all(
        isinstance(k, dict) and isinstance(k.get("name"), str) and _config_ok(k.get("config"))
        and isinstance(k.get("task"), str) and k["task"] in tasks and _number(k.get("build_s", 0.0))
        for k in lib["kernels"]) for lib in libraries)


def unpacked(path: Path, into: Path) -> Path:
    """A pack folder, or an archive extracted into the folder `into`."""
    from tuning.hardware.gpu_pack import unpack

    return unpack(path, into) if path.is_file() else path


# ---- command line ----------------------------------------------------------------------------------------
def add_gpu_batch(command) -> None:
    actions = command.add_subparsers(dest="action", required=True, metavar="ACTION",
                                     help="export (the readings come back with `dataset import`)")
    from tuning.config.cli import add_command

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
