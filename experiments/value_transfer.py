"""Does a value function learned on other networks schedule an unseen one? A matched campaign that resumes.

    python experiments/value_transfer.py --hours 2          # corpora, training, runs, then the tables
    python experiments/value_transfer.py --table-only       # the tables from the runs finished so far

Steiner et al. 2020 ("Value function based performance optimization of deep learning workloads")
train V on schedules of some networks and schedule others with no measurement, 1.5x faster than
AutoTVM and 5.1x faster than PyTorch (Fig. 2b). Here, leave one network out, for each of the networks
(ResNet-18, SqueezeNet 1.0, MobileNetV2 by default):

  corpora   each network's kernels measured twice into its own stores, at one size (`--per-kernel`
            configs a kernel): the tuning records of sa+greedy+xgb (AutoTVM's tuner; its seed-0 run is
            also the AutoTVM row below) and random schedules (`tunelab dataset build`).
  training  for each held-out network, source (tuning records or random schedules) and seed: V
            (`tunelab value train`) and MetaSchedule's cost model (`tunelab pretrain`) on the other
            networks' corpora of that source, every kernel cut to `--configs-per-kernel` configs (a
            seeded draw), so the two sources differ in source only; V is also scored on the held-out
            network's random schedules, the same configs for both sources.
  runs      on the held-out network, each seed, with e2e timing against torch in the same run:
              value-tuning, value-random   search=value with that V, budget.trials=0
              xgb-tuning, xgb-random       the pretrained model's pick of `--best-of` random configs, 0
              random                       a random legitimate schedule per kernel, 0
              autotvm8, autotvm32          sa+greedy+xgb at 8 and 32 measurements a kernel (plan size 8)

Every run is in its own folder under outputs/campaigns/value-transfer/<network>/<row>/seed<k>
(tuning/tools/campaign.py: `--hours` stops cleanly, the same command continues). In-model re-choice
is off (e2e.in_model_kernels=0): each row applies what its method chose.

The tables compare rows by each run's latency over torch's in that run (torch is the yardstick timed
beside every model, so runs hours apart on a drifting host compare), paired by (network, seed), with
intervals that resample the seeds and every run's timed calls, Wilcoxon on the paired log ratios and
Holm's correction across the table; then each network's medians and the heaviest kernels' latencies
inside the model per row.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np

from tuning.config.cli import add_tracking_uri
from tuning.config.conf_dir import CONF_DIR
from tuning.core.plausible import positive_number
from tuning.tools.campaign import Job, finished_folders, is_finished, progress, run_campaign
from tuning.tools.campaign_archive import add_archive_option, archived, view_for_tables
from tuning.tools.compare.cli import default_out_dir
from tuning.tools.compare.report import claim_cell
from tuning.tools.compare.statistics import claim_verdict, magnitude
from tuning.tools.compare.stats import holm, paired_ratio_with_readings

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "value-transfer"  # the MLflow experiment of the runs (training runs: value-transfer-training)
NETWORKS = ("resnet18", "squeezenet1_0", "mobilenet_v2")
SOURCES = ("tuning", "random")
ZERO_ROWS = ("value-tuning", "value-random", "xgb-tuning", "xgb-random", "random")
ROWS = (*ZERO_ROWS, "autotvm8", "autotvm32")
AUTOTVM = ("search=sa", "sampler=greedy", "cost_model=xgb", "budget.plan_size=8")
TORCH = "torch"
# (claim, method row, baseline row, the paper's speed-up); speed-up = baseline / method latency
CLAIMS = (
    ("V schedules an unseen network faster than V from random schedules (tuning records vs random, one size)",
     "value-tuning", "value-random", ""),
    ("V beats MetaSchedule's cost model pre-trained on the same tuning records, both with no measurement",
     "value-tuning", "xgb-tuning", ""),
    ("V beats MetaSchedule's cost model pre-trained on the same random schedules, both with no measurement",
     "value-random", "xgb-random", ""),
    ("V (tuning records) beats a random legitimate schedule", "value-tuning", "random", ""),
    ("V (random schedules) beats a random legitimate schedule", "value-random", "random", ""),
    ("V is faster than AutoTVM (Fig. 2b), AutoTVM at 32 measurements a kernel", "value-tuning", "autotvm32", "1.5x"),
    ("V is faster than AutoTVM (Fig. 2b), AutoTVM at 8 measurements a kernel", "value-tuning", "autotvm8", "1.5x"),
    ("V is faster than PyTorch (Fig. 2b)", "value-tuning", TORCH, "5.1x"),
    ("control: AutoTVM at 32 against 8 measurements a kernel", "autotvm32", "autotvm8", ""),
)


# ---- the campaign's jobs -------------------------------------------------------------------------
def store(args, network: str, kind: str) -> str:
    """kind: tuning (the corpus of tuning records), random (the random corpus) or runs (every other run)."""
    return str(args.stores / f"{network}-{kind}.sqlite")


def model_name(kind: str, source: str, heldout: str, seed: int) -> str:
    return f"{EXPERIMENT}-{kind}-{source}-without-{heldout}-seed{seed}"


def run_job(args, network: str, row: str, seed: int, *overrides: str, kind: str = "runs") -> Job:
    common = (f"model={network}", f"seed={seed}", "e2e.in_model_kernels=0", f"hardware.store={store(args, network, kind)}",
              f"tracking.uri={args.tracking_uri}", f"tracking.experiment={EXPERIMENT}")
    return Job(args.campaign / network / row / f"seed{seed}", (*overrides, *common, *args.overrides))


def autotvm(args, network: str, per_kernel: int, seed: int) -> Job:
    kind = "tuning" if per_kernel == args.per_kernel and seed == 0 else "runs"  # seed 0 at full size: the corpus
    return run_job(args, network, f"autotvm{per_kernel}", seed, *AUTOTVM, f"budget.trials_per_task={per_kernel}",
                   f"budget.min_trials_per_task={per_kernel}", kind=kind)


def corpus_jobs(args) -> list[Job]:
    jobs = []
    for network in args.networks:
        jobs.append(autotvm(args, network, args.per_kernel, 0))
        jobs.append(Job(args.campaign / network / "random-corpus", command=(
            "-m", "tuning.tools.dataset", "build", "--store", store(args, network, "random"), "--model", network,
            "--configs", str(args.per_kernel), "--exhaustive-limit", str(args.per_kernel), "--seed", "0",
            *args.overrides)))
    return jobs


def training_jobs(args) -> list[Job]:
    jobs = []
    for heldout in args.networks:
        others = [n for n in args.networks if n != heldout]
        for source in SOURCES:
            corpus = [arg for n in others for arg in ("--store", store(args, n, source))]
            for seed in args.seeds:
                if not feeds_unfinished_rows(args, heldout, source, seed):
                    continue
                cut = ("--configs-per-kernel", str(args.configs_per_kernel), "--seed", str(seed))
                tracking = ("--tracking-uri", args.tracking_uri, "--experiment", f"{EXPERIMENT}-training")
                folder = args.campaign / heldout / "training" / f"{source}-seed{seed}"
                jobs.append(Job(folder / "value", archived=False, command=(  # the models live in MLflow
                    "-m", "tuning.value", "train", *corpus, "--holdout-store", store(args, heldout, "random"),
                    "--val-fraction", "0", "--epochs", str(args.epochs), *cut, *tracking,
                    "--name", model_name("value", source, heldout, seed))))
                jobs.append(Job(folder / "xgb", archived=False, command=(
                    "-m", "tuning.tools.pretrain", *corpus, "--no-heldout", *cut, *tracking,
                    "--name", model_name("xgb", source, heldout, seed))))
    return jobs


def feeds_unfinished_rows(args, heldout: str, source: str, seed: int) -> bool:
    """Whether a training step's models are still wanted: once the two rows they feed have finished, a
    campaign restored on a new machine (whose MLflow lacks the models) does not train them again."""
    rows = [job for job in zero_measurement_jobs(args, heldout, seed) if job.folder.parent.name.endswith(f"-{source}")]
    return not all(is_finished(job) for job in rows)


def zero_measurement_jobs(args, network: str, seed: int) -> list[Job]:
    jobs = []
    for source in SOURCES:
        value, xgb = model_name("value", source, network, seed), model_name("xgb", source, network, seed)
        jobs.append(run_job(args, network, f"value-{source}", seed, "search=value", f"search.model={value}",
                            f"search.registry={args.tracking_uri}", "budget.trials=0"))
        jobs.append(run_job(args, network, f"xgb-{source}", seed, "search=random", f"search.best_of={args.best_of}",
                            "cost_model=xgb_ms", f"cost_model.pretrained={xgb}",
                            f"cost_model.registry={args.tracking_uri}", "budget.trials=0"))
    jobs.append(run_job(args, network, "random", seed, "search=random", "budget.trials=0"))
    return jobs


def campaign_jobs(args) -> list[Job]:
    """Corpora, then training, then seed by seed the runs (no measurement first): a campaign stopped
    early leaves whole seeds."""
    jobs = [*corpus_jobs(args), *training_jobs(args)]
    for seed in args.seeds:
        for network in args.networks:
            jobs += zero_measurement_jobs(args, network, seed)
        for network in args.networks:
            jobs.append(autotvm(args, network, args.small_per_kernel, seed))
            if seed != 0:
                jobs.append(autotvm(args, network, args.per_kernel, seed))
    return jobs


# ---- the tables ----------------------------------------------------------------------------------
def read_e2e(folder: Path) -> dict | str:
    """A finished run's end-to-end reading: tuned and torch latencies (ms, each timed call) and the
    kernels inside the model; a message instead when the file is missing or malformed (untrusted)."""
    try:
        e2e = json.loads((folder / "e2e.json").read_text())
        calls = {name: [float(x) for x in e2e["latencies_ms"][name]] for name in ("tuned", TORCH)}
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"{folder}: no readable e2e.json ({type(error).__name__}: {error})"
    if not all(calls[name] and all(positive_number(x) for x in calls[name]) for name in calls):
        return f"{folder}: e2e.json holds a latency that is not a positive number"
    kernels = {}
    for row in e2e.get("kernels", []) if isinstance(e2e.get("kernels"), list) else []:
        if isinstance(row, dict) and isinstance(row.get("task"), str) and positive_number(row.get("in_model_us")):
            kernels[row["task"]] = {"calls": row.get("calls"), "in_model_us": float(row["in_model_us"])}
    return {**calls, "match": bool(e2e.get("match")), "kernels": kernels}


def gather(jobs: list[Job]) -> tuple[dict, list[str]]:
    """{(network, row, seed): e2e reading} of every finished run, and what was left out and why."""
    readings, problems = {}, []
    for folder in finished_folders([job for job in jobs if not job.command]):
        found = read_e2e(folder)
        if isinstance(found, str):
            problems.append(found)
        else:
            readings[(folder.parent.parent.name, folder.parent.name, int(folder.name.removeprefix("seed")))] = found
    return readings, problems


def claim_rows(readings: dict, rng) -> list[dict]:
    """Each claim over the (network, seed) pairs both rows finished; Holm across the table."""
    rows = []
    for claim, method, baseline, paper in CLAIMS:
        pairs = sorted((n, s) for n, r, s in readings if r == method and (baseline == TORCH or (n, baseline, s) in readings))
        row = {"claim": claim, "method": method, "baseline": baseline, "paper": paper, "n": len(pairs),
               "networks": sorted({n for n, _ in pairs})}
        if pairs:
            ours = [readings[(n, method, s)] for n, s in pairs]
            if baseline == TORCH:  # the method's own run times torch: no yardstick needed
                found = paired_ratio_with_readings([r[TORCH] for r in ours], [r["tuned"] for r in ours], rng)
            else:
                theirs = [readings[(n, baseline, s)] for n, s in pairs]
                found = paired_ratio_with_readings([r["tuned"] for r in theirs], [r["tuned"] for r in ours], rng,
                                                   method_scale=[r[TORCH] for r in theirs],
                                                   baseline_scale=[r[TORCH] for r in ours])
            row.update(speedup=found["ratio"], low=found["low"], high=found["high"], p=found["p"])
        rows.append(row)
    for row, adjusted in zip(rows, holm([r.get("p", math.nan) for r in rows])):
        row["p_holm"] = adjusted
        row["verdict"] = verdict(row)
    return rows


# these rows compare the latency of the output, not the measurements a method needs
LATENCY_WORDS = ("the method's output is faster", "the method's output is slower")


def verdict(row: dict) -> str:
    """The claims tables' rule (statistics.claim_verdict): decided only when the CI of the speed-up
    excludes 1 and Holm's p < 0.05; a paper's figure is then placed against the interval
    (statistics.magnitude)."""
    if not row["n"]:
        return "undecided at this power"
    speed = {"low": row["low"], "high": row["high"], "p_holm": row["p_holm"]}
    said = claim_verdict(speed, {}, None, claimed=bool(row["paper"]), words=LATENCY_WORDS)
    placed = magnitude(row["paper"], speed) if said != "undecided at this power" else ""
    return f"{said}; {placed}" if placed else said


def network_table(readings: dict, networks) -> list[str]:
    out = ["| network | row | runs | tuned ms (median) | torch ms (median, same runs) | torch / tuned (median) |",
           "|---|---|---|---|---|---|"]
    for network in networks:
        for row in ROWS:
            runs = [v for (n, r, _), v in sorted(readings.items()) if n == network and r == row]
            if runs:
                tuned = [float(np.median(v["tuned"])) for v in runs]
                torch = [float(np.median(v[TORCH])) for v in runs]
                out.append(f"| {network} | {row} | {len(runs)} | {np.median(tuned):.2f} | {np.median(torch):.2f} | "
                           f"{np.median(np.divide(torch, tuned)):.3f}x |")
    return out


def kernel_table(readings: dict, network: str, heaviest: int) -> list[str]:
    """The heaviest kernels (by calls x latency under AutoTVM at 32, else any row) inside the model,
    each row's median over seeds in microseconds."""
    runs = {row: [v for (n, r, _), v in readings.items() if n == network and r == row] for row in ROWS}
    reference = runs["autotvm32"] or next((v for v in runs.values() if v), [])
    if not reference:
        return []
    weight = {task: (k["calls"] or 1) * k["in_model_us"] for task, k in reference[0]["kernels"].items()
              if isinstance(k["calls"], int)}
    tasks = sorted(weight, key=weight.get, reverse=True)[:heaviest]
    shown = [row for row in ROWS if runs[row]]
    out = [f"| {network}: kernel (calls) | " + " | ".join(shown) + " |", "|---" * (1 + len(shown)) + "|"]
    for task in tasks:
        cells = []
        for row in shown:
            values = [v["kernels"][task]["in_model_us"] for v in runs[row] if task in v["kernels"]]
            cells.append(f"{np.median(values):.1f}" if values else "-")
        out.append(f"| {task} ({reference[0]['kernels'][task]['calls']}) | " + " | ".join(cells) + " |")
    return out


