"""experiments/gemm_tiling_grid.py: one factor at a time from the GEMM-tiling paper's settings, a
campaign on a synthetic backend, the finalists' re-reads, and both claims tables."""
from __future__ import annotations

import sqlite3

import pytest
from omegaconf import OmegaConf

from test_store import SYNTHETIC_BACKEND
from tuning.core.records import RecordLog
from tuning.store import connect_store
from tuning.tools.dataset import best_configs

# what each sensitivity row may change from its default row, nothing else
CHANGES = {"gbfs_random_start": {"search.start"}, "gbfs_shared_start": {"budget.init_random"},
           "a2c_shared_start": {"budget.init_random"}, "a2c_epsilon_printed": {"search.epsilon"},
           "gbfs_rho2": {"search.rho", "search.default_plan_size"},
           "gbfs_rho10": {"search.rho", "search.default_plan_size"},
           "a2c_t1": {"search.walk_steps"}, "a2c_t6": {"search.walk_steps"}}


def flat(cfg) -> dict:
    """A job config as {dotted key: value}, Hydra's own node left out."""
    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("hydra", None)
    found = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            found[prefix[:-1]] = node

    walk(container, "")
    return found


def differences(a, b) -> set:
    a, b = flat(a), flat(b)
    return {key for key in a.keys() | b.keys() if a.get(key) != b.get(key)}


def test_each_factor_block_on_gemm_512_runs_the_gemm_1024_blocks_rows_beside_size512(experiment_script):
    grid = experiment_script("gemm_tiling_grid")
    for factor in ("start", "epsilon", "rho", "walk"):
        rows = [row for _, row in grid.BLOCKS[factor]]
        assert grid.BLOCKS[f"{factor}512"] == [("gemm_512", row) for row in rows]
        assert {model for model, _ in grid.BLOCKS[factor]} == {"gemm_1024"}
    assert {row for _, row in grid.BLOCKS["size512"]} == {grid.DEFAULT_OF[row] for row in CHANGES} | {"xgb", "random"}
    assert list(grid.BLOCKS)[:7] == ["paper", "start", "epsilon", "rho", "walk", "size512", "size2048"]


def test_the_paper_rows_on_another_size_change_the_size_and_the_budget_only(compose_cfg, experiment_script, tmp_path):
    grid = experiment_script("gemm_tiling_grid")
    args = grid.parse_args(["--store", str(tmp_path / "s.sqlite")])
    base = compose_cfg(*grid.run_overrides(args, "gemm_1024", "gbfs", 3))
    other = compose_cfg(*grid.run_overrides(args, "gemm_512", "gbfs", 3))
    assert {key for key in differences(base, other) if not key.startswith("model.")} == {"budget.trials"}
    assert base.search.start == "untiled" and base.budget.trials == 900 and other.budget.trials == 484
    assert base.model.space == other.model.space == "tiling"
    xgb = compose_cfg(*grid.run_overrides(args, "gemm_1024", "xgb", 3))
    assert xgb.budget.init_random == 16 and base.budget.init_random == 0  # XGB shares the shared-start rows' 16


def test_the_grid_goes_block_by_block_and_seed_by_seed(experiment_script, tmp_path):
    grid = experiment_script("gemm_tiling_grid")
    args = grid.parse_args(["--blocks", "rho", "paper", "--seeds", "2", "--campaign", str(tmp_path / "c"),
                            "--store", str(tmp_path / "s.sqlite")])
    names = [str(job.folder.relative_to(tmp_path / "c")) for job in grid.grid_jobs(args)]
    assert names[:4] == ["gemm_1024/gbfs_rho2/seed0", "gemm_1024/gbfs_rho10/seed0", "gemm_1024/gbfs_rho2/seed1",
                         "gemm_1024/gbfs_rho10/seed1"]
    assert names[4:8] == [f"gemm_1024/{row}/seed0" for row in ("gbfs", "a2c", "xgb", "random")] and len(names) == 12


def test_bad_grid_options_are_named(experiment_script, capsys):
    grid = experiment_script("gemm_tiling_grid")
    for argv, named in ((["--blocks", "nope"], "--blocks"), (["--rereads", "0"], "--rereads"),
                        (["--hours", "0"], "--hours")):
        with pytest.raises(SystemExit):
            grid.parse_args(argv)
        assert named in capsys.readouterr().err


