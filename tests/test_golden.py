"""Behaviour pinned: the same seed on synthetic hardware gives the same records as the code did
before the component architecture was introduced. tests/golden/<name>.jsonl were written by the commands below
(run.py's overrides, run here in this process by tunelab.tune) on the code before that change; every field
but the wall-clock `time` must match exactly.

A deliberate change of a method's behaviour regenerates the file it affects (run the command into a
folder, drop `time`, sort keys) and says why in its commit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_loop import tune_job

GOLDEN = Path(__file__).parent / "golden"
COMMON = ("hardware=synthetic", "tracking=none")
RUNS = {
    "sa_greedy_xgb": ("model=gemm_64", "budget.trials=160", "seed=3"),
    "ppo_kmeans_xgb": ("model=conv_tiny", "search=ppo", "sampler=kmeans", "budget.trials=128", "search.episodes=16",
                       "search.max_steps=40"),
    "csa_rf_adaptive": ("model=gemm_64", "search=csa", "cost_model=rf", "evaluator=adaptive", "hardware.noise=0.15",
                        "budget.trials=96", "seed=1"),
    "random_none": ("model=conv_tiny", "search=random", "cost_model=none", "budget.trials=80", "seed=2"),
    "sa_kmeans_code": ("model=gemm_64", "sampler=kmeans_code", "budget.trials=96", "budget.early_stop=40"),
}


def stripped(path: Path) -> list[dict]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        record.pop("time", None)
    return records


@pytest.mark.parametrize("name", RUNS)
def test_same_seed_same_records_as_before(tmp_path, monkeypatch, name):
    tune_job(tmp_path, monkeypatch, *COMMON, *RUNS[name], f"output_dir={tmp_path / name}")
    expected = [json.loads(line) for line in (GOLDEN / f"{name}.jsonl").read_text().splitlines()]
    got = stripped(tmp_path / name / "records.jsonl")
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"record {i} differs"
