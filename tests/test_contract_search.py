"""Contract of every search in conf/search/: valid, distinct, reproducible, resumable."""
from __future__ import annotations

import json

import hydra.utils
import numpy as np
import pytest
from omegaconf import OmegaConf

from tuning.cost_model.none import NoCostModel
from tuning.cost_model.rf import RandomForestCostModel
from tuning.cost_model.xgb import XGBoostCostModel
from tuning.core.measure import MeasureSpec
from tuning.hardware.synthetic import SyntheticHardware
from tuning.core.task import conv2d_task, gemm_task

from configs import group_yamls, load_option
from value_models import shared_value_model

SEARCH_YAMLS = group_yamls("search")
TASKS = {"gemm64": gemm_task("g", 64, 64, 64), "conv": conv2d_task("c", 1, 16, 14, 14, 32, 3, 1, 1)}
HARDWARE = SyntheticHardware()


def instantiate(path):
    """The YAML under a root that has the top-level `seed` its interpolations use; a search that needs
    a registered value function (search=value) gets a small one."""
    node = load_option(path)
    if "model" in node and node.model is None:  # search=value's registered V
        node.model, node.registry = shared_value_model()
    return hydra.utils.instantiate(OmegaConf.create({"seed": 0, "node": node}).node)


def fitted(model, task, samples=64, seed=0):
    space = HARDWARE.space(task)
    rng = np.random.default_rng(seed)
    configs = [space.sample(rng) for _ in range(samples)]
    y = [r.gflops(task.flops) for r in HARDWARE.measure(task, configs, MeasureSpec())]
    return model.fit(space.features(configs), np.array(y))


class _Models:
    """Per task, a fitted xgb, or a fitted rf for searches that need an uncertainty."""

    def __init__(self):
        self.xgb = {name: fitted(XGBoostCostModel(), task) for name, task in TASKS.items()}
        self.rf = {name: fitted(RandomForestCostModel(), task) for name, task in TASKS.items()}

    def for_search(self, path):
        return self.rf if instantiate(path).needs("cost_model", "has_uncertainty") else self.xgb


@pytest.fixture(scope="module")
def models():
    return _Models()


def visited_of(space, count=20, seed=99):
    rng = np.random.default_rng(seed)
    return {space.canonical(space.sample(rng)) for _ in range(count)}


def one_round(search, task, model, n, visited, rng):
    """propose, 'measure' the proposals, observe them; returns the proposals."""
    space = HARDWARE.space(task)
    proposals = search.propose(space, model, n, visited, rng)
    batch = [space.canonical(c) for c in proposals if space.canonical(c) not in visited]
    search.observe(batch, HARDWARE.measure(task, batch, MeasureSpec()))
    visited |= set(batch)
    return proposals


@pytest.mark.parametrize("path", SEARCH_YAMLS, ids=lambda p: p.stem)
def test_yaml_instantiates_and_has_default_plan_size(path):
    search = instantiate(path)
    assert isinstance(search.default_plan_size, int) and search.default_plan_size > 0
    assert all(isinstance(c, str) for needs in search.requires.values() for c in needs)


@pytest.mark.parametrize("task_name", TASKS)
@pytest.mark.parametrize("path", SEARCH_YAMLS, ids=lambda p: p.stem)
def test_proposals_valid_distinct_at_most_n(path, task_name, models):
    task, n = TASKS[task_name], 16
    space = HARDWARE.space(task)
    search = instantiate(path)
    proposals = search.propose(space, models.for_search(path)[task_name], n, visited_of(space), np.random.default_rng(0))
    assert 0 < len(proposals) <= n
    assert all(space.is_valid(tuple(c)) for c in proposals)
    assert len({space.canonical(c) for c in proposals}) == len(proposals)


@pytest.mark.parametrize("path", SEARCH_YAMLS, ids=lambda p: p.stem)
def test_searches_without_model_run_on_none(path):
    search = instantiate(path)
    if search.needs("cost_model", "can_rank"):
        pytest.skip("needs a cost model; config validation rejects cost_model=none")
    space = HARDWARE.space(TASKS["gemm64"])
    proposals = search.propose(space, NoCostModel(), 8, set(), np.random.default_rng(0))
    assert 0 < len(proposals) <= 8 and all(space.is_valid(tuple(c)) for c in proposals)


@pytest.mark.parametrize("task_name", TASKS)
@pytest.mark.parametrize("path", SEARCH_YAMLS, ids=lambda p: p.stem)
def test_same_seed_same_proposals(path, task_name, models):
    task = TASKS[task_name]
    runs = []
    for _ in range(2):
        search, rng, visited = instantiate(path), np.random.default_rng(7), set()
        runs.append([one_round(search, task, models.for_search(path)[task_name], 16, visited, rng)
                     for _ in range(2)])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("path", SEARCH_YAMLS, ids=lambda p: p.stem)
