"""The in-context evaluator's choice (tuning/engine/model_choice.py): the heaviest tasks' finalists, read
inside the model by the hardware, re-chosen by their median there and reported at those readings.
A stand-in hardware returns the readings: no TVM build (tests/test_e2e.py runs the real one)."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from omegaconf import OmegaConf

from tuning.config import ConfigError
from tuning.core.outcome import TaskOutcome
from tuning.core.records import MeasureResult, Record
from tuning.core.task import Task, gemm_task
from tuning.engine.loop import RunInfo, remeasure_deferred, tune_tasks
from tuning.engine.model_choice import REPORT_FILE, choose_in_model, finalists, heaviest_outcomes, take_in_model
from tuning.engine.spec import E2ESpec, ModelSpec
from tuning.engine.validate import validate
from tuning.scheduler.gradient import Gradient
from tuning.tools.sync import CHOSEN_FILE, load_chosen, save_chosen


def record(task: Task, config, seconds: float, error: str | None = None) -> Record:
    result = MeasureResult(costs=[] if error else [seconds], error=error)
    return Record(task.name, task.key, list(config), {}, result, 0, "test", 0, 0, 0.0)


def outcome(name: str, weight: int, readings: dict, chosen=None) -> TaskOutcome:
    """A task's outcome with one record per config (config -> seconds; None: a failed build)."""
    task = Task(name, {"op": "gemm", "M": len(name), "N": weight, "K": 1}, flops=1.0, weight=weight)
    records = [record(task, c, s if s is not None else 0.0, None if s is not None else "build") for c, s in readings.items()]
    best = chosen or min((c for c, s in readings.items() if s is not None), key=readings.get)
    return TaskOutcome(task, records, best_config=tuple(best), best_cost=readings[best], final_costs=[readings[best]])


class Tracker:
    def __init__(self):
        self.metrics, self.artifacts = {}, []

    def log_metrics(self, metrics, step):
        self.metrics.update(metrics)

    def log_artifact(self, path, *_):
        self.artifacts.append(path)


class InModelHardware:
    """time_in_model answering each candidate with seconds from `seconds` ({config: per-process list})."""

    def __init__(self, seconds: dict, missing=()):
        self.seconds, self.missing, self.asked = seconds, set(missing), []

    def time_in_model(self, model_cfg, seed, database_dir, candidates, timing):
        self.asked.append((candidates, timing))
        return [{name: [[self.seconds[tuple(c)][p]] * timing["rounds"] for c in configs]
                 for name, configs in candidates.items() if name not in self.missing}
                for p in range(timing["processes"])]


def settings(**e2e):
    """choose_in_model's (e2e settings, model, seed)."""
    values = {"enabled": True, "runs": 50, "min_runs": 3, "max_seconds": 10.0, "fresh_input": True,
              "in_model_kernels": 10, "in_model_candidates": 3, "in_model_processes": 2, "in_model_rounds": 2,
              "in_model_runs": 5, "timeout_s": 60.0, **e2e}
    return E2ESpec(**values), ModelSpec.of(OmegaConf.create({"kind": "network"})), 0


def test_the_heaviest_are_by_weight_times_latency_and_need_records():
    light = outcome("light", 1, {(1,): 5e-3})
    heavy = outcome("heavy", 4, {(1,): 2e-3})  # 8 ms a run
    unmeasured = TaskOutcome(Task("unmeasured", {"op": "gemm"}, weight=100), [], best_config=(1,), best_cost=1.0)
    assert [o.task.name for o in heaviest_outcomes([light, heavy, unmeasured], 2)] == ["heavy", "light"]
    assert heaviest_outcomes([light, heavy], 0) == []


def test_finalists_are_the_chosen_config_then_the_fastest_valid_others():
    o = outcome("t", 1, {(1,): 3e-3, (2,): 1e-3, (3,): 2e-3, (4,): None, (5,): 4e-3}, chosen=(1,))
    assert finalists(o, 3) == [(1,), (2,), (3,)]  # the failed build (4,) is never a finalist
    assert finalists(o, 10) == [(1,), (2,), (3,), (5,)]


def test_the_config_with_the_lowest_median_inside_the_model_is_reported_at_those_readings():
    o = outcome("t", 1, {(1,): 1.0e-3, (2,): 1.01e-3})
    take_in_model(o, [(1,), (2,)], [[1.2e-3, 1.3e-3, 1.1e-3], [1.05e-3, 1.0e-3, 1.5e-3]])
    assert o.best_config == (2,) and o.final_costs == [1.05e-3, 1.0e-3, 1.5e-3]
    assert o.best_cost == pytest.approx(1.05e-3) and o.chosen_in_model
    assert o.true_cost is None  # the store's median of the config chosen before no longer applies


