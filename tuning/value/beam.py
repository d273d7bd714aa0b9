"""Scheduling with a value function: the paper's Alg. 1 (greedy) and its beam search.

    beam_search(space, value, beam, prefix=(), noise=0.0, rng=None) -> [(V, config), ...] best first

From `prefix`, every state one decision longer is valued and the `beam` lowest-valued open prefixes are
kept; completed schedules met on the way are collected. beam=1 is Alg. 1: N x M values for N decisions
of M choices each, no measurement. `noise` is Alg. 2's epsilon: each value is multiplied by
exp(noise x N(0, 1)) before comparing, so repeated searches visit other good states.
`value(space, prefixes) -> array` is any function lower-is-better (ValueNet.value, or a test's).
"""
from __future__ import annotations

import numpy as np

from tuning.value.encoding import children, config_of, is_complete


def beam_search(space, value, beam: int = 1, prefix=(), noise: float = 0.0, rng=None) -> list[tuple[float, tuple]]:
    if beam < 1:
        raise ValueError(f"beam: expected >= 1, got {beam}")
    if noise and rng is None:
        raise ValueError("noise needs an rng (a seeded numpy Generator)")
    frontier, complete = [tuple(prefix)], []
    if is_complete(space, frontier[0]):
        return [(float(value(space, frontier)[0]), config_of(space, frontier[0]))]
    while frontier:
        candidates = [child for parent in frontier for child in children(space, parent)]
        scores = np.asarray(value(space, candidates), dtype=np.float64)
        if noise:
            scores = scores + noise * rng.standard_normal(len(scores)) / np.log(10)  # log10 values
        open_ = []
        for score, candidate in zip(scores, candidates):
            (complete if is_complete(space, candidate) else open_).append((float(score), candidate))
        open_.sort(key=lambda item: item[0])
        frontier = [candidate for _, candidate in open_[:beam]]
    complete.sort(key=lambda item: item[0])
    return [(score, config_of(space, prefix)) for score, prefix in complete]


def first_legitimate(space, found) -> tuple[float, tuple] | None:
    """The best (value, config) of `beam_search`'s list that schedules (the space's legitimacy check)."""
    return next(((score, config) for score, config in found if space.is_legitimate(config)), None)
