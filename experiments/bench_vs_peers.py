"""tunelab's best methods against MetaSchedule's own tuner, torch and numpy, in one sitting.

    python experiments/bench_vs_peers.py                  # 3 workloads x 3 seeds x 256: hours
    python experiments/bench_vs_peers.py --estimate-only  # what it would cost
    python experiments/bench_vs_peers.py --workloads conv_l8 --seeds 0 --trials 64   # a quick look

1. Tuning, one job at a time, each in its own process: every `--methods` row through
   `python run.py model=W seed=S budget.trials=T search=.. sampler=.. cost_model=..` (MLflow
   experiment bench_vs_peers), and MetaSchedule's `tune_tir` (max_trials_global=T, 64 a round, its
   evolutionary search, XGB model, LocalBuilder and LocalRunner, with evaluator=fixed's timing).
   A job whose folder under --out holds done.json is not run again: a killed benchmark resumes.
2. Re-timing: every job's best kernel is built here (output checked against the untuned kernel)
   and timed beside torch (and numpy for GEMM) at --threads threads, --passes passes with the order
   rotated per pass; each timing is the median of 5 repeats of at least 50 ms (TVM's
   time_evaluator for kernels, tvm_export.call_seconds, the same loop, for the libraries).
3. One table per workload: median GFLOP/s over seeds; speed relative to torch and to MetaSchedule's
   tuner (geometric mean over seeds x passes of the ratios paired by pass and seed, bootstrap 95% CI
   resampling seeds); the median tuning wall time. Then the geomeans over workloads, relative to
   torch and to MetaSchedule's tuner (`--no-peer`: the lab's methods and the libraries only).
4. Where each job's tuning seconds went: a lab run's search, model, measure (builds, runs, the
   store, the workers' messages), tracking, state and the loop's own Python as shares of its
   rounds' wall (its final_metrics.json), and tune_tir's own profiler scopes (work/profile.json).

The hardware is conf/hardware's `--hardware` (Hydra overrides, default hardware=cpu) at --threads
threads, for the lab's runs, MetaSchedule's target and the re-timing alike. Real hardware only; run it
alone on the host (a compile beside a timing nearly doubles it).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

METHODS = ("sa+greedy+xgb", "evolutionary+greedy+xgb_ms", "ppo+kmeans+xgb")
WORKLOADS = ("gemm_1024", "conv_l7", "conv_l8")
PEER = "metaschedule"
SECONDS_PER_MEASUREMENT = 1.0  # this host, conv_l8/gemm_1024 at 256 (a first guess; the measured pace replaces it)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), help="conf/model names to tune and time")
    parser.add_argument("--methods", nargs="+", default=list(METHODS),
                        help="search+sampler+cost_model[:key=value,...] (extra run.py overrides)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="one tuning job per seed, method and workload")
    parser.add_argument("--trials", type=int, default=256, help="measurements a tuning job (a method's own budget.trials= wins)")
    parser.add_argument("--passes", type=int, default=5, help="re-timing passes, the order rotated per pass")
    parser.add_argument("--threads", type=int, default=2, help="threads for tuning, re-timing and the libraries")
    parser.add_argument("--hardware", nargs="+", default=["hardware=cpu"], metavar="OVERRIDE",
                        help="the hardware that tunes and times, as Hydra overrides of conf/")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "bench_vs_peers",
                        help="job folders; a job whose folder holds done.json is not run again")
    parser.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                        help="also tune with MetaSchedule's tune_tir (--no-peer: the lab's methods and the libraries)")
    parser.add_argument("--estimate-only", action="store_true", help="print what the benchmark would cost and stop")
    parser.add_argument("--metaschedule-job", nargs=3, metavar=("WORKLOAD", "SEED", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for method in args.methods:
        parts, _, extra = method.partition(":")
        if len(parts.split("+")) != 3 or any("=" not in o for o in filter(None, extra.split(","))):
            parser.error(f"--methods: expected search+sampler+cost_model[:key=value,...], got {method!r}")
        try:
            if trials_of(method, args) < 1:
                raise ValueError
        except ValueError:
            parser.error(f"--methods: {method!r}: budget.trials must be a positive integer")
    for name in args.workloads:
        if not (REPO / "conf" / "model" / f"{name}.yaml").exists():
            parser.error(f"--workloads: no conf/model/{name}.yaml")
    return args


def task_of(name: str, run: Path | None = None):
    """The workload's task as conf/model has it or, given a run folder, as that run tuned it (a
    method's model.* overrides, e.g. model.space=wide, make another task)."""
    from omegaconf import OmegaConf

    from tuning.core.task import build_tasks
    from tuning.engine.run_folder import load_config

    if run is not None:
        model = load_config(run / "config.yaml", "run").model  # a run folder is read as untrusted input
    else:
        model = OmegaConf.load(REPO / "conf" / "model" / f"{name}.yaml")
    [task] = build_tasks(model)
    return task