def test_a_choice_changes_the_outcome_the_saved_choice_and_the_report(tmp_path):
    stem = outcome("stem", 1, {(1,): 0.95e-3, (2,): 0.96e-3, (3,): 0.99e-3})
    other = outcome("other", 2, {(7,): 0.5e-3, (8,): 0.6e-3})
    reshape = outcome("reshape", 1, {(0,): 0.1e-3})
    stem.remeasure_deferred = reshape.remeasure_deferred = True  # the loop left them to this choice
    hardware = InModelHardware({(1,): [1.20e-3, 1.16e-3], (2,): [0.99e-3, 1.01e-3], (3,): [1.0e-3, 1.1e-3],
                                (7,): [0.52e-3, 0.51e-3], (8,): [0.7e-3, 0.8e-3], (0,): [1.0, 1.0]},
                               missing={"reshape"})  # the model runs it as a view: no kernel to replace
    tracker = Tracker()
    report = choose_in_model(*settings(), hardware, [stem, other, reshape], tmp_path, tracker)
    candidates, timing = hardware.asked[0]
    assert candidates["stem"] == [[1], [2], [3]] and timing["processes"] == 2 and timing["rounds"] == 2
    # process 0 chose (2,) at 0.99 ms, process 1's readings of it are its prediction
    assert stem.best_config == (2,) and stem.best_cost == pytest.approx(1.01e-3) and stem.final_costs == [1.01e-3] * 2
    assert other.best_config == (7,) and other.chosen_in_model  # kept, now at its in-model readings
    assert reshape.best_config == (0,) and not reshape.chosen_in_model and reshape.best_cost == 0.1e-3
    assert not stem.remeasure_deferred and reshape.remeasure_deferred  # not taken: re-measured alone after
    saved = json.loads((tmp_path / REPORT_FILE).read_text())
    assert saved == report and saved["stem"]["chosen"] == 1 and set(saved) == {"stem", "other"}
    assert tracker.metrics["in_model/changed"] == 1 and tracker.metrics["in_model/kernels"] == 2
    assert str(tmp_path / REPORT_FILE) in tracker.artifacts
    save_chosen(tmp_path, [stem, other, reshape])
    rows = {row["task"]: row for row in json.loads((tmp_path / CHOSEN_FILE).read_text())}
    assert rows["stem"]["in_model"] is True and "in_model" not in rows["reshape"]
    assert load_chosen(tmp_path)["stem"] == ((2,), pytest.approx(1.01e-3))


def test_the_prediction_is_read_by_processes_that_did_not_choose(tmp_path):
    """Even-numbered processes choose, odd-numbered ones predict: a candidate that looked fastest by
    chance in the choosing processes is reported at what the others read of it."""
    lucky, steady = (1,), (2,)
    stem = outcome("stem", 1, {lucky: 1.0e-3, steady: 1.0e-3})
    per_process = {lucky: [0.90e-3, 1.10e-3, 0.92e-3, 1.08e-3], steady: [1.00e-3, 1.00e-3, 1.00e-3, 1.00e-3]}
    report = choose_in_model(*settings(in_model_processes=4), InModelHardware(per_process), [stem], tmp_path, Tracker())
    assert stem.best_config == lucky and stem.best_cost == pytest.approx(1.09e-3)  # not the 0.91 ms that chose it
    assert report["stem"]["median_s"][0] == pytest.approx(0.91e-3) and report["stem"]["predicted_s"][0] == pytest.approx(1.09e-3)
    assert len(report["stem"]["choice_s"][0]) == len(report["stem"]["prediction_s"][0]) == 2 * 2  # 2 processes x 2 rounds
    alone = outcome("stem", 1, {lucky: 1.0e-3, steady: 1.0e-3})
    choose_in_model(*settings(in_model_processes=1), InModelHardware(per_process), [alone], tmp_path, Tracker())
    assert alone.best_config == lucky and alone.best_cost == pytest.approx(0.90e-3)  # one process: both at once


