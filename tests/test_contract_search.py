"""Every search in conf/search/ (and in the directories of TUNELAB_CONF_DIRS) passes the shipped contract
suite (tuning.testing.search_contract): valid, distinct, unvisited, reproducible, resumable, never
measuring, its hyperparameters checked. The suite can fail: a search that proposes configs measured
already fails it, run by pytest from another folder. Then the repository's own tests of the space and
the helpers the searches share."""
from __future__ import annotations

import hydra.utils
import numpy as np
import pytest
from omegaconf import OmegaConf

from configs import group_yamls, load_option
from helpers import write_and_run
from tuning.core.task import conv2d_task, gemm_task
from tuning.hardware.synthetic import SyntheticHardware
from tuning.testing.search_contract import SearchContract
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


@pytest.fixture(params=SEARCH_YAMLS, ids=lambda p: p.stem)
def search_yaml(request):
    return request.param


class TestSearchOption(SearchContract):
    """The shipped suite, once per conf/search YAML (the test ids name the option)."""

    @pytest.fixture(autouse=True)
    def _option(self, search_yaml):
        self.path = search_yaml

    def make_search(self):
        return instantiate(self.path)


# ---- the suite can fail -------------------------------------------------------------------------------
BROKEN_SUITE = '''
from tuning.search.base import Search, fill_with_random
from tuning.testing.search_contract import SearchContract


class Fine(Search):
    ranges = {"default_plan_size": (1, None)}

    def __init__(self, default_plan_size: int = 8):
        self.default_plan_size = default_plan_size

    def propose(self, space, cost_model, n, visited, rng):
        return fill_with_random([], space, visited, n, rng)


class Revisits(Fine):
    """Half of every round from the configs measured already."""

    def propose(self, space, cost_model, n, visited, rng):
        return fill_with_random(sorted(visited)[:n // 2], space, set(), n, rng)


class TestFine(SearchContract):
    def make_search(self):
        return Fine()


class TestRevisits(SearchContract):
    def make_search(self):
        return Revisits()
'''


def test_the_suite_fails_a_search_that_proposes_visited_configs(tmp_path):
    """Run by pytest from another folder against the installed package: the search that follows the
    contract passes every test, the one that proposes measured configs fails the tests that ask."""
    run = write_and_run(tmp_path, "test_broken_search.py", BROKEN_SUITE)
    run.assert_failed_only_in("TestRevisits", "test_proposals_are_at_most_n_valid_distinct_and_unvisited",
                              says="measured already")
    assert len(run.passed_in("TestFine")) >= 8, run.output


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
