"""A run reports the config its end chose by re-measuring its finalists, not its fastest single
reading; it saves that choice (best_configs.json), and the tools that read a run back (apply,
export, the in-model probe through `best_in_run`) use it. Synthetic hardware: no TVM build."""
from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tuning.config import ConfigError
from tuning.core.records import MeasureResult, Record, RecordLog
from tuning.engine.run_folder import load_config
from tuning.tools.export import best_in_run
from tuning.tools.sync import CHOSEN_FILE, final_metrics, load_chosen

CONF = Path(__file__).resolve().parents[1] / "conf"


def finished_run(tmp_path):
    from hydra import compose, initialize_config_dir

    from tuning.config import register
    from tuning.engine.run import main

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"output_dir={tmp_path / 'run'}", "tracking=none", "hardware=synthetic",
                                           "hardware.noise=0.3", "model=gemm_64", "budget.trials=48",
                                           "budget.plan_size=16"])
    with contextlib.redirect_stdout(io.StringIO()):
        main(cfg)
    return tmp_path / "run"


def test_a_finished_run_saves_the_choice_it_reports_and_best_in_run_returns_it(tmp_path):
    run = finished_run(tmp_path)
    [row] = json.loads((run / CHOSEN_FILE).read_text())
    _, final = final_metrics(run)
    chosen = load_chosen(run)[row["task"]]
    assert chosen[1] * 1e6 == pytest.approx(final["best/final_latency_us"])  # the headline's kernel
    cfg = load_config(run / "config.yaml", "run")
    with instantiate(cfg.hardware) as hardware:
        outcome = best_in_run(cfg, hardware, run)
    assert (outcome.best_config, outcome.best_cost) == chosen
    fastest = min(r.result.cost for r in RecordLog(run / "records.jsonl").load() if r.result.ok)
    assert outcome.tuning_best_cost == fastest <= outcome.best_cost  # noise 0.3: the re-measured best reads slower


def plain_run(compose_cfg, tmp_path, readings: dict):
    """A run folder with config.yaml and one record per config (config -> its readings)."""
    from tuning.core.task import build_tasks

    composed = compose_cfg("tracking=none", "hardware=synthetic", "model=gemm_64")
    OmegaConf.set_struct(composed, False)
    composed.pop("hydra")
    cfg = OmegaConf.to_container(composed, resolve=True)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    [task] = build_tasks(cfg["model"])
    log = RecordLog(run / "records.jsonl")
    for i, (config, costs) in enumerate(readings.items()):
        log.append(Record(task.name, task.key, list(config), {}, MeasureResult(costs=costs), 0, "test", 0, i, 1000.0))
    return run, task


def best_of(run):
    cfg = load_config(run / "config.yaml", "run")
    with instantiate(cfg.hardware) as hardware:
        return best_in_run(cfg, hardware, run)


def test_the_saved_choice_wins_over_a_faster_single_reading(compose_cfg, tmp_path):
    lucky, steady = (0, 0, 0, 1), (0, 0, 1, 0)
    run, task = plain_run(compose_cfg, tmp_path, {lucky: [1e-3], steady: [1.2e-3]})
    assert best_of(run).best_config == lucky  # without the file: the records' fastest
    (run / CHOSEN_FILE).write_text(json.dumps([{"task": task.name, "config": list(steady),
                                                "costs": [1.1e-3, 1.3e-3, 1.15e-3]}]))
    outcome = best_of(run)
    assert outcome.best_config == steady and outcome.best_cost == 1.15e-3 and outcome.tuning_best_cost == 1e-3


@pytest.mark.parametrize("row, says", [
    ({"config": [9, 9, 9, 9], "costs": [1e-3]}, "has no valid record in the run"),  # a config never measured
    ({"config": [0, 0, 0, 1.0], "costs": [1e-3]}, "not a list of integers"),
    ({"config": [0, 0, 0, True], "costs": [1e-3]}, "not a list of integers"),
    ({"config": [0, 0, 0, 1], "costs": []}, "not positive finite seconds"),
    ({"config": [0, 0, 0, 1], "costs": [math.nan]}, "not positive finite seconds"),
    ({"config": [0, 0, 0, 1]}, "KeyError"),
])
def test_a_choice_that_is_not_one_of_the_runs_measurements_is_refused_naming_the_file(compose_cfg, tmp_path, row,
                                                                                      says):
    run, task = plain_run(compose_cfg, tmp_path, {(0, 0, 0, 1): [1e-3]})
    (run / CHOSEN_FILE).write_text(json.dumps([{"task": task.name, **row}]))
    with pytest.raises(ConfigError, match=f"{CHOSEN_FILE}.*{says}"):
        best_of(run)


def test_the_end_to_end_line_sets_the_heaviest_kernels_beside_their_predictions():
    """Each kernel's reading inside the model beside what the run predicted for it (its chosen best),
    heaviest in the model (calls x seconds) first; the line summarises the ten heaviest."""
    from types import SimpleNamespace

    from tuning.core.outcome import TaskOutcome
    from tuning.engine.whole_model import HEAVIEST, e2e_line, e2e_metrics, heaviest_kernels, kernel_rows

    outcomes = [TaskOutcome(SimpleNamespace(name=f"k{i}", weight=1 + (i == 0)), [], best_cost=(i + 1) * 1e-4)
                for i in range(12)]
    outcomes.append(TaskOutcome(SimpleNamespace(name="untuned", weight=1), []))  # no prediction: no row
    in_model = {f"k{i}": {"seconds": (i + 1) * 1e-4 * (1.10 if i in (3, 11) else 1.0), "calls": 1 + (i == 0)}
                for i in range(12)}
    in_model["untuned"] = {"seconds": 5e-3, "calls": 1}
    rows = kernel_rows(in_model, outcomes)
    assert [row["task"] for row in rows][:10] == [f"k{i}" for i in range(11, 1, -1)] and len(rows) == 12
    e2e = {"latency_ms": {"tuned": 8.0, "untuned": 80.0}, "match": True, "reference": "untuned", "max_abs_diff": 0.0,
           "num_threads": 2, "estimate_ms": 7.8, "kernels": rows}
    heaviest = heaviest_kernels(e2e)  # k11 (1.10) among the ten heaviest, k3 (1.10) too; k0-k1 are not
    assert heaviest["kernels"] == HEAVIEST and heaviest["within"] == 8 and heaviest["high"] == pytest.approx(1.10)
    assert "its 10 heaviest kernels in the model / predicted: geomean 1.019 (1.00-1.10), 8 within 1.05" in e2e_line(e2e)
    assert e2e_metrics(e2e)["e2e/heaviest_kernels_within_margin"] == 8
    assert "tuned / estimate 1.026" in e2e_line(e2e)
