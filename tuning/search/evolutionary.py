"""search=evolutionary: MetaSchedule's evolutionary search, on tunelab's knob spaces.

After TVM 0.27 `src/s_tir/meta_schedule/search_strategy/evolutionary_search.cc` (EvolutionarySearch,
Python wrapper `s_tir/meta_schedule/search_strategy/evolutionary_search.py`), Ansor's search (Zheng et
al. 2020, OSDI, §5.2). Each round:

 1. The initial population: the best measured configs (init_measured_ratio x population_size, best
    first), then random legitimate configs up to population_size (at least init_min_unmeasured).
 2. genetic_num_iters times: score the population with the cost model and keep the best unmeasured
    configs seen in any generation (a heap of the plan size); then each of population_size children
    draws a parent with probability proportional to its score (negative scores clamped to 0) and
    either mutates it (probability genetic_mutate_prob; one mutator, drawn by its probability; the
    child must be legitimate: it replays and passes TVM's postprocessors) or copies it (each parent
    at most once a generation); a failure draws a new parent, up to genetic_max_fail_count times,
    then the last parent is kept. The last generation is scored too.
 3. The heap, best first. MetaSchedule then replaces exactly floor(eps_greedy x n) picks by random
    configs of its initial population; here `exploration()` hands eps_greedy to the sampler:
    sampler=greedy draws each slot at random with probability eps (binomial, not exact) from
    unmeasured configs it does not check for legitimacy, and sampler=all measures the heap alone.

Mutators, MetaSchedule's llvm defaults (Mutator.create("llvm")), each one decision of the trace:
    p_tile_size 0.9          MutateTileSize: divide one level of a tile split by a divisor, multiply
                             another level by it (kept only inside the knob's choices)
    p_compute_location 0.05  MutateComputeLocation: another compute location
    p_unroll 0.03            MutateUnroll: another unroll limit
MutateParallel (0.02) changes the parallel extent, which tunelab's spaces fix in the sketch: it is
not a decision here, and the three others' probabilities are renormalised to sum to 1. A mutator
drawn for a config without its kind of knob fails, as in MetaSchedule, and the child draws again.

Duplicates are one config: the heap and the measured set compare canonical configs (MetaSchedule:
the scheduled module's structural hash).
"""
from __future__ import annotations

import math

import numpy as np

from tuning.core.component import Hyper
from tuning.search.base import Search, TopN, predict

MUTATORS = {"tile": "p_tile_size", "location": "p_compute_location", "categorical": "p_unroll"}


_ES = "MetaSchedule EvolutionarySearch's default (TVM 0.27 evolutionary_search.cc)"
_LLVM = ("MetaSchedule's llvm mutator probability (Mutator.create(\"llvm\")). MutateParallel (0.02) has no "
         "decision in tunelab's spaces; the three others are renormalised to sum to 1")


