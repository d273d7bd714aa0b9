"""tuning/engine/run.py orchestrates and nothing more: it stays short, the budget is resolved into a frozen
plan without editing the config, the store wiring returns new hardware instead of changing the
given one, and the loop's RunInfo is a frozen plan beside a mutable Progress."""
from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tuning.core.task import build_tasks, gemm_task

REPO = Path(__file__).resolve().parents[1]
KERNELS = [gemm_task(f"k{i}", 16 + 8 * i, 32, 16) for i in range(22)]


# ---- structure ---------------------------------------------------------------------------------
def test_run_py_is_short_and_its_run_fits_on_a_screen():
    from tuning.engine import run

    assert len((REPO / "tuning" / "engine" / "run.py").read_text().splitlines()) < 250
    lines, _ = inspect.getsourcelines(run._run)
    assert len(lines) <= 40, f"_run is {len(lines)} lines"


def test_no_module_in_tuning_imports_hydra_plugins():
    importers = []
    for path in sorted((REPO / "tuning").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name == "hydra_plugins" or name.startswith("hydra_plugins.") for name in names):
                importers.append(str(path.relative_to(REPO)))
    assert importers == []


# ---- the budget ------------------------------------------------------------------------------------
def test_budget_resolution_leaves_the_config_alone_and_gives_a_frozen_plan(compose_cfg):
    from tuning.engine.budget import DEFAULT_TRIALS_PER_KERNEL, resolve_budget
    from tuning.engine.spec import JobSpec

    cfg = compose_cfg("model=resnet18", "budget.time_limit_s=3600")
    before = OmegaConf.to_container(cfg.budget)
    job = JobSpec.from_cfg(cfg, Path("run"))
    first, second = resolve_budget(job.budget, job.model, KERNELS), resolve_budget(job.budget, job.model, KERNELS)
    assert first == second and first.trials == DEFAULT_TRIALS_PER_KERNEL * 22
    assert first.min_trials_per_task == DEFAULT_TRIALS_PER_KERNEL  # 704 cannot give 22 kernels 64 each
    assert OmegaConf.to_container(cfg.budget) == before and cfg.budget.trials is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.trials = 1


def test_the_applied_copy_holds_the_numbers_used(compose_cfg):
    from tuning.engine.budget import resolve_budget, with_plan_size
    from tuning.engine.spec import JobSpec
    from tuning.hardware.synthetic import SyntheticHardware

    cfg = compose_cfg("model=gemm_64", "budget.trials_per_task=40")
    tasks = build_tasks(cfg.model)
    job = JobSpec.from_cfg(cfg, Path("run"))
    plan = with_plan_size(resolve_budget(job.budget, job.model, tasks), 64, tasks, SyntheticHardware())
    applied = plan.applied(cfg)
    assert (applied.budget.trials, applied.budget.plan_size) == (40, 64)
    assert (cfg.budget.trials, cfg.budget.plan_size) == (None, None)
    assert with_plan_size(resolve_budget(job.budget, job.model, tasks), 64, tasks, SyntheticHardware()) == plan


# ---- the store wiring -----------------------------------------------------------------------------
def test_store_wiring_returns_new_hardware_and_leaves_the_given_one_as_it_was(tmp_path):
    from tuning.core.measure import MeasureSpec
    from tuning.engine.store_wiring import wire_store
    from tuning.hardware.replay import ReplayHardware
    from tuning.hardware.synthetic import SyntheticHardware

    given = SyntheticHardware(store=str(tmp_path / "store.sqlite"))
    hardware, writer = wire_store("store", given, MeasureSpec(repeat=3))
    assert isinstance(hardware, ReplayHardware) and hardware is not given
    assert given.reuse is False and writer.hardware is hardware
    writer.store.close()


# ---- the loop's run --------------------------------------------------------------------------------
def test_run_info_is_a_frozen_plan_with_a_mutable_progress(tmp_path):
    from tuning.engine.loop import Progress, RunInfo

    run = RunInfo(seed=0, out_dir=tmp_path, method="test", trials=8, plan_size=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.trials = 9
    run.progress.measured += 3
    assert run.progress == Progress(measured=3)
    assert RunInfo(seed=0, out_dir=tmp_path, method="test", trials=8, plan_size=4).progress.measured == 0


def test_one_plan_per_kernel_warns_only_where_the_sampler_surely_measures_the_whole_plan():
    from tuning.engine.budget import BudgetPlan
    from tuning.sampler.kmeans import KMeansSampler

    def notice(trials, per_round=None):
        return BudgetPlan(trials=trials, plan_size=64, min_trials_per_task=0).no_feedback(range(22), per_round)

    kmeans = KMeansSampler().measured_per_round(64)
    assert kmeans == (8, 63)
    assert notice(704).startswith("warning:") and "no measurement is fed back" in notice(704)  # a whole plan a round
    said = notice(704, kmeans)  # the headline's default: 32 a kernel, k-means measuring 8 to 63 of a plan
    assert not said.startswith("warning:") and "measures 8 to 63 configs of a plan" in said, said
    assert notice(176, kmeans).startswith("warning:")  # 8 a kernel: surely one round
    assert notice(22 * 63 + 1, kmeans) is None and notice(22 * 64 + 1) is None
