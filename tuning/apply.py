"""Apply a run's best schedules to its whole model and time it against the untuned build and torch.

    python -m tuning.apply outputs/runs/2026-11-21/18-00-00-000000

does for a finished (or killed) run what the end of `run.py` does for a network
model: compile with the run's MetaSchedule database (exported again from its
records if missing), check the output against torch, time tuned / untuned /
torch eager with the run's thread count, print the per-task table and the
end-to-end line, write e2e.json and log `e2e/*` to the run's MLflow run.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

WHOLE_MODEL_KINDS = ("network", "onnx")


def is_whole_model(model_cfg) -> bool:
    return model_cfg["kind"] in WHOLE_MODEL_KINDS


def weighted_latency_ms(outcomes) -> float:
    """Sum over tasks of weight x best latency: the model's latency if kernels were all it ran."""
    return sum(o.task.weight * o.best_cost for o in outcomes) * 1e3


def in_measured_order(outcomes) -> list[tuple[object, object, bool]]:
    """(task, record, reused) over all tasks: reused records first, then in the order measured."""
    merged = sorted(((i >= o.reused, r.time, o.task, r) for o in outcomes for i, r in enumerate(o.records)),
                    key=lambda item: item[:2])
    return [(task, record, not own) for own, _, task, record in merged]


def model_curve(outcomes) -> list[tuple[int, float]]:
    """(measurements, sum of weight x best latency in ms) once every task has a valid record,
    records in the order they were measured (reused ones first)."""
    best: dict = {}
    points = []
    for count, (task, record, _) in enumerate(in_measured_order(outcomes), start=1):
        if record.result.ok:
            best[task.key] = min(best.get(task.key, math.inf), task.weight * record.result.cost)
        if len(best) == len(outcomes):
            points.append((count, sum(best.values()) * 1e3))
    return points


def task_table(outcomes) -> str:
    """Where the time goes: one row per task, biggest share of weight x latency first."""
    total = weighted_latency_ms(outcomes)
    header = (f"{'task':<44} {'weight':>6} {'MFLOP':>8} {'best us':>10} {'GFLOP/s':>8} "
              f"{'x weight ms':>11} {'share':>6} {'trials':>6} {'reused':>6} {'invalid':>7}  stopped")
    rows = [header, "-" * len(header)]
    for o in sorted(outcomes, key=lambda o: -o.task.weight * o.best_cost):
        weighted = o.task.weight * o.best_cost * 1e3
        share = f"{100 * weighted / total:5.1f}%" if math.isfinite(total) and total > 0 else "   n/a"
        rows.append(f"{o.task.name[:44]:<44} {o.task.weight:>6} {o.task.flops / 1e6:>8.1f} "
                    f"{o.best_cost * 1e6:>10.1f} {o.best_gflops:>8.1f} {weighted:>11.3f} {share:>6} "
                    f"{len(o.records):>6} {o.reused:>6} {o.invalid:>7}  {o.stopped_because}")
    rows.append(f"{'all tasks':<44} {sum(o.task.weight for o in outcomes):>6} "
                f"{sum(o.task.weight * o.task.flops for o in outcomes) / 1e6:>8.1f} {'':>10} {'':>8} "
                f"{total:>11.3f} {'':>6} {sum(len(o.records) for o in outcomes):>6} "
                f"{sum(o.reused for o in outcomes):>6} {sum(o.invalid for o in outcomes):>7}")
    return "\n".join(rows)


def e2e_line(e2e: dict) -> str:
    latency = e2e["latency_ms"]
    parts = [f"end to end: tuned {latency['tuned']:.2f} ms", f"untuned {latency['untuned']:.1f} ms"]
    if "torch" in latency:
        parts.append(f"torch eager {latency['torch']:.2f} ms")
        parts.append(f"speed-up vs torch {latency['torch'] / latency['tuned']:.2f}x")
    parts.append(f"vs untuned {latency['untuned'] / latency['tuned']:.1f}x")
    verdict = "match" if e2e["match"] else "DO NOT match"
    parts.append(f"outputs {verdict} {e2e['reference']} (max abs diff {e2e['max_abs_diff']:.2e})")
    return "  ".join(parts) + f"  [{e2e['num_threads']} threads]"


