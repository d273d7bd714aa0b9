"""search=random: uniform random configs, the baseline every method must beat.

With budget.trials=0 it schedules without measuring: each kernel gets a random legitimate schedule
(`best_of` 1), or, with a cost model that ranks (a pretrained cost_model=xgb_ms), the model's best
of `best_of` random configs: the zero-measurement baselines a learned scheduler is held against.
"""
from __future__ import annotations

import numpy as np

from tuning.core.component import Hyper
from tuning.sampler.base import random_unvisited
from tuning.search.base import Search, predict


class RandomSearch(Search):
    """Propose n distinct random configs that have not been measured."""

    hyperparameters = {
        "default_plan_size": Hyper(
            64, low=1, help="configs measured per round unless budget.plan_size says otherwise; the search "
            "proposes whatever n it is asked",
            cite="AutoTVM's plan size (Chameleon, Ahn et al. 2020, ICLR, Table 8: b_GBT = 64; docs/methods.md "
            "§AutoTVM); a run's budget.plan_size overrides it (null keeps 64)"),
        "best_of": Hyper(
            1, low=1, help="budget.trials=0 only: random configs drawn for each kernel, ranked by the cost model "
            "(which must rank configs when this is above 1); the first legitimate one in that order is applied",
            cite="tunelab's: 1 gives each kernel one random legitimate schedule; above 1 (with a cost model "
            "that ranks, e.g. a pretrained cost_model=xgb_ms), the model's best of that many random configs: "
            "the zero-measurement baselines of a learned scheduler"),
    }

    affords_program_features = True  # scores nothing: the model is only fit on what was measured
    schedules_without_measuring = True

    def __init__(self, default_plan_size: int = 64, best_of: int = 1):
        self.default_plan_size = default_plan_size
        self.best_of = best_of

    def propose(self, space, cost_model, n, visited, rng):
        proposals: list = []
        while len(proposals) < n:
            config = random_unvisited(space, visited, proposals, rng)
            if config is None:  # the space (as far as sampling finds) is used up
                break
            proposals.append(config)
        return proposals

    def best(self, space, cost_model, rng):
        """The first legitimate of `best_of` random configs, in the cost model's order (best first)
        when there are several; (config, None): nothing here predicts seconds."""
        drawn = self.propose(space, cost_model, self.best_of, set(), rng)
        if len(drawn) > 1:
            scores = predict(space, cost_model, drawn)
            drawn = [drawn[i] for i in np.argsort(-scores, kind="stable")]
        return next(((config, None) for config in drawn if space.is_legitimate(config)), None)
