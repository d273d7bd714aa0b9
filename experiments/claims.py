"""The seed papers' claims re-tested on replay over a measurement store: one command per table.

    python experiments/claims.py chameleon                  # grid + control + table (docs/claims.md)
    python experiments/claims.py adatune
    python experiments/claims.py chameleon --table-only     # the table from the runs already made
    python experiments/claims.py adatune --models conv_l8 --seeds 10 --jobs 2
    python experiments/claims.py adatune budget.trials=500                  # Hydra overrides for every run
    python experiments/claims.py chameleon --full-space --hours 2           # the headline rows on whole spaces
    python experiments/claims.py adatune --build --hours 2 --archive campaigns/claims-restricted

The store is one built with the store's documented command (docs/store.md), timed as
evaluator=adatune_de so that one store answers every evaluator of both papers:

    python -m tuning.tools.dataset build --store stores/lab.sqlite --model conv_l8 conv_l7 gemm_512 conv_l6 \
        --configs 1000 evaluator=adatune_de hardware.build_workers=2

`chameleon` runs `+experiment=chameleon_replay` (SA, AE, SA+AS, AE+AS, the controls and the code's
sampler), reads the mean k that k-means chose per task in SA+AS, runs the control "SA at plan size
mean k" (sa_plan_k), then compares everything with `python -m tuning.tools.compare` and prints one row per
claim: the paper's number, ours with a 95% CI over seeds, and a verdict. `adatune` does the same with
`+experiment=adatune_replay`. Nothing is measured: every run replays the store (simulated clock).

`--build` makes the whole table a campaign: the store's sample of each of the paper's tasks (conv_l8
2000 configs, the others 500, seed 0) is built first, one task at a time, as steps that resume, then
the replays run as one step and the table is printed. Its folders are under
outputs/campaigns/claims-restricted; `--hours` stops it cleanly and the same command continues it;
`--archive campaigns/claims-restricted` carries the store (never the replays, which the next sitting
replays again from it) to the next machine of this host's kind. Both papers share the store. The
positional overrides go to the replays; `--build-override` sets the builds' own.

`--full-space` re-tests the headline rows (Chameleon: SA, SA+AS, AE, AE+AS; AdaTune: XGB+SA+DE and
RFEI+CSA+AE) where the methods' moves are their own: the tasks' whole spaces (conv_l8 and gemm_512 by
default), 500 measurements a run, each config no run has measured before timed on this host and added
to the store (stores/full-space.sqlite; hardware.on_miss=measure), so the seeds and rows share every
reading and a run that proposes a config another measured replays it. Each run has its folder under
outputs/campaigns/<paper>-full/<task>/<row>/seed<k>; the runs go seed by seed, one at a time; `--hours`
stops the campaign cleanly (the run in flight ends KILLED) and the same command continues it: finished
runs are skipped, a stopped one resumes, nothing measured is measured again. The table (MLflow
experiment claims-<paper>-full) compares the finished runs.

A claim's ratio is a speed-up, baseline / method (above 1: the method needs less). For times to a
target with censored runs it is the ratio of the Kaplan-Meier medians with a bootstrap CI that
resamples seeds (the same seeds for both: common random numbers); for a final metric it is the
geometric mean of the per-seed ratios. Verdicts: "holds" when the CI lies above 1 (and, where the
claim has a quality bound, the final latency's CI lies within it), "does not hold" when the CI lies
below 1 ("does not hold: slower output" when the quality bound is broken for sure), otherwise
"undecided at this power". A control or fidelity row states no claim: it says which of the two
needs less, or "undecided at this power".
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tuning.config.cli import add_tracking_uri
from tuning.tools.campaign import Job, is_finished, progress, run_campaign, run_in_group
from tuning.tools.campaign_archive import add_archive_option, archived, is_archive_file, view_for_tables
from tuning.tools.compare.cli import default_out_dir
from tuning.tools.compare.cli import main as compare_main
from tuning.tools.compare.load import find_runs
from tuning.tools.compare.report import claims_markdown, seed_label
from tuning.tools.compare.statistics import Claim, claim_rows

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Paper:
    experiment: str  # +experiment=<this>
    mlflow_experiment: str
    row_group: str  # experiment/<group>: the rows' choice tag
    rows: dict  # row option -> name shown
    models: tuple
    baseline: str
    budgets: tuple
    claims: tuple
    notes: tuple
    full_rows: tuple  # the headline rows --full-space re-runs on the tasks' whole spaces


CHAMELEON = Paper(
    "chameleon_replay", "claims-chameleon", "experiment/chameleon_row",
    {"sa": "SA", "ae": "AE", "sa_as": "SA+AS", "ae_as": "AE+AS", "ae_cold": "AE cold", "ae_as_cold": "AE+AS cold",
     "sa_plan_k": "SA plan=k", "sa_as_code": "SA+AS code", "ae_as_code": "AE+AS code"},
    ("conv_l6", "conv_l7", "conv_l8"), "SA", (64, 128),
    (Claim("adaptive sampling cuts measurements with SA (Fig. 7b)", "SA", "SA+AS", "measurements", "1.98x"),
     Claim("adaptive sampling cuts measurements with PPO (Fig. 7b)", "AE", "AE+AS", "measurements", "2.33x"),
     Claim("adaptive sampling measures less in 16 iterations, with SA", "SA", "SA+AS", "made", "1.98x"),
     Claim("adaptive sampling measures less in 16 iterations, with PPO", "AE", "AE+AS", "made", "2.33x"),
     # §4.3: "4.45x optimization time speedup while achieving up to 6.4% improvement" of the output
     # code, so the claim includes a kernel no slower than the baseline's
     Claim("Chameleon cuts optimisation time, output no slower (§4.3, Table 2)", "SA", "AE+AS", "opt_s", "4.45x",
           quality_bound=1.0),
     Claim("Chameleon reaches the target sooner (seconds)", "SA", "AE+AS", "seconds", ""),
     Claim("control: refitting as often as SA+AS, nothing else", "SA", "SA plan=k", "measurements", ""),
     Claim("control: SA+AS against SA at plan size k (refit frequency held equal)", "SA plan=k", "SA+AS",
           "measurements", ""),
     Claim("control: PPO's head start (best_starts 16 vs 0), greedy", "AE cold", "AE", "measurements", ""),
     Claim("control: PPO's head start (best_starts 16 vs 0), adaptive sampling", "AE+AS cold", "AE+AS",
           "measurements", ""),
     Claim("fidelity: the code's sampler against the paper's, with SA", "SA+AS", "SA+AS code", "measurements", ""),
     Claim("fidelity: the code's sampler against the paper's, with PPO", "AE+AS", "AE+AS code", "measurements", "")),
    ("Budget: 16 iterations per task and at most 1000 measurements (Chameleon Tables 7-8); greedy columns "
     "measure 1000, adaptive ones what their knee asks for.",
     "opt_s: the simulated build + run seconds of the store's readings plus the search and model-fitting "
     "seconds this host spent (the paper's optimisation time includes all three)."),
    ("sa", "sa_as", "ae", "ae_as"))

ADATUNE = Paper(
    "adatune_replay", "claims-adatune", "experiment/adatune_row",
    {"xgb_sa_de": "XGB+SA+DE", "xgbrank_sa_de": "XGBrank+SA+DE", "rfei_sa_de": "RFEI+SA+DE",
     "rfei_csa_de": "RFEI+CSA+DE", "rfei_csa_ae": "RFEI+CSA+AE", "rfei_csa_de150": "RFEI+CSA+DE150"},
    ("conv_l7", "conv_l8", "gemm_512"), "XGB+SA+DE", (64, 256, 1000),
    (Claim("the adaptive evaluator cuts measurement time at <= 2% loss (Fig. 9)", "RFEI+CSA+DE", "RFEI+CSA+AE",
           "run/run_s", "2.5x", 1.02),
     Claim("control: the adaptive evaluator against a fixed 150 runs", "RFEI+CSA+DE150", "RFEI+CSA+AE",
           "run/run_s", "", 1.02),
     Claim("AdaTune reaches the target sooner than AutoTVM (§5.2)", "XGB+SA+DE", "RFEI+CSA+AE", "seconds",
           "1.3-3.9x"),
     Claim("control: the same against a fixed 150 runs", "RFEI+CSA+DE150", "RFEI+CSA+AE", "seconds", ""),
     Claim("fidelity: the same against AutoTVM with its rank loss", "XGBrank+SA+DE", "RFEI+CSA+AE", "seconds",
           "1.3-3.9x"),
     Claim("RFEI alone (§5.3, Fig. 10)", "XGB+SA+DE", "RFEI+SA+DE", "seconds", ""),
     Claim("contextual SA on top of RFEI (§5.3, Fig. 11)", "RFEI+SA+DE", "RFEI+CSA+DE", "seconds", "")),
    ("Budget: 1000 measurements, plan size 32 for every row (AdaTune's code).",
     "run/run_s: the seconds spent running kernels, from the store's rows (the adaptive evaluator is "
     "charged the stored seconds of the micro-batches its rule kept)."),
    ("xgb_sa_de", "rfei_csa_ae"))

PAPERS = {"chameleon": CHAMELEON, "adatune": ADATUNE}


# ---- running the grid ----------------------------------------------------------------------------
def run_grid(paper: Paper, args, extra: list[str]) -> float:
    """One `python run.py -m` of the paper's experiment; returns its wall seconds."""
    command = [sys.executable, str(REPO / "run.py"), "-m", f"+experiment={paper.experiment}",
               f"hardware.store={args.store}", f"model={','.join(args.models)}",
               f"seed=range({args.seed_from},{args.seed_from + args.seeds})",
               f"tracking.uri={args.tracking_uri}", *args.overrides, *extra]
    if args.jobs > 1:
        command += ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={args.jobs}"]
    print("$ " + " ".join(command), flush=True)
    started = time.perf_counter()
    if code := run_in_group(command):
        raise SystemExit(f"claims: the grid exited {code} (its output above says why)")
    return time.perf_counter() - started


