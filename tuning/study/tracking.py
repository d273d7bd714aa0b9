"""A study's blocks in MLflow: each block file as one run of the experiment `study-<name>`, so blocks
made on any host (pulled with git) are browsed side by side in the MLflow UI.

    run name  the block file's name (<task>-seed<seed>-<plan hash>-<host key>)
    params    study, plan_hash, task, seed, host_key, cpu_model, cores, isa, space_size, arm.<name>
              (the arm's overrides, or its peer kind)
    metrics   final_us.<arm>, selecting_us.<arm>, winners_curse.<arm>, to_target.<arm> (where not
              censored), panel_drift, wall_min, others_cpu_share, steal_share
    tags      tunelab.block_file (what makes logging idempotent), tunelab.flagged (panel past its bound)
    artifact  the block file itself, under block/

The block file is the record; MLflow is a view of it. A block is logged once: `log_blocks` skips the
files whose run is there, and a store it cannot reach costs a warning, never a block.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuning.cluster.host_identity import host_key
from tuning.config.cli import tunelab_command
from tuning.config.untrusted import without_secrets
from tuning.study.files import BlockFile, number, read_blocks
from tuning.study.spec import StudySpec

BLOCK_TAG = "tunelab.block_file"


def experiment_name(spec: StudySpec) -> str:
    return f"study-{spec.name}"


def log_blocks(spec: StudySpec, uri: str, say: Callable[[str], None] = print) -> int:
    """Log every block file of the study not yet in the MLflow store at `uri`; how many were logged."""
    from tuning.tracking.mlflow_tracker import MlflowTracker

    files, _ = read_blocks(spec.results, spec.name, spec.arm_names)
    tracker = MlflowTracker(uri, experiment_name(spec), system_metrics_s=0)
    logged = _logged(uri, experiment_name(spec))
    count = 0
    for block in files:
        if block.path.stem in logged:
            continue
        tracker.start(block.path.stem, _params(spec, block), {BLOCK_TAG: block.path.stem,
                                                              "tunelab.flagged": str(bool(
                                                                  block.data["panel"].get("flagged")))})
        tracker.log_metrics(_metrics(spec, block), step=0)
        tracker.log_artifact(str(block.path), "block")
        tracker.end()
        if tracker.offline:
            say(f"study {spec.name}: MLflow at {without_secrets(uri)} is not reachable ({tracker.offline}); the "
                f"block files stand: log them later with `{tunelab_command('study', 'log', spec.name)}`")
            break
        count += 1
    return count


def _logged(uri: str, experiment: str) -> set[str]:
    """The block files the experiment already has a run of."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return set()
    runs = client.search_runs([found.experiment_id], max_results=50_000)
    return {run.data.tags[BLOCK_TAG] for run in runs if BLOCK_TAG in run.data.tags}


def _params(spec: StudySpec, block: BlockFile) -> dict[str, Any]:
    data, peers = block.data, dict(spec.peers)
    host = data["host"]
    return {"study": spec.name, "plan_hash": data["plan_hash"], "task": data["task"], "seed": data["seed"],
            "host_key": host_key(host), "cpu_model": host.get("cpu_model"), "cores": host.get("cores"),
            "isa": data.get("isa", "not recorded"), "space_size": data.get("space_size", "not recorded"),
            **{f"arm.{name}": peers.get(name) or " ".join(overrides) for name, overrides in spec.arms}}


def _metrics(spec: StudySpec, block: BlockFile) -> dict[str, float]:
    data = block.data
    metrics: dict[str, float] = {}
    for arm in spec.arm_names:
        record = data["arms"].get(arm)
        if not isinstance(record, dict):
            continue
        for key, name, scale in (("final_s", "final_us", 1e6), ("selecting_s", "selecting_us", 1e6),
                                 ("winners_curse", "winners_curse", 1.0), ("to_target", "to_target", 1.0)):
            value = number(record.get(key))
            if value is not None:
                metrics[f"{name}.{arm}"] = value * scale
    machine: dict[str, Any] = data["machine"] if isinstance(data.get("machine"), dict) else {}
    for key in ("others_cpu_share", "steal_share"):
        value = number(machine.get(key))
        if value is not None:
            metrics[key] = value
    drift, wall = number(data["panel"].get("drift")), number(data.get("wall_s"))
    if drift is not None:
        metrics["panel_drift"] = drift
    if wall is not None:
        metrics["wall_min"] = wall / 60
    return metrics