def hardware_of(args):
    """conf/hardware's --hardware at --threads threads."""
    from hydra.utils import instantiate

    from tuning.tools.dataset import compose

    return instantiate(compose([*args.hardware, f"hardware.num_threads={args.threads}"]).hardware)


def fixed_spec():
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    return instantiate(OmegaConf.load(REPO / "conf" / "evaluator" / "fixed.yaml")).spec


# ---- 1. tuning -------------------------------------------------------------------------------------
def jobs(args) -> list[tuple[str, str, int, Path]]:
    """Seed by seed: a benchmark stopped early has whole seeds to re-time (`--seeds 0 1`)."""
    return [(workload, method, seed, args.out / workload / folder_name(method) / f"seed{seed}")
            for seed in args.seeds for workload in args.workloads for method in rows(args)]


def rows(args) -> list[str]:
    return [*args.methods, *([PEER] if args.peer else [])]


def trials_of(method: str, args) -> int:
    """A row's measurements: --trials, or its own `budget.trials=` override (`sa+greedy+xgb:budget.trials=1000`)."""
    _, _, extra = method.partition(":")
    own = [o.split("=", 1)[1] for o in filter(None, extra.split(",")) if o.split("=", 1)[0] == "budget.trials"]
    return int(own[-1]) if own else args.trials


def folder_name(method: str) -> str:
    return method.replace(":", "__").replace("=", "-").replace(",", "_").replace("/", "_")