def run_replays(paper: Paper, args) -> tuple[float, dict]:
    """The paper's grid and, for Chameleon, the control SA at SA+AS's mean plan size on each task:
    (wall seconds, the mean k by task)."""
    seconds = run_grid(paper, args, [])
    k_by_model = plan_sizes(paper, args)
    for model, k in k_by_model.items():
        seconds += run_grid(paper, argparse.Namespace(**{**vars(args), "models": [model]}),
                            ["+experiment/chameleon_row=sa_plan_k", f"budget.plan_size={round(k)}"])
    return seconds, k_by_model


# ---- the restricted tables as a campaign ----------------------------------------------------------
STORE_TASKS = ("conv_l8", "conv_l7", "conv_l6", "gemm_512")  # every task either paper's table reads by default
STORE_CONFIGS = {"conv_l8": 2000}  # configs sampled per task; 500 for the others (docs/claims.md)
OTHER_TASK_CONFIGS = 500
STORE_EVALUATOR = "evaluator=adatune_de"  # every micro-batch kept: one store answers both papers' evaluators
BUILD_OVERRIDES = ("hardware.build_workers=2",)  # the default of --build-override


def build_job(args, task: str) -> Job:
    """One task's share of the store: `dataset build` resumes a stopped build with the same seed. The
    folder is named by what the build puts in the store (its file name, not where this checkout is),
    so a build of other settings is a step of its own."""
    what = ("--store", Path(args.store).name, "--model", task, "--configs",
            str(STORE_CONFIGS.get(task, OTHER_TASK_CONFIGS)), "--seed", "0", STORE_EVALUATOR, *args.build_overrides)
    return Job(args.campaign / "store" / f"{task}-{digest(what)}", command=(
        "-m", "tuning.tools.dataset", "build", "--store", args.store, *what[2:]))


