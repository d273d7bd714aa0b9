"""What a researcher meets in the first hour: whole-model budgets, conv2d shapes and batch_matmul,
names that say what ran, MLflow as a researcher reads it, the help text."""
from __future__ import annotations

import dataclasses
import logging
import math
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers import component, components
from tuning.config import ConfigError
from tuning.config.naming import run_name, sweep_name, workload_label
from tuning.core.outcome import TaskOutcome, task_table
from tuning.core.task import batch_matmul_task, build_tasks, conv2d_output_shape, conv2d_task, gemm_task
from tuning.engine.budget import (
    CANDIDATE_BUILD_S,
    DEFAULT_FIRST,
    DEFAULT_MODEL_MINUTES,
    DEFAULT_TRIALS,
    DEFAULT_TRIALS_PER_KERNEL,
    REMEASURE_S,
    TIMED_PLAN_SIZE,
    TIMED_TRIALS_PER_KERNEL,
    checks_estimate_s,
    even_share,
    resolve_budget,
    with_checks,
    with_plan_size,
)
from tuning.engine.final import headline_metrics
from tuning.engine.loop import RunInfo, tune_tasks
from tuning.engine.spec import BudgetSpec, JobSpec, ModelSpec
from tuning.engine.validate import validate
from tuning.scheduler.gradient import Gradient
from tuning.tracking.base import run_params

REPO = Path(__file__).resolve().parents[1]
KERNELS = [gemm_task(f"k{i}", 16 + 8 * i, 32, 16) for i in range(22)]  # ResNet-18 has 22 distinct kernels


# ---- whole-model budgets ----------------------------------------------------------------------
def test_even_share_by_hand():
    assert even_share(88, 22, 64) == 4  # `model=resnet18 budget.trials=88`
    assert even_share(64, 22, 64) == 2
    assert even_share(22 * 64, 22, 64) == 64  # enough for everyone: the minimum stands
    assert even_share(10, 1, 64) == 64  # one task shares with nobody


def test_small_budget_lowers_the_minimum_and_says_so(compose_cfg, caplog):
    cfg = compose_cfg("model=resnet18", "budget.trials=88")
    with caplog.at_level(logging.INFO, logger="tunelab"):
        plan = resolve_budget(BudgetSpec.of(cfg.budget), ModelSpec.of(cfg.model), KERNELS)
    assert plan.trials == 88 and plan.min_trials_per_task == 4
    assert "each gets 4 first" in caplog.text and "22 kernels" in caplog.text


def test_a_whole_models_default_budget_is_its_minutes_in_rounds_that_feed_every_kernel(compose_cfg):
    whole = compose_cfg("model=resnet18")
    assert whole.budget.trials is None and whole.budget.minutes is None
    plan = resolve_budget(BudgetSpec.of(whole.budget), ModelSpec.of(whole.model), KERNELS)
    assert plan.minutes == DEFAULT_MODEL_MINUTES and plan.trials == TIMED_TRIALS_PER_KERNEL * 22
    assert plan.min_trials_per_task is None  # one round: it waits for the plan size
    plan = with_plan_size(plan, 64, KERNELS, hardware=None)  # sa's, ppo's default plan of 64
    assert plan.plan_size == TIMED_PLAN_SIZE and plan.min_trials_per_task == TIMED_PLAN_SIZE
    assert plan.no_feedback(KERNELS) is None
    assert with_plan_size(resolve_budget(BudgetSpec.of(whole.budget), ModelSpec.of(whole.model), KERNELS), 5,
                          KERNELS, hardware=None).plan_size == 5  # gbfs's rounds of 5 stay as they are
    given = compose_cfg("model=resnet18", "budget.minutes=30", "budget.plan_size=48", "budget.min_trials_per_task=50")
    plan = with_plan_size(resolve_budget(BudgetSpec.of(given.budget), ModelSpec.of(given.model), KERNELS), 64,
                          KERNELS, hardware=None)
    assert (plan.minutes, plan.plan_size, plan.min_trials_per_task) == (30, 48, 50)  # what is given stands


