"""Contract of every sampler in conf/sampler/: at most b distinct, canonical, unvisited configs."""
from __future__ import annotations


import numpy as np
import pytest

from tuning.hardware.synthetic import synthetic_space
from tuning.core.space import Space
from tuning.core.task import conv2d_task, gemm_task

from configs import group_yamls, instantiate_option

SAMPLER_YAMLS = group_yamls("sampler")


def repairing_space(workload):
    """Like a TVM backend that repairs decisions: unroll choice 3 replays as choice 2."""
    base = synthetic_space(workload)
    unroll = len(base.knobs) - 1

    def canonicalize(config):
        return tuple(2 if i == unroll and c == 3 else c for i, c in enumerate(config))

    return Space(base.knobs, base.active, canonicalize)


SPACES = {
    "gemm64": lambda: synthetic_space(gemm_task("g", 64, 64, 64).workload),
    "conv": lambda: synthetic_space(conv2d_task("c", 1, 16, 14, 14, 32, 3, 1, 1).workload),
    "repairing": lambda: repairing_space(gemm_task("g", 64, 64, 64).workload),
}


def setting(space, seed=0, candidates=60, visited=30):
    """Raw candidates (some duplicates after canonicalisation) and a visited set overlapping them."""
    rng = np.random.default_rng(seed)
    cands = [space.sample(rng) for _ in range(candidates)]
    cands += cands[:5]  # repeated proposals
    last = len(space.knobs) - 1  # unroll: choices 2 and 3 are one schedule in the repairing space
    cands += [c[:last] + (unroll,) for c in cands[:10] for unroll in (2, 3)]
    seen = {space.canonical(c) for c in cands[:visited:2]}
    seen |= {space.canonical(space.sample(rng)) for _ in range(visited)}
    return cands, seen


def check(selected, space, visited, b):
    assert len(selected) <= b
    assert all(isinstance(c, tuple) and space.canonical(c) == c for c in selected)
    assert all(space.is_valid(c) for c in selected)
    assert len(set(selected)) == len(selected)
    assert not set(selected) & visited


@pytest.mark.parametrize("space_name", SPACES)
@pytest.mark.parametrize("path", SAMPLER_YAMLS, ids=lambda p: p.stem)
def test_distinct_canonical_unvisited_at_most_b(path, space_name):
    space = SPACES[space_name]()
    candidates, visited = setting(space)
    for b in (1, 8, 32, 200):
        selected = instantiate_option(path).select(candidates, space, visited, b, np.random.default_rng(0))
        check(selected, space, visited, b)


@pytest.mark.parametrize("space_name", SPACES)
@pytest.mark.parametrize("path", SAMPLER_YAMLS, ids=lambda p: p.stem)
def test_exactly_b_when_candidates_allow(path, space_name):
    space = SPACES[space_name]()
    candidates, visited = setting(space, candidates=200)
    new = {space.canonical(c) for c in candidates} - visited
    b = 32
    assert len(new) >= b
    sampler = instantiate_option(path)
    selected = sampler.select(candidates, space, visited, b, np.random.default_rng(0))
    check(selected, space, visited, b)
    if sampler.adaptive:
        assert 1 <= len(selected)
    else:
        assert len(selected) == b


@pytest.mark.parametrize("path", SAMPLER_YAMLS, ids=lambda p: p.stem)
def test_same_seed_same_selection(path):
    space = SPACES["repairing"]()
    candidates, visited = setting(space)
    first, second = (instantiate_option(path).select(candidates, space, visited, 32, np.random.default_rng(3))
                     for _ in range(2))
    assert first == second


@pytest.mark.parametrize("space_name", SPACES)
@pytest.mark.parametrize("path", SAMPLER_YAMLS, ids=lambda p: p.stem)
def test_never_returns_visited_even_if_all_candidates_are(path, space_name):
    space = SPACES[space_name]()
    candidates, _ = setting(space)
    visited = {space.canonical(c) for c in candidates}
    selected = instantiate_option(path).select(candidates, space, visited, 16, np.random.default_rng(0))
    check(selected, space, visited, 16)


@pytest.mark.parametrize("path", SAMPLER_YAMLS, ids=lambda p: p.stem)
def test_empty_candidates_and_zero_b(path):
    space = SPACES["gemm64"]()
    sampler = instantiate_option(path)
    assert sampler.select([], space, set(), 0, np.random.default_rng(0)) == []
    check(sampler.select([], space, set(), 4, np.random.default_rng(0)), space, set(), 4)
