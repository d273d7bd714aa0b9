"""Config rejection before any work, and contract tests over every YAML of the groups.

`python run.py <bad override>` must exit non-zero within seconds, name the key
(and, for a group, the allowed options), and leave no records behind. Every
YAML must compose with the defaults, pass `validate`, and instantiate without
doing work (constructors store hyperparameters only).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from configs import options, searchpath_overrides
from tuning.config import ConfigError
from tuning.core.task import build_tasks
from tuning.cost_model.base import CostModel
from tuning.engine.validate import validate
from tuning.evaluator.base import Evaluator
from tuning.hardware.base import Hardware
from tuning.hardware.synthetic import SyntheticHardware
from tuning.sampler.base import Sampler
from tuning.scheduler.base import Scheduler
from tuning.search.base import Search
from tuning.store import connect_store
from tuning.tracking.base import Tracker

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
BASES = {"search": Search, "sampler": Sampler, "evaluator": Evaluator, "cost_model": CostModel,
         "hardware": Hardware, "tracking": Tracker, "scheduler": Scheduler}


def choices(cfg) -> dict:
    return {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra/")}


# ---- rejection through the CLI -------------------------------------------------------------
BAD = {
    "unknown group option": (["search=nope"], ["search", "nope", "random", "sa"]),
    "negative trials": (["budget.trials=-3"], ["budget.trials", ">= 0"]),
    "trials not a number": (["budget.trials=abc"], ["budget.trials", "abc"]),
    "hyperparameter wrong type": (["search.n_iter=abc"], ["search.n_iter", "int"]),
    "unknown hyperparameter": (["+search.foo=1"], ["search.foo", "n_iter", "parallel_size"]),
    "search needs a cost model": (["cost_model=none"], ["cost_model", "search=sa", "xgb"]),
    "cache flush needs number 1": (["evaluator=autotvm_x86", "evaluator.number=4"],
                                   ["evaluator.cache_flush", "evaluator.number"]),
    "negative model shape": (["model.M=-1", "model=gemm"], ["model.M", ">= 1"]),
    "unknown hardware": (["hardware=nope"], ["hardware", "cpu", "synthetic"]),
}


@pytest.mark.parametrize("overrides,expected", BAD.values(), ids=BAD.keys())
def test_cli_rejects_before_any_work(tmp_path, overrides, expected):
    run_dir = tmp_path / "run"
    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp_path / "outputs")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "run.py", *overrides, f"hydra.run.dir={run_dir}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    for text in expected:
        assert text in output, f"{text!r} not in:\n{output}"
    assert "Traceback" not in output, "a config error should be a message, not a crash"
    assert elapsed < 30, f"took {elapsed:.1f} s: work started before the config was checked"
    assert not (run_dir / "records.jsonl").exists()
    assert not (run_dir / "config.yaml").exists()
    assert not (tmp_path / "outputs").exists(), "the MLflow store was opened"


# ---- validate, in process ------------------------------------------------------------------
REJECTED = {
    "trials zero": (["budget.trials=0"], "budget.trials"),
    "time limit zero": (["budget.time_limit_s=0"], "budget.time_limit_s"),
    "minutes zero": (["budget.minutes=0"], "budget.minutes"),
    "minutes negative": (["model=resnet18", "budget.minutes=-5"], "budget.minutes"),
    "minutes and a time limit": (["budget.minutes=10", "budget.time_limit_s=60"],
                                 "budget.minutes and budget.time_limit_s"),
    "early stop zero": (["budget.early_stop=0"], "budget.early_stop"),
    "negative seed": (["seed=-1"], "seed"),
    "plan size zero": (["budget.plan_size=0"], "budget.plan_size"),
    "float for int": (["search.n_iter=1.5"], "search.n_iter"),
    "int for bool": (["search.persistent=1"], "search.persistent"),
    "repeat zero": (["evaluator.repeat=0"], "evaluator.repeat"),
    "threads zero": (["hardware.num_threads=0"], "hardware.num_threads"),
    "unknown model kind": (["model.kind=lstm"], "model.kind"),
    "negative padding": (["model.padding=-1"], "model.padding"),
    "missing model key": (["model=gemm", "~model.K"], "model.K"),
    "bad target": (["sampler._target_=tuning.sampler.nope.Nope"], "sampler._target_"),
    "cache flush": (["evaluator=autotvm_x86", "evaluator.number=0"], "evaluator.cache_flush"),
    "cache flush with min_repeat_ms": (["evaluator.cache_flush=true"], "evaluator.cache_flush"),
    "unknown network": (["model=resnet18", "model.network=resnet19"], "model.network"),
    "kernels not a list": (["model=resnet18", "+model.kernels=conv"], "model.kernels"),
    "kernels empty": (["model=resnet18", "+model.kernels=[]"], "model.kernels"),
    "kernels of one operator": (["model=gemm_64", "+model.kernels=[a]"], "model.kernels"),
    "onnx without a file": (["model=onnx", "model.input_shape=[1,3,8,8]"], "model.path"),
    "onnx file missing": (["model=onnx", "model.path=/nonexistent.onnx", "model.input_shape=[1,3]"], "model.path"),
    "onnx bad shape": (["model=onnx", "model.path=pyproject.toml", "model.input_shape=[1,0]"], "model.input_shape"),
    "gradient alpha": (["scheduler.alpha=1.5"], "scheduler.alpha"),
    "negative per-task minimum": (["budget.min_trials_per_task=-1"], "budget.min_trials_per_task"),
    "e2e runs zero": (["e2e.runs=0"], "e2e.runs"),
    "rounds per task zero": (["budget.rounds_per_task=0"], "budget.rounds_per_task"),
    "trials per task zero": (["budget.trials_per_task=0"], "budget.trials_per_task"),
    "kmeans synthesis pool": (["sampler=kmeans", "sampler.synthesis_pool=everything"], "sampler.synthesis_pool"),
    "kmeans empty k range": (["sampler=kmeans", "sampler.k_min=64"], "sampler.k_min"),
    "ppo clip zero": (["search=ppo", "search.clip=0"], "search.clip"),
    "ppo gamma above one": (["search=ppo", "search.gamma=1.5"], "search.gamma"),
    "ppo without a model": (["search=ppo", "cost_model=none"], "cost_model"),
    "csa without an uncertainty": (["search=csa", "cost_model=xgb"], "cost_model"),
    "adaptive micro-batch above runs": (["evaluator=adaptive", "evaluator.micro_batch=600"], "evaluator.micro_batch"),
    "adaptive minimum unreachable": (["evaluator=adaptive", "evaluator.min_batches=11"], "evaluator.min_batches"),
    "adaptive statistic": (["evaluator=adaptive", "evaluator.statistic=median"], "evaluator.statistic"),
    "adaptive threshold negative": (["evaluator=adaptive", "evaluator.cv_threshold=-0.1"], "evaluator.cv_threshold"),
    "rf acquisition": (["cost_model=rf", "cost_model.acquisition=ucb"], "cost_model.acquisition"),
    "rf no trees": (["cost_model=rf", "cost_model.n_estimators=0"], "cost_model.n_estimators"),
}


@pytest.mark.parametrize("overrides,key", REJECTED.values(), ids=REJECTED.keys())
def test_validate_names_the_key(compose_cfg, overrides, key):
    cfg = compose_cfg(*overrides)
    with pytest.raises(ConfigError, match=rf"(?m)^  {key}: "):
        validate(cfg, choices(cfg))


def test_validate_lists_every_problem_at_once(compose_cfg):
    cfg = compose_cfg("budget.trials=-3", "search.n_iter=abc", "+search.foo=1", "model.kind=lstm")
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    for key in ("budget.trials", "search.n_iter", "search.foo", "model.kind"):
        assert f"\n  {key}: " in str(error.value)


ACCEPTED = {
    "random without a model": ["search=random", "cost_model=none"],
    "sa fixed temperature": ["search.temp=0.5"],  # documented: one number holds it fixed
    "sa temperature schedule": ["search.temp=[2.0,0.5]"],
    "float hyperparameter given an int": ["cost_model.eta=1"],
    "float-annotated int default": ["cost_model.min_child_weight=0.5"],
    "no cache flush, several runs": ["evaluator.cache_flush=false", "evaluator.number=4"],
    "padding zero": ["model.padding=0"],
    "gemm shape": ["model=gemm", "model.M=8", "model.N=16", "model.K=4"],
    "time limit and early stop": ["budget.time_limit_s=0.5", "budget.early_stop=10"],
    "a whole model's minutes": ["model=resnet18", "budget.minutes=30"],
    "a single operator's minutes": ["budget.minutes=2.5"],
    "synthetic": ["hardware=synthetic", "tracking=none"],
    "network round robin": ["model=resnet18", "scheduler=round_robin", "budget.min_trials_per_task=0"],
    "chameleon as published in code": ["search=ppo", "sampler=kmeans", "search.clip=0.2", "search.entropy_coef=0.3",
                                       "sampler.k_step=8", "sampler.cluster_dims=2", "sampler.synthesis_pool=cluster"],
    "paper protocol budget": ["budget.trials_per_task=1000", "budget.rounds_per_task=16"],
    "ablation experiment": ["+experiment=chameleon_ablation_reduced"],
    "adatune": ["evaluator=adaptive", "cost_model=rf", "search=csa"],
    "adatune as published in code": ["evaluator=adaptive_code", "cost_model=rf", "search=csa"],
    "rfei with sa": ["cost_model=rf", "search=sa"],
    "adatune ablation experiment": ["+experiment=adatune_ablation_reduced"],
}


@pytest.mark.parametrize("overrides", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_validate_accepts(compose_cfg, overrides):
    cfg = compose_cfg(*overrides)
    validate(cfg, choices(cfg))


# ---- contracts over every YAML -------------------------------------------------------------
VALIDATED_GROUPS = ("evaluator", "hardware", "model", "tracking", "budget", "scheduler", "objective")
REQUIRED = {("model", "onnx"): ("model.path=pyproject.toml", "model.input_shape=[1,3,8,8]"),
            ("objective", "measurements_to_target"): ("objective.target_latency_us=100",),
            ("objective", "seconds_to_target"): ("objective.target_latency_us=100",),
            ("hardware", "replay"): ("hardware.store={store}",),
            ("hardware", "cuda"): ("hardware.arch=sm_90",)}


@pytest.mark.parametrize("group,option", [(g, o) for g in VALIDATED_GROUPS for o in options(g)])
def test_every_yaml_composes_and_validates(compose_cfg, tmp_path, group, option):
    store = connect_store(tmp_path / "store.sqlite")
    store.count()  # creates the file
    cfg = compose_cfg(f"{group}={option}", *(o.format(store=store.path) for o in REQUIRED.get((group, option), ())))
    assert choices(cfg)[group] == option
    validate(cfg, choices(cfg))


@pytest.mark.parametrize("option", [o for o in options("model") if OmegaConf.load(CONF / "model" / f"{o}.yaml").kind
                                    in ("gemm", "conv2d")])
def test_every_single_operator_model_builds_tasks(compose_cfg, option):
    cfg = compose_cfg(f"model={option}")
    tasks = build_tasks(cfg.model)
    assert tasks and all(t.flops > 0 and t.workload["op"] == cfg.model.kind for t in tasks)
    assert cfg.model.name == tasks[0].name
    assert SyntheticHardware().space(tasks[0]).size > 0


@pytest.mark.parametrize("group,option", [(g, o) for g in BASES for o in options(g)])
def test_every_component_instantiates_without_work(compose_cfg, tmp_path, group, option):
    cfg = compose_cfg(f"{group}={option}", *(o for o in REQUIRED.get((group, option), ()) if "{" not in o))
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    files_before = sorted(tmp_path.rglob("*"))

    component = instantiate(cfg[group])

    assert isinstance(component, BASES[group])
    assert {p.pid for p in psutil.Process().children(recursive=True)} == children_before, "a process was started"
    assert not multiprocessing.active_children()
    assert sorted(tmp_path.rglob("*")) == files_before, "the constructor wrote files"
    if group == "hardware" and hasattr(component, "runner"):
        assert component.runner.setup is None, "the runner was set up in __init__"
    if group == "tracking" and hasattr(component, "_client"):
        assert component._client is None, "the tracker opened its store in __init__"


def test_instantiating_everything_imports_no_tvm(tmp_path):
    """In a fresh interpreter: compose + instantiate every YAML of every group; TVM and Optuna stay unloaded."""
    script = f"""
