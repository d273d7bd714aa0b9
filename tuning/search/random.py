"""search=random: uniform random configs, the baseline every method must beat."""
from __future__ import annotations

from tuning.sampler.base import random_unvisited
from tuning.search.base import Search


class RandomSearch(Search):
    """Propose n distinct random configs that have not been measured.

    Hyperparameters:
        default_plan_size   configs measured per round unless budget.plan_size says
                            otherwise (AutoTVM's 64); the search proposes whatever n it is asked.
    """

    ranges = {"default_plan_size": (1, None)}
    affords_program_features = True  # scores nothing: the model is only fit on what was measured

    def __init__(self, default_plan_size: int = 64):
        self.default_plan_size = default_plan_size

    def propose(self, space, cost_model, n, visited, rng):
        proposals: list = []
        while len(proposals) < n:
            config = random_unvisited(space, visited, proposals, rng)
            if config is None:  # the space (as far as sampling finds) is used up
                break
            proposals.append(config)
        return proposals
