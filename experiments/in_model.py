"""Why a tuned kernel is slower inside its model than alone: a whole-model run's heaviest kernels, each
timed alone, on fresh and on the model's own buffers, after an idle gap, with every cache flushed,
inside the model with every other kernel skipped and inside the whole model, under several settings
of TVM's thread pool.

    python experiments/in_model.py outputs/runs/DAY/TIME                       # 10 kernels, 4 settings
    python experiments/in_model.py RUN --kernels 5 --settings default no_spin --passes 3

Each setting runs in its own process (TVM reads the thread pool's settings when its runtime starts),
at the run's threads: the model compiled with the run's database as the end-to-end check compiles it,
then every context of tuning/hardware/kernel_context.py read once a pass, in rotated order. The table
gives each context's median per call (us) and the steps between contexts as ratios (geometric mean
over the kernels), so the step that moves a kernel from its standalone time to what the model pays
shows as the ratio far from 1, and each kernel's in-model time over the run's own reading of it (its
prediction: in_model / predicted, with how many kernels are within 5%; `predicted` is the task's best
re-measured at the run's end, the term the estimate sums, and `tuner` the best single reading during
tuning, which the choice of the best among thousands of noisy readings biases low). The model's latency
is read beside the lab's estimate (the run's final_metrics.json: the tasks' re-measured best, weighted
by calls).
Real hardware only; run it alone on the host.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from tuning.config.cli import child_json
from tuning.hardware.kernel_context import PREPACKED
from tuning.tools.sync import final_metrics

REPO = Path(__file__).resolve().parents[1]
ARGS_FLUSHED_REPEAT = 10  # single calls read per args_flushed reading (evaluator=autotvm_x86's repeat)
SETTINGS = {  # TVM thread pool environment per setting (src/runtime/thread_pool.cc reads them at start)
    "default": {},
    "no_spin": {"TVM_THREAD_POOL_SPIN_COUNT": "0"},   # workers sleep as soon as a parallel region ends
    "long_spin": {"TVM_THREAD_POOL_SPIN_COUNT": "100000000"},  # workers never sleep between kernels
    "unbound": {"TVM_BIND_THREADS": "0"},              # no thread-to-core affinity
}
STEPS = (  # (label, from context, to context): what each ratio isolates
    ("the kernel's arguments cold, its input warm (args_flushed / alone)", "alone", "args_flushed"),
    ("the model's build of the kernel (model_fn / alone)", "alone", "model_fn"),
    ("the model's buffers and prepacked weights (model_args / model_fn)", "model_fn", "model_args"),
    ("waking the thread pool after a gap (idle / model_args)", "model_args", "idle"),
    ("cold caches, every level (flushed / idle)", "idle", "flushed"),
    ("the VM around one kernel (model_only / model_args)", "model_args", "model_only"),
    ("the other kernels between calls (in_model / model_only)", "model_only", "in_model"),
    ("the model's input not written between runs (stale_input / in_model)", "in_model", "stale_input"),
    ("what the model pays beyond the call (skip_delta / in_model)", "in_model", "skip_delta"),
    ("in the model against alone (in_model / alone)", "alone", "in_model"),
    ("in the model against its arguments flushed (in_model / args_flushed)", "args_flushed", "in_model"),
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished whole-model run folder (with database/ and records)")
    parser.add_argument("--kernels", type=int, default=10, help="the heaviest kernels (by their time in the model)")
    parser.add_argument("--passes", type=int, default=5, help="readings of every context per kernel")
    parser.add_argument("--runs", type=int, default=10, help="model runs (or single calls) per reading")
    parser.add_argument("--number", type=int, default=20, help="back-to-back calls per loop reading")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS),
                        help="thread pool settings, one process each")
    parser.add_argument("--child", choices=list(SETTINGS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("kernels", "passes", "runs", "number"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be >= 1")
    if not (args.run / "database" / "database_tuning_record.json").is_file():
        parser.error(f"run: {args.run} has no database/ (a finished whole-model run)")
    return args


def measure_in_this_process(args) -> dict:
    """One setting's readings (kernel_context.time_contexts) of the run's heaviest kernels, with the
    model's latency and the run's estimate of it."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from tuning.hardware.kernel_context import capture_calls, model_call_seconds, standalone_timers, time_contexts
    from tuning.hardware.relax_models import as_tuning_tasks, compiled_model, extract_tasks, load_model, plain_seconds
    from tuning.tools.export import best_in_run, open_tvm_run

    cfg, hardware = open_tvm_run(args.run, "model")
    with hardware:
        spec = instantiate(cfg.evaluator).spec
        specs = {"alone": spec, "args_flushed": replace(spec, number=1, min_repeat_ms=0, cache_flush=True,
                                                        repeat=max(spec.repeat, ARGS_FLUSHED_REPEAT))}
        device = hardware.attached().devices[0]
        loaded = load_model(OmegaConf.to_container(cfg.model, resolve=True), cfg.seed, hardware.target)
        vm, x, dev = compiled_model(loaded, hardware.target, str(args.run / "database"), hardware.weight_prepack, device)
        # the run's tasks from the model already loaded (hardware.model_tasks would import it again)
        model_tasks = as_tuning_tasks(extract_tasks(loaded.mod, hardware.target, hardware.weight_prepack))
        calls = capture_calls(vm, x)
        names = {task.name for task in model_tasks}
        per_symbol = model_call_seconds(vm, x, args.runs)[0]
        tuned = {s: float(np.median(v)) for s, v in per_symbol.items() if s.removesuffix(PREPACKED) in names}
        heaviest = sorted(tuned, key=tuned.get, reverse=True)[:args.kernels]
        # every task's best built once: its "alone" timer re-reads the estimate, the heaviest are also the table's
        outcomes = {task.name: best_in_run(cfg, hardware, args.run, task.name, model_tasks) for task in model_tasks}
        timers = {name: standalone_timers(o.task.workload, hardware.target, o.best_config, specs, dev)
                  for name, o in outcomes.items()}
        tuner_s = {s: outcomes[s.removesuffix(PREPACKED)].tuning_best_cost for s in heaviest}
        kernels = {s: timers[s.removesuffix(PREPACKED)] for s in heaviest}

        def reread_estimate() -> float:
            return sum(task.weight * timers[task.name]["alone"]() for task in model_tasks)

        plain_before = plain_seconds(vm, x, args.runs * args.passes)
        reread_before = reread_estimate()
        timed = time_contexts(vm, x, calls, kernels, args.passes, args.runs, args.number, dev)
        reread_after = reread_estimate()
        plain_after = plain_seconds(vm, x, args.runs * args.passes)
    _, final = final_metrics(args.run)  # read as untrusted input: {} where unreadable
    tasks = {s: s.removesuffix(PREPACKED) for s in heaviest}
    return {"setting": args.child, "threads": int(os.environ.get("TVM_NUM_THREADS", "0")),
            "plain_s": plain_before + plain_after, "estimate_s": final.get("best/final_latency_ms", float("nan")) / 1e3,
            "reread_s": [reread_before, reread_after], "tuner_s": tuner_s, "tasks": tasks,
            "predicted_s": {s: final[f"task/{task}/final_latency_us"] / 1e6 for s, task in tasks.items()
                            if f"task/{task}/final_latency_us" in final}, **timed}


