"""sampler=greedy: AutoTVM XGBTuner's batch pick (top candidates, eps random)."""
from __future__ import annotations

from tuning.sampler.base import Sampler, random_unvisited


class GreedySampler(Sampler):
    """Walk the candidates best first; each slot is a random config with probability eps.

    Hyperparameters:
        eps   chance that a slot takes a random unvisited config instead of the
              next candidate (0.05). AutoTVM's `ModelBasedTuner.next_batch` makes
              the last int(0.05 * plan_size) picks of each plan random; a
              per-slot coin gives the same expected share for any batch size.

    A contextual search (search=csa) passes its eps_t as `exploration`, which replaces eps.
    When the candidates run out the remaining slots are random unvisited configs.
    """

    ranges = {"eps": (0.0, 1.0)}

    def __init__(self, eps: float = 0.05):
        self.eps = eps

    def select(self, candidates, space, visited, b, rng, exploration=None):
        eps = self.eps if exploration is None else exploration
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
