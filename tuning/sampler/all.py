"""sampler=all: measure exactly the search's own picks (for searches that choose their measurements)."""
from __future__ import annotations

from tuning.sampler.base import Sampler, take_unvisited


class AllSampler(Sampler):
    """The first b unvisited candidates, canonical and distinct, in the search's order.

    No hyperparameters. Adds nothing of its own: fewer than b candidates that
    are new means a smaller batch, because the search decided what to measure.
    """

    candidates_only = True

    def select(self, candidates, space, visited, b, rng, exploration=None):
        return take_unvisited(candidates, space, visited, [], b)
