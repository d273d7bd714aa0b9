"""The GEMM-tiling paper's comparison, one factor at a time from its defaults: a campaign that resumes.

    python experiments/gemm_tiling_grid.py --hours 2                 # runs, re-reads, then both tables
    python experiments/gemm_tiling_grid.py --blocks paper start      # only some blocks of the grid
    python experiments/gemm_tiling_grid.py --table-only              # the tables from the runs made so far

Zhang et al. 2019 ("Compiler-Level Matrix Multiplication Optimization for Deep Learning") compare
G-BFS and N-A2C with TVM's XGBoost tuner on GEMM tilings (Fig. 8: 0.1% of gemm_1024's space). Every
run here is `+experiment=gemm_tiling` (the tiling space, one measurement store, 3 repeats of >= 50 ms)
with one row of conf/experiment/gemm_tiling_row, in blocks, each changing one thing:

    paper     gemm_1024: G-BFS, N-A2C, XGB (sa+greedy+xgb), random, each with the paper's settings
    start     G-BFS from a random state; G-BFS and N-A2C from the 16 random configs the seed's XGB
              and random rows measure first (budget.init_random=16, common random numbers)
    epsilon   N-A2C with Algorithm 2's epsilon as printed (search.epsilon=0.9)
    rho       G-BFS with rho 2 and 10 (the paper: 5)
    walk      N-A2C with walks of 1 and 6 steps (the paper: T = 3)
    size512   the paper block on gemm_512
    size2048  the paper block on gemm_2048
    start512 epsilon512 rho512 walk512
              start, epsilon, rho and walk on gemm_512, beside a host's size512 rows

10 seeds; a run measures 0.1% of its space (484 configs of gemm_512, 900 of gemm_1024), but 900 on
gemm_2048 (0.06%: its kernels take 8x as long). The XGB and random rows measure the seed's 16 shared
configs first: the same distribution as their own first random round, and pairs them with the
shared-start rows. The campaign goes block by block, seed by seed within a block, one run at a
time, each in its folder under outputs/campaigns/gemm-tiling/<task>/<row>/seed<k>
(tuning/tools/campaign.py): `--hours` stops it cleanly and the same command continues; a config
any run measured is answered from the store (stores/gemm_tiling.sqlite).

Then each finished run's best config is measured again until the store holds `--rereads` readings
of it (`tunelab dataset reread`), so a final kernel's latency is the median of 5 readings, not one,
and the intervals resample those readings as well as the seeds. The tables follow, each one family
of Holm-adjusted tests (experiments/claims.py's rules): the paper's claims on every size, then the
sensitivity of each factor (the variant against its default and against XGB), one family for each
size the factor blocks ran on. Seconds are on one time axis for every method: the stored build + run
seconds plus each run's own search and model-fitting seconds (compare --with-overhead).
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from tuning.config.cli import add_tracking_uri
from tuning.tools.campaign import Job, finished_folders, progress, run_campaign
from tuning.tools.campaign_archive import add_archive_option, archived, view_for_tables
from tuning.tools.compare.cli import default_out_dir
from tuning.tools.compare.cli import main as compare_main
from tuning.tools.compare.report import claims_markdown, seed_label
from tuning.tools.compare.statistics import Claim, claim_rows
from tuning.tools.dataset import main as dataset_main

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "gemm-tiling-grid"  # the MLflow experiment of the grid's runs
STORE = "stores/gemm_tiling.sqlite"
TRIALS = {"gemm_512": 484, "gemm_1024": 900, "gemm_2048": 900}
SHARED_CONFIGS = 16
ROWS = {"gbfs": "G-BFS", "a2c": "N-A2C", "xgb": "XGB", "random": "random",
        "gbfs_random_start": "G-BFS random start", "gbfs_shared_start": "G-BFS shared start",
        "a2c_shared_start": "N-A2C shared start", "a2c_epsilon_printed": "N-A2C epsilon as printed",
        "gbfs_rho2": "G-BFS rho=2", "gbfs_rho10": "G-BFS rho=10", "a2c_t1": "N-A2C T=1", "a2c_t6": "N-A2C T=6"}
PAPER_ROWS = ("gbfs", "a2c", "xgb", "random")
FACTOR_ROWS = {
    "start": ("gbfs_random_start", "gbfs_shared_start", "a2c_shared_start"),
    "epsilon": ("a2c_epsilon_printed",),
    "rho": ("gbfs_rho2", "gbfs_rho10"),
    "walk": ("a2c_t1", "a2c_t6"),
}
BLOCKS = {
    "paper": [("gemm_1024", row) for row in PAPER_ROWS],
    **{factor: [("gemm_1024", row) for row in rows] for factor, rows in FACTOR_ROWS.items()},
    "size512": [("gemm_512", row) for row in PAPER_ROWS],
    "size2048": [("gemm_2048", row) for row in PAPER_ROWS],
    **{f"{factor}512": [("gemm_512", row) for row in rows] for factor, rows in FACTOR_ROWS.items()},
}
DEFAULT_OF = {"gbfs_random_start": "gbfs", "gbfs_shared_start": "gbfs", "a2c_shared_start": "a2c",
              "a2c_epsilon_printed": "a2c", "gbfs_rho2": "gbfs", "gbfs_rho10": "gbfs", "a2c_t1": "a2c", "a2c_t6": "a2c"}
# "24% lower cost than the XGBoost method" (Fig. 8a) as baseline / method latency: 1 / 0.76
PAPER_SPEEDUP = "1.32x"
PAPER_CLAIMS = (
    Claim("G-BFS finds a faster kernel than TVM's XGBoost tuner at the budget (Fig. 8a)", "XGB", "G-BFS", "final",
          PAPER_SPEEDUP),
    Claim("N-A2C finds a faster kernel than TVM's XGBoost tuner at the budget (Fig. 8a)", "XGB", "N-A2C", "final",
          PAPER_SPEEDUP),
    Claim("G-BFS reaches the target sooner (Fig. 8b)", "XGB", "G-BFS", "seconds", ""),
    Claim("N-A2C reaches the target sooner (Fig. 8b)", "XGB", "N-A2C", "seconds", ""),
    Claim("control: G-BFS against uniform random search", "random", "G-BFS", "final", ""),
    Claim("control: N-A2C against uniform random search", "random", "N-A2C", "final", ""),
)
SENSITIVITY_CLAIMS = (
    *(Claim(f"factor: {ROWS[row]} against the paper's setting", ROWS[DEFAULT_OF[row]], ROWS[row], "final", "")
      for row in DEFAULT_OF),
    *(Claim(f"the claim with {ROWS[row]}: a faster kernel than XGB", "XGB", ROWS[row], "final", PAPER_SPEEDUP)
      for row in DEFAULT_OF),
)


def grid_jobs(args) -> list[Job]:
    """Block by block, seed by seed within a block: a campaign stopped early leaves whole seeds."""
    jobs = []
    for block in args.blocks:
        for seed in range(args.seed_from, args.seed_from + args.seeds):
            for model, row in BLOCKS[block]:
                jobs.append(Job(args.campaign / model / row / f"seed{seed}", run_overrides(args, model, row, seed)))
    return jobs


def run_overrides(args, model: str, row: str, seed: int) -> tuple:
    shared = (f"budget.init_random={SHARED_CONFIGS}",) if row in ("xgb", "random") else ()
    return ("+experiment=gemm_tiling", f"+experiment/gemm_tiling_row={row}", f"model={model}", f"seed={seed}",
            f"budget.trials={TRIALS[model]}", *shared, f"hardware.store={args.store}",
            f"tracking.uri={args.tracking_uri}", f"tracking.experiment={EXPERIMENT}", *args.overrides)


def reread(args, jobs: list[Job]) -> None:
    """Each finished run's best configs measured again until the store holds --rereads of each."""
    folders = finished_folders(jobs)
    if folders and args.rereads > 1:
        dataset_main(["reread", "--store", args.store, *map(str, folders), "--top", str(args.top),
                      "--measurements", str(args.rereads)])


