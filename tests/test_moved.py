"""What was written before the package was given rooms by role still works after it:
- a run folder written by the flat layout (tests/data/run_before_move, made by commit 9483630 with
  `run.py hardware=synthetic model=gemm_64 tracking=none search=sa cost_model=xgb budget.plan_size=8
  budget.trials=16 seed=3`) resumes to a larger budget;
- the old module names import their new homes (tuning/core/moved.py), `python -m` included, and a
  saved Hydra callback's `tuning.sweep.SweepParent` is still the class.
"""
from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tuning.core.moved import MOVED, new_name

REPO = Path(__file__).resolve().parents[1]
BEFORE = REPO / "tests" / "data" / "run_before_move"


def lab(*args: str, cwd: Path, env_extra: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "TUNELAB_OUTPUTS": str(cwd / "outputs"), **(env_extra or {})}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_run_folder_from_before_the_move_resumes_to_its_new_budget(tmp_path):
    run = Path(shutil.copytree(BEFORE, tmp_path / "run"))
    assert len((run / "records.jsonl").read_text().splitlines()) == 16
    done = lab(str(REPO / "run.py"), f"resume={run}", "budget.trials=24", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    assert len(records) == 24
    assert len({json.dumps(r["config"]) for r in records}) == 24  # nothing measured twice
    assert (run / "status").read_text().strip() == "FINISHED"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_name_imports_its_new_home(old):
    if old.endswith(".__main__"):
        pytest.skip("a __main__ is run, not imported (the `python -m` test below)")
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert any(issubclass(w.category, DeprecationWarning) and MOVED[old] in str(w.message) for w in caught)


def test_old_dotted_names_and_saved_callbacks_resolve():
    assert new_name("tuning.run_folder.load_config") == "tuning.engine.run_folder.load_config"
    assert new_name("tuning.search.sa.SimulatedAnnealing") == "tuning.search.sa.SimulatedAnnealing"
    from hydra.utils import get_class

    from tuning.sweep.multirun import SweepParent

    assert get_class("tuning.sweep.SweepParent") is SweepParent


def test_python_dash_m_under_an_old_name_runs_the_new_module(tmp_path):
    done = lab("-m", "tuning.value", "--help", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "train" in done.stdout and "improve" in done.stdout
