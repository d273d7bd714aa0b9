"""The search contract.

A search strategy proposes candidate configs each round; it never measures.

    propose(space, cost_model, n, visited, rng) -> list of configs
        At most n configs, valid in `space` (space.is_valid), distinct, none in
        `visited` (a set of canonical configs already measured; the sampler
        filters them too), best first by the strategy's own judgement.
        All randomness comes from `rng` (a numpy Generator seeded by the run).
        `cost_model` may be a model that cannot rank (cost_model=none);
        strategies that need one declare `requires = {"cost_model": ("can_rank",)}`
        and the config is rejected before any work.
    observe(configs, results)
        The configs measured this round (canonical) and their MeasureResults.
    state_dict() / load_state_dict(state)
        Everything needed to continue after a resume (JSON-serialisable).
    metrics() -> dict
        Numbers about the latest propose, logged per round as search/<name>.
    exploration() -> float | None
        The share of this round's batch the search wants drawn at random, for
        samplers with a random share (sampler=greedy's eps); None leaves the
        sampler's own. A contextual search (csa) sets it from its model's
        uncertainty, and requires a cost model that `has_uncertainty`.

A search that scores few enough candidates a round to schedule each one with TVM sets
`affords_program_features = True`; only those run with a cost model that reads per-store
features of the scheduled program (cost_model.features=per_store|both: ~3 ms a candidate on a
2-core host, so SA's ~64,000 scores a round would take minutes).

A search that can choose a schedule with no measurement at all (search=value: a learned value
function; search=random: a random legitimate schedule, or a pretrained cost model's pick of random
ones) sets `schedules_without_measuring = True` and implements
    best(space, cost_model, rng) -> (config, predicted seconds or None) | None
        Its choice for the task, legitimate in `space`; a run with budget.trials=0 applies it
        (config validation accepts 0 only for such a search). `rng` is seeded from the run's seed
        and the task; None for the seconds when the search predicts no time.

Every search takes a `default_plan_size` hyperparameter: configs measured per
round when `budget.plan_size` is null, its paper's value (cited in its declaration).
`n` above is the resolved plan size. A search that decides what is measured
itself requires a sampler that is `candidates_only` (sampler=all).

Hyperparameters are declared once, in the class's `hyperparameters` (tuning/core/component.py
`Hyper`: default, bounds or choices, source), from which the class gets its `ranges`, `options` and
docstring table; `check` adds cross-field rules. The option's YAML and `__init__` give the declared
defaults (tests/test_hyperparameters.py). __init__ stores hyperparameters only: no TVM, no I/O, no threads.

tuning.testing.search_contract ships the contract as a pytest suite (`SearchContract`).
"""
from __future__ import annotations

import heapq
from abc import abstractmethod
from typing import TYPE_CHECKING, Any

import numpy as np

from tuning.core.component import Component
from tuning.cost_model.base import model_input

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Sequence

    from tuning.core.records import MeasureResult
    from tuning.core.space import Config, Space
    from tuning.cost_model.base import CostModel

    Scores = np.ndarray | Sequence[float]  # one score per config, higher is better


class Search(Component):
    moved = {"plan_size": "budget.plan_size (null: the method's default, search.default_plan_size)"}
    default_plan_size: int
    affords_program_features = False
    schedules_without_measuring = False

    @abstractmethod
    def propose(self, space: Space, cost_model: CostModel, n: int, visited: set[Config],
                rng: np.random.Generator) -> list[Config]:
        """At most n valid, distinct configs, best first."""

    def observe(self, configs: Sequence[Config], results: Sequence[MeasureResult]) -> None:
        pass

    def best(self, space: Space, cost_model: CostModel, rng: np.random.Generator) -> tuple[Config, float | None] | None:
        """(config, predicted seconds or None) chosen without measuring; see `schedules_without_measuring`."""
        raise NotImplementedError(f"{type(self).__name__} does not schedule without measuring")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def metrics(self) -> dict[str, Any]:
        return {}

    def exploration(self) -> float | None:
        return None


# ---- helpers shared by the model-guided searches ------------------------------------------
def predict(space: Space, cost_model: CostModel, configs: Sequence[Config]) -> np.ndarray:
    return np.asarray(cost_model.predict(model_input(space, cost_model, configs)), dtype=np.float64)