class EvolutionarySearch(Search):
    """MetaSchedule's evolutionary search (module docstring)."""

    requires = {"cost_model": ("can_rank",)}
    affords_program_features = True  # population_size x (genetic_num_iters + 1) = 2,560 scores a round
    hyperparameters = {
        "population_size": Hyper(512, low=2, help="configs in each generation", cite=_ES),
        "init_measured_ratio": Hyper(0.2, low=0.0, high=1.0,
                                     help="share of the initial population taken from the best measured configs",
                                     cite=_ES),
        "init_min_unmeasured": Hyper(50, low=1, help="random legitimate configs in the initial population, at least",
                                     cite=_ES),
        "max_fail_count": Hyper(5, low=1, help="short batches of random sampling before giving up", cite=_ES),
        "genetic_num_iters": Hyper(4, low=0, help="generations evolved per round", cite=_ES),
        "genetic_mutate_prob": Hyper(0.85, low=0.0, high=1.0, help="probability a child is mutated rather than copied",
                                     cite=_ES),
        "genetic_max_fail_count": Hyper(10, low=1, help="parents a child draws again after a failed mutation",
                                        cite=_ES),
        "eps_greedy": Hyper(0.05, low=0.0, high=1.0, help="share of a round drawn at random, handed to the sampler",
                            cite=_ES + ". Deviation: drawn by the sampler (sampler=greedy, the default: each slot "
                            "random with probability eps, from unmeasured configs not checked for legitimacy; "
                            "MetaSchedule: exactly floor(eps x n) from its legitimate random samples; sampler=all "
                            "measures the model's picks alone)"),
        "p_tile_size": Hyper(0.9, low=0.0, high=1.0, help="probability of MutateTileSize", cite=_LLVM),
        "p_compute_location": Hyper(0.05, low=0.0, high=1.0, help="probability of MutateComputeLocation", cite=_LLVM),
        "p_unroll": Hyper(0.03, low=0.0, high=1.0, help="probability of MutateUnroll", cite=_LLVM),
        "default_plan_size": Hyper(64, low=1, help="configs measured per round unless budget.plan_size says otherwise",
                                   cite="MetaSchedule's num_trials_per_iter (tune_tir's default)"),
    }

    def __init__(self, population_size: int = 512, init_measured_ratio: float = 0.2, init_min_unmeasured: int = 50,
                 max_fail_count: int = 5, genetic_num_iters: int = 4, genetic_mutate_prob: float = 0.85,
                 genetic_max_fail_count: int = 10, eps_greedy: float = 0.05, p_tile_size: float = 0.9,
                 p_compute_location: float = 0.05, p_unroll: float = 0.03, default_plan_size: int = 64):
        self.population_size = population_size
        self.init_measured_ratio = init_measured_ratio
        self.init_min_unmeasured = init_min_unmeasured
        self.max_fail_count = max_fail_count
        self.genetic_num_iters = genetic_num_iters
        self.genetic_mutate_prob = genetic_mutate_prob
        self.genetic_max_fail_count = genetic_max_fail_count
        self.eps_greedy = eps_greedy
        self.p_tile_size = p_tile_size
        self.p_compute_location = p_compute_location
        self.p_unroll = p_unroll
        self.default_plan_size = default_plan_size
        self.measured: list[tuple[float, tuple]] = []  # (cost, config) of the best measured, best first
        self.last: dict = {}

    @classmethod
    def check(cls, params, group):
        if sum(params[p] for p in MUTATORS.values()) <= 0:
            return [f"{group}.p_tile_size: the mutator probabilities (p_tile_size, p_compute_location, "
                    f"p_unroll) must not all be 0"]
        return []

    # ---- one round --------------------------------------------------------------------------
    def propose(self, space, cost_model, n, visited, rng):
        population = self._initial_population(space, rng)
        if not population:  # MetaSchedule ends the search here; the sampler fills the round at random
            self.last = {"population": 0, "mutated": 0, "copied": 0, "mutation_failed": 0}
            return []
        best = TopN(space, visited, n)
        counts = {"mutated": 0, "copied": 0, "mutation_failed": 0}
        for generation in range(self.genetic_num_iters + 1):
            scores = predict(space, cost_model, population)
            best.offer(population, scores)
            if generation == self.genetic_num_iters:
                break
            population = self._next_generation(space, population, scores, rng, counts)
        self.last = {"population": len(population), **counts,
                     "measured_in_population": len(self._measured_seeds())}
        return best.sorted_configs()

    def _measured_seeds(self) -> list:
        count = math.floor(self.population_size * self.init_measured_ratio)
        return [config for _, config in self.measured[:count]]

    def _initial_population(self, space, rng) -> list:
        population = list(self._measured_seeds())
        wanted = max(self.population_size - len(population), self.init_min_unmeasured)
        sampled: list = []
        for _ in range(self.max_fail_count):  # MetaSchedule: give up after max_fail_count short batches
            before = len(sampled)
            sampled += [c for c in (space.sample(rng) for _ in range(wanted - len(sampled))) if space.is_legitimate(c)]
            if len(sampled) >= wanted or len(sampled) == before:
                break
        return population + sampled

    def _next_generation(self, space, population, scores, rng, counts) -> list:
        """MetaSchedule's EvolveWithCostModel step: each child draws a parent by score and decides
        mutate (genetic_mutate_prob: a mutator by its probability; a legitimate result is the child)
        or copy (only a parent not copied yet this generation); on failure it draws again, up to
        genetic_max_fail_count more times, then keeps the last parent drawn."""
        cumulative = np.cumsum(_selection(scores))
        kinds = list(MUTATORS)
        weights = np.array([getattr(self, MUTATORS[kind]) for kind in kinds], dtype=np.float64)
        weights = np.cumsum(weights / weights.sum())
        copied: set = set()
        children = []
        for _ in range(self.population_size):
            child = None
            for _ in range(self.genetic_max_fail_count + 1):
                parent = min(int(np.searchsorted(cumulative, rng.random() * cumulative[-1])), len(population) - 1)
                if rng.random() < self.genetic_mutate_prob:
                    kind = kinds[min(int(np.searchsorted(weights, rng.random())), len(kinds) - 1)]
                    child = _mutate(space, population[parent], kind, rng)
                    if child is not None:
                        counts["mutated"] += 1
                        break
                elif parent not in copied:
                    copied.add(parent)
                    child = population[parent]
                    counts["copied"] += 1
                    break
            if child is None:
                child = population[parent]
                counts["mutation_failed"] += 1
            children.append(child)
        return children

    # ---- measurements and state -------------------------------------------------------------
    def observe(self, configs, results):
        best = dict((config, cost) for cost, config in self.measured)
        for config, result in zip(configs, results):
            if result.ok and math.isfinite(result.cost):
                config = tuple(int(c) for c in config)
                best[config] = min(result.cost, best.get(config, math.inf))
        ranked = sorted((cost, config) for config, cost in best.items())
        self.measured = ranked[:self.population_size]

    def state_dict(self) -> dict:
        return {"measured": [[cost, list(config)] for cost, config in self.measured]}

    def load_state_dict(self, state: dict) -> None:
        self.measured = [(float(cost), tuple(int(c) for c in config)) for cost, config in state.get("measured", [])]

    def metrics(self) -> dict:
        return dict(self.last)

    def exploration(self) -> float:
        return self.eps_greedy