def run_settings(args, threads: int) -> list[dict]:
    results = []
    for setting in args.settings:
        env = {**os.environ, **SETTINGS[setting], "TVM_NUM_THREADS": str(threads)}
        command = [sys.executable, __file__, str(args.run), "--child", setting, "--kernels", str(args.kernels),
                   "--passes", str(args.passes), "--runs", str(args.runs), "--number", str(args.number)]
        results.append(child_json(command, f"tunelab: the {setting} process failed", cwd=REPO, env=env))
        print(f"setting {setting} timed", file=sys.stderr, flush=True)
    return results


# ---- the tables -----------------------------------------------------------------------------------
def medians(result: dict) -> dict:
    """{symbol: {context: median seconds per call}}."""
    return {s: {c: float(np.median(v)) for c, v in contexts.items() if v} for s, contexts in result["readings"].items()}


def cold_estimate(result: dict) -> float:
    """The run's estimate with each kernel of the table counted at its args_flushed reading, not its
    prediction: what the lab would estimate had it timed them as evaluator=autotvm_x86 does."""
    table = medians(result)
    return result["estimate_s"] + sum(result["counts"][s] * (row["args_flushed"] - predicted(result, s))
                                      for s, row in table.items() if "args_flushed" in row)


def predicted(result: dict, symbol: str) -> float:
    """A kernel's prediction: its task's re-measured best (the estimate's term), or, for a run folder
    without per-task final metrics, the best reading during tuning."""
    return result.get("predicted_s", {}).get(symbol, result["tuner_s"][symbol])


