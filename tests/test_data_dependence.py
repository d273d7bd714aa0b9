"""experiments/data_dependence.py without TVM: its options, which configs it times, its summary."""
from __future__ import annotations

import pytest

from tuning.core.records import MeasureResult, Record


@pytest.fixture
def script(experiment_script):
    return experiment_script("data_dependence")


def record(config, key="k", error=None):
    return Record("t", key, list(config), {}, MeasureResult(costs=[] if error else [1e-3], error=error), 0, "m", 0, 0,
                  0.0)


def test_it_times_each_measured_config_once_in_the_runs_order(script):
    records = [record((2,)), record((1,)), record((2,)), record((3,), error="build"), record((4,), key="other"),
               record((5,))]
    assert script.measured_configs(records, "k", 10) == [(2,), (1,), (5,)]
    assert script.measured_configs(records, "k", 2) == [(2,), (1,)]


def test_the_summary_names_the_config_zeros_would_pick_and_what_it_costs(script):
    rows = [((1,), 3.0e-3, 347e-3), ((2,), 3.2e-3, 3.3e-3), ((3,), 4.0e-3, 4.4e-3)]
    summary = script.task_summary("conv", rows)
    assert summary["over_10x"] == 1 and summary["over_2x"] == 1 and summary["largest"] == pytest.approx(347 / 3)
    assert summary["median"] == pytest.approx(1.1)
    assert summary["fastest_on_zeros"]["config"] == [1] and summary["fastest_on_zeros"]["uniform_ms"] == pytest.approx(347)
    assert summary["fastest_on_uniform"]["config"] == [2]


def test_bad_options_are_refused_before_any_work(script, tmp_path, capsys):
    for argv, said in (([str(tmp_path)], "not a run folder"), ([str(tmp_path), "--configs", "0"], "--configs")):
        with pytest.raises(SystemExit):
            script.parse_args(argv)
        assert said in capsys.readouterr().err
