"""Optuna sweeps: the sweeper plugin (search space, tell, results), the objective, pruning,
and `python run.py -m hparams_search=...` end to end on the synthetic hardware."""
from __future__ import annotations

import csv
import math
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from hydra.core.utils import JobReturn, JobStatus
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.exceptions import ExperimentalWarning
from optuna.trial import TrialState

from hydra_plugins.tunelab_optuna_sweeper import _search_space as search_space
from hydra_plugins.tunelab_optuna_sweeper._sweeper import OptunaSweeperImpl as OptunaSweeper
from hydra_plugins.tunelab_optuna_sweeper._sweeper import _tell, write_results
from tuning.config import ConfigError
from tuning.config.objective import objective_values
from tuning.core.records import MeasureResult, Record
from tuning.engine.callbacks import RoundReport
from tuning.engine.trial import Pruning
from tuning.engine.validate import validate

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")
optuna.logging.set_verbosity(optuna.logging.WARNING)


# ---- search space -----------------------------------------------------------------------------
def test_sweep_syntax_becomes_optuna_distributions():
    space, fixed = search_space.parse([
        "a=choice(1, 2, 4)", "b=range(2, 17, step=2)", "c=interval(0.1, 0.4)", "d=tag(log, interval(0.0001, 0.01))",
        "e=tag(log, int(interval(1, 64)))", "f=x,y", "g=range(0.5, 2.0, step=0.5)", "model=gemm_64", "+h=choice(p, q)"])
    assert space["a"] == CategoricalDistribution([1, 2, 4])
    assert space["b"] == IntDistribution(2, 16, step=2)  # range() excludes its stop; Optuna's high is inclusive
    assert space["c"] == FloatDistribution(0.1, 0.4)
    assert space["d"] == FloatDistribution(0.0001, 0.01, log=True)
    assert space["e"] == IntDistribution(1, 64, log=True)
    assert space["f"] == CategoricalDistribution(["x", "y"])
    assert space["g"] == FloatDistribution(0.5, 1.5, step=0.5)
    assert space["+h"] == CategoricalDistribution(["p", "q"])
    assert fixed == {"model": "gemm_64"}


def test_a_later_override_replaces_an_earlier_one():
    space, fixed = search_space.parse(["a=choice(1, 2)", "a=3", "b=4", "b=interval(0, 1)"])
    assert fixed == {"a": "3"} and list(space) == ["b"]


def test_grid_comes_from_choice_and_range_only():
    space, _ = search_space.parse(["a=choice(x, y)", "b=range(1, 4)", "c=range(0.0, 1.0, step=0.25)"])
    assert search_space.grid(space) == {"a": ["x", "y"], "b": [1, 2, 3], "c": [0.0, 0.25, 0.5, 0.75]}
    space, _ = search_space.parse(["lr=interval(0.1, 1.0)"])
    with pytest.raises(search_space.SearchSpaceError, match="hydra.sweeper.params.lr"):
        search_space.grid(space)


@pytest.mark.parametrize("value", [None, 3, 2.5e-05, True, False, "kmeans", "a b", "1.5", "x,y", "it's", "sqlite:////t/o.db"])
def test_a_trial_value_survives_the_trip_through_hydra_overrides(value):
    line = search_space.override("key", value)
    parsed, _ = search_space.parse([line])
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert OverridesParser.create().parse_override(line).value() == value, line
    assert parsed == {}


# ---- telling Optuna what a job did -------------------------------------------------------------
def _job(status, value) -> JobReturn:
    return JobReturn(status=status, _return_value=value, overrides=["x=1"])


def test_job_outcomes_become_trial_states():
    study = optuna.create_study(directions=["maximize"])
    cases = [(_job(JobStatus.COMPLETED, 1.5), TrialState.COMPLETE, None),
             (_job(JobStatus.FAILED, optuna.TrialPruned("bad")), TrialState.PRUNED, None),
             (_job(JobStatus.FAILED, RuntimeError("boom")), TrialState.FAIL, RuntimeError),
             (_job(JobStatus.COMPLETED, [1.0, 2.0]), TrialState.FAIL, ValueError),   # two values, one objective
             (_job(JobStatus.COMPLETED, "fast"), TrialState.FAIL, ValueError),
             (_job(JobStatus.COMPLETED, float("nan")), TrialState.FAIL, ValueError)]
    for ret, state, error in cases:
        trial = study.ask()
        failure = _tell(study, trial, ret, 1)
        assert study.trials[-1].state == state
        assert (failure is None) if error is None else isinstance(failure, error)
    assert study.trials[0].value == 1.5


