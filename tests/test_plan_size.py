"""budget.plan_size: null runs each method at its own default (its YAML's default_plan_size, cited
there), a number overrides it, and the old search.plan_size key is rejected naming the new one."""
from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers import run_py_completed, tune_run
from value_models import shared_value_model

REPO = Path(__file__).resolve().parents[1]
DEFAULTS = {"sa": 64, "ppo": 64, "random": 64, "csa": 32, "gbfs": 5, "a2c": 6, "evolutionary": 64, "value": 64}
QUICK = {"ppo": ("search.episodes=4", "search.max_steps=20"), "csa": ("cost_model=rf", "search.n_iter=20"),
         "sa": ("search.n_iter=20",), "random": ("cost_model=none",), "gbfs": (), "a2c": (),
         "evolutionary": ("search.population_size=32",)}
FIRST_ROUND = {"gbfs": 1}  # G-BFS measures its start state alone first (Algorithm 1, line 2)


def quick(search: str) -> tuple:
    """A short run of `search`; search=value gets a small registered value function."""
    if search == "value":
        model, registry = shared_value_model()
        return ("search.greedy=false", "search.beam=2", f"search.model={model}", f"search.registry={registry}")
    return QUICK[search]


SHORT = ("hardware=synthetic", "tracking=none", "model=gemm_64")


def run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """A short run.py run into tmp_path/run, in a fresh process."""
    return run_py_completed(*SHORT, f"hydra.run.dir={tmp_path / 'run'}", *overrides, tmp=tmp_path)


def tune(tmp_path: Path, monkeypatch, *overrides: str) -> Path:
    """The same short run in this process (tunelab.tune): its folder."""
    return tune_run(tmp_path, monkeypatch, *SHORT, *overrides)


def round_sizes(run_dir: Path) -> list[int]:
    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    sizes = Counter(r["round"] for r in records)
    return [sizes[i] for i in sorted(sizes)]


def test_every_search_yaml_has_a_tested_default():
    assert {p.stem: OmegaConf.load(p).default_plan_size for p in (REPO / "conf" / "search").glob("*.yaml")} == DEFAULTS


@pytest.mark.parametrize("search", DEFAULTS)
def test_null_plan_size_is_the_methods_default(tmp_path, monkeypatch, search):
    default = DEFAULTS[search]
    folder = tune(tmp_path, monkeypatch, f"search={search}", *quick(search), f"budget.trials={default + 4}")
    first = FIRST_ROUND.get(search)
    assert round_sizes(folder) == ([first, default, 4 - first] if first else [default, 4])
    saved = OmegaConf.load(folder / "config.yaml")
    assert saved.budget.plan_size == default  # the number used, not null, is what the run records


def test_budget_plan_size_overrides_the_default(tmp_path, monkeypatch):
    folder = tune(tmp_path, monkeypatch, "search=sa", *QUICK["sa"], "budget.plan_size=10", "budget.trials=25")
    assert round_sizes(folder) == [10, 10, 5]


@pytest.mark.parametrize("override", ["search.plan_size=32", "+search.plan_size=32"])
def test_old_key_on_the_command_line_names_the_new_one(tmp_path, override):
    proc = run(tmp_path, override, "budget.trials=8")
    assert proc.returncode == 2
    assert "search.plan_size" in proc.stderr and "budget.plan_size" in proc.stderr
    assert not (tmp_path / "run" / "records.jsonl").exists()


def test_old_key_in_a_saved_config_names_the_new_one(tmp_path):
    assert run(tmp_path, "budget.trials=8").returncode == 0
    saved = tmp_path / "run" / "config.yaml"
    cfg = OmegaConf.load(saved)
    cfg.search.plan_size = 32  # a run folder written before plan_size moved
    saved.write_text(OmegaConf.to_yaml(cfg))
    proc = run(tmp_path, f"resume={tmp_path / 'run'}", "budget.trials=16")
    assert proc.returncode == 2
    assert "search.plan_size" in proc.stderr and "budget.plan_size" in proc.stderr
    assert len(round_sizes(tmp_path / "run")) == 1  # nothing measured after the rejection
