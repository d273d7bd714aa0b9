"""Is it the space or the search? A run's best kernel against hand-made neighbours, timed side by side.

    python experiments/probe_space.py outputs/runs/DAY/TIME \\
        --variant 'four_rows:tile0=4x1x64x4' --variant 'no_unroll:tile0=4x1x64x4,categorical3=0'
    python experiments/probe_space.py RUN --list          # the run's best config, knob by knob

A single-operator run (model=gemm_1024, conv_l1..conv_l8, ...) on hardware=cpu. A variant is the
run's best config with some knobs set to other values of the same space (a tile as its factors,
`4x1x64x4`; any other knob as its choice index; `sketch` first, then the chosen sketch's knobs, which
--list names), so a variant that beats the best says the search, not the space, stopped short. Each
of `--processes` fresh processes builds every kernel (output checked against the untuned kernel),
then times them and torch in `--passes` passes with the order rotated, at the run's threads and with
its evaluator's repeats (TVM's time_evaluator; the library through tvm_export.call_seconds, the same
loop). Fresh processes because on this host the same kernel has timed at two levels ~20% apart in
different processes, whatever the order within one: a ratio is paired within a process, and the
table gives its median and range over processes.

Real hardware only; run it alone on the host.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from tuning.config import ConfigError
from tuning.config.cli import child_json

REPO = Path(__file__).resolve().parents[1]

FOUND = "found"  # the run's best, as measured by the run
RESERVED = (FOUND, "torch", "numpy")  # rows of the table that are not variants


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a tunelab run folder (config.yaml, records.jsonl)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KNOB=VALUE[,KNOB=VALUE]")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--list", action="store_true", help="print the best config's knobs and stop")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("processes", "passes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    args.variants = {}
    for text in args.variant:
        name, settings = parse_variant(text, parser)
        if name in args.variants:
            parser.error(f"--variant {text!r}: a second variant named {name!r}")
        args.variants[name] = settings
    return args


def parse_variant(text: str, parser) -> tuple[str, dict]:
    name, _, assignments = text.partition(":")
    if not name or not assignments or name in RESERVED:
        parser.error(f"--variant {text!r}: expected NAME:KNOB=VALUE[,KNOB=VALUE] (NAME not one of {RESERVED})")
    settings = {}
    for assignment in assignments.split(","):
        knob, _, value = assignment.partition("=")
        if not knob or not value:
            parser.error(f"--variant {text!r}: {assignment!r} is not KNOB=VALUE")
        settings[knob.strip()] = value.strip()
    return name, settings


# ---- the run's best config and its variants -------------------------------------------------------
def open_run(folder: Path):
    """(hardware, its schedules of the task, the task's outcome, the run's measure spec) of a
    single-operator run folder on TVM hardware, read as untrusted input; the hardware is the run's
    own (its target and threads): close it."""
    from hydra.utils import instantiate

    from tuning.tools.export import best_in_run, open_tvm_run

    cfg, hardware = open_tvm_run(folder, "operator")  # a whole model's kernels: no torch operator to time beside
    try:
        outcome = best_in_run(cfg, hardware, folder)
        return hardware, hardware.schedules(outcome.task), outcome, instantiate(cfg.evaluator).spec
    except BaseException:
        hardware.close()
        raise


def with_settings(space, config: tuple, settings: dict) -> tuple:
    """The config with each named knob set to a value of its own choices (`sketch` first: the other
    names are those of the chosen sketch's knobs), or ConfigError naming the knob."""
    out = list(config)
    ordered = sorted(settings.items(), key=lambda item: item[0] != "sketch")
    for name, text in ordered:
        slots = active_slots(space, out[0])
        if name not in slots:
            raise ConfigError(f"knob {name!r}: sketch {out[0]} has {', '.join(slots)}")
        knob = space.knobs[slots[name]]
        try:
            value = tuple(int(f) for f in text.split("x")) if knob.kind == "tile" else None
            out[slots[name]] = knob.choices.index(value) if value is not None else int(text)
        except ValueError:
            raise ConfigError(f"knob {name}={text}: not one of its choices "
                              f"({describe_choices(knob)})") from None
        if not 0 <= out[slots[name]] < len(knob.choices):
            raise ConfigError(f"knob {name}={text}: a choice index below {len(knob.choices)}")
    return tuple(out)


def active_slots(space, sketch: int) -> dict:
    """{knob name: slot} of the knobs a sketch uses (the others do not change its program)."""
    return {"sketch": 0, **{space.knobs[slot].name: slot for slot in space.active[sketch]}}


def describe_choices(knob) -> str:
    if knob.kind == "tile":
        return f"{len(knob.choices)} factorizations, e.g. {'x'.join(map(str, knob.choices[-1]))}"
    return f"indices 0..{len(knob.choices) - 1}"


def describe(space, config: tuple) -> str:
    lines = []
    for slot in active_slots(space, config[0]).values():
        knob, index = space.knobs[slot], config[slot]
        value = knob.choices[index]
        shown = "x".join(map(str, value)) if knob.kind == "tile" else f"{index} ({value})"
        lines.append(f"  {knob.name:14s} {shown}")
    return "\n".join(lines)


# ---- one process's timings ------------------------------------------------------------------------
def time_in_this_process(args) -> dict:
    """{"seconds": {variant: [seconds per pass]} with the libraries', "errors": {variant: why it did
    not build}, "flop": the task's}."""
    from experiments.bench_vs_peers import library_timers
    from tuning.hardware.tvm_export import rotated_passes
    from tuning.hardware.tvm_peers import KernelTimer

    hardware, schedules, outcome, spec = open_run(args.run)
    with hardware:
        best = tuple(outcome.best_config)
        timer = KernelTimer(outcome.task.workload, hardware.target, spec)
        configs = {FOUND: best, **{n: with_settings(schedules.space, best, s) for n, s in args.variants.items()}}
        timers, errors = {}, {}
        for name, config in configs.items():
            try:
                timers[name] = timer.build(schedules.schedule(config)[0].mod)
            except Exception as error:  # noqa: BLE001 - an illegitimate or wrong variant is a result
                errors[name] = (str(error).strip().splitlines() or [type(error).__name__])[-1][:200]
        timers.update(library_timers(outcome.task, timer.inputs, hardware.num_threads, spec))
        seconds = rotated_passes(timers, args.passes)
    return {"seconds": seconds, "errors": errors, "flop": outcome.task.flops}


def run_processes(args, threads: int | None) -> list[dict]:
    env = {**os.environ, **({"TVM_NUM_THREADS": str(threads)} if threads else {})}  # before TVM's runtime starts
    command = [sys.executable, __file__, str(args.run), "--child", "--passes", str(args.passes),
               *[f"--variant={v}" for v in args.variant]]
    results = []
    for index in range(args.processes):
        results.append(child_json(command, f"tunelab: probe process {index + 1} failed", cwd=REPO, env=env))
        print(f"process {index + 1}/{args.processes} timed", file=sys.stderr, flush=True)
    return results


# ---- the table ------------------------------------------------------------------------------------
def table(results: list[dict]) -> str:
    """Per variant: median GFLOP/s over processes, and its speed relative to the found best and to
    torch, each paired within a process (median over the process's passes), median [min, max]."""
    flop = results[0]["flop"]
    names = list(results[0]["seconds"])
    medians = [{n: float(np.median(r["seconds"][n])) for n in names} for r in results]
    lines = [f"{len(results)} processes, {len(results[0]['seconds'][names[0]])} passes each",
             f"  {'variant':28s} {'GFLOP/s':>8s}  {'vs found [min, max]':>22s}  {'vs torch [min, max]':>22s}"]
    for name in names:
        gflops = np.median([flop / m[name] / 1e9 for m in medians])
        vs_found = [m[FOUND] / m[name] for m in medians] if FOUND in names else []
        vs_torch = [m["torch"] / m[name] for m in medians]
        lines.append(f"  {name:28s} {gflops:8.1f}  {_spread(vs_found):>22s}  {_spread(vs_torch):>22s}")
    errors = {name: error for r in results for name, error in r["errors"].items()}
    for name, error in errors.items():
        lines.append(f"  {name:28s} not built: {error}")
    return "\n".join(lines)


def _spread(ratios: list[float]) -> str:
    if not ratios:
        return "-"
    return f"{np.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]"


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        if args.child:
            print(json.dumps(time_in_this_process(args)))
            return
        hardware, schedules, outcome, _ = open_run(args.run)  # every check here, before any process starts
        with hardware:
            space, best = schedules.space, tuple(outcome.best_config)
            variants = {name: with_settings(space, best, settings) for name, settings in args.variants.items()}
            threads = hardware.num_threads
        if args.list or not variants:
            print(f"{outcome.task.name}: the run's best config\n{describe(space, best)}")
            for name, config in variants.items():
                print(f"{name}:\n{describe(space, config)}")
            return
        print(table(run_processes(args, threads)))
    except ConfigError as error:
        raise SystemExit(f"tunelab: {error}") from None


if __name__ == "__main__":
    main()