def test_state_dict_round_trip_resumes(path, models):
    """A fresh instance loaded from the JSON state proposes what the original would."""
    task, model = TASKS["gemm64"], models.for_search(path)["gemm64"]
    original, visited = instantiate(path), set()
    one_round(original, task, model, 16, visited, np.random.default_rng(1))
    state = json.loads(json.dumps(original.state_dict()))
    resumed = instantiate(path)
    resumed.load_state_dict(state)
    space = HARDWARE.space(task)
    expected = original.propose(space, model, 16, set(visited), np.random.default_rng(2))
    assert resumed.propose(space, model, 16, set(visited), np.random.default_rng(2)) == expected
    json.dumps(resumed.state_dict())


@pytest.mark.parametrize("task_name", TASKS)
def test_feature_table_matches_knob_definition(task_name):
    """Space.features uses per-slot lookup tables; it must equal Knob.feature cell by cell."""
    space = HARDWARE.space(TASKS[task_name])
    rng = np.random.default_rng(0)
    configs = [space.sample(rng) for _ in range(300)]
    features = space.features(configs)
    for row, config in zip(features, configs):
        expected = np.zeros(space.feature_width, dtype=np.float32)
        expected[config[0]] = 1.0
        col = space.num_sketches
        for i, knob in enumerate(space.knobs[1:], start=1):
            if i in space.active[config[0]]:
                expected[col:col + knob.feature_width] = knob.feature(config[i])
            col += knob.feature_width
        assert row.tobytes() == expected.tobytes()
    assert space.features([]).shape == (0, space.feature_width)


def test_enumerate_lists_every_valid_config_once():
    space = HARDWARE.space(gemm_task("small", 4, 2, 2))
    every = list(space.enumerate())
    assert len(every) == len(set(every)) == space.size
    assert all(space.is_valid(c) for c in every)
    rng = np.random.default_rng(0)
    assert {space.sample(rng) for _ in range(2000)} <= set(every)


def test_topn_prefetch_changes_nothing_and_looks_up_only_what_offer_would():
    """SA canonicalises a walk's candidates in batches (TopN.prefetch) before offering them: the heap
    must end the same, and the batch must hold only configs the offers look up anyway (none wasted).
    The canonicalisation here merges configs, as TVM's compute-location repair does."""
    from tuning.search.base import TopN

    looked_up, batched = [], []

    def space_with_collisions():
        base = HARDWARE.space(TASKS["conv"])
        merge = lambda config: (*config[:-1], config[-1] - config[-1] % 3)  # noqa: E731
        def one(config):
            looked_up.append(config)
            return merge(config)
        def many(configs):
            batched.extend(configs)
            return [merge(c) for c in configs]
        return type(base)(base.knobs, base.active, canonicalize=one, canonicalize_many=many)

    for seed in range(5):
        rng = np.random.default_rng(seed)
        offers = []
        for _ in range(40):
            configs = [HARDWARE.space(TASKS["conv"]).sample(rng) for _ in range(16)]
            offers.append((configs, rng.normal(size=len(configs)) + 0.05 * len(offers)))
        offers.append((offers[5][0], offers[5][1] - 1.0))  # configs offered again, lower
        visited = {offers[0][0][0]}
        results = []
        for prefetching in (False, True):
            looked_up.clear(), batched.clear()
            top = TopN(space_with_collisions(), visited, 24)
            for start in range(0, len(offers), 8):
                chunk = offers[start:start + 8]
                if prefetching and start:
                    top.prefetch(chunk)
                for configs, scores in chunk:
                    for config, score in zip(configs, scores):  # one by one: offer's own batch stays out
                        top.offer([config], [score])
            results.append((top.sorted_configs(), set(looked_up)))
        assert results[1][0] == results[0][0]
        assert batched and set(batched) <= results[0][1]


@pytest.mark.parametrize("visited_share", [0.0, 0.5, 0.97, 1.0])
def test_fill_with_random_is_slot_by_slot_filling_in_batches(visited_share):
    """The batched fill keeps the configs, in the order, that filling slot by slot with
    random_unvisited keeps, and leaves the rng where that leaves it (also when draws run out)."""
    from tuning.sampler.base import random_unvisited
    from tuning.search.base import fill_with_random

    space = HARDWARE.space(gemm_task("small", 8, 4, 4))
    every = list(space.enumerate())
    picker = np.random.default_rng(7)
    visited = {c for c in every if picker.random() < visited_share}
    start = [c for c in every if c not in visited][:2]

    def slot_by_slot(rng, n, tries):
        proposals, keys = list(start), [space.canonical(c) for c in start]
        while len(proposals) < n:
            config = random_unvisited(space, visited, keys, rng, tries=tries)
            if config is None:
                break
            proposals.append(config), keys.append(config)
        return proposals

    for n, tries in ((16, 1000), (len(every), 1000), (40, 30)):
        expected_rng, rng = np.random.default_rng(3), np.random.default_rng(3)
        assert fill_with_random(start, space, visited, n, rng, tries=tries) == slot_by_slot(expected_rng, n, tries)
        assert rng.random() == expected_rng.random()