def digest(arguments) -> str:
    return hashlib.sha1("\0".join(arguments).encode()).hexdigest()[:10]


def replay_job(paper: Paper, args) -> Job:
    """The paper's replays as one step. Its runs live in MLflow, not in an archive: a new sitting
    replays them again from the store, and the same seed gives the same records. The folder is named
    by the step's arguments, so other seeds, tasks or overrides are a step of their own."""
    arguments = (args.paper, "--replays-only", "--store", args.store, "--models", *args.models,
                 "--seeds", str(args.seeds), "--seed-from", str(args.seed_from), "--jobs", str(args.jobs),
                 "--tracking-uri", args.tracking_uri, *args.overrides)
    return Job(args.campaign / args.paper / f"replays-{digest(arguments)}", archived=False,
               command=(str(REPO / "experiments" / "claims.py"), *arguments))


def build_main(paper: Paper, args) -> list[dict]:
    """The restricted table as a campaign: the store's share of each of the paper's tasks, one at a
    time, then the replays, then the table. The archive carries the store and the finished builds of
    the four tasks either paper reads by default, so the other paper's call keeps them."""
    every = {task: build_job(args, task) for task in [*STORE_TASKS, *args.models]}
    builds = [every[task] for task in args.models]
    replays, cost = replay_job(paper, args), {}

    def run() -> None:
        if not args.table_only:
            cost["campaign"] = f"{run_campaign([*builds, replays], args.hours) / 60:.1f} min wall this call"

    archived(args.archive, [*every.values(), replays], args.campaign, [Path(args.store)], args.tracking_uri, run,
             pack_after=not args.table_only)
    if not (args.table_only or is_finished(replays)):
        print(f"claims: {sum(map(is_finished, builds))} of the store's {len(builds)} tasks built, replays not "
              "finished: no table yet")
        return []
    return claims_table(paper, args, paper.mlflow_experiment, paper.budgets, paper.claims, cost,
                        plan_sizes(paper, args), "restricted to the store's configs")


