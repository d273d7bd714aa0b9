"""search=random: uniform random configs, the baseline every method must beat."""
from __future__ import annotations

from tuning.sampler.base import random_unvisited
from tuning.search.base import Search


class RandomSearch(Search):
    """Propose n distinct random configs that have not been measured.

    Hyperparameters:
        plan_size   configs measured per round (AutoTVM's default 64); the loop
                    reads it, the search itself proposes whatever n it is asked.
    """

    ranges = {"plan_size": (1, None)}

    def __init__(self, plan_size: int = 64):
        self.plan_size = plan_size

    def propose(self, space, cost_model, n, visited, rng):
        proposals: list = []
        while len(proposals) < n:
            config = random_unvisited(space, visited, proposals, rng)
            if config is None:  # the space (as far as sampling finds) is used up
                break
            proposals.append(config)
        return proposals
