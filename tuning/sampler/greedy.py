"""sampler=greedy: AutoTVM XGBTuner's batch pick (top candidates, eps random), with its optional
diversity filter."""
from __future__ import annotations

import math

from tuning.sampler.base import Sampler, random_unvisited


class GreedySampler(Sampler):
    """Walk the candidates best first; each slot is a random config with probability eps.

    Hyperparameters:
        eps   chance that a slot takes a random unvisited config instead of the
              next candidate (0.05). AutoTVM's `ModelBasedTuner.next_batch` makes
              the last int(0.05 * plan_size) picks of each plan random; a
              per-slot coin gives the same expected share for any batch size.
        diversity_ratio  null (AutoTVM's default) or r >= 1: the search proposes r x plan
              size candidates and the b that cover the most distinct knob values are
              kept, in AutoTVM's greedy order (ModelBasedTuner with
              diversity_filter_ratio, `submodular_pick` with the scores zeroed);
              AdaTune §4.2.1 selects with this "diversity-aware cost function"

    A contextual search (search=csa) passes its eps_t as `exploration`, which replaces eps.
    When the candidates run out the remaining slots are random unvisited configs.
    """

    ranges = {"eps": (0.0, 1.0), "diversity_ratio": (1.0, None)}

    def __init__(self, eps: float = 0.05, diversity_ratio: float | None = None):
        self.eps = eps
        self.diversity_ratio = diversity_ratio

    def candidates_wanted(self, plan_size: int) -> int:
        return plan_size if self.diversity_ratio is None else math.ceil(plan_size * self.diversity_ratio)

    def select(self, candidates, space, visited, b, rng, exploration=None):
        eps = self.eps if exploration is None else exploration
        if self.diversity_ratio is not None:
            candidates = most_diverse(_new(candidates, space, visited), b)
        chosen: list = []
        taken: set = set()
        queue = iter(candidates)
        while len(chosen) < b:
            pick = None
            if rng.random() < eps:
                pick = random_unvisited(space, visited, chosen, rng)
            if pick is None:
                pick = _next_new(queue, space, visited, taken)
            if pick is None:
                pick = random_unvisited(space, visited, chosen, rng)
            if pick is None:  # nothing unvisited left that sampling can find
                break
            chosen.append(pick)
            taken.add(pick)
        return chosen


def _next_new(queue, space, visited, taken):
    """The next candidate whose canonical form is neither measured nor chosen."""
    for config in queue:
        canonical = space.canonical(config)
        if canonical not in visited and canonical not in taken:
            return canonical
    return None


def _new(candidates, space, visited) -> list:
    return list(dict.fromkeys(c for c in (space.canonical(c) for c in candidates) if c not in visited))


def most_diverse(configs: list, b: int) -> list:
    """AutoTVM's submodular_pick with zero scores: b configs, each the one adding the most knob values
    not yet covered (ties: the better-ranked, i.e. earlier, config)."""
    covered = [set() for _ in configs[0]] if configs else []
    remaining, picked = list(configs), []
    while remaining and len(picked) < b:
        gains = [sum(value not in seen for value, seen in zip(config, covered)) for config in remaining]
        best = remaining.pop(gains.index(max(gains)))
        picked.append(best)
        for value, seen in zip(best, covered):
            seen.add(value)
    return picked
