"""A run's best kernel as a shared library you can call from your own code.

    python -m tuning.tools.export outputs/runs/2026-11-24/19-00-00-000000
    python -m tuning.tools.export RUN --task fused_conv2d_add_relu     # one kernel of a whole model

builds the task's best measured schedule (a single operator's, or the named kernel of a whole
model) into `<run>/export/<task>.so`, loads it back, checks its answer on random inputs (numpy's
product, torch's conv2d; a network's kernel against its untuned build), times it beside the untuned
kernel and torch with the run's thread count, and writes `<run>/export/run_<task>.py`: a short
script that loads the library, calls it, checks it and times it. That script and its library are
then copied into an empty temporary folder and the script is run there once, as a user who moved
them elsewhere would run it, isolated (`python -I`: a module planted beside the script in the run
folder is never imported). Exit status 1 when an answer is wrong or the script fails. The library
and the script are added to the run's MLflow run (artifacts under export/). A run folder holding a
link is refused before any work (tuning/engine/run_folder.py `refuse_links`).

What a tuning job exports itself once tuning is over is tuning/engine/artifacts.py.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tuning.config import ConfigError
from tuning.config.cli import new_parser
from tuning.core.host_load import host_load
from tuning.core.outcome import TaskOutcome
from tuning.core.plausible import reference_problem
from tuning.core.records import RecordLog
from tuning.core.task import is_whole_model
from tuning.engine.artifacts import choose_in_model_and_export, export_artifacts, export_choice  # noqa: F401
from tuning.engine.resume import prior_records
from tuning.engine.run_folder import load_config, on_run_folder
from tuning.engine.validate import validate
from tuning.tools.sync import best_as_reported, load_chosen, tracker_of


def export_run(run_dir: Path, task_name: str | None = None) -> dict:
    """The run folder is untrusted input: its config is checked like run.py's before anything is built."""
    from hydra.utils import instantiate

    cfg = load_config(run_dir / "config.yaml", "run")
    validate(cfg)
    with instantiate(cfg.hardware) as hardware:
        outcome = best_in_run(cfg, hardware, run_dir, task_name)
        task = outcome.task
        try:
            result = hardware.export_library(task, outcome.best_config, run_dir / "export")
        except NotImplementedError as error:  # synthetic hardware (also behind a replay) builds no kernel
            raise ConfigError(f"hardware: {error}; export a run made on real hardware (hardware=cpu)") from None
    result["snippet_output"], result["snippet_ok"] = _run_snippet(Path(result["snippet"]), [Path(result["library"])])
    _report(task, result)
    tracker = tracker_of(cfg, run_dir)
    try:
        for path in (result["library"], result["snippet"]):
            tracker.log_artifact(path, "export")
    finally:
        tracker.end("FINISHED")
    return result


def open_tvm_run(run_dir: Path, scope: str = "any", run_threads: bool = False):
    """(config, hardware) of a run folder tuned on TVM hardware, read as untrusted input: the config is
    checked like run.py's and, before anything is built, a run of the wrong `scope` ("model": a whole
    model only; "operator": a single operator only) or on other hardware is refused, naming the key.
    `run_threads`: TVM's thread pool gets the run's threads (set before the pool starts). Close the hardware."""
    from hydra.utils import instantiate

    from tuning.hardware.tvm_backend import TVMHardware

    cfg = load_config(run_dir / "config.yaml", "run")
    validate(cfg)
    if scope == "model" and not is_whole_model(cfg.model):
        raise ConfigError(f"model: {run_dir} tunes a single operator; this needs a whole-model run")
    if scope == "operator" and is_whole_model(cfg.model):  # its kernels are fused Relax functions
        raise ConfigError(f"model: {run_dir} tunes a whole model; this needs a single-operator run (model=gemm_1024, ...)")
    if run_threads:
        os.environ["TVM_NUM_THREADS"] = str(cfg.hardware.get("num_threads", 1))
    hardware = instantiate(cfg.hardware)
    if not isinstance(hardware, TVMHardware):
        hardware.close()
        raise ConfigError(f"hardware: {run_dir} was not tuned on TVM hardware (hardware=cpu): no kernels to build")
    return cfg, hardware