def tables(args, jobs: list[Job], cost: dict) -> list[dict]:
    readings, problems = gather(jobs)
    if not readings:
        print("no run of the transfer experiment has finished yet: no table (the same command continues)")
        return []
    rows = claim_rows(readings, np.random.default_rng(0))
    seeds = sorted({s for _, _, s in readings})
    networks = [n for n in args.networks if any(k[0] == n for k in readings)]
    text = [f"# Value-function transfer, leave one network out: {', '.join(networks)}; seeds {seeds}", "",
            "Speed-up = baseline / method latency, each run's latency over torch's timed in that run; 95% CI "
            "resampling the (network, seed) pairs and every run's timed calls; Wilcoxon on the paired log ratios, "
            "Holm across this table; a verdict only when the CI excludes 1 and Holm's p < 0.05.", "",
            "| claim | method vs baseline | pairs (networks) | paper | speed-up [95% CI] | p (Holm) | verdict |",
            "|---|---|---|---|---|---|---|"]
    for r in rows:
        cell = claim_cell(r["speedup"], r["low"], r["high"]) if r["n"] else "-"
        p_cell = f"{r['p']:.3g} ({r['p_holm']:.3g})" if r["n"] else "-"
        text.append(f"| {r['claim']} | {r['method']} vs {r['baseline']} | {r['n']} ({', '.join(r['networks'])}) | "
                    f"{r['paper'] or '-'} | {cell} | {p_cell} | {r['verdict']} |")
    text += ["", "Each network's runs:", "", *network_table(readings, networks), "",
             f"The {args.heaviest} heaviest kernels inside the model (us per call, median over seeds):", ""]
    for network in networks:
        text += [*kernel_table(readings, network, args.heaviest), ""]
    mismatched = sorted(f"{n}/{r}/seed{s}" for (n, r, s), v in readings.items() if not v["match"])
    notes = [f"Corpora: {args.per_kernel} configs a kernel of each source, cut to {args.configs_per_kernel} a "
             f"kernel for training; V trained {args.epochs} epochs; xgb rows rank {args.best_of} random configs.",
             "Cost: " + ", ".join(f"{k} {v}" for k, v in cost.items()) + "."]
    if mismatched:
        notes.append("Output differs from torch beyond tolerance in: " + ", ".join(mismatched) + ".")
    notes += [f"Left out: {p}" for p in problems]
    text += notes
    out = Path(args.out) if args.out else default_out_dir(args.tracking_uri, EXPERIMENT)
    out.mkdir(parents=True, exist_ok=True)
    (out / "value-transfer.md").write_text("\n".join(text) + "\n")
    print("\n" + "\n".join(text) + f"\n\nfiles: {out}")
    return rows