def test_a_synthetic_grid_runs_rereads_its_finalists_and_prints_both_tables(tmp_path, experiment_script, monkeypatch):
    """The paper block at 1 seed on a synthetic backend: 4 runs, each finished run's best config read
    5 times in the store, both tables written; a second call measures nothing and starts no run, and
    packs the archive, whose file prints the same tables on a machine without the store or the runs."""
    from mlflow.tracking import MlflowClient

    grid = experiment_script("gemm_tiling_grid")
    store, uri = tmp_path / "grid.sqlite", f"sqlite:///{tmp_path}/mlflow.db"
    command = ["--blocks", "paper", "--seeds", "1", "--store", str(store), "--campaign", str(tmp_path / "c"),
               "--tracking-uri", uri, "--out", str(tmp_path / "out"), *SYNTHETIC_BACKEND, "budget.trials=16",
               "budget.plan_size=8"]
    assert grid.main([*command, "--table-only"]) == ([], [])  # nothing finished: no table, no error
    paper, sensitivity = grid.main(command)
    assert {(r["method"], r["baseline"]) for r in paper} >= {("G-BFS", "XGB"), ("N-A2C", "XGB"), ("G-BFS", "random")}
    assert not sensitivity  # no variant ran
    text = (tmp_path / "out" / "grid.md").read_text()
    assert "seed 0\n" in text and "one Holm family" in text and "4 of the grid's 4 runs finished" in text
    readings = connect_store(str(store))
    for folder in (tmp_path / "c" / "gemm_1024").glob("*/seed*"):
        [[best]] = best_configs(RecordLog(folder / "records.jsonl").load(), 1).values()
        [key] = [k for k in readings.keys() if readings.task_info(k[1])["name"] == "gemm_1024"]
        assert sum(row.ok for row in readings.rows(*key, best)) >= 5, folder
    client = MlflowClient(uri)
    [experiment] = [e for e in client.search_experiments() if e.name == grid.EXPERIMENT]
    runs = len(client.search_runs([experiment.experiment_id]))
    rows = sqlite3.connect(store).execute("SELECT count(*) FROM readings").fetchone()[0]
    grid.main([*command, "--archive", str(tmp_path / "campaigns" / "gemm-tiling")])
    assert len(client.search_runs([experiment.experiment_id])) == runs
    assert sqlite3.connect(store).execute("SELECT count(*) FROM readings").fetchone()[0] == rows

    [packed] = (tmp_path / "campaigns" / "gemm-tiling").glob("*.tar.xz")
    with pytest.raises(SystemExit, match="read for its tables only"):
        grid.main([*command, "--archive", str(packed)])
    store.rename(tmp_path / "elsewhere.sqlite")
    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "outputs"))
    viewed, _ = grid.main(["--blocks", "paper", "--seeds", "1", "--store", str(store), "--out", str(tmp_path / "v"),
                           "--table-only", "--archive", str(packed)])

    def table(found):
        return [(r["claim"], r["task"], str(r["speed_ratio"]), str(r["speed_low"]), r["verdict"]) for r in found]

    assert table(viewed) == table(paper) and not store.exists()
    assert len(client.search_runs([experiment.experiment_id])) == runs


def sensitivity_result(tasks: dict):
    """Hand-made curves: on each task, XGB and G-BFS end on the best config, and "G-BFS shared start"
    ends on a kernel `tasks[task]` x slower at every seed (10 seeds)."""
    import numpy as np

    from tuning.tools.compare import Curve, TaskTruth, compare

    curves = []
    for task, slower in tasks.items():
        for seed in range(10):
            for method, final in (("XGB", 1.0), ("G-BFS", 1.0), ("G-BFS shared start", slower * (1 + 0.01 * seed))):
                values = np.full(50, 2e-3)
                values[10:] = 1e-3 * final
                curves.append(Curve(task, method, seed, f"{task}{method}{seed}", values, np.arange(1, 51) * 0.5,
                                    "store"))
    truths = {task: TaskTruth({}, 1e-3, "store x") for task in tasks}
    return compare(curves, truths, "XGB", budgets=(50,), fraction=0.95)


def test_the_sensitivity_table_is_one_holm_family_per_size(experiment_script, tmp_path, monkeypatch):
    """A size's factor rows are adjusted among themselves: adding gemm_512's rows beside gemm_1024's
    leaves gemm_1024's adjusted p-values as they were alone."""
    grid = experiment_script("gemm_tiling_grid")
    args = grid.parse_args(["--store", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "out")])
    (tmp_path / "out").mkdir()

    def sensitivity_of(tasks):
        monkeypatch.setattr(grid, "compare_main", lambda *a, **k: sensitivity_result(tasks))
        return grid.tables(args, {})[1]

    alone = sensitivity_of({"gemm_1024": 1.3})
    both = sensitivity_of({"gemm_1024": 1.3, "gemm_512": 1.2})
    text = (tmp_path / "out" / "grid.md").read_text()
    assert "## Sensitivity on gemm_1024 (one Holm family)" in text and "## Sensitivity on gemm_512 (one" in text
    on_1024 = [(r["claim"], r["speed_p_holm"], r["verdict"]) for r in both if r["task"] == "gemm_1024"]
    assert on_1024 == [(r["claim"], r["speed_p_holm"], r["verdict"]) for r in alone] and len(on_1024) == 2
    assert any(r["verdict"] != "undecided at this power" for r in alone)  # the factor decides at 10 seeds