def setting_table(result: dict) -> str:
    from tuning.hardware.kernel_context import CONTEXTS

    table = medians(result)
    plain = float(np.median(result["plain_s"]))
    lines = [f"### {result['setting']} ({result['threads']} threads; one flush {result['flush_s'] * 1e3:.0f} ms)", "",
             f"Model: {plain * 1e3:.2f} ms a run (median of {len(result['plain_s'])}); the run's estimate "
             f"{result['estimate_s'] * 1e3:.2f} ms: model / estimate {plain / result['estimate_s']:.2f}; with the "
             f"kernels below at their args_flushed readings {cold_estimate(result) * 1e3:.2f} ms: model / that "
             f"{plain / cold_estimate(result):.2f}. The estimate re-read in this process (every task's best "
             f"timed as the run's evaluator times it, weighted by calls; before and after the contexts) "
             f"{reread_line(result, plain)}.", "",
             "| kernel | calls | tuner | predicted | " + " | ".join(CONTEXTS) + " | in_model / alone | in_model / predicted |",
             "|---|---:|---:|---:|" + "---:|" * len(CONTEXTS) + "---:|---:|"]
    for symbol, row in table.items():
        cells = [f"{row[c] * 1e6:.1f}" if c in row else "-" for c in CONTEXTS]
        ratio = row["in_model"] / row["alone"] if "alone" in row and "in_model" in row else float("nan")
        lines.append(f"| {result['tasks'][symbol]} | {result['counts'][symbol]} | {result['tuner_s'][symbol] * 1e6:.1f} | "
                     f"{predicted(result, symbol) * 1e6:.1f} | "
                     + " | ".join(cells) + f" | {ratio:.2f} | {in_model_over_predicted(result, symbol):.2f} |")
    lines += ["", "| step | geomean ratio over the kernels | range |", "|---|---:|---|"]
    for label, before, after in STEPS:
        ratios = [row[after] / row[before] for row in table.values() if before in row and after in row]
        if ratios:
            lines.append(f"| {label} | {geomean(ratios):.3f} | "
                         f"{min(ratios):.2f}-{max(ratios):.2f} |")
    return "\n".join(lines + ["", predicted_line(result)])


def geomean(ratios) -> float:
    return float(np.exp(np.mean(np.log(ratios))))


def reread_line(result: dict, plain: float) -> str:
    reread = result["reread_s"]
    return f"{', '.join(f'{s * 1e3:.2f}' for s in reread)} ms: model / that {plain / float(np.median(reread)):.2f}"


def in_model_over_predicted(result: dict, symbol: str) -> float:
    """What the model pays for a kernel's call over the run's prediction of it."""
    readings = result["readings"][symbol].get("in_model")
    return float(np.median(readings)) / predicted(result, symbol) if readings else float("nan")


def predicted_line(result: dict, margin: float = 1.05) -> str:
    ratios = [r for r in (in_model_over_predicted(result, s) for s in result["readings"]) if np.isfinite(r)]
    if not ratios:
        return "In the model against the run's prediction: no in_model readings."
    source = ("each task's best re-measured at the run's end" if len(result.get("predicted_s", {})) == len(ratios)
              else "the best reading during tuning where the run folder has no re-measured per-task value")
    return (f"In the model against the run's prediction ({source}; in_model / predicted): geomean "
            f"{geomean(ratios):.3f}, range {min(ratios):.2f}-{max(ratios):.2f}; "
            f"{sum(r <= margin for r in ratios)} of {len(ratios)} kernels within {margin:.2f}.")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(measure_in_this_process(args)))
        return
    from tuning.engine.run_folder import load_config

    cfg = load_config(args.run / "config.yaml", "run")
    threads = (cfg.hardware.get("backend") or cfg.hardware).num_threads or os.cpu_count()
    results = run_settings(args, int(threads))
    print(f"Kernels of {args.run} (us per call, median of {args.passes} passes; contexts: "
          "tuning/hardware/kernel_context.py)\n")
    print("\n\n".join(setting_table(result) for result in results))


if __name__ == "__main__":
    main()
