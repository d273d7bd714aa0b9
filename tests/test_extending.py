"""Adding a method is one module and one YAML, with no other edit (docs/architecture.md §Adding a method).

A toy search lives in a temporary directory of its own: its module on PYTHONPATH, its YAML in a config
directory declared in TUNELAB_CONF_DIRS (Hydra's search path gains it: hydra_plugins/tunelab_searchpath).
The search contract suite and the config suite pick it up, and run.py's job tunes with it (here through
tunelab.tune, in this process), with the directory also named in `hydra.searchpath`, which keeps working;
tests/test_out_of_tree.py kills, resumes, applies and syncs a run.py run, and refuses it where the directory
is not declared."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TOY_MODULE = '''
from tuning.search.base import Search, fill_with_random


class ToySearch(Search):
    """Random unvisited configs, best first by nothing."""

    ranges = {"default_plan_size": (1, None)}

    def __init__(self, default_plan_size: int = 16):
        self.default_plan_size = default_plan_size

    def propose(self, space, cost_model, n, visited, rng):
        return fill_with_random([], space, visited, n, rng)
'''
TOY_YAML = "_target_: toy_search.ToySearch\ndefault_plan_size: 16\n"


def toy_env(tmp_path: Path) -> dict:
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "toy_search.py").write_text(TOY_MODULE)
    (tmp_path / "conf" / "search").mkdir(parents=True)
    (tmp_path / "conf" / "search" / "toy.yaml").write_text(TOY_YAML)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "plugin"), str(REPO)]),
            "TUNELAB_CONF_DIRS": str(tmp_path / "conf"), "TUNELAB_OUTPUTS": str(tmp_path / "outputs")}


def test_a_toy_search_runs_through_the_contract_suites(tmp_path):
    env = toy_env(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-k", "toy",
                           "tests/test_contract_search.py", "tests/test_config.py"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = [line for line in proc.stdout.splitlines() if line.startswith("PASSED") and "toy" in line]
    contract = [line for line in passed if "test_contract_search" in line]
    assert len(contract) >= 6, proc.stdout[-4000:]  # every search contract test has a toy case
    assert any("test_every_component_instantiates_without_work" in line for line in passed)


def test_a_toy_search_tunes_a_job(tmp_path, monkeypatch):
    import tunelab

    env = toy_env(tmp_path)
    for name in ("TUNELAB_CONF_DIRS", "TUNELAB_OUTPUTS"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.syspath_prepend(str(tmp_path / "plugin"))
    run_dir = tmp_path / "run"
    tunelab.tune([f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "search=toy", "cost_model=none",
                  "hardware=synthetic", "tracking=none", "model=gemm_64", "budget.trials=40", f"output_dir={run_dir}"])
    records = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    assert len(records) == 40 and {r["method"] for r in records} == {"toy+greedy"}
    assert {r["round"] for r in records} == {0, 1, 2}  # default_plan_size 16: rounds of 16, 16, 8