import json, sys, psutil
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from tuning.config import register
register()
groups = {list(BASES)!r}
with initialize_config_dir(config_dir={str(CONF)!r}, version_base="1.3"):
    for group in groups:
        for option in {json.dumps({g: options(g) for g in BASES})}[group]:
            required = {json.dumps({f"{g}={o}": [r for r in v if "{" not in r] for (g, o), v in REQUIRED.items()})}
            cfg = compose("config", overrides=["output_dir=/nonexistent", *{searchpath_overrides()!r},
                                               f"{{group}}={{option}}", *required.get(f"{{group}}={{option}}", [])],
                          return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            instantiate(cfg[group])
print(json.dumps({{"tvm": sorted(m for m in sys.modules if m == "tvm" or m.startswith("tvm.")),
                  "optuna": "optuna" in sys.modules,  # the sweeper plugin loads it for a sweep only
                  "children": len(psutil.Process().children(recursive=True))}}))
"""
    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp_path / "outputs")}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"tvm": [], "optuna": False, "children": 0}
    assert not (tmp_path / "outputs").exists()


def test_budget_schema_is_typed(compose_cfg):
    """budget.* is a structured config: a wrong type fails at composition, naming the key."""
    with pytest.raises(Exception, match="budget.trials"):
        compose_cfg("budget.trials=abc")
    cfg = compose_cfg("budget.trials=12")
    assert cfg.budget.trials == 12 and OmegaConf.get_type(cfg.budget).__name__ == "BudgetSchema"


def test_a_whole_models_kernels_are_a_subset_named_by_the_models_own_names():
    from types import SimpleNamespace

    from tuning.engine.whole_model import only_kernels

    tasks = [SimpleNamespace(name=n) for n in ("conv_a", "conv_b", "dense")]
    assert only_kernels(tasks, None) == tasks
    assert [t.name for t in only_kernels(tasks, ["dense", "conv_a"])] == ["conv_a", "dense"]  # the model's order
    with pytest.raises(ConfigError, match=r"^model.kernels: conv_c is not a kernel of this model \(its kernels: "
                                          r"conv_a, conv_b, dense\)"):
        only_kernels(tasks, ["conv_c", "dense"])