def test_multi_objective_results_hold_the_pareto_front(tmp_path):
    study = optuna.create_study(directions=["minimize", "minimize"])
    points = [(1.0, 9.0), (2.0, 2.0), (3.0, 3.0), (9.0, 1.0), (5.0, 5.0)]
    for i, values in enumerate(points):
        trial = study.ask({"x": FloatDistribution(0, 10)})
        _tell(study, trial, _job(JobStatus.COMPLETED, list(values)), 2)
    write_results(study, tmp_path, ["final_latency_us", "tuning_s"], None)
    results = OmegaConf.load(tmp_path / "optimization_results.yaml")
    assert [tuple(p["values"].values()) for p in results.pareto_front] == [(1.0, 9.0), (2.0, 2.0), (9.0, 1.0)]
    rows = list(csv.DictReader(open(tmp_path / "pareto_front.csv")))
    assert [int(r["trial"]) for r in rows] == [0, 1, 3] and set(rows[0]) >= {"final_latency_us", "tuning_s", "x"}
    assert len(list(csv.DictReader(open(tmp_path / "trials.csv")))) == 5


def _sweeper(direction=None, objective=None) -> OptunaSweeper:
    sweeper = OptunaSweeper(None, None, direction, None, None, 1, 1, 0.0, True, None)
    sweeper.config = OmegaConf.create({"objective": objective} if objective else {})
    return sweeper


def test_directions_come_from_the_objective_and_a_contradiction_is_refused():
    objective = {"metrics": ["final_latency_us", "tuning_s"], "directions": ["minimize", "minimize"]}
    assert _sweeper(objective=objective)._directions() == ["minimize", "minimize"]
    assert _sweeper()._directions() == ["minimize"]
    assert _sweeper("maximize")._directions() == ["maximize"]
    with pytest.raises(ValueError, match="hydra.sweeper.direction.*objective.directions"):
        _sweeper("maximize", objective)._directions()
    with pytest.raises(ValueError, match="hydra.sweeper.direction"):
        _sweeper("up")._directions()


class FakeLauncher:
    """Runs each trial's overrides through `objective(params)` in-process."""

    def __init__(self, objective):
        self.objective, self.launched = objective, []

    def launch(self, job_overrides, initial_job_idx):
        returns = []
        for overrides in job_overrides:
            params = dict(o.split("=", 1) for o in overrides if not o.startswith(("++hydra.", "hydra.")))
            self.launched.append(params)
            returns.append(JobReturn(status=JobStatus.COMPLETED, _return_value=self.objective(params),
                                     overrides=list(overrides)))
        return returns


def run_sweeper(tmp_path, sampler: str, params: dict, n_trials: int, storage=None) -> tuple[optuna.Study, list]:
    from hydra_plugins.tunelab_optuna_sweeper import config as sweeper_config

    conf = {"tpe": sweeper_config.TPESamplerConf, "random": sweeper_config.RandomSamplerConf,
            "cmaes": sweeper_config.CmaEsSamplerConf, "grid": sweeper_config.GridSamplerConf,
            "nsgaii": sweeper_config.NSGAIISamplerConf}[sampler]
    sweeper = OptunaSweeper(OmegaConf.structured(conf), None, "minimize", storage, "s", n_trials, 2, 0.0, True,
                            params)
    sweeper.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}})
    sweeper.launcher = FakeLauncher(lambda p: (float(p["x"]) - 0.5) ** 2)
    sweeper.validate_batch_is_legal = lambda batch: None
    return sweeper.sweep([]), sweeper.launcher.launched


@pytest.mark.parametrize("sampler", ["tpe", "random", "cmaes", "nsgaii"])
def test_every_sampler_runs_its_trials(tmp_path, sampler):
    study, launched = run_sweeper(tmp_path, sampler, {"x": "interval(-2.0, 2.0)", "y": "fixed"}, 6)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 6
    assert len({t.params["x"] for t in study.trials}) == 6 and all(-2 <= t.params["x"] <= 2 for t in study.trials)
    assert all(p["y"] == "fixed" for p in launched)
    again, _ = run_sweeper(tmp_path / "again", sampler, {"x": "interval(-2.0, 2.0)", "y": "fixed"}, 6)
    assert [t.params for t in again.trials] == [t.params for t in study.trials]  # seeded