def run_job(workload: str, method: str, seed: int, folder: Path, args) -> float:
    """Tune; returns the wall seconds (and writes done.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    started = time.time()
    if method == PEER:
        shutil.rmtree(folder / "work", ignore_errors=True)  # a killed tune_tir would add to its database
        command = [sys.executable, __file__, "--metaschedule-job", workload, str(seed), str(folder),
                   "--trials", str(args.trials), "--threads", str(args.threads), "--hardware", *args.hardware]
    elif (folder / "run" / "run.yaml").exists():  # killed before done.json: continue it
        command = [sys.executable, "run.py", f"resume={folder / 'run'}"]
    else:
        parts, _, extra = method.partition(":")
        search, sampler, cost_model = parts.split("+")
        command = [sys.executable, "run.py", f"model={workload}", f"seed={seed}", f"budget.trials={args.trials}",
                   f"search={search}", f"sampler={sampler}", f"cost_model={cost_model}", *filter(None, extra.split(",")),
                   *args.hardware, f"hardware.num_threads={args.threads}", "tracking.experiment=bench_vs_peers",
                   f"hydra.run.dir={folder / 'run'}"]
    with open(folder / "log.txt", "w") as log:
        code = subprocess.call(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"{workload} {method} seed {seed} failed (exit {code}); see {folder / 'log.txt'}")
    wall = time.time() - started
    (folder / "done.json").write_text(json.dumps({"wall_s": wall, "trials": trials_of(method, args), "command": command}))
    return wall


def metaschedule_job(args) -> None:
    from tuning.hardware.tvm_peers import tune_with_metaschedule

    workload, seed, folder = args.metaschedule_job
    task = task_of(workload)
    target = hardware_of(args).target
    tune_with_metaschedule(task.workload, target, Path(folder) / "work", args.trials, int(seed), fixed_spec(),
                           args.threads)


def tune_all(args) -> None:
    todo = [job for job in jobs(args) if not (job[3] / "done.json").exists()]
    pace, measurements = SECONDS_PER_MEASUREMENT, sum(trials_of(job[1], args) for job in todo)
    print(f"estimate: {len(todo)} tuning jobs, {measurements} measurements to run "
          f"({len(jobs(args)) - len(todo)} jobs done) at ~{pace:.1f} s a measurement = "
          f"{measurements * pace / 3600:.1f} h, then re-timing "
          f"~{len(args.workloads) * len(args.seeds) * len(rows(args)) * args.passes * 1.5 / 60:.0f} min",
          flush=True)
    if args.estimate_only:
        return
    spent = 0.0
    for done, (workload, method, seed, folder) in enumerate(todo, start=1):
        spent += run_job(workload, method, seed, folder, args)
        left = (len(todo) - done) * spent / done
        print(f"[{done}/{len(todo)}] {workload} {method} seed {seed}: {spent / done / 60:.1f} min a job so far, "
              f"~{left / 3600:.1f} h left", flush=True)


# ---- 2. re-timing ---------------------------------------------------------------------------------
def best_module(workload: str, method: str, folder: Path, hardware):
    if method == PEER:
        from tuning.hardware.tvm_peers import metaschedule_best

        return metaschedule_best(task_of(workload).workload, hardware.target, folder / "work")
    from tuning.core.outcome import TaskOutcome, best_from_records
    from tuning.core.records import RecordLog

    task = task_of(workload, folder / "run")
    records = [r for r in RecordLog(folder / "run" / "records.jsonl").load() if r.workload_key == task.key]
    outcome = TaskOutcome(task, records)
    best_from_records(outcome)
    if outcome.best_config is None:
        return None
    return hardware.schedules(task).schedule(tuple(outcome.best_config))[0].mod


def library_timers(task, inputs, threads: int, spec) -> dict:
    """Timing functions of torch (and numpy for GEMM) on the kernels' inputs, with the kernels'
    repeats (tvm_export.call_seconds)."""
    from tuning.hardware.tvm_export import call_seconds, torch_call

    calls = {"torch": torch_call(task.workload, inputs, threads)}
    if task.workload["op"] == "gemm":
        a, b = inputs
        calls["numpy"] = lambda: a @ b
    return {name: (lambda c=c: call_seconds(c, spec.repeat, spec.min_repeat_ms)) for name, c in calls.items()}


def retime(args) -> dict:
    """{workload: {variant: {seed: [seconds per pass]}}}; libraries under seed -1."""
    from tuning.hardware.tvm_export import rotated_passes
    from tuning.hardware.tvm_peers import KernelTimer

    spec = fixed_spec()
    seconds: dict = {}
    hardware = hardware_of(args)
    for workload in args.workloads:
        task = task_of(workload)
        timer = KernelTimer(task.workload, hardware.target, spec)
        timers = {(name, -1): t for name, t in library_timers(task, timer.inputs, args.threads, spec).items()}
        for method in rows(args):
            for seed in args.seeds:
                folder = args.out / workload / folder_name(method) / f"seed{seed}"
                if not (folder / "done.json").exists():
                    continue
                mod = best_module(workload, method, folder, hardware)
                if mod is None:
                    print(f"{workload} {method} seed {seed}: no measured config to re-time", flush=True)
                else:
                    timers[(method, seed)] = timer.build(mod)
        timed = rotated_passes(timers, args.passes, after_pass=lambda step, _, w=workload: print(
            f"{w} pass {step + 1}/{args.passes} timed", flush=True))
        seconds[workload] = {}
        for (name, seed), values in timed.items():
            seconds[workload].setdefault(name, {})[seed] = values
    return seconds


# ---- 3. the table ---------------------------------------------------------------------------------
def paired_ratios(reference: dict, variant: dict) -> dict:
    """{seed: [reference / variant per pass]}; a library reference (seed -1) pairs with every seed."""
    out = {}
    for seed, values in variant.items():
        ref = reference.get(seed, reference.get(-1))
        if ref is not None:
            out[seed] = np.asarray(ref) / np.asarray(values)
    return out


def geomean_ci(by_seed: dict, rng, draws: int = 2000) -> tuple[float, float, float]:
    """Geometric mean of all ratios; 95% CI resampling seeds (and passes within them)."""
    groups = [np.log(v) for v in by_seed.values() if len(v)]
    if not groups:
        return float("nan"), float("nan"), float("nan")
    centre = float(np.exp(np.mean(np.concatenate(groups))))
    means = []
    for _ in range(draws):
        chosen = [groups[i] for i in rng.integers(len(groups), size=len(groups))]
        means.append(np.mean(np.concatenate([g[rng.integers(len(g), size=len(g))] for g in chosen])))
    return centre, float(np.exp(np.percentile(means, 2.5))), float(np.exp(np.percentile(means, 97.5)))


def wall_minutes(args, workload, method) -> float:
    folder = args.out / workload / folder_name(method)
    walls = [json.loads((folder / f"seed{s}" / "done.json").read_text())["wall_s"]
             for s in args.seeds if (folder / f"seed{s}" / "done.json").exists()]
    return float(np.median(walls)) / 60 if walls else float("nan")


# ---- 3. where the tuning seconds went -------------------------------------------------------------
LAB_SHARES = ("search_s", "model_s", "measure_s", "tracking_s", "state_s")  # tuning.engine.loop.ROUND_TIMES


def lab_shares(folder: Path) -> dict | None:
    """A lab run's wall seconds by part (its final_metrics.json run/*), as shares of its rounds' wall."""
    from tuning.tools.sync import FINAL_METRICS_FILE

    path = folder / "run" / FINAL_METRICS_FILE
    if not path.exists():
        return None
    metrics = json.loads(path.read_text())["metrics"]
    wall = metrics.get("run/wall_s", 0.0)
    if wall <= 0 or any(f"run/{key}" not in metrics for key in LAB_SHARES):
        return None  # a run from before these were kept
    shares = {key[:-2]: metrics[f"run/{key}"] / wall for key in LAB_SHARES}
    shares["python"] = 1 - sum(shares.values())
    shares["run (in measure)"] = metrics["run/run_s"] / wall
    return shares


def metaschedule_shares(folder: Path) -> dict | None:
    """tune_tir's ms.Profiler scopes as shares of its total."""
    from tuning.hardware.tvm_peers import PROFILE_FILE

    path = folder / "work" / PROFILE_FILE
    if not path.exists():
        return None
    scopes = json.loads(path.read_text())
    total = scopes.pop("Total", 0.0)
    return {name: value / total for name, value in sorted(scopes.items(), key=lambda kv: -kv[1])[:8]} if total else None


