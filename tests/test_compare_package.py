"""tuning/tools/compare/ as a package: one run lookup for every reader of runs, the names the package
exports, the command behind `python -m tuning.tools.compare`, and experiments/ scripts that import the
installed package and take their hardware from conf/."""
from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted((REPO / "experiments").glob("*.py"))
RUN_READERS = [*sorted((REPO / "tuning" / "tools" / "compare").glob("*.py")), *EXPERIMENTS]


def calls_of(path: Path, attribute: str) -> list[int]:
    """Lines where `path` calls `<anything>.<attribute>(...)`."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attribute]


# ---- one run lookup -------------------------------------------------------------------------------
def test_only_load_searches_mlflow_for_runs():
    searching = {path.relative_to(REPO).as_posix(): calls_of(path, "search_runs") for path in RUN_READERS}
    assert {path for path, lines in searching.items() if lines} == {"tuning/tools/compare/load.py"}
    assert len(searching["tuning/tools/compare/load.py"]) == 1


class RecordingClient:
    """An MLflow client that records the searches it is asked for and finds one run."""

    def __init__(self):
        self.queries = []

    def get_experiment_by_name(self, name):
        return SimpleNamespace(experiment_id="7") if name != "missing" else None

    def search_runs(self, experiment_ids, query, max_results, order_by):
        self.queries.append((experiment_ids, query, order_by))
        return [SimpleNamespace(info=SimpleNamespace(run_id="r1"), data=SimpleNamespace(tags={"experiment": "abl_x"}))]


def test_compare_and_the_presets_find_runs_the_same_way():
    from tuning.tools.compare.ablation import latest_sweep
    from tuning.tools.compare.load import job_runs

    client = RecordingClient()
    job_runs(client, "tunelab", ["p1", "p2"], [("experiment", "x")], "gemm_64")
    assert latest_sweep(client, "tunelab", "abl", None, None)[0] == "abl_x"
    assert len(client.queries) == 3  # one search per multirun parent, then one
    for ids, query, order_by in client.queries:
        assert ids == ["7"] and query.startswith("attributes.status = 'FINISHED' and ")
        assert order_by == ["attributes.start_time DESC"]
    assert [q.count("parentRunId") for _, q, _ in client.queries] == [1, 1, 0]
    assert "tags.experiment LIKE 'abl%'" in client.queries[2][1]


def test_a_missing_experiment_stops_compare():
    from tuning.tools.compare.load import find_runs

    with pytest.raises(SystemExit, match="no MLflow experiment 'missing'"):
        find_runs(RecordingClient(), "missing")


# ---- the package's names and command ---------------------------------------------------------------
def test_every_exported_name_resolves_to_its_module():
    import tuning.tools.compare as package

    for name in package.__all__:
        value = getattr(package, name)
        assert getattr(value, "__module__", "tuning.tools.compare").startswith("tuning.tools.compare"), name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        package.nothing  # noqa: B018


def test_python_m_tuning_compare_is_the_command(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["python -m tuning.tools.compare", "--help"])
    with pytest.raises(SystemExit) as stopped:
        runpy.run_module("tuning.tools.compare", run_name="__main__")
    assert stopped.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m tuning.tools.compare")


# ---- experiments on the installed package ----------------------------------------------------------
def names_in(path: Path) -> set[str]:
    """Every name, attribute and imported module a script mentions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            found.add(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            found |= {node.module or ""} | {alias.name for alias in node.names}
    return found


@pytest.mark.parametrize("script", EXPERIMENTS, ids=lambda path: path.name)
def test_a_script_neither_edits_sys_path_nor_names_a_hardware_class(script):
    names = names_in(script)
    assert "sys.path" not in names, f"{script.name} edits sys.path: the project is installed"
    assert not {"CPUHardware", "tuning.hardware.cpu"} & names, f"{script.name}: its hardware comes from conf/"


def test_finalists_are_remeasured_on_the_hardware_named(experiment_script, monkeypatch):
    """remeasure_finalists on hardware=synthetic: the same loop as on cpu, no TVM."""
    from hydra.utils import instantiate

    from tuning.core.task import build_tasks
    from tuning.evaluator.fixed import FixedEvaluator
    from tuning.tools.dataset import compose

    monkeypatch.chdir(REPO)
    script = experiment_script("remeasure_finalists")
    cfg = compose(["hardware=synthetic", "model=gemm_64"])
    [task] = build_tasks(cfg.model)
    space = instantiate(cfg.hardware).space(task)
    configs = list(dict.fromkeys(space.canonical(space.sample(np.random.default_rng(0))) for _ in range(4)))
    runs = [{"model": "gemm_64", "configs": configs, "readings": {c: 1.0 for c in configs}}]
    script.remeasure(runs, 2, FixedEvaluator(number=1, repeat=2, min_repeat_ms=0), ["hardware=synthetic"])
    assert 0 < runs[0]["latency_s"] < 1.0 and runs[0]["reading_s"] == 1.0
