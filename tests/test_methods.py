"""Behaviour of the AutoTVM pieces: SA finds what the model likes, the loop beats random."""
from __future__ import annotations

import json

import numpy as np

from tuning.core.measure import MeasureSpec
from tuning.core.task import gemm_task
from tuning.cost_model.none import NoCostModel
from tuning.cost_model.xgb import XGBoostCostModel
from tuning.hardware.synthetic import SyntheticHardware
from tuning.sampler.all import AllSampler
from tuning.sampler.greedy import GreedySampler
from tuning.search.random import RandomSearch
from tuning.search.sa import SimulatedAnnealing

HARDWARE = SyntheticHardware()
TASK = gemm_task("g", 1024, 1024, 1024)


def tune(search, sampler, cost_model, rounds, batch, seed):
    """A minimal tuning loop; returns the best measured GFLOP/s."""
    space, rng = HARDWARE.space(TASK), np.random.default_rng(seed)
    visited, configs, gflops = set(), [], []
    for _ in range(rounds):
        candidates = search.propose(space, cost_model, batch, visited, rng)
        chosen = sampler.select(candidates, space, visited, batch, rng)
        results = HARDWARE.measure(TASK, chosen, MeasureSpec())
        visited |= set(chosen)
        configs += chosen
        gflops += [r.gflops(TASK.flops) for r in results]
        cost_model.fit(space.features(configs), np.array(gflops))
        search.observe(chosen, results)
    assert len(configs) == rounds * batch == len(visited)
    return max(gflops)


def test_sa_finds_configs_the_model_rates_higher_than_random_picks():
    space, rng = HARDWARE.space(TASK), np.random.default_rng(0)
    configs = [space.sample(rng) for _ in range(64)]
    y = [r.gflops(TASK.flops) for r in HARDWARE.measure(TASK, configs, MeasureSpec())]
    model = XGBoostCostModel(seed=0).fit(space.features(configs), np.array(y))
    proposals = SimulatedAnnealing().propose(space, model, 64, set(configs), rng)
    random_picks = [space.sample(rng) for _ in range(64)]
    sa_scores = model.predict(space.features(proposals))
    random_scores = model.predict(space.features(random_picks))
    assert len(proposals) == 64 and not set(proposals) & set(configs)
    assert list(sa_scores) == sorted(sa_scores, reverse=True)  # best first
    assert sa_scores.max() > random_scores.max()
    assert sa_scores.mean() > random_scores.mean()


def test_sa_refinement_leads_with_the_models_best_neighbours_of_the_fastest_measured():
    space, rng = HARDWARE.space(TASK), np.random.default_rng(0)
    configs = [space.canonical(space.sample(rng)) for _ in range(64)]
    results = HARDWARE.measure(TASK, configs, MeasureSpec())
    model = XGBoostCostModel(seed=0).fit(space.features(configs), np.array([r.gflops(TASK.flops) for r in results]))
    search = SimulatedAnnealing(refine_share=0.25, refine_top=2)
    search.observe(configs, results)
    fastest = sorted(zip((r.cost for r in results), configs))[:2]
    assert search.fastest == [[cost, list(config)] for cost, config in fastest]
    proposals = search.propose(space, model, 16, set(configs), rng)
    assert search.metrics() == {"refined": 4}
    near = {space.canonical(c) for _, best in fastest for c in space.neighbors(best, SimulatedAnnealing.REFINE_MOVES)}
    unvisited = sorted(near - set(configs))
    scores = dict(zip(unvisited, model.predict(space.features(unvisited))))
    assert set(proposals[:4]) <= near and [scores[c] for c in proposals[:4]] == sorted(scores.values(), reverse=True)[:4]
    assert len(set(proposals)) == 16 and not set(proposals) & set(configs)
    again = SimulatedAnnealing(refine_share=0.25, refine_top=2)
    again.load_state_dict(json.loads(json.dumps(search.state_dict())))  # resumed from the run's state file
    assert again.fastest == search.fastest


def test_sa_greedy_xgb_beats_random_search_at_equal_budget():
    budget = {"rounds": 5, "batch": 32, "seed": 0}
    autotvm = tune(SimulatedAnnealing(), GreedySampler(), XGBoostCostModel(seed=0), **budget)
    random = tune(RandomSearch(), AllSampler(), NoCostModel(), **budget)
    assert autotvm > random


def test_greedy_without_eps_takes_top_b_unvisited_in_order():
    space, rng = HARDWARE.space(TASK), np.random.default_rng(0)
    candidates = [space.sample(rng) for _ in range(40)]
    visited = {candidates[0], candidates[3], candidates[10]}
    candidates.insert(5, candidates[2])  # a repeated candidate is taken once
    expected = [c for c in dict.fromkeys(candidates) if c not in visited][:16]
    assert GreedySampler(eps=0.0).select(candidates, space, visited, 16, rng) == expected


def test_greedy_eps_share_of_random_picks():
    space, rng = HARDWARE.space(TASK), np.random.default_rng(0)
    candidates = [space.sample(rng) for _ in range(2000)]
    picks = GreedySampler(eps=0.25).select(candidates, space, set(), 1000, rng)
    outside = sum(1 for c in picks if c not in set(candidates[:1000]))
    assert 150 < outside < 350  # ~25% of slots go to random configs