def best_in_run(cfg, hardware, run_dir: Path, task_name: str | None = None, tasks: list | None = None) -> TaskOutcome:
    """A run's task (by name in a whole-model run) with the best config the run reported
    (best_configs.json; in a run without one, the fastest of its records, tuning.database's
    included), or ConfigError when it has none. `tasks`: the run's tasks
    when the caller has them (a whole model's take seconds to extract)."""
    from hydra.utils import instantiate

    from tuning.core.task import build_tasks

    records = RecordLog(run_dir / "records.jsonl").load()
    if tasks is None:
        tasks = hardware.model_tasks(cfg.model, cfg.seed) if is_whole_model(cfg.model) else build_tasks(cfg.model)
    task = _pick(tasks, task_name, run_dir)
    prior = prior_records(cfg, [task], run_dir, instantiate(cfg.tracking)).get(task.key, [])
    outcome = TaskOutcome(task, [*prior, *(r for r in records if r.workload_key == task.key)])
    best_as_reported(outcome, load_chosen(run_dir), run_dir)
    if outcome.best_config is None:
        raise ConfigError(f"run: {run_dir} holds no valid measurement of {task.name}")
    return outcome


def _pick(tasks, name: str | None, run_dir: Path):
    if name is None and len(tasks) == 1:
        return tasks[0]
    found = [t for t in tasks if t.name == name]
    if not found:
        names = ", ".join(t.name for t in tasks)
        what = f"no task {name!r}" if name else f"{len(tasks)} tasks: name one"
        raise ConfigError(f"--task: {run_dir} has {what} (its tasks: {names})")
    return found[0]


def _run_snippet(script: Path, beside: list[Path]) -> tuple[str, bool]:
    """The written script, copied with the files it needs (`beside`: its library) into an empty folder
    and run there once in a fresh interpreter, as a user who moved them elsewhere would. Isolated (-I:
    neither the script's folder nor PYTHON* variables on the path, no user site): a numpy.py or
    sitecustomize.py left in a shared run folder is never imported. The script finds its library beside
    its own __file__."""
    with tempfile.TemporaryDirectory(prefix="tunelab-export-") as clean:
        for path in (script, *beside):
            shutil.copyfile(path, Path(clean) / path.name)
        try:
            done = subprocess.run([sys.executable, "-I", script.name], cwd=clean, capture_output=True,
                                  text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return "no answer within 600 s", False
    return (done.stdout + done.stderr).strip(), done.returncode == 0


def _report(task, result: dict) -> None:
    gflops = task.flops / result["tuned_s"] / 1e9
    print(f"[{task.name}] {result['library']}: output {'matches' if result['correct'] else 'DIFFERS FROM'} "
          f"{result['reference']} (max |error| {result['max_abs_error']:.2e} of values up to "
          f"{result['reference_max']:.3g})")
    timings = [f"tuned {result['tuned_s'] * 1e6:.1f} us ({gflops:.1f} GFLOP/s)",
               f"untuned {result['untuned_s'] * 1e6:.1f} us ({result['untuned_s'] / result['tuned_s']:.1f}x slower)"]
    if result.get("torch_s"):
        timings.append(torch_timing(result, task.flops))
    print("  " + "; ".join(timings) + " (medians of 10, measured one after another)")
    print(f"  {result['snippet']}: {'ran' if result['snippet_ok'] else 'FAILED'}: "
          + result["snippet_output"].replace("\n", " | ")[-400:])


def torch_timing(result: dict, flops: float) -> str:
    """torch's time beside the tuned kernel's, as a ratio only when its readings can stand as a latency
    (tuning.core.plausible.reference_problem); else why not, with the host's load then."""
    count = result.get("torch_threads")
    threads = f" at {count} thread{'s' if count != 1 else ''}" if count else ""
    torch_s, readings = result["torch_s"], result.get("torch_readings") or [result["torch_s"]]
    problem = reference_problem(readings, flops)
    if problem:
        load = host_load()
        return (f"torch {torch_s * 1e6:.1f} us{threads} IMPLAUSIBLE, no ratio: {problem}"
                f"{f'; the host {load}' if load else ''}")
    return f"torch {torch_s * 1e6:.1f} us{threads} (tuned is {torch_s / result['tuned_s']:.2f}x torch's speed)"


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = new_parser("python -m tuning.tools.export", __doc__.split("\n\n")[0], prog)
    parser.add_argument("run", type=Path, help="a run folder (outputs/runs/<date>/<time>)")
    parser.add_argument("--task", help="which kernel of a whole model (the names in the run's task table); "
                                       "default: the run's only task")
    return parser


def main(argv=None, prog: str | None = None) -> None:
    args = build_parser(prog).parse_args(argv)
    result = on_run_folder(args.run, lambda run_dir: export_run(run_dir, args.task))
    if not (result["correct"] and result["snippet_ok"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
