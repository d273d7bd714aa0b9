"""A peer tuner run whole in a block, in a process of its own: MetaSchedule's tune_tir on the block's
task with the study's budget, its database read back as the lab's configs (tuning/hardware/tvm_peers.py
`metaschedule_configs`), so that its finalists are re-read by the same timer as every other arm's."""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tuning.core.space import Config


def run_peer(kind: str, workload: dict, target: dict, work_dir: Path, trials: int, seed: int, spec: Any,
             threads: int, plan_size: int) -> tuple[list[tuple[Config, float | None]], int]:
    """(each record as (config, its mean seconds or None where it failed), records left unmapped)."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_metaschedule, workload, target, str(work_dir), trials, seed, spec, threads,
                           plan_size).result()


def _metaschedule(workload: dict, target: dict, work_dir: str, trials: int, seed: int, spec: Any, threads: int,
                  plan_size: int) -> tuple[list[tuple[Config, float | None]], int]:
    import json
    import math

    from tuning.hardware.tvm_peers import metaschedule_configs, tune_with_metaschedule

    folder = Path(work_dir)
    folder.mkdir(parents=True, exist_ok=True)
    tune_with_metaschedule(workload, target, folder, trials, seed, spec, threads, trials_per_round=plan_size)
    mapped = metaschedule_configs(workload, target, folder)
    records = folder / "database_tuning_record.json"
    total = sum(1 for line in records.read_text().splitlines() if line.strip() and json.loads(line))
    return [(tuple(c), s if math.isfinite(s) else None) for c, s in mapped], total - len(mapped)
