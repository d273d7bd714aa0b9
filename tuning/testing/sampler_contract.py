"""The contract suite of a sampler (tuning/sampler/base.py), for pytest; no TVM import here.

A sampler passes it by subclassing `SamplerContract` in a test module and saying how to make one:

    from tuning.testing.sampler_contract import SamplerContract

    class TestMySampler(SamplerContract):
        def make_sampler(self):
            return MySampler(eps=0.1, seed=0)

It runs on synthetic spaces only (tuning/hardware/synthetic.py): a GEMM, a conv2d, and a GEMM whose
canonicalisation merges two unroll choices, as a TVM backend that repairs decisions does (`SPACES`;
`make_space(name)` may be overridden). Every test makes fresh samplers with `make_sampler()`.

What it checks: `select` returns at most b configs that are tuples, canonical, valid, distinct and
not visited, for b from 1 to more than the candidates; exactly b when the candidates allow (at least
one for an `adaptive` sampler); the same rng seed gives the same selection; nothing visited comes
back even when every candidate was visited; no candidates and b = 0 give an empty list, and no
candidates with b > 0 still keep the contract.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import numpy as np
import pytest

from tuning.core.space import Config, Space
from tuning.core.task import conv2d_task, gemm_task
from tuning.hardware.synthetic import synthetic_space
from tuning.sampler.base import Sampler


def repairing_space(workload) -> Space:
    """Like a TVM backend that repairs decisions: unroll choice 3 replays as choice 2."""
    base = synthetic_space(workload)
    unroll = len(base.knobs) - 1

    def canonicalize(config):
        return tuple(2 if i == unroll and c == 3 else c for i, c in enumerate(config))

    return Space(base.knobs, base.active, canonicalize)


SPACES: dict[str, Callable[[], Space]] = {
    "gemm64": lambda: synthetic_space(gemm_task("g", 64, 64, 64).workload),
    "conv": lambda: synthetic_space(conv2d_task("c", 1, 16, 14, 14, 32, 3, 1, 1).workload),
    "repairing": lambda: repairing_space(gemm_task("g", 64, 64, 64).workload),
}


def setting(space: Space, seed: int = 0, candidates: int = 60, visited: int = 30) -> tuple[list, set]:
    """Raw candidates (some duplicates after canonicalisation) and a visited set overlapping them."""
    rng = np.random.default_rng(seed)
    cands = [space.sample(rng) for _ in range(candidates)]
    cands += cands[:5]  # repeated proposals
    last = len(space.knobs) - 1  # unroll: choices 2 and 3 are one schedule in the repairing space
    cands += [c[:last] + (unroll,) for c in cands[:10] for unroll in (2, 3)]
    seen = {space.canonical(c) for c in cands[:visited:2]}
    seen |= {space.canonical(space.sample(rng)) for _ in range(visited)}
    return cands, seen


def check(selected: Sequence[Config], space: Space, visited: Collection[Config], b: int) -> None:
    """At most b tuples, canonical, valid, distinct and unvisited."""
    assert len(selected) <= b, f"{len(selected)} configs selected, asked for at most {b}"
    assert all(isinstance(c, tuple) and space.canonical(c) == c for c in selected), "a config not canonical"
    assert all(space.is_valid(c) for c in selected), "a config not valid in the space"
    assert len(set(selected)) == len(selected), "the same config selected twice"
    again = set(selected) & set(visited)
    assert not again, f"{len(again)} configs selected that were measured already: {sorted(again)[:3]}"


class SamplerContract:
    """Subclass it with `make_sampler()`; pytest collects the tests below."""

    def make_sampler(self) -> Sampler:
        raise NotImplementedError("a sampler's contract test says how to make one")

    def make_space(self, name: str) -> Space:
        return SPACES[name]()

    # ---- the contract ---------------------------------------------------------------------------
    def test_it_is_a_sampler(self):
        sampler = self.make_sampler()
        assert isinstance(sampler, Sampler)
        assert isinstance(sampler.adaptive, bool) and isinstance(sampler.candidates_only, bool)
        assert isinstance(sampler.candidates_wanted(16), int) and sampler.candidates_wanted(16) >= 16
        assert isinstance(sampler.metrics(), dict)

    @pytest.mark.parametrize("space_name", SPACES)
    def test_distinct_canonical_unvisited_at_most_b(self, space_name):
        space = self.make_space(space_name)
        candidates, visited = setting(space)
        for b in (1, 8, 32, 200):
            selected = self.make_sampler().select(candidates, space, visited, b, np.random.default_rng(0))
            check(selected, space, visited, b)

    @pytest.mark.parametrize("space_name", SPACES)
    def test_exactly_b_when_candidates_allow(self, space_name):
        space = self.make_space(space_name)
        candidates, visited = setting(space, candidates=200)
        new = {space.canonical(c) for c in candidates} - visited
        b = 32
        assert len(new) >= b
        sampler = self.make_sampler()
        selected = sampler.select(candidates, space, visited, b, np.random.default_rng(0))
        check(selected, space, visited, b)
        if sampler.adaptive:
            assert 1 <= len(selected)
        else:
            assert len(selected) == b, f"{len(selected)} configs selected of {b} asked, {len(new)} new candidates"

    def test_same_seed_same_selection(self):
        space = self.make_space("repairing")
        candidates, visited = setting(space)
        first, second = (self.make_sampler().select(candidates, space, visited, 32, np.random.default_rng(3))
                         for _ in range(2))
        assert first == second, "the same seed selected other configs"

    @pytest.mark.parametrize("space_name", SPACES)
    def test_never_returns_visited_even_if_all_candidates_are(self, space_name):
        space = self.make_space(space_name)
        candidates, _ = setting(space)
        visited = {space.canonical(c) for c in candidates}
        selected = self.make_sampler().select(candidates, space, visited, 16, np.random.default_rng(0))
        check(selected, space, visited, 16)

    def test_empty_candidates_and_zero_b(self):
        space = self.make_space("gemm64")
        sampler = self.make_sampler()
        assert sampler.select([], space, set(), 0, np.random.default_rng(0)) == []
        check(sampler.select([], space, set(), 4, np.random.default_rng(0)), space, set(), 4)
