"""Whole models (model.kind network / onnx): apply the tuned schedules and time the model end to end.

`evaluate_end_to_end` asks the hardware to compile the model with the run's exported MetaSchedule
database, check its output and time it against the untuned build and torch; the result goes to
e2e.json and the run's `e2e/*` metrics. Used at the end of run.py and by `python -m tuning.tools.apply`,
which pass the run's outcomes: the lab's estimate of the model (its kernels' chosen latencies
weighted by calls) and each kernel's prediction are kept beside what the model took, and the line
says how far the heaviest kernels ran inside the model from their predictions.
Its files are checked before the model is compiled: none is written through a symlink in the run folder.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from tuning.config import ConfigError
from tuning.core.outcome import weighted_latency_ms
from tuning.core.plausible import spread_problem
from tuning.core.task import WHOLE_MODEL_KINDS, build_tasks, is_whole_model  # noqa: F401 - re-exported
from tuning.engine.run_folder import inside, write_inside
from tuning.engine.spec import E2ESpec, JobSpec, ModelSpec

E2E_FILES = ("e2e.json", "e2e_input.npy", "e2e_output.npy")  # the last two written by the hardware
HEAVIEST = 10  # kernels whose in-model time is set beside their prediction in the end-to-end line
KERNEL_MARGIN = 1.05  # a kernel within this of its prediction runs in the model as the tuner timed it


def peer_problem(e2e: dict, peer: str) -> str | None:
    """Why a peer library's timing of the model cannot stand as a latency to divide by (its readings
    spread too wide: a busy host, threads fighting), or None."""
    readings = [ms / 1e3 for ms in (e2e.get("latencies_ms") or {}).get(peer, []) if ms and ms > 0]
    return spread_problem(readings) if len(readings) >= 2 else None


def e2e_line(e2e: dict) -> str:
    latency = e2e["latency_ms"]
    parts = [f"end to end: tuned {latency['tuned']:.2f} ms", f"untuned {latency['untuned']:.1f} ms"]
    for peer, label in (("torch", "torch eager"), ("onnxruntime", "onnxruntime")):
        if peer not in latency:
            continue
        parts.append(f"{label} {latency[peer]:.2f} ms")
        problem = peer_problem(e2e, peer)
        parts.append(f"IMPLAUSIBLE, no ratio: {problem}" if problem else
                     f"speed-up vs {peer} {latency[peer] / latency['tuned']:.2f}x")
    if "onnxruntime" not in latency and str(e2e.get("onnxruntime", "")).startswith("not installed"):
        parts.append(f"onnxruntime {e2e['onnxruntime']}")
    parts.append(f"vs untuned {latency['untuned'] / latency['tuned']:.1f}x")
    verdict = "match" if e2e["match"] else "DO NOT match"
    parts.append(f"outputs {verdict} {e2e['reference']} (max abs diff {e2e['max_abs_diff']:.2e})")
    if "estimate_ms" in e2e:
        parts.append(f"the lab's estimate {e2e['estimate_ms']:.2f} ms (tuned / estimate "
                     f"{latency['tuned'] / e2e['estimate_ms']:.3f})")
    heaviest = heaviest_kernels(e2e)
    if heaviest:
        parts.append(f"its {heaviest['kernels']} heaviest kernels in the model / predicted: geomean "
                     f"{heaviest['geomean']:.3f} ({heaviest['low']:.2f}-{heaviest['high']:.2f}), "
                     f"{heaviest['within']} within {KERNEL_MARGIN:.2f}")
    if e2e.get("remote_device"):
        peer = "onnxruntime" if e2e.get("reference") == "onnxruntime" else "torch"
        parts.append(f"on {e2e['remote_device']} ({peer} checked here, not timed: it does not run there)")
    stale = "; one input, untouched between calls" if e2e.get("fresh_input") is False else ""
    return "  ".join(parts) + f"  [{e2e['num_threads']} threads{stale}]"


def e2e_metrics(e2e: dict) -> dict:
    latency = e2e["latency_ms"]
    metrics = {f"e2e/{name}_ms": value for name, value in latency.items()}
    metrics["e2e/speedup_vs_untuned"] = latency["untuned"] / latency["tuned"]
    for peer in ("torch", "onnxruntime"):
        if peer in latency and peer_problem(e2e, peer) is None:
            metrics[f"e2e/speedup_vs_{peer}"] = latency[peer] / latency["tuned"]
    if "estimate_ms" in e2e:
        metrics["e2e/estimate_ms"] = e2e["estimate_ms"]
        metrics["e2e/tuned_over_estimate"] = latency["tuned"] / e2e["estimate_ms"]
    heaviest = heaviest_kernels(e2e)
    if heaviest:
        metrics["e2e/heaviest_kernels_in_model_over_predicted"] = heaviest["geomean"]
        metrics["e2e/heaviest_kernels_within_margin"] = heaviest["within"]
    metrics["e2e/match"] = float(e2e["match"])
    metrics["e2e/max_abs_diff"] = e2e["max_abs_diff"]
    return metrics


def evaluate_end_to_end(settings: E2ESpec, model: ModelSpec, seed: int, hardware, tracker, out_dir: Path,
                        outcomes=None) -> dict:
    """Apply the exported database (out_dir/database), time (`settings`: e2e.*), write e2e.json, log
    e2e/*. `outcomes`: the run's tasks with their chosen best, whose latencies weighted by calls are the
    lab's estimate of the model (`estimate_ms`) and each kernel's prediction (`kernels`: beside its
    reading inside the model), kept with the reading of the model they describe."""
    timing = settings.timing()
    for name in E2E_FILES:
        inside(out_dir, name)
    e2e = hardware.evaluate_model(model.resolved(), seed, out_dir / "database", out_dir, timing)
    if outcomes:
        estimate_ms = weighted_latency_ms(outcomes)
        if math.isfinite(estimate_ms) and estimate_ms > 0:
            e2e["estimate_ms"] = estimate_ms
        e2e["kernels"] = kernel_rows(e2e.pop("kernels_in_model", {}), outcomes)
    path = write_inside(out_dir, "e2e.json", json.dumps(e2e, indent=1))
    tracker.log_metrics(e2e_metrics(e2e), step=0)
    tracker.set_tags({"e2e_match": str(e2e["match"])})
    tracker.log_artifact(str(path))
    return e2e


def kernel_rows(in_model: dict, outcomes) -> list[dict]:
    """Each tuned kernel read inside the model beside its prediction (the run's chosen best),
    heaviest in the model first."""
    rows = [{"task": o.task.name, "calls": in_model[o.task.name]["calls"], "predicted_us": o.best_cost * 1e6,
             "in_model_us": in_model[o.task.name]["seconds"] * 1e6}
            for o in outcomes if o.task.name in in_model and math.isfinite(o.best_cost) and o.best_cost > 0]
    return sorted(rows, key=lambda row: -row["calls"] * row["in_model_us"])


def heaviest_kernels(e2e: dict) -> dict:
    """The HEAVIEST kernels' in-model / predicted: geometric mean, range and how many are within
    KERNEL_MARGIN; {} without kernel readings."""
    ratios = [row["in_model_us"] / row["predicted_us"] for row in e2e.get("kernels", [])[:HEAVIEST]]
    if not ratios:
        return {}
    return {"kernels": len(ratios), "geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)),
            "low": min(ratios), "high": max(ratios), "within": sum(r <= KERNEL_MARGIN for r in ratios)}


def job_tasks(job: JobSpec, hardware) -> list:
    """The model's tasks; a whole model's come from the backend (import + extraction)."""
    model = job.model
    if not model.whole:
        return build_tasks(model.node)
    try:
        tasks = hardware.model_tasks(model.node, job.seed)
    except Exception as error:  # noqa: BLE001 - a file the frontend cannot read is bad input, not a crash
        if model.kind != "onnx":
            raise
        raise ConfigError(f"model.path: Relax's ONNX frontend cannot import {model.path}: "
                          f"{type(error).__name__}: {error}") from error
    return only_kernels(tasks, model.config.get("kernels"))


def only_kernels(tasks: list, kernels) -> list:
    """model.kernels: the tasks of these names, in the model's order (the others keep TVM's default
    schedules); every task when null. ConfigError naming the model's kernels where a name is not one."""
    if kernels is None:
        return tasks
    wanted, names = set(kernels), {t.name for t in tasks}
    unknown = [name for name in kernels if name not in names]
    if unknown:
        raise ConfigError(f"model.kernels: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a kernel of "
                          f"this model (its kernels: {', '.join(t.name for t in tasks)})")
    return [t for t in tasks if t.name in wanted]