def test_the_final_metrics_follow_the_new_choice_and_keep_the_rest(tmp_path):
    from tuning.engine.final import log_choice_metrics
    from tuning.tools.sync import final_metrics, save_final_metrics

    stem = outcome("stem", 1, {(1,): 0.95e-3, (2,): 0.96e-3})
    other = outcome("other", 2, {(7,): 0.5e-3})
    save_final_metrics(tmp_path, 640, {"task/stem/final_latency_us": 950.0, "run/build_s": 12.0,
                                       "best/final_latency_ms": 1.95})
    take_in_model(stem, [(1,), (2,)], [[1.2e-3], [1.0e-3]])
    tracker = Tracker()
    log_choice_metrics([stem, other], tracker, tmp_path)
    step, saved = final_metrics(tmp_path)
    assert step == 640 and saved["run/build_s"] == 12.0  # what the choice does not decide is kept
    assert saved["task/stem/final_latency_us"] == pytest.approx(1000.0)
    assert saved["best/final_latency_ms"] == pytest.approx(1.0 + 2 * 0.5) == tracker.metrics["best/final_latency_ms"]
    assert saved["tuning/final_gflops"] == pytest.approx(stem.best_gflops + other.best_gflops)


def test_off_or_on_hardware_that_cannot_changes_nothing(tmp_path):
    stem = outcome("stem", 1, {(1,): 0.95e-3, (2,): 0.96e-3})
    assert choose_in_model(*settings(in_model_kernels=0), InModelHardware({}), [stem], tmp_path, Tracker()) is None

    class Plain:
        def time_in_model(self, *args):
            raise NotImplementedError("Plain cannot time kernels inside a model")

    assert choose_in_model(*settings(), Plain(), [stem], tmp_path, Tracker()) is None

    class Crashing:
        def time_in_model(self, *args):
            raise RuntimeError("timing kernels inside the model failed (crash): worker exited with -11")

    tracker = Tracker()
    tracker.tags = {}
    tracker.set_tags = tracker.tags.update
    assert choose_in_model(*settings(), Crashing(), [stem], tmp_path, tracker) is None
    assert tracker.tags["in_model"].startswith("failed: timing kernels inside the model failed (crash)")
    assert stem.best_config == (1,) and not stem.chosen_in_model and not (tmp_path / REPORT_FILE).exists()
    assert math.isclose(stem.best_cost, 0.95e-3)


def test_the_loop_leaves_the_heaviest_to_the_choice_and_re_measures_them_alone_where_it_fails(tmp_path):
    """The finalists of the tasks the in-model choice reads are not re-measured alone at the loop's end
    (the choice reads them); where the choice does not take them (here its timing crashes), they are."""
    from helpers import component, components

    tasks = [gemm_task(f"k{i}", 16 + 16 * i, 32, 16) for i in range(5)]
    shared = components(search="random", sampler="all", cost_model="none")
    asked = []

    class Counting:
        final_candidates = shared.evaluator.final_candidates

        def __getattr__(self, name):
            return getattr(shared.evaluator, name)

        def remeasure(self, hardware, task, configs):
            asked.append(task.name)
            return shared.evaluator.remeasure(hardware, task, configs)

    def components_for(index):
        return replace(shared, evaluator=Counting(), search=component("search", "random"))

    run = RunInfo(seed=0, out_dir=tmp_path, method="test", trials=40, plan_size=8, min_trials_per_task=8,
                  in_model_kernels=2)
    outcomes = tune_tasks(tasks, components_for, run, Gradient())
    left = [o for o in outcomes if o.remeasure_deferred]
    assert sorted(o.task.name for o in left) == sorted(o.task.name for o in heaviest_outcomes(outcomes, 2))
    assert len(left) == 2
    assert sorted(asked) == sorted(o.task.name for o in outcomes if o not in left)
    for o in left:  # the fastest reading stands until the choice reads the finalists
        assert o.best_cost == o.tuning_best_cost == min(r.result.cost for r in o.records if r.result.ok)

    class Crashing:
        def time_in_model(self, *args):
            raise RuntimeError("timing kernels inside the model failed (crash): worker exited with -11")

    tracker = Tracker()
    tracker.set_tags = lambda tags: None
    assert choose_in_model(*settings(in_model_kernels=2), Crashing(), outcomes, tmp_path, tracker) is None
    assert remeasure_deferred(outcomes, Counting(), shared.hardware) == left  # both in the tasks' order
    assert sorted(asked) == sorted(o.task.name for o in outcomes)
    assert not any(o.remeasure_deferred for o in outcomes)
    assert all(o.best_cost == pytest.approx(float(np.median(o.final_costs))) for o in left)
    assert all(len(o.final_costs) == shared.evaluator.final_repeat for o in left)


@pytest.mark.parametrize("key, value", [("in_model_kernels", -1), ("in_model_candidates", 0),
                                        ("in_model_processes", 0), ("in_model_rounds", 0), ("in_model_runs", 0)])
def test_bad_in_model_settings_are_rejected_naming_the_key(compose_cfg, key, value):
    cfg = compose_cfg("tracking=none", "hardware=synthetic", f"e2e.{key}={value}")
    with pytest.raises(ConfigError, match=f"e2e.{key}"):
        validate(cfg)