def tables(args, cost: dict) -> tuple[list[dict], list[dict]]:
    """The comparison of the grid's finished runs, then the paper's claims and the sensitivity table."""
    out = Path(args.out) if args.out else default_out_dir(args.tracking_uri, "gemm-tiling-grid")
    budgets = sorted({100, 300, *TRIALS.values()})
    result = compare_main(["--experiment", EXPERIMENT, "--tag", "experiment=gemm_tiling",
                           "--method-by", "choice.experiment/gemm_tiling_row", "--baseline", "XGB",
                           "--fraction", str(args.fraction), "--budgets", *map(str, budgets), "--seconds", "750",
                           "--store", args.store, "--with-overhead", "--tracking-uri", args.tracking_uri,
                           "--out", str(out), "--no-mlflow-run"], rename=ROWS)
    paper = claim_rows(PAPER_CLAIMS, result)
    sensitivity = {task: rows for task in result.tasks()  # one Holm family a size
                   if (rows := claim_rows(SENSITIVITY_CLAIMS, result, tasks=[task]))}
    seeds = sorted({c.seed for c in result.curves})
    notes = [f"Budget: {', '.join(f'{m} {n}' for m, n in TRIALS.items())} measurements a run; the tiling space "
             "(model.space=tiling); 3 repeats of >= 50 ms a reading. Final latency: the median of every reading the "
             f"store holds of the run's best config ({args.rereads} or more after the re-reads). Seconds: stored "
             "build + run plus each run's own search and model-fitting seconds, for every method. Target: "
             f"{args.fraction:g} of the best known throughput.",
             "Cost: " + ", ".join(f"{k} {v}" for k, v in cost.items()) + "."]
    text = (f"# GEMM tiling, one factor at a time: {seed_label(seeds)}\n\n"
            "## The paper's claims (one Holm family)\n\n" + claims_markdown(paper, notes)
            + "".join(f"\n## Sensitivity on {task} (one Holm family)\n\n" + claims_markdown(rows, notes[:1])
                      for task, rows in sensitivity.items())
            + ("" if sensitivity else "\n## Sensitivity\n\nNo sensitivity row has a finished run yet.\n"))
    (out / "grid.md").write_text(text)
    print("\n" + text)
    print(f"files: {out}")
    return paper, [row for rows in sensitivity.values() for row in rows]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run (e.g. evaluator.repeat=5)")
    parser.add_argument("--blocks", nargs="+", choices=list(BLOCKS), default=list(BLOCKS),
                        help="the grid's blocks to run, in this order (default: all)")
    parser.add_argument("--seeds", type=int, default=10, help="seeds per row")
    parser.add_argument("--seed-from", type=int, default=0, help="the first seed")
    parser.add_argument("--hours", type=float, help="stop cleanly after this many hours (the run in flight ends "
                                                    "KILLED; the same command continues)")
    parser.add_argument("--store", default=STORE, help=f"the measurement store (default: {STORE}, created when missing)")
    parser.add_argument("--campaign", type=Path, help="the runs' folders (default: outputs/campaigns/gemm-tiling)")
    parser.add_argument("--rereads", type=int, default=5, help="readings of each finished run's best configs the "
                                                               "store should hold before the tables")
    parser.add_argument("--top", type=int, default=1, help="each run's best this many configs are re-read")
    parser.add_argument("--fraction", type=float, default=0.95, help="target: this share of the best known throughput")
    add_tracking_uri(parser, help="the MLflow store the grid's runs go to and the tables read")
    parser.add_argument("--table-only", action="store_true", help="no runs and no re-reads: the tables only")
    parser.add_argument("--out", help="output folder (default: gemm-tiling-grid/<time> beside the MLflow store)")
    add_archive_option(parser, "gemm-tiling")
    args = parser.parse_intermixed_args(argv)
    if args.seeds < 1 or args.seed_from < 0 or args.rereads < 1 or args.top < 1 or not 0 < args.fraction <= 1:
        parser.error("--seeds, --rereads and --top must be >= 1, --seed-from >= 0, --fraction in (0, 1]")
    if args.hours is not None and not args.hours > 0:
        parser.error("--hours: must be > 0")
    store = Path(args.store)
    store = (REPO / store if not store.is_absolute() else store).resolve()
    store.parent.mkdir(parents=True, exist_ok=True)
    args.store = str(store)
    args.campaign = (args.campaign or REPO / "outputs" / "campaigns" / "gemm-tiling").resolve()
    return args


def main(argv=None) -> tuple[list[dict], list[dict]]:
    args = parse_args(argv)
    if view := view_for_tables(args.archive, args.table_only, stores=(args.store,)):
        args.store = str(view.store(args.store))
        args.campaign, args.tracking_uri, args.archive = view.root, view.tracking_uri, None
    jobs, cost = grid_jobs(args), {}

    def run() -> None:
        if not args.table_only:
            cost["campaign"] = f"{run_campaign(jobs, args.hours, 'the grid') / 60:.1f} min wall this call"
            started = time.perf_counter()
            reread(args, jobs)
            cost["re-reads"] = f"{(time.perf_counter() - started) / 60:.1f} min"

    archived(args.archive, jobs, args.campaign, [Path(args.store)], args.tracking_uri, run,
             pack_after=not args.table_only)
    finished, total = progress(jobs)
    cost["runs"] = f"{finished} of the grid's {total} runs finished ({args.campaign})"
    if not any(folder.parent.name == "xgb" for folder in finished_folders(jobs)):
        print(f"{finished} of the grid's {total} runs finished, none of XGB yet: the tables compare every row "
              "with it, so they wait for its first finished run (the same command continues the grid)")
        return [], []
    return tables(args, cost)


if __name__ == "__main__":
    main()