# ---- the full-space campaign ---------------------------------------------------------------------
FULL_MODELS = ("conv_l8", "gemm_512")
FULL_TRIALS = 500  # measurements per run
FULL_BUDGETS = (128, 500)
FULL_STORE = "stores/full-space.sqlite"


def full_experiment(paper: Paper) -> str:
    return f"{paper.mlflow_experiment}-full"


def full_space_overrides(paper: Paper, args) -> list[str]:
    """The paper's experiment on the tasks' whole spaces: every proposal answered from the store when a
    reading is there, measured on this host and added first when not (hardware.on_miss=measure)."""
    return ["model.space=full", "hardware.on_miss=measure", "hardware.create=true", f"hardware.store={args.store}",
            f"budget.trials_per_task={FULL_TRIALS}", f"tracking.uri={args.tracking_uri}",
            f"tracking.experiment={full_experiment(paper)}"]


def campaign_jobs(paper: Paper, args) -> list[Job]:
    """One job per (model, row), seed by seed: a campaign stopped early leaves whole seeds behind it."""
    return [Job(args.campaign / model / row / f"seed{seed}",
                (f"+experiment={paper.experiment}", f"+{paper.row_group}={row}", f"model={model}", f"seed={seed}",
                 *full_space_overrides(paper, args), *args.overrides))
            for seed in range(args.seed_from, args.seed_from + args.seeds)
            for model in args.models for row in paper.full_rows]