# ---- the command ---------------------------------------------------------------------------------
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run and corpus build "
                                                     "(e.g. hardware.num_threads=2)")
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS),
                        help="model configs of whole networks, each left out in turn (at least 3)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of every trained model and run")
    parser.add_argument("--per-kernel", type=int, default=32,
                        help="each corpus's configs a kernel, and AutoTVM's larger budget a kernel")
    parser.add_argument("--small-per-kernel", type=int, default=8, help="AutoTVM's smaller budget a kernel")
    parser.add_argument("--configs-per-kernel", type=int, default=24,
                        help="training cuts every kernel of either corpus to this many configs")
    parser.add_argument("--epochs", type=int, default=200, help="V's training epochs")
    parser.add_argument("--best-of", type=int, default=512,
                        help="random configs the pre-trained cost model ranks per kernel (MetaSchedule's population)")
    parser.add_argument("--heaviest", type=int, default=8, help="kernels shown per network in the kernel table")
    parser.add_argument("--hours", type=float, help="stop cleanly after this many hours (the same command continues)")
    parser.add_argument("--stores", type=Path, help="the corpora's and runs' stores (default: stores/value-transfer)")
    parser.add_argument("--campaign", type=Path, help="the runs' folders (default: outputs/campaigns/value-transfer)")
    add_tracking_uri(parser, help="the MLflow store of the runs and the registry of the trained models")
    parser.add_argument("--table-only", action="store_true", help="no runs: the tables from the finished runs")
    parser.add_argument("--out", help="output folder (default: value-transfer/<time> beside the MLflow store)")
    add_archive_option(parser, EXPERIMENT)
    args = parser.parse_intermixed_args(argv)
    if len(set(args.networks)) < 3:
        parser.error("--networks: leave-one-network-out needs at least 3 networks")
    for key in ("seeds", "per_kernel", "small_per_kernel", "epochs", "best_of", "heaviest"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')}: must be >= 1")
    if not 2 <= args.configs_per_kernel <= args.per_kernel:
        parser.error("--configs-per-kernel: must be in [2, --per-kernel]")
    if args.hours is not None and not args.hours > 0:
        parser.error("--hours: must be > 0")
    args.networks = list(dict.fromkeys(args.networks))
    unknown = [n for n in args.networks if not _is_network(n)]
    if unknown:
        parser.error(f"--networks: {', '.join(unknown)}: not a whole network's model config in conf/model")
    args.seeds = list(range(args.seeds))
    args.stores = (args.stores or REPO / "stores" / "value-transfer").resolve()
    args.campaign = (args.campaign or REPO / "outputs" / "campaigns" / "value-transfer").resolve()
    return args


def run(args, jobs: list[Job], cost: dict) -> None:
    if not args.table_only:
        args.stores.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        run_campaign(jobs, args.hours, "the transfer experiment")
        cost["campaign"] = f"{(time.perf_counter() - started) / 60:.1f} min wall this call"


def _is_network(name: str) -> bool:
    """Whether conf/model/<name>.yaml is a whole network (model.kind network: torch times it too)."""
    from omegaconf import OmegaConf

    path = CONF_DIR / "model" / f"{name}.yaml"
    return path.name == f"{name}.yaml" and path.is_file() and OmegaConf.load(path).get("kind") == "network"


def progress_line(jobs: list[Job], campaign: Path) -> str:
    """Runs finished of all the rows' runs (a fixed count), then the corpus and training steps still
    wanted (a training step drops out once the rows it feeds have finished)."""
    runs = [job for job in jobs if not job.command]
    steps = [job for job in jobs if job.command]
    (runs_done, runs_total), (steps_done, steps_total) = progress(runs), progress(steps)
    return (f"{runs_done} of the experiment's {runs_total} runs finished, {steps_done} of {steps_total} corpus "
            f"and training steps (those the unfinished rows still need) ({campaign})")


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if view := view_for_tables(args.archive, args.table_only):
        args.campaign, args.stores, args.tracking_uri, args.archive = view.root, view.stores, view.tracking_uri, None
    jobs, cost = campaign_jobs(args), {}
    stores = [Path(store(args, n, kind)) for n in args.networks for kind in ("tuning", "random", "runs")]
    archived(args.archive, jobs, args.campaign, stores, args.tracking_uri, lambda: run(args, jobs, cost),
             pack_after=not args.table_only)
    cost["progress"] = progress_line(jobs, args.campaign)
    return tables(args, jobs, cost)


if __name__ == "__main__":
    main()