def test_grid_sampler_walks_the_grid_once(tmp_path):
    study, launched = run_sweeper(tmp_path, "grid", {"x": "range(-2, 3)"}, 100)
    assert sorted(int(p["x"]) for p in launched) == [-2, -1, 0, 1, 2]  # n_trials capped at the grid's 5 points
    assert study.best_params == {"x": 0} or study.best_params == {"x": 1}


def test_n_trials_is_the_study_total_and_a_resumed_sampler_draws_new_points(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    first, _ = run_sweeper(tmp_path, "random", {"x": "interval(-2.0, 2.0)"}, 3, storage)
    study, launched = run_sweeper(tmp_path, "random", {"x": "interval(-2.0, 2.0)"}, 5, storage)
    assert len(launched) == 2 and len(study.trials) == 5
    assert len({t.params["x"] for t in study.trials}) == 5
    _, launched = run_sweeper(tmp_path, "random", {"x": "interval(-2.0, 2.0)"}, 5, storage)
    assert launched == []  # already complete


# ---- a study takes trials of one kind only ------------------------------------------------------
def settled_sweep(tmp_path, storage: str, n_trials: int, capsys=None, **settings) -> tuple[optuna.Study | None, list]:
    """A sweep of search.temp.0 on a config with these settings (budget, hardware, seed), in process."""
    from hydra_plugins.tunelab_optuna_sweeper import config as sweeper_config

    config = {"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}, "seed": settings.get("seed", 0),
              "output_dir": "${hydra:runtime.output_dir}",
              "budget": {"trials": settings.get("trials", 256), "plan_size": None},
              "hardware": {"_target_": settings.get("hardware", "tuning.hardware.synthetic.SyntheticHardware")},
              "search": {"_target_": "tuning.search.sa.SimulatedAnnealing", "temp": [1.0, 0.0]},
              "cost_model": {"seed": "${seed}"}, "tracking": None,
              "objective": {"metrics": ["final_latency_us"], "directions": ["minimize"]}}
    sweeper = OptunaSweeper(OmegaConf.structured(sweeper_config.RandomSamplerConf), None, None, storage, "sa-gemm_64",
                            n_trials, 1, 0.0, True, {"search.temp.0": "interval(0.1, 10.0)"})
    sweeper.config = OmegaConf.create(config)
    sweeper.launcher = FakeLauncher(lambda p: float(p["search.temp.0"]))
    sweeper.validate_batch_is_legal = lambda batch: None
    return sweeper.sweep([]), sweeper.launcher.launched


@pytest.mark.parametrize("changed, key, was, now", [
    ({"trials": 32}, "budget.trials", "256", "32"),
    ({"hardware": "tuning.hardware.cpu.CPUHardware"}, "hardware._target_", "tuning.hardware.synthetic.SyntheticHardware",
     "tuning.hardware.cpu.CPUHardware"),
])
def test_a_study_refuses_a_sweep_under_other_settings_before_any_trial(tmp_path, capsys, changed, key, was, now):
    """A resumed study whose trials ran at 256 measurements on synthetic hardware takes no trial at 32, nor one
    timed on this CPU (it did, when only the directions were checked); another seed is the same settings."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study, _ = settled_sweep(tmp_path, storage, 2)
    assert study.user_attrs["tunelab.settings"]["budget.trials"] == "256"
    assert "search.temp.0" not in study.user_attrs["tunelab.settings"]  # swept: each trial's own
    assert study.user_attrs["tunelab.settings"]["search.temp.1"] == "0.0"
    assert not {"seed", "cost_model.seed"} & set(study.user_attrs["tunelab.settings"])
    assert study.metric_names == ["final_latency_us"]  # optuna-dashboard's name for the value, not "Objective 0"
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        settled_sweep(tmp_path, storage, 4, **changed)
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert f"study 'sa-gemm_64' in {storage} ran its 2 trials under other settings: {key}: {was} in the study, " \
           f"{now} now" in err
    assert len(optuna.load_study(study_name="sa-gemm_64", storage=storage).trials) == 2  # no trial added
    study, launched = settled_sweep(tmp_path, storage, 3, seed=7)  # the seed is no setting
    assert len(launched) == 1 and len(study.trials) == 3


def test_a_study_optimising_another_metric_is_refused(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    settled_sweep(tmp_path, storage, 1)
    study = optuna.load_study(study_name="sa-gemm_64", storage=storage)
    with warnings.catch_warnings():  # experimental in Optuna 5
        warnings.simplefilter("ignore", ExperimentalWarning)
        study.set_metric_names(["tuning_s"])  # as a sweep of another objective in the same direction leaves it
    with pytest.raises(SystemExit):
        settled_sweep(tmp_path, storage, 2)
    assert "optimises ['tuning_s'], not ['final_latency_us'] (objective.metrics)" in capsys.readouterr().err


# ---- the objective and pruning (job side) ------------------------------------------------------
def _outcome(latencies_us, flops=2e6, started=1000.0, weight=1):
    task = SimpleNamespace(key="t", name="t", flops=flops, weight=weight)
    records = [Record("t", "t", [i], {}, MeasureResult([c * 1e-6]) if c else MeasureResult([], error="bad"),
                      0, "m", 0, i, started + i) for i, c in enumerate(latencies_us)]
    best = min(c for c in latencies_us if c) * 1e-6
    return SimpleNamespace(task=task, records=records, reused=0, best_cost=best,
                           best_gflops=flops / best / 1e9, curve=lambda: [])


def test_objective_metrics_by_hand():
    outcome = _outcome([40.0, None, 20.0, 10.0, 10.0])  # best-so-far 40, 40, 20, 10, 10 us
    objective = OmegaConf.create({"metrics": ["final_gflops", "final_latency_us", "tuning_s",
                                              "measurements_to_target", "seconds_to_target"],
                                  "directions": [], "target_latency_us": 20.0})
    gflops, latency, seconds, to_target, seconds_to_target = objective_values(objective, [outcome], 7.5, 1000.0)
    assert gflops == pytest.approx(2e6 / 10e-6 / 1e9) and latency == pytest.approx(10.0)
    assert seconds == 7.5 and to_target == 3.0 and seconds_to_target == 2.0  # the 3rd record, stamped at +2 s
    objective.target_latency_us = 5.0  # never reached: the spend, scaled by best / target = 2
    _, _, _, missed, missed_s = objective_values(objective, [outcome], 7.5, 1000.0)
    assert missed == pytest.approx(5 * 2.0) and missed_s == pytest.approx(7.5 * 2.0)
    single = OmegaConf.create({"metrics": ["final_latency_us"], "directions": ["minimize"]})
    assert objective_values(single, [outcome], 1.0, 0.0) == pytest.approx(10.0)  # one metric: a float


def after(measured, outcome) -> RoundReport:
    return RoundReport(tuner=None, batch=[], results=[], round_index=0, search_s=0.0, measured=measured,
                       outcomes=[outcome])


class FakeTrial:
    def __init__(self, prune_after: int | None):
        self.reports, self.prune_after = [], prune_after

    def report(self, value, step):
        self.reports.append((step, value))

    def should_prune(self):
        return self.prune_after is not None and self.reports[-1][0] >= self.prune_after


def test_pruning_reports_best_so_far_on_a_fixed_step_grid():
    objective = OmegaConf.create({"metrics": ["final_latency_us"], "report_every": 2})
    trial = FakeTrial(prune_after=None)
    pruning = Pruning(trial, objective, budget=5)
    outcome = _outcome([40.0, None, 20.0, 10.0, 30.0])
    outcome.records = outcome.records[:3]
    assert pruning.after_round(after(3, outcome)) is None  # a round of 3: only step 2 is complete
    outcome.records = _outcome([40.0, None, 20.0, 10.0, 30.0]).records
    assert pruning.after_round(after(5, outcome)) is None
    assert trial.reports == [(2, pytest.approx(40.0)), (4, pytest.approx(10.0))]


def test_a_pruned_trial_stops_the_run_but_never_at_its_budget():
    objective = OmegaConf.create({"metrics": ["final_gflops"], "report_every": 1})
    outcome = _outcome([40.0, 20.0, 10.0])
    assert Pruning(FakeTrial(prune_after=1), objective, budget=10).after_round(after(3, outcome)) == "pruned"
    assert Pruning(FakeTrial(prune_after=1), objective, budget=3).after_round(after(3, outcome)) is None  # nothing left to save
    multi = OmegaConf.create({"metrics": ["final_latency_us", "tuning_s"], "report_every": 1})
    trial = FakeTrial(prune_after=1)
    assert Pruning(trial, multi, budget=10).after_round(after(3, outcome)) is None and trial.reports == []


@pytest.mark.parametrize("overrides, key", [
    (["objective.metrics=[speed]"], "objective.metrics"),
    (["objective.directions=[minimize]"], "objective.directions"),
    (["objective=seconds_to_target"], "objective.target_latency_us"),
    (["objective.report_every=0"], "objective.report_every"),
])
def test_a_bad_objective_is_refused_naming_its_key(compose_cfg, overrides, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        validate(compose_cfg("hardware=synthetic", "model=gemm_64", *overrides))


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONF / "hparams_search").glob("*.yaml")))
def test_every_preset_composes_validates_and_parses(compose_cfg, preset):
    cfg = compose_cfg("hardware=synthetic", "model=gemm_64", f"hparams_search={preset}")
    validate(cfg)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("tunelab_optuna_sweeper.optuna_sweeper.OptunaSweeper")
    assert sweeper.study_name == f"{preset}-gemm_64" and sweeper.storage.endswith("/optuna.db")
    space, fixed = search_space.parse([f"{k}={v}" for k, v in sweeper.params.items()])
    assert space and not fixed
    for key in space:  # every swept key exists in the job's config
        assert OmegaConf.select(cfg, key) is not None, key
    yaml_text = (CONF / "hparams_search" / f"{preset}.yaml").read_text()
    assert re.search(r"(Table|§)\s*\d", yaml_text), f"{preset}.yaml cites no table or section"


# ---- end to end: python run.py -m hparams_search=... ------------------------------------------
WARNING = re.compile(r"^(?P<where>\S+):\d+: (?P<kind>\w*Warning):", re.M)


def sweep(tmp: Path, *args: str, warnings="default") -> subprocess.CompletedProcess:
    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp / "outputs"), "PYTHONWARNINGS": warnings}
    proc = subprocess.run([sys.executable, "run.py", "-m", "hardware=synthetic", "model=gemm_64",
                           f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}", f"hydra.sweep.dir={tmp / 'sweep'}", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return proc


def study_of(tmp: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp / 'outputs' / 'optuna.db'}")


def mlflow_runs(tmp: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("tunelab").experiment_id], max_results=200)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return client, parents, [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def test_kmeans_threshold_sweep_writes_a_study_that_a_second_invocation_resumes(tmp_path):
    first = sweep(tmp_path, "hparams_search=kmeans_threshold", "budget.trials=16", "hydra.sweeper.n_trials=2")
    noisy = [m.group(0) for m in WARNING.finditer(first.stderr) if "/mlflow/" not in m["where"]]
    assert not noisy, noisy  # Optuna 5, Hydra and tunelab emit no deprecation (or other) warnings
    assert len(study_of(tmp_path, "kmeans_threshold-gemm_64").trials) == 2
    second = sweep(tmp_path, "hparams_search=kmeans_threshold", "budget.trials=16", "hydra.sweeper.n_trials=3",
                   f"hydra.sweep.dir={tmp_path / 'sweep2'}")
    assert "Using an existing study" in second.stderr
    assert len(re.findall(r"^\[gemm_64\] best", second.stdout, re.M)) == 1  # only the one missing trial ran
    study = study_of(tmp_path, "kmeans_threshold-gemm_64")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert {"sampler.threshold", "sampler.k_min", "sampler.k_max"} == set(study.trials[2].params)
    assert len({t.params["sampler.threshold"] for t in study.trials}) == 3  # the resumed sampler drew new points

    client, parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 2 and len(children) == 3
    for child in children:
        tags = child.data.tags
        assert tags["optuna.study"] == "kmeans_threshold-gemm_64" and tags["optuna.state"] == "COMPLETE"
        trial = study.trials[int(tags["optuna.trial"])]
        assert float(tags["optuna.param.sampler.threshold"]) == trial.params["sampler.threshold"]
        assert float(child.data.params["sampler.threshold"]) == pytest.approx(trial.params["sampler.threshold"])
        assert child.data.metrics["best/final_gflops"] == pytest.approx(trial.value)
    latest = max(parents, key=lambda r: r.info.start_time)
    best = study.best_trial
    assert latest.data.tags["optuna.best_trial"] == str(best.number)
    assert float(latest.data.params["best.sampler.threshold"]) == pytest.approx(best.params["sampler.threshold"])
    assert latest.data.metrics["best.final_gflops"] == pytest.approx(best.value)
    assert {a.path for a in client.list_artifacts(latest.info.run_id)} >= {"optimization_results.yaml", "trials.csv"}
    [line] = [line for line in second.stdout.splitlines() if "best trial" in line]
    assert f"best trial {best.number}, final_gflops=" in line and "3 COMPLETE" in line
    assert latest.data.tags["mlflow.note.content"] == line.removeprefix("tunelab: ")  # the parent's description
    assert f"/runs/{latest.info.run_id}?workflowType=machine_learning" in second.stdout
    assert study.metric_names == ["final_gflops"]

    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp_path / "outputs")}  # the same study at another budget
    other = subprocess.run([sys.executable, "run.py", "-m", "hardware=synthetic", "model=gemm_64",
                            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"hydra.sweep.dir={tmp_path / 'sweep3'}",
                            "hparams_search=kmeans_threshold", "budget.trials=32", "hydra.sweeper.n_trials=4"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert other.returncode == 2, (other.stdout + other.stderr)[-3000:]
    assert "ran its 3 trials under other settings: budget.trials: 16 in the study, 32 now" in other.stderr
    assert len(study_of(tmp_path, "kmeans_threshold-gemm_64").trials) == 3 and "best" not in other.stdout


def test_an_interrupted_trial_is_run_again_on_resume(tmp_path):
    storage = f"sqlite:///{tmp_path / 'outputs' / 'optuna.db'}"
    (tmp_path / "outputs").mkdir()
    study = optuna.create_study(study_name="kmeans_threshold-gemm_64", storage=storage, direction="maximize")
    study.ask({"sampler.threshold": FloatDistribution(0.5, 10.0, log=True),
               "sampler.k_min": IntDistribution(2, 16, step=2), "sampler.k_max": CategoricalDistribution([32, 64, 96])})
    left_running = study.trials[0].params  # as a killed sweep without heartbeats leaves it
    sweep(tmp_path, "hparams_search=kmeans_threshold", "budget.trials=16", "hydra.sweeper.n_trials=1",
          "hydra.sweeper.heartbeat_interval=1", "hydra.sweeper.grace_period=2")  # dead once 2 s old
    trials = study_of(tmp_path, "kmeans_threshold-gemm_64").trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[1].params == left_running and trials[1].user_attrs["retry_of"] == 0


@pytest.mark.slow
def test_a_clearly_bad_trial_is_pruned_early(tmp_path):
    """Three trials on the synthetic machine at its 100 GFLOP/s peak, then one on a machine 50x
    slower: its best-so-far is far below the others' at the first step, so it stops there."""
    storage = f"sqlite:///{tmp_path / 'outputs' / 'optuna.db'}"
    (tmp_path / "outputs").mkdir()
    study = optuna.create_study(study_name="kmeans_threshold-gemm_64", storage=storage, direction="maximize")
    for peak in (100.0, 100.0, 100.0, 2.0):
        study.enqueue_trial({"hardware.peak_gflops": peak})
    sweep(tmp_path, "hparams_search=kmeans_threshold", "budget.trials=96", "hydra.sweeper.n_trials=4",
          "hardware.peak_gflops=choice(2.0, 100.0)", "hydra.sweeper.pruner.n_startup_trials=3",
          "hydra.sweeper.pruner.n_warmup_steps=0", "objective.report_every=16")
    trials = study_of(tmp_path, "kmeans_threshold-gemm_64").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3 + [TrialState.PRUNED]
    assert max(trials[3].intermediate_values) < 96 and max(trials[0].intermediate_values) == 96
    records = (tmp_path / "sweep" / "trial_3" / "records.jsonl").read_text().splitlines()
    assert len(records) < 96
    _, _, children = mlflow_runs(tmp_path)
    pruned = [c for c in children if c.data.tags["optuna.trial"] == "3"][0]
    assert pruned.info.status == "KILLED" and pruned.data.tags["optuna.state"] == "PRUNED"
    assert all(c.info.status == "FINISHED" for c in children if c is not pruned)


@pytest.mark.slow
def test_four_parallel_joblib_trials_lose_nothing(tmp_path):
    sweep(tmp_path, "hparams_search=kmeans_threshold", "budget.trials=32", "hydra.sweeper.n_trials=4",
          "hydra.sweeper.n_jobs=4", "hydra/launcher=joblib", "hydra.launcher.n_jobs=4")
    trials = study_of(tmp_path, "kmeans_threshold-gemm_64").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    _, parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and len(children) == 4
    assert sorted(c.data.tags["optuna.trial"] for c in children) == ["0", "1", "2", "3"]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert len({c.data.tags["optuna.param.sampler.threshold"] for c in children}) == 4


def test_cv_threshold_preset_writes_its_pareto_front(tmp_path):
    sweep(tmp_path, "hparams_search=cv_threshold", "budget.trials=32", "hydra.sweeper.n_trials=4",
          "hardware.noise=0.05")
    study = study_of(tmp_path, "cv_threshold-gemm_64")
    assert [d.name for d in study.directions] == ["MINIMIZE", "MINIMIZE"]
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    rows = list(csv.DictReader(open(tmp_path / "sweep" / "pareto_front.csv")))
    front = {int(r["trial"]) for r in rows}
    dominated = {a.number for a in complete for b in complete
                 if all(x <= y for x, y in zip(b.values, a.values)) and b.values != a.values}
    assert front == {t.number for t in complete} - dominated and front
    assert all(math.isfinite(float(r["final_latency_us"])) and float(r["tuning_s"]) > 0 for r in rows)
    client, parents, _ = mlflow_runs(tmp_path)
    assert "pareto_front.csv" in {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert parents[0].data.tags["optuna.pareto_trials"] == ",".join(r["trial"] for r in rows)


# a trial still under way after 20 measurements (12.8 s of pauses), and a rerun of the study's settings
SLOW_TRIALS = ("budget.trials=32", "hardware.delay_s=0.4")


def test_a_sweep_interrupted_with_ctrl_c_reruns_the_interrupted_trial(tmp_path):
    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp_path / "outputs")}
    args = [sys.executable, "run.py", "-m", "hardware=synthetic", "model=gemm_64", "hparams_search=kmeans_threshold",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "hydra.sweeper.n_trials=2", *SLOW_TRIALS]
    # Ctrl-C as in a terminal, also where the suite itself runs in the background (SIGINT ignored, inherited)
    proc = subprocess.Popen([*args, f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    records = tmp_path / "sweep" / "trial_0" / "records.jsonl"
    deadline = time.monotonic() + 300  # a loaded 2-core host starts a sweep slowly; Ctrl-C goes to a trial under way
    while time.monotonic() < deadline and not (records.exists() and records.read_text().count("\n") >= 20):
        time.sleep(0.2)
    if not records.exists():
        proc.kill()
        pytest.fail(f"no trial measured within 300 s: {proc.communicate()[1][-3000:]}")
    proc.send_signal(signal.SIGINT)
    stderr = proc.communicate(timeout=120)[1]
    assert proc.returncode != 0, stderr[-3000:]
    trials = study_of(tmp_path, "kmeans_threshold-gemm_64").trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING], stderr[-3000:]
    assert trials[1].user_attrs["retry_of"] == 0

    sweep(tmp_path, "hparams_search=kmeans_threshold", "hydra.sweeper.n_trials=2", *SLOW_TRIALS,
          f"hydra.sweep.dir={tmp_path / 'sweep2'}")  # the study's own settings: it takes no other
    trials = study_of(tmp_path, "kmeans_threshold-gemm_64").trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert trials[1].params == trials[0].params  # the interrupted point, measured this time


def test_a_trial_with_an_invalid_config_stops_the_sweep_naming_the_key(tmp_path):
    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp_path / "outputs")}
    proc = subprocess.run([sys.executable, "run.py", "-m", "hardware=synthetic", "model=gemm_64",
                           "hparams_search=kmeans_threshold", "hydra.sweeper.n_trials=2", "tracking=none",
                           "sampler.k_max=64", "sampler.k_min=choice(70, 80)", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "sampler.k_min: must be below sampler.k_max" in proc.stderr, proc.stderr[-3000:]
    assert [t.state for t in study_of(tmp_path, "kmeans_threshold-gemm_64").trials] == [TrialState.FAIL]
    assert not (tmp_path / "sweep" / "trial_0" / "records.jsonl").exists()  # rejected before any work