def plan_sizes(paper: Paper, args) -> dict:
    """Chameleon's SA+AS mean k by task, as the control SA plan=k ran it; nothing for AdaTune."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(args.tracking_uri)
    return {m: mean_k(client, paper, m) for m in args.models} if paper is CHAMELEON else {}


def mean_k(client, paper: Paper, model: str) -> float:
    """The mean sampler/k over every round of the SA+AS runs of `model`."""
    where = [f"tags.experiment = '{paper.experiment}'", f"tags.`choice.{paper.row_group}` = 'sa_as'",
             f"params.`model.name` = '{model}'"]
    runs = find_runs(client, paper.mlflow_experiment, where, limit=1000, required=False)
    ks = [m.value for run in runs for m in client.get_metric_history(run.info.run_id, "sampler/k")]
    if not ks:
        raise SystemExit(f"no sa_as run of {model} with sampler/k in {paper.mlflow_experiment}: run the grid first")
    return float(np.mean(ks))


# ---- the claims' page ----------------------------------------------------------------------------
def page_notes(paper: Paper, cost: dict, k_by_model: dict) -> list[str]:
    notes = list(paper.notes)
    if k_by_model:
        notes.append("SA plan=k: greedy SA at plan size " + ", ".join(f"{m} {k:.1f} -> {round(k)}" for m, k in k_by_model.items())
                     + " (SA+AS's mean k on the task).")
    return notes + ["Cost: " + ", ".join(f"{k} {v}" for k, v in cost.items()) + "."]


def replay_cost(result) -> str:
    """The replays' own wall time (their runs' run/tuning_wall_s)."""
    seconds = sum(m.get("run/tuning_wall_s", 0.0) for m in result.run_metrics.values())
    return f"{seconds / 60:.1f} min of replay tuning over {len(result.run_metrics)} runs"


def store_cost(store: str, keys: list) -> str:
    from tuning.store import connect_store

    rows = connect_store(store).conn.execute(
        "SELECT count(*), coalesce(sum(build_s + run_s), 0) FROM readings WHERE task IN (%s)" % ",".join("?" * len(keys)),
        keys).fetchone() if keys else (0, 0.0)
    return f"{rows[0]:,} store rows measured in {rows[1] / 60:.1f} min of build + run"


# ---- the command ----------------------------------------------------------------------------------
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paper", choices=sorted(PAPERS))
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run (e.g. budget.trials=500)")
    parser.add_argument("--store", help=f"the measurement store (default: stores/lab.sqlite, built by --build; "
                                        f"with --full-space {FULL_STORE}, created when missing)")
    parser.add_argument("--models", nargs="+", help="tasks (default: the paper's)")
    parser.add_argument("--seeds", type=int, default=10, help="seeds to run")
    parser.add_argument("--seed-from", type=int, default=0, help="the first seed (add seeds to a grid already run: "
                                                                     "--seeds 10 --seed-from 10; the table uses them all)")
    parser.add_argument("--jobs", type=int, default=1, help="parallel replay jobs (hydra/launcher=joblib)")
    parser.add_argument("--fraction", type=float, default=0.95, help="target: this share of the best known throughput")
    add_tracking_uri(parser, help="the MLflow store the grid's runs go to and the table reads")
    parser.add_argument("--table-only", action="store_true", help="no runs: the table from the runs already made")
    parser.add_argument("--with-overhead", action="store_true",
                        help="seconds to the target also count each run's own search and model-fitting seconds, "
                             "as the optimisation seconds do (one time axis for every method)")
    parser.add_argument("--out", help="output folder (default: claims-<paper>/<time> beside the MLflow store)")
    parser.add_argument("--full-space", action="store_true",
                        help=f"the paper's headline rows on the tasks' whole spaces (default tasks "
                             f"{' '.join(FULL_MODELS)}), {FULL_TRIALS} measurements a run, each new config measured "
                             "on this host into --store: a campaign of hours that resumes")
    parser.add_argument("--build", action="store_true",
                        help="build the store first (the tasks' sample of docs/claims.md, timed as "
                             "evaluator=adatune_de), one task at a time, then replay and print the table: a "
                             "campaign of hours that resumes")
    parser.add_argument("--build-override", action="append", dest="build_overrides", metavar="OVERRIDE",
                        help="--build: a Hydra override of the build steps (the store's hardware), repeated for "
                             f"several; given, they replace the default {' '.join(BUILD_OVERRIDES)} "
                             f"({STORE_EVALUATOR} always; the positional overrides go to the replays only)")
    parser.add_argument("--replays-only", action="store_true", help=argparse.SUPPRESS)  # a --build campaign's step
    parser.add_argument("--hours", type=float, help="a campaign: stop cleanly after this many hours (the run or "
                                                    "build in flight is stopped; the same command continues)")
    parser.add_argument("--campaign", type=Path, help="a campaign's folders (default: outputs/campaigns/<paper>-full "
                                                      "with --full-space, outputs/campaigns/claims-restricted with "
                                                      "--build)")
    add_archive_option(parser, "<paper>-full or campaigns/claims-restricted")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    paper = PAPERS[args.paper]
    args.models = args.models or list(FULL_MODELS if args.full_space else paper.models)
    if args.seeds < 1 or args.seed_from < 0 or not (0 < args.fraction <= 1) or args.jobs < 1:
        parser.error("--seeds must be >= 1, --seed-from >= 0, --fraction in (0, 1], --jobs >= 1")
    if args.build and args.full_space:
        parser.error("--build: a --full-space campaign fills its own store as it measures")
    if args.build_overrides and not args.build:
        parser.error("--build-override belongs to --build")
    if args.replays_only and (args.build or args.full_space or args.table_only):
        parser.error("--replays-only: a --build campaign's own step, alone")
    args.build_overrides = tuple(args.build_overrides or BUILD_OVERRIDES)
    if (args.hours is not None or args.campaign or args.archive) and not (args.full_space or args.build):
        parser.error("--hours, --campaign and --archive belong to a campaign (--full-space or --build)")
    if args.full_space and args.jobs > 1:
        parser.error("--jobs: a --full-space campaign times kernels, one run at a time")
    if args.hours is not None and not args.hours > 0:
        parser.error("--hours: must be > 0")
    if args.build and is_archive_file(args.archive):
        parser.error("--archive: a --build campaign's replays are not in its archive (their runs live in MLflow), "
                     "so its table prints only on a host of the archive's kind, from the folder (--archive "
                     f"{args.archive.parent}), which replays them again")
    if (args.full_space or args.build) and "://" in (args.store or ""):
        parser.error("--store: a campaign's store is a sqlite file, which its archive carries (copy it to "
                     "a server after: python -m tuning.tools.dataset copy)")
    store = Path(args.store or (FULL_STORE if args.full_space else "stores/lab.sqlite"))
    if args.full_space or args.build:
        store = REPO / store if not store.is_absolute() else store
        store.parent.mkdir(parents=True, exist_ok=True)
        name = f"{args.paper}-full" if args.full_space else "claims-restricted"
        args.campaign = (args.campaign or REPO / "outputs" / "campaigns" / name).resolve()
    elif not store.is_file():
        parser.error(f"--store: no such file {str(store)!r} (build it: see this command's --help, or --build)")
    args.store = str(store.resolve())
    return args, paper


def main(argv=None) -> list[dict]:
    args, paper = parse_args(argv)
    if view := view_for_tables(args.archive, args.table_only, stores=(args.store,)):
        args.store = str(view.store(args.store))
        args.campaign, args.tracking_uri, args.archive = view.root, view.tracking_uri, None
    if args.full_space:
        return full_space_main(paper, args)
    if args.build:
        return build_main(paper, args)
    if args.replays_only:
        run_replays(paper, args)
        return []
    cost, k_by_model = {}, {}
    if not args.table_only:
        seconds, k_by_model = run_replays(paper, args)
        cost["grid"] = f"{seconds / 60:.1f} min wall"
    else:
        k_by_model = plan_sizes(paper, args)
    return claims_table(paper, args, paper.mlflow_experiment, paper.budgets, paper.claims, cost, k_by_model,
                        "restricted to the store's configs")


def full_space_main(paper: Paper, args) -> list[dict]:
    """The campaign (unless --table-only), then the table of the claims between its rows."""
    cost, jobs = {}, campaign_jobs(paper, args)

    def run() -> None:
        if not args.table_only:
            cost["campaign"] = f"{run_campaign(jobs, args.hours) / 60:.1f} min wall this call"

    archived(args.archive, jobs, args.campaign, [Path(args.store)], args.tracking_uri, run,
             pack_after=not args.table_only)
    finished, total = progress(jobs)
    cost["runs"] = f"{finished} of the campaign's {total} runs finished ({args.campaign})"
    names = {paper.rows[row] for row in paper.full_rows}
    claims = tuple(c for c in paper.claims if {c.baseline, c.method} <= names)
    full = replace(paper, notes=(f"Full space (model.space=full): at most {FULL_TRIALS} measurements a run (the "
                                 "paper's rounds otherwise; an adaptive sampler measures what its knee asks for); "
                                 "a config the store held was answered from it, any other measured on this host and "
                                 "added (hardware.on_miss=measure), so seeds and rows share readings and the "
                                 "simulated clock counts each reading's stored build + run seconds.", *paper.notes[1:]))
    return claims_table(full, args, full_experiment(paper), FULL_BUDGETS, claims, cost, {}, "full space")


def claims_table(paper: Paper, args, experiment: str, budgets, claims, cost: dict, k_by_model: dict,
                 space: str) -> list[dict]:
    """The comparison of the experiment's finished runs, the claims' rows and the page claims.md."""
    out = Path(args.out) if args.out else default_out(args.tracking_uri, args.paper)
    result = compare_main(["--experiment", experiment, "--tag", f"experiment={paper.experiment}",
                           "--method-by", f"choice.{paper.row_group}", "--baseline", paper.baseline,
                           "--fraction", str(args.fraction), "--budgets", *map(str, budgets),
                           "--metric", "run/run_s", "--tracking-uri", args.tracking_uri, "--out", str(out),
                           *(["--store", args.store] if args.full_space or args.build else []),  # a view's copy
                           "--no-mlflow-run", *(["--with-overhead"] if args.with_overhead else [])],
                          rename=paper.rows)
    cost["replays"] = replay_cost(result)
    cost["store"] = store_cost(args.store, _store_tasks(args.store, result))
    rows = claim_rows(claims, result)
    seeds = sorted({c.seed for c in result.curves})
    text = (f"# Claims: {args.paper}, {space}, {seed_label(seeds)}, target {args.fraction:g} "
            f"of the best known throughput\n\n" + claims_markdown(rows, page_notes(paper, cost, k_by_model)))
    (out / "claims.md").write_text(text)
    print("\n" + text)
    print(f"files: {out}")
    return rows


def default_out(uri: str, paper: str) -> Path:
    """claims-<paper>/<time>/ beside the MLflow sqlite store (as tuning.tools.compare's compare/<time>/)."""
    return default_out_dir(uri, f"claims-{paper}")


def _store_tasks(store: str, result) -> list[str]:
    """The store's task keys of the compared tasks (by name)."""
    from tuning.store import connect_store

    names = result.tasks()
    found = connect_store(store).conn.execute(
        "SELECT key FROM tasks WHERE name IN (%s)" % ",".join("?" * len(names)), names).fetchall()
    return [row[0] for row in found]


if __name__ == "__main__":
    main()
