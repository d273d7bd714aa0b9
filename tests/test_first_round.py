"""A prior's first round (tuning/engine/first_round.py, `tuning.prior`): each task's first round is the
prior's best of a random pool, the rounds after it the method's own; on the synthetic hardware with a
stand-in prior (the real one reads TVM's per-store features)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from helpers import component, components
from tuning.core.task import gemm_task
from tuning.engine.first_round import POOL, guided_round
from tuning.engine.loop import RunInfo, tune_tasks
from tuning.scheduler.gradient import Gradient

TASKS = [gemm_task(f"g{i}", 32 + 16 * i, 64, 32) for i in range(3)]


class FirstKnobHigh:
    """Scores a config by its first knob's index: the prior "knows" that a high first knob is fast."""

    def __init__(self, applies: bool = True):
        self.asked: list[int] = []
        self._applies = applies

    def applies(self, space) -> bool:
        return self._applies

    def scores(self, space, configs):
        self.asked.append(len(configs))
        return np.array([float(config[0]) + 1e-3 * float(config[-1]) for config in configs])


def test_the_first_round_is_the_priors_best_of_a_pool_of_the_round_times_pool():
    hardware = component("hardware", "synthetic")
    space = hardware.space(TASKS[0])
    prior = FirstKnobHigh()
    picked = guided_round(prior, space, set(), [], 8, np.random.default_rng(0))
    assert prior.asked == [8 * POOL] and len(set(picked)) == 8
    again = guided_round(FirstKnobHigh(), space, set(), [], 8, np.random.default_rng(0))
    assert again == picked  # the task's own generator decides the pool: the same on a resume
    rng = np.random.default_rng(1)
    unguided = [space.canonical(space.sample(rng)) for _ in range(64)]
    assert np.mean([config[0] for config in picked]) > np.mean([config[0] for config in unguided])


def tune(out_dir, prior, init_random: int = 0):
    out_dir.mkdir(parents=True)
    shared = components(search="random", sampler="all", cost_model="none")

    def components_for(index):
        return replace(shared, search=component("search", "random"), cost_model=component("cost_model", "none"))

    run = RunInfo(seed=0, out_dir=out_dir, method="test", trials=48, plan_size=8, min_trials_per_task=16,
                  init_random=init_random, first_round_prior=prior)
    return tune_tasks(TASKS, components_for, run, Gradient())


def test_only_each_tasks_first_round_comes_from_the_prior(tmp_path):
    prior = FirstKnobHigh()
    outcomes = tune(tmp_path / "with", prior)
    assert prior.asked == [8 * POOL] * len(TASKS)  # once a task, for its first round only
    for outcome in outcomes:
        rounds = {r.round for r in outcome.records}
        assert rounds == {0, 1}  # 16 first measurements in rounds of 8
        first = [tuple(r.config) for r in outcome.records if r.round == 0]
        later = [tuple(r.config) for r in outcome.records if r.round == 1]
        assert np.mean([c[0] for c in first]) > np.mean([c[0] for c in later])  # the prior's picks lean its way


def test_a_prior_that_does_not_apply_or_a_common_first_round_changes_what_it_should(tmp_path):
    idle = FirstKnobHigh(applies=False)
    without = tune(tmp_path / "none", None)
    assert [[tuple(r.config) for r in o.records] for o in tune(tmp_path / "idle", idle)] == \
        [[tuple(r.config) for r in o.records] for o in without]
    assert idle.asked == []
    prior = FirstKnobHigh()
    common = tune(tmp_path / "common", prior, init_random=3)
    assert prior.asked == [5 * POOL] * len(TASKS)  # the prior fills what the 3 common configs leave
    plain = tune(tmp_path / "plain", None, init_random=3)
    for guided, unguided in zip(common, plain):
        assert [tuple(r.config) for r in guided.records[:3]] == [tuple(r.config) for r in unguided.records[:3]]


def test_a_prior_that_cannot_be_read_is_refused_naming_the_key(compose_cfg, tmp_path, monkeypatch):
    from tuning.config import ConfigError
    from tuning.engine.validate import validate

    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "outputs"))
    cfg = compose_cfg("model=gemm_64", "hardware=synthetic", "tracking=none", "tuning.prior=models:/absent/1")
    with pytest.raises(ConfigError, match=r"(?m)^  tuning.prior: .*no registered model"):
        validate(cfg)


def test_auto_is_the_hardwares_default_prior_and_a_study_arm_has_none_unless_it_names_one(tmp_path):
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from tuning.engine.first_round import AUTO, resolved
    from tuning.hardware.cpu import CPUHardware
    from tuning.hardware.synthetic import SyntheticHardware
    from tuning.study.block import NO_PRIOR, arm_config
    from tuning.study.spec import study_spec

    assert resolved(AUTO, SyntheticHardware()) is None and resolved(AUTO, CPUHardware()) == "package:cpu"
    assert resolved(None, CPUHardware()) is None and resolved("models:/p/1", SyntheticHardware()) == "models:/p/1"
    assert resolved(AUTO, SimpleNamespace(default_prior="package:x")) == "package:x"
    spec = study_spec("s", OmegaConf.create({
        "arms": {"a": ["search=sa"], "b": ["search=sa", "tuning.prior=auto"]}, "tasks": ["gemm_64"],
        "common": ["hardware=synthetic"], "seeds": [0, 1], "budget": {"trials": 16, "plan_size": 8},
        "analysis": {"claims": [{"arm": "b", "baseline": "a", "kind": "difference"}], "min_blocks": 2}}))
    plain, named = (arm_config(spec, overrides, "gemm_64", 0, tmp_path / name) for name, overrides in spec.arms)
    assert NO_PRIOR == "tuning.prior=null" and plain.tuning.prior is None and named.tuning.prior == AUTO