def overhead_report(args) -> list[str]:
    """Per workload and row, the median over seeds of each part's share of the tuning wall time; the
    lab's overhead is everything but measure (builds, runs, the store and the workers' messages)."""
    lines = ["", "where the tuning seconds went (median share over seeds; lab: the rounds' wall; "
             "metaschedule: its profiler's total):"]
    width = name_width(args)
    for workload in args.workloads:
        for method in rows(args):
            read = metaschedule_shares if method == PEER else lab_shares
            found = [read(args.out / workload / folder_name(method) / f"seed{s}") for s in args.seeds]
            found = [f for f in found if f]
            if not found:
                continue
            keys = list(found[0])
            medians = {k: float(np.median([f.get(k, 0.0) for f in found])) for k in keys}
            parts = "  ".join(f"{k} {v:.1%}" for k, v in medians.items())
            overhead = "" if method == PEER else f"  -> outside measure {1 - medians['measure']:.1%}"
            lines.append(f"  {workload:10s} {method:{width}s} {parts}{overhead}")
    return lines


def name_width(args) -> int:
    """The tables' first column: as wide as the longest row name (a method with overrides is long)."""
    return max(34, *(len(name) for name in rows(args)))


def report(args, seconds: dict) -> str:
    rng = np.random.default_rng(0)
    lines = [f"{args.trials} measurements a tuning job (a row's own budget.trials= where it names one), "
             f"seeds {args.seeds}, {args.threads} threads, "
             f"{args.passes} re-timing passes"]
    overall: dict = {}
    overall_torch: dict = {}
    width = name_width(args)
    for workload, variants in seconds.items():
        flops = task_of(workload).flops
        lines += ["", f"{workload}", f"  {'variant':{width}s} {'GFLOP/s':>8s}  {'vs torch [95% CI]':>24s}  "
                  f"{'vs metaschedule [95% CI]':>26s}  {'tuning min':>10s}"]
        for name, by_seed in variants.items():
            gflops = flops / np.median(np.concatenate(list(by_seed.values()))) / 1e9
            torch_ratio = paired_ratios(variants["torch"], by_seed)
            peer_ratio = paired_ratios(variants[PEER], by_seed) if PEER in variants and name != PEER else {}
            t, tl, th = geomean_ci(torch_ratio, rng)
            p, pl, ph = geomean_ci(peer_ratio, rng)
            overall.setdefault(name, {}).update({(workload, s): v for s, v in peer_ratio.items()})
            overall_torch.setdefault(name, {}).update({(workload, s): v for s, v in torch_ratio.items()})
            peer = f"{p:.2f}x [{pl:.2f}, {ph:.2f}]" if peer_ratio else "-"
            wall = wall_minutes(args, workload, name) if name in rows(args) else float("nan")
            lines.append(f"  {name:{width}s} {gflops:8.1f}  {t:.2f}x [{tl:.2f}, {th:.2f}]".ljust(width + 36)
                         + f"{peer:>26s}  " + (f"{wall:10.1f}" if np.isfinite(wall) else f"{'-':>10s}"))
    for reference, by_name in (("metaschedule's tuner", overall), ("torch", overall_torch)):
        if any(by_name.values()):
            lines += ["", f"geomean over workloads and seeds, speed relative to {reference} "
                      "(95% CI resampling workload-seed pairs):"]
            lines += [f"  {name:{width}s} " + "{:.2f}x [{:.2f}, {:.2f}]".format(*geomean_ci(ratios, rng))
                      for name, ratios in by_name.items() if ratios and name != "torch"]
    return "\n".join(lines + overhead_report(args))


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # before TVM's runtime starts in this process
    if args.metaschedule_job:
        metaschedule_job(args)
        return
    tune_all(args)
    if args.estimate_only:
        return
    seconds = retime(args)
    (args.out / "seconds.json").write_text(json.dumps(
        {w: {n: {str(s): v for s, v in by.items()} for n, by in variants.items()} for w, variants in seconds.items()}))
    table = report(args, seconds)
    (args.out / "table.txt").write_text(table + "\n")
    print("\n" + table)


if __name__ == "__main__":
    main()
