"""The sampler contract.

A sampler picks which candidates are measured this round.

    select(candidates, space, visited, b, rng, exploration=None) -> list of configs
        `candidates` come from the search, best first. Returns at most b
        configs that are canonical (space.canonical), distinct, and not in
        `visited`; fewer only when the space has no more unvisited configs it
        can find, or when the sampler is `adaptive` (it decides how many to
        measure, e.g. kmeans's knee; then at least one while any candidate
        is new). Samplers may add configs that are
        not candidates (random exploration, synthesis). Randomness only from
        `rng`. `exploration` is the search's wish for the share of random
        configs this round (search=csa's eps_t); a sampler with a random share
        uses it in place of its own, others ignore it.
    candidates_wanted(plan_size) -> int
        How many candidates the search should propose for a plan of `plan_size`
        (plan_size itself by default; a sampler that filters a longer list, e.g.
        greedy's diversity filter, asks for more).
    metrics() -> dict
        Numbers about the latest select, logged per round as sampler/<name>.

Capabilities a search may require (`requires = {"sampler": (...)}`):
    adaptive         decides how many to measure (1..b)
    candidates_only  measures only the search's candidates, adding none of its own

__init__ stores hyperparameters only; tuning/core/component.py says how they are checked.
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from tuning.core.component import Component

if TYPE_CHECKING:
    import numpy as np

    from tuning.core.space import Config, Space


class Sampler(Component):
    capabilities = {"adaptive": ("decides how many configs to measure", "kmeans"),
                    "candidates_only": ("measures only the search's own candidates", "all")}
    adaptive = False
    candidates_only = False

    @abstractmethod
    def select(self, candidates: Sequence[Config], space: Space, visited: Collection[Config], b: int,
               rng: np.random.Generator, exploration: float | None = None) -> list[Config]:
        """At most b canonical, distinct, unvisited configs."""

    def candidates_wanted(self, plan_size: int) -> int:
        return plan_size

    def measured_per_round(self, plan_size: int) -> tuple[int, int]:
        """The fewest and the most configs of a plan of `plan_size` a round measures (when the space
        and the candidates allow): a plan's worth, unless the sampler decides how many."""
        return plan_size, plan_size

    def metrics(self) -> dict[str, Any]:
        return {}


def take_unvisited(configs: Iterable[Sequence[int]], space: Space, visited: Collection[Config], chosen: list[Config],
                   limit: int) -> list[Config]:
    """Append canonical configs from `configs` that are new, until `chosen` holds `limit`."""
    seen = set(chosen)
    for config in configs:
        if len(chosen) >= limit:
            break
        canonical = space.canonical(config)
        if canonical not in visited and canonical not in seen:
            chosen.append(canonical)
            seen.add(canonical)
    return chosen


def random_unvisited(space: Space, visited: Collection[Config], chosen: Iterable[Config], rng: np.random.Generator,
                     tries: int = 1000) -> Config | None:
    """One canonical config not in visited/chosen, or None after `tries` draws."""
    taken = set(chosen)
    for _ in range(tries):
        canonical = space.canonical(space.sample(rng))
        if canonical not in visited and canonical not in taken:
            return canonical
    return None