def test_a_count_or_a_time_limit_keeps_a_whole_model_on_its_count(compose_cfg):
    for overrides, trials in ((["budget.trials=704"], 704), (["budget.trials_per_task=8"], 176),
                              (["budget.time_limit_s=600"], DEFAULT_TRIALS_PER_KERNEL * 22)):
        cfg = compose_cfg("model=resnet18", *overrides)
        plan = resolve_budget(BudgetSpec.of(cfg.budget), ModelSpec.of(cfg.model), KERNELS)
        assert plan.minutes is None and plan.trials == trials, overrides
        assert plan.min_trials_per_task == min(DEFAULT_FIRST, trials // 22)
        assert with_plan_size(plan, 64, KERNELS, hardware=None).plan_size == 64
    single = compose_cfg("model=gemm_64")
    plan = resolve_budget(BudgetSpec.of(single.budget), ModelSpec.of(single.model), build_tasks(single.model))
    assert plan.minutes is None and plan.trials == DEFAULT_TRIALS and plan.min_trials_per_task == DEFAULT_FIRST


def test_minutes_count_from_the_jobs_start_and_keep_the_checks_estimate(compose_cfg):
    cfg = compose_cfg("model=resnet18")
    plan = with_plan_size(resolve_budget(BudgetSpec.of(cfg.budget), ModelSpec.of(cfg.model), KERNELS), 64,
                          KERNELS, hardware=None)
    started = time.monotonic() - 30.0  # the model's import took 30 s
    timed = with_checks(plan, started, 150.0)
    assert timed.deadline() == pytest.approx(started + 15 * 60 - 150.0)
    assert "budget: 15 min in all (budget.minutes): tuning until " in timed.line(KERNELS)
    line = timed.line(KERNELS)
    assert "then about 2.5 min of checks" in line and "16 each first, up to 16 per round" in line
    counted = resolve_budget(BudgetSpec.of(compose_cfg("model=resnet18", "budget.trials=704").budget),
                             ModelSpec.of(cfg.model), KERNELS)
    assert with_checks(counted, started, 150.0) == counted  # no minutes: nothing to count down
    short = resolve_budget(BudgetSpec.of(compose_cfg("model=resnet18", "budget.minutes=3").budget),
                           ModelSpec.of(cfg.model), KERNELS)
    with pytest.raises(ConfigError, match=r"^budget.minutes=3 leaves \d+ s to tune after \d+ s of preparing"):
        with_checks(short, started, 150.0)


def test_the_checks_estimate_follows_what_the_checks_do(compose_cfg):
    e2e = JobSpec.from_cfg(compose_cfg("model=resnet18"), Path("run")).e2e
    heavy = [conv2d_task(f"c{i}", 1, 64, 56, 56, 64, 3, 1, 1, weight=2) for i in range(22)]
    full = checks_estimate_s(heavy, e2e, 3)
    # a single operator's: its finalists alone
    assert checks_estimate_s(heavy, None, 3) == pytest.approx(22 * 3 * REMEASURE_S)
    assert checks_estimate_s(heavy, dataclasses.replace(e2e, enabled=False), 3) == checks_estimate_s(heavy, None, 3)
    without_choice = checks_estimate_s(heavy, dataclasses.replace(e2e, in_model_kernels=0), 3)
    assert without_choice < full < checks_estimate_s(heavy, dataclasses.replace(e2e, in_model_processes=8), 3)
    assert full < checks_estimate_s([*heavy, *heavy], e2e, 3)  # a heavier model runs longer in every pass
    # a task the in-model choice reads is not re-measured alone: its candidates are built there instead
    one_more = checks_estimate_s(heavy, dataclasses.replace(e2e, in_model_kernels=e2e.in_model_kernels + 1), 3)
    assert one_more - full == pytest.approx(e2e.in_model_candidates * CANDIDATE_BUILD_S - 3 * REMEASURE_S)


def test_every_kernel_gets_its_share_before_the_scheduler(tmp_path):
    """88 measurements over 22 kernels: each is measured (4 each), none is left "inf"."""
    shared = components(search="random", sampler="all", cost_model="none")

    def components_for(index):
        return replace(shared, search=component("search", "random"), cost_model=component("cost_model", "none"))

    run = RunInfo(seed=0, out_dir=tmp_path, method="test", trials=88, plan_size=64,
                  min_trials_per_task=even_share(88, 22, 64))
    outcomes = tune_tasks(KERNELS, components_for, run, Gradient())
    assert run.progress.measured == 88
    assert [len(o.records) for o in outcomes] == [4] * 22
    assert all(math.isfinite(o.best_cost) for o in outcomes)


def test_task_table_names_untuned_kernels():
    tuned = TaskOutcome(KERNELS[0], records=[], best_cost=1e-4, best_config=(0,))
    untuned = TaskOutcome(KERNELS[1], records=[])
    table = task_table([tuned, untuned])
    assert "untuned" in table.splitlines()[2]  # listed first: it is where the budget went short
    assert "1 of 2 kernels untuned" in table and "inf" not in table.split("all tasks")[0]


def test_headline_metric_of_a_whole_model_is_its_flops_over_its_latency():
    a = TaskOutcome(gemm_task("a", 64, 64, 64, weight=2), records=[], best_cost=1e-3)
    b = TaskOutcome(gemm_task("b", 32, 32, 32), records=[], best_cost=2e-3)
    metrics = headline_metrics([a, b])
    assert metrics["best/final_latency_ms"] == pytest.approx(2 * 1.0 + 2.0)
    flops = 2 * a.task.flops + b.task.flops
    assert metrics["best/final_gflops"] == pytest.approx(flops / 4e-3 / 1e9)  # not the sum of per-kernel rates
    single = headline_metrics([a])
    assert single["best/final_latency_us"] == pytest.approx(1000.0) and single["best/final_gflops"] == a.best_gflops


# ---- shapes --------------------------------------------------------------------------------------
def test_depthwise_flops_are_one_channel_per_group():
    dense = conv2d_task("dense", 1, 144, 56, 56, 144, 3, 1, 1)
    depthwise = conv2d_task("dw", 1, 144, 56, 56, 144, 3, 1, 1, groups=144)
    assert dense.flops == 2 * 144 * 56 * 56 * 144 * 3 * 3
    assert depthwise.flops == dense.flops / 144 == 2 * 144 * 56 * 56 * 1 * 3 * 3


def test_per_axis_sizes_and_dilation_by_hand():
    task = conv2d_task("c", 2, 32, 56, 40, 64, [1, 7], [2, 1], [0, 3], dilation=[1, 2], groups=4)
    # height: (56 + 0 - 1*0 - 1) // 2 + 1 = 28; width: (40 + 6 - 2*6 - 1) // 1 + 1 = 34
    assert conv2d_output_shape(task.workload) == (28, 34)
    assert task.flops == 2 * 2 * 64 * 28 * 34 * (32 // 4) * 1 * 7
    assert batch_matmul_task("bmm", 12, 128, 128, 64).flops == 2 * 12 * 128 * 128 * 64


def test_default_shape_options_keep_the_old_task_keys():
    """Stored measurements are keyed by the workload: a square, ungrouped conv must not move."""
    old = {"op": "conv2d", "batch": 1, "in_channels": 256, "height": 14, "width": 14, "out_channels": 512,
           "kernel": 1, "stride": 2, "padding": 0, "dtype": "float32"}
    assert conv2d_task("l8", 1, 256, 14, 14, 512, 1, 2, 0).workload == old
    assert conv2d_task("l8", 1, 256, 14, 14, 512, [1, 1], [2, 2], [0, 0], groups=1, dilation=[1, 1]).workload == old


def test_conv2d_yaml_takes_the_new_keys(compose_cfg):
    cfg = compose_cfg("model=conv2d", "model.in_channels=144", "model.out_channels=144", "model.groups=144",
                      "model.kernel=[3,5]", "model.padding=[1,2]", "model.dilation=2")
    validate(cfg)
    [task] = build_tasks(cfg.model)
    assert task.workload["groups"] == 144 and task.workload["kernel"] == [3, 5]
    assert conv2d_output_shape(task.workload) == (54, 52)


@pytest.mark.parametrize("override, key", [
    (["model.groups=5"], "model.groups"),  # does not divide 64
    (["model.groups=0"], "model.groups"),
    (["model.kernel=[3,3,3]"], "model.kernel"),
    (["model.stride=[1,0]"], "model.stride"),
    (["model.dilation=30"], "model.kernel"),  # a dilated 3x3 spans 61 > 56 + 2
    (["model.padding=[-1,1]"], "model.padding"),
])
def test_bad_shapes_are_rejected_naming_the_key(compose_cfg, override, key):
    cfg = compose_cfg("model=conv2d", *override)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(cfg)


def test_batch_matmul_on_synthetic_hardware(compose_cfg):
    cfg = compose_cfg("model=batch_matmul", "hardware=synthetic")
    validate(cfg)
    [task] = build_tasks(cfg.model)
    space = component("hardware", "synthetic").space(task)
    assert {"tile.b", "tile.i", "tile.j", "tile.k"} <= {k.name.split(":")[-1] for k in space.knobs}


# ---- names ----------------------------------------------------------------------------------------
def _model(**model):
    return OmegaConf.create({"model": model, "seed": 3})


def test_run_names_carry_the_shape_and_non_default_hardware():
    gemm = _model(name="gemm", kind="gemm", M=512, N=256, K=128)
    assert run_name(gemm, {"search": "sa", "sampler": "greedy", "hardware": "cpu"}) == "gemm-512x256x128-sa-greedy-3"
    assert run_name(gemm, {"search": "sa", "sampler": "greedy", "hardware": "synthetic"}) == \
        "gemm-512x256x128-sa-greedy-synthetic-3"
    other = _model(name="gemm", kind="gemm", M=64, N=64, K=64)
    assert run_name(other, {"search": "sa", "sampler": "greedy"}) != run_name(gemm, {"search": "sa", "sampler": "greedy"})
    depthwise = _model(name="conv2d", kind="conv2d", in_channels=144, height=56, width=56, out_channels=144,
                       kernel=3, stride=1, padding=1, groups=144, dilation=1)
    assert workload_label(depthwise.model) == "conv2d-144x56x56-144-k3s1p1g144"
    assert workload_label(_model(name="conv_l8", kind="conv2d").model) == "conv_l8"
    onnx = _model(name="onnx", kind="onnx", path="/data/models/mynet.onnx", input_shape=[1, 3, 224, 224])
    assert workload_label(onnx.model) == "onnx-mynet"


def test_sweep_parent_is_named_after_the_sweep(tmp_path):
    sweep = tmp_path / "2026-11-24" / "18-56-29-000000"
    sweep.mkdir(parents=True)
    assert sweep_name(sweep) == "2026-11-24/18-56-29-000000"  # no multirun.yaml: the time alone
    saved = {"hydra": {"runtime": {"choices": {"experiment": "gemm_tiling", "model": "gemm_1024"}},
                       "overrides": {"task": ["+experiment=gemm_tiling"]}}}
    (sweep / "multirun.yaml").write_text(OmegaConf.to_yaml(saved))
    assert sweep_name(sweep) == "gemm_tiling 2026-11-24/18-56-29-000000"
    saved["hydra"]["runtime"]["choices"] = {"experiment": None}
    saved["hydra"]["overrides"]["task"] = ["seed=0,1,2", "search=sa,ppo", "model=gemm_64", "model.kernel=[1,7]"]
    (sweep / "multirun.yaml").write_text(OmegaConf.to_yaml(saved))
    assert sweep_name(sweep) == "sweep seed x search 2026-11-24/18-56-29-000000"


def test_paths_are_tags_not_params():
    params, tags = run_params({"output_dir": "/tmp/run", "resume": None, "seed": 0,
                               "tracking": {"uri": "sqlite:////x/mlflow.db", "experiment": "e"},
                               "hardware": {"store": "stores/a.sqlite", "reuse": True}})
    assert set(params) == {"seed", "tracking.experiment", "hardware.reuse"}
    assert tags == {"tunelab.output_dir": "/tmp/run", "tunelab.tracking.uri": "sqlite:////x/mlflow.db",
                    "tunelab.hardware.store": "stores/a.sqlite"}


# ---- the command line -----------------------------------------------------------------------------
def test_help_describes_every_group():
    done = subprocess.run([sys.executable, "run.py", "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    for group in ("model", "search", "sampler", "cost_model", "evaluator", "hardware", "budget", "scheduler",
                  "tracking", "objective", "experiment"):
        assert f"\n  {group} " in done.stdout, group
    assert "Powered by Hydra" not in done.stdout


def test_experiment_without_plus_is_added(tmp_path):
    done = subprocess.run([sys.executable, "run.py", "experiment=chameleon_ablation_reduced", "--cfg", "job"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_estimate_comes_once_after_the_first_round(tmp_path, caplog):
    from tuning.engine.callbacks import Pace

    parts = components(search="random", sampler="all", cost_model="none", hardware_overrides={"delay_s": 0.01})
    run = RunInfo(seed=0, out_dir=tmp_path, method="test", trials=32, plan_size=8,
                  callbacks=[Pace(kernels=22, e2e_timing_s=30, finalists=3)])
    with caplog.at_level(logging.INFO, logger="tunelab"):
        tune_tasks([KERNELS[0]], lambda _: parts, run, Gradient())
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("estimate:")]
    assert "x 24 to go" in line and "re-measuring the best" in line and "for the end-to-end check" in line
    seconds_per = float(line.split("(")[1].split(" s per")[0])
    assert 0.01 <= seconds_per < 1.0  # 8 measurements of >= 10 ms each in the first round


def test_under_a_deadline_the_estimate_is_what_the_time_allows_and_says_when_it_is_short(tmp_path, caplog):
    from tuning.engine.callbacks import Pace

    shared = components(search="random", sampler="all", cost_model="none", hardware_overrides={"delay_s": 0.01})

    def components_for(index):
        return replace(shared, search=component("search", "random"), cost_model=component("cost_model", "none"))

    run = RunInfo(seed=0, out_dir=tmp_path, method="test", trials=10_000, plan_size=8, min_trials_per_task=8,
                  deadline=time.monotonic() + 0.5, callbacks=[Pace(tasks=22)])
    with caplog.at_level(logging.INFO, logger="tunelab"):
        tune_tasks(KERNELS, components_for, run, Gradient())
    said = [r.getMessage() for r in caplog.records]
    [line] = [m for m in said if m.startswith("estimate:")]
    assert "more measurements in the" in line and "of tuning left" in line, line
    [warning] = [m for m in said if m.startswith("warning: at this pace")]
    assert "fewer than every kernel's first 8 (176)" in warning  # 22 kernels x 8 cannot all be measured in 0.5 s
    assert run.progress.measured < 176
