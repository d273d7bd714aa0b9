"""experiments/e2e_processes.py's summaries of repeated end-to-end checks (the processes themselves
need a tuned whole model: tests/test_e2e.py runs apply)."""
import importlib.util
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "e2e_processes.py"
spec = importlib.util.spec_from_file_location("e2e_processes", SCRIPT)
e2e_processes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(e2e_processes)


def e2e(tuned, kernels, estimate=10.0, torch=12.0):
    return {"latency_ms": {"tuned": tuned, "torch": torch, "untuned": 50.0}, "match": True, "estimate_ms": estimate,
            "kernels": [{"task": t, "calls": c, "predicted_us": p, "in_model_us": m} for t, c, p, m in kernels]}


def test_a_kernel_at_its_prediction_passes_and_one_above_the_margin_does_not():
    processes = [e2e(10.0, [("a", 1, 100.0, 100.0 * f), ("b", 2, 50.0, 60.0 * f)]) for f in (0.98, 1.0, 1.01, 0.99, 1.02)]
    tasks = e2e_processes.heaviest_tasks(processes, 10)
    assert tasks == ["b", "a"]  # 2 x 60 > 1 x 100
    rows = {row["task"]: row for row in e2e_processes.kernel_rows(processes, tasks, 1.05)}
    assert rows["a"]["ratio"] == pytest.approx(math.exp(sum(math.log(f) for f in (0.98, 1.0, 1.01, 0.99, 1.02)) / 5))
    assert rows["a"]["within"] == 5 and rows["a"]["p_below_holm"] < 0.05
    assert rows["b"]["ratio"] == pytest.approx(1.2, rel=0.02) and rows["b"]["within"] == 0
    assert rows["b"]["p_below_holm"] > 0.5
    summary = e2e_processes.run_summary(processes, list(rows.values()), 1.05)
    assert "geomean at or below 1.05 for 1 of 2" in summary and "in 0 of 5 processes" in summary


def test_the_count_of_processes_with_every_kernel_within_reads_each_process():
    processes = [e2e(10.0, [("a", 1, 100.0, m)]) for m in (100.0, 104.0, 106.0, 101.0)]
    rows = e2e_processes.kernel_rows(processes, ["a"], 1.05)
    assert "in 3 of 4 processes" in e2e_processes.run_summary(processes, rows, 1.05)


def test_runs_are_compared_process_by_process():
    runs = [Path("a"), Path("b")]
    readings = {"a": [e2e(t, []) for t in (10.0, 11.0, 10.5, 10.2)], "b": [e2e(t, []) for t in (9.0, 9.9, 9.45, 9.18)]}
    [line] = e2e_processes.pair_lines(runs, readings)
    assert line.startswith("b over a, end to end: 0.900x [0.900, 0.900] over 4 processes")


def test_bad_arguments_are_refused_naming_them(tmp_path, capsys):
    with pytest.raises(SystemExit):
        e2e_processes.parse_args([str(tmp_path)])
    assert "is not a finished whole-model run folder" in capsys.readouterr().err
    (tmp_path / "best_configs.json").write_text("[]")
    (tmp_path / "config.yaml").write_text("{}")
    with pytest.raises(SystemExit):
        e2e_processes.parse_args([str(tmp_path), "--processes", "1"])
    assert "--processes" in capsys.readouterr().err