def e2e_metrics(e2e: dict) -> dict:
    latency = e2e["latency_ms"]
    metrics = {f"e2e/{name}_ms": value for name, value in latency.items()}
    metrics["e2e/speedup_vs_untuned"] = latency["untuned"] / latency["tuned"]
    if "torch" in latency:
        metrics["e2e/speedup_vs_torch"] = latency["torch"] / latency["tuned"]
    metrics["e2e/match"] = float(e2e["match"])
    metrics["e2e/max_abs_diff"] = e2e["max_abs_diff"]
    return metrics


def evaluate_end_to_end(cfg, hardware, tracker, out_dir: Path) -> dict:
    """Apply the exported database (out_dir/database), time, write e2e.json, log e2e/*."""
    from omegaconf import OmegaConf

    timing = {k: cfg.e2e[k] for k in ("runs", "min_runs", "max_seconds", "timeout_s")}
    model = OmegaConf.to_container(cfg.model, resolve=True)
    e2e = hardware.evaluate_model(model, cfg.seed, out_dir / "database", out_dir, timing)
    path = out_dir / "e2e.json"
    path.write_text(json.dumps(e2e, indent=1))
    tracker.log_metrics(e2e_metrics(e2e), step=0)
    tracker.set_tags({"e2e_match": str(e2e["match"])})
    tracker.log_artifact(str(path))
    return e2e


# ---- python -m tuning.apply <run> ------------------------------------------------------------
def apply_run(run_dir: Path) -> dict:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from tuning.loop import TaskOutcome, best_from_records
    from tuning.records import RecordLog
    from tuning.run import prior_records  # run.py imports this module: import at call time

    cfg = OmegaConf.load(run_dir / "config.yaml")
    if not is_whole_model(cfg.model):
        raise SystemExit(f"tunelab: {run_dir} tuned model {cfg.model.name} (kind {cfg.model.kind}); "
                         f"apply needs a whole model ({', '.join(WHOLE_MODEL_KINDS)})")
    records = RecordLog(run_dir / "records.jsonl").load()
    with instantiate(cfg.hardware) as hardware:
        tasks = hardware.model_tasks(cfg.model, cfg.seed)
        prior = prior_records(cfg, tasks, run_dir, instantiate(cfg.tracking))  # its tuning.database, if any
        outcomes = []
        for task in tasks:
            own = [r for r in records if r.workload_key == task.key]
            outcome = TaskOutcome(task, [*prior.get(task.key, []), *own], reused=len(prior.get(task.key, [])))
            best_from_records(outcome)
            outcome.stopped_because = "from records"
            outcomes.append(outcome)
        missing = [o.task.name for o in outcomes if o.best_config is None]
        if missing:
            raise SystemExit(f"tunelab: no valid record for {len(missing)} task(s) of {run_dir}: {', '.join(missing)}")
        hardware.export_database([(o.task, o.records) for o in outcomes], run_dir / "database")
        tracker = _tracker_of(cfg, run_dir)
        try:
            e2e = evaluate_end_to_end(cfg, hardware, tracker, run_dir)
        finally:
            tracker.end("FINISHED")
    print(task_table(outcomes))
    print(e2e_line(e2e))
    return e2e


def _tracker_of(cfg, run_dir: Path):
    from hydra.utils import instantiate

    from tuning.tracking.base import NoTracker

    run_id_file = run_dir / "mlflow_run_id"
    if not run_id_file.exists():
        return NoTracker()
    tracker = instantiate(cfg.tracking)
    tracker.start(cfg.model.name, {}, {}, resume_run_id=run_id_file.read_text().strip())
    return tracker


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tuning.apply", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run folder (outputs/runs/<date>/<time>)")
    args = parser.parse_args(argv)
    run_dir = args.run.expanduser().resolve()
    if not (run_dir / "config.yaml").exists():
        print(f"tunelab: {run_dir} holds no config.yaml (not a tunelab run folder)", file=sys.stderr)
        sys.exit(2)
    apply_run(run_dir)


if __name__ == "__main__":
    main()