class CachedScores:
    """The cost model's scores, each distinct config predicted once: within one propose the model
    does not change, and walkers keep landing on configs already scored. A small space (a
    store-restricted one) is scored whole up front. Exact: a prediction depends on its own row only."""

    PRIME_UP_TO = 4096  # configs: a space up to this size is scored whole, in one predict call

    def __init__(self, space: Space, cost_model: CostModel) -> None:
        self.space, self.cost_model = space, cost_model
        self.scores: dict[Config, float] = {}
        if space.size <= self.PRIME_UP_TO:
            every = list(space.enumerate())
            self.scores.update(zip(every, predict(space, cost_model, every).tolist()))

    def __call__(self, configs: np.ndarray | Sequence[Sequence[int]]) -> np.ndarray:
        keys = list(map(tuple, np.asarray(configs).tolist()))
        new = list({key: None for key in keys if key not in self.scores})
        if new:
            self.scores.update(zip(new, predict(self.space, self.cost_model, new).tolist()))
        return np.fromiter(map(self.scores.__getitem__, keys), dtype=np.float64, count=len(keys))


def fill_with_random(proposals: Iterable[Config], space: Space, visited: Collection[Config], n: int,
                     rng: np.random.Generator, tries: int = 1000) -> list[Config]:
    """Top up `proposals` to n with random unvisited configs (a walk may find fewer): random draws,
    canonical, each kept unless visited or taken, until n are held or `tries` draws in a row fail
    (sampler.base.random_unvisited, slot by slot). The draws are canonicalised in batches no larger
    than the draws that slot-by-slot filling is sure to make, so the same configs come out and the
    rng ends where it would."""
    proposals = list(proposals)
    taken = set(space.canonical_many(proposals))
    failures = 0
    while len(proposals) < n and failures < tries:
        draws = [space.sample(rng) for _ in range(min(n - len(proposals), tries - failures))]
        for canonical in space.canonical_many(draws):
            if canonical in visited or canonical in taken:
                failures += 1
            else:
                proposals.append(canonical)
                taken.add(canonical)
                failures = 0
    return proposals


class TopN:
    """Min-heap of the n best distinct (by canonical form) unvisited configs."""

    def __init__(self, space: Space, visited: Collection[Config], n: int) -> None:
        self.space, self.visited, self.n = space, visited, n
        self.heap: list[tuple[float, Config]] = []
        self.keys: set[Config] = set()

    def offer(self, configs: Sequence[Config], scores: Scores) -> bool:
        changed = False
        scores = np.asarray(scores, dtype=np.float64)
        if self.n > 0 and len(self.heap) == self.n:  # only a score above today's minimum can enter
            better = np.flatnonzero(scores > self.heap[0][0]).tolist()
            configs, scores = [configs[i] for i in better], scores[better]
        if self.n > 0 and len(configs) > 1:
            self.space.canonical_many(configs)  # one batch: a backend may replay them side by side
        for config, score in zip(configs, scores.tolist()):
            if self.n <= 0 or (len(self.heap) == self.n and score <= self.heap[0][0]):
                continue
            key = self.space.canonical(config)
            if key in self.visited or key in self.keys:
                continue
            if len(self.heap) < self.n:
                heapq.heappush(self.heap, (score, config))
            else:
                _, dropped = heapq.heapreplace(self.heap, (score, config))
                self.keys.discard(self.space.canonical(dropped))
            self.keys.add(key)
            changed = True
        return changed

    def prefetch(self, offers: Iterable[tuple[Sequence[Config], Scores]]) -> None:
        """Canonicalise in one batch the configs of `offers` ([(configs, scores)], to be offered in
        this order) that `offer` will look up for certain: those scored above the n-th best of the
        distinct configs' best scores in the heap and `offers`, a floor the heap's minimum cannot end
        above (n distinct canonical configs are n distinct configs). Changes nothing `offer` decides; a
        backend may replay the batch side by side."""
        if self.n <= 0:
            return
        scored = {config: score for score, config in self.heap}
        for configs, scores in offers:
            for config, score in zip(map(tuple, configs), np.asarray(scores, dtype=np.float64).tolist()):
                scored[config] = max(score, scored.get(config, -np.inf))
        if len(scored) < self.n:
            return
        floor = heapq.nlargest(self.n, scored.values())[-1]
        self.space.canonical_many([config for config, score in scored.items() if score > floor])

    def sorted_configs(self) -> list[Config]:
        return [config for _, config in sorted(self.heap, reverse=True)]