def _selection(scores) -> np.ndarray:
    """Selection probabilities: scores clamped at 0 (MetaSchedule's PredictNormalizedScore); when
    none is positive (a rank model's scores), shifted to start at 0; all equal: uniform."""
    weights = np.asarray(scores, dtype=np.float64)
    weights = np.where(np.isfinite(weights), weights, 0.0)
    clamped = np.maximum(weights, 0.0)
    if clamped.sum() <= 0:
        clamped = weights - weights.min()
    total = clamped.sum()
    return clamped / total if total > 0 else np.full(len(weights), 1.0 / len(weights))


def _mutate(space, config, kind: str, rng) -> tuple | None:
    """One mutator of `kind` applied to one random knob of that kind; None when the config has no
    such knob, the change is not among the knob's choices, or TVM rejects the result."""
    slots = [s for s in space.active_slots(config) if space.knobs[s].kind == kind and space.dims[s] > 1]
    if not slots:
        return None
    slot = slots[int(rng.integers(len(slots)))]
    value = _move_tile_factor(space, config, slot, rng) if kind == "tile" else _other_choice(space, config, slot, rng)
    if value is None:
        return None
    child = (*config[:slot], value, *config[slot + 1:])
    return child if space.is_legitimate(child) else None


def _move_tile_factor(space, config, slot, rng) -> int | None:
    """MutateTileSize: a divisor d > 1 of one level moves to another level; None if the split is
    not among the knob's choices (the innermost-factor cap) or no level can give one."""
    split = list(space.knobs[slot].choices[config[slot]])
    sources = [level for level, factor in enumerate(split) if factor > 1]
    if not sources or len(split) < 2:
        return None
    src = sources[int(rng.integers(len(sources)))]
    dst = [level for level in range(len(split)) if level != src][int(rng.integers(len(split) - 1))]
    divisors = [d for d in range(2, split[src] + 1) if split[src] % d == 0]
    d = divisors[int(rng.integers(len(divisors)))]
    split[src] //= d
    split[dst] *= d
    return space._choice_index(slot).get(tuple(split))


def _other_choice(space, config, slot, rng) -> int:
    """MutateComputeLocation / MutateUnroll: any other choice of the knob, uniformly."""
    value = int(rng.integers(space.dims[slot] - 1))
    return value + (value >= config[slot])
