"""search=gbfs: Greedy Best-First Search over a space's neighbourhood, measuring every proposal.

Zhang, Cheng, Zang, Park, "Compiler-Level Matrix Multiplication Optimization for Deep Learning",
arXiv 2019, §4.2, Algorithm 1. No cost model: the hardware is the only judge.

  1. start  measure the start state s0 (§5: no tiling, Space.untiled) and push it; when a run
            measured shared random configs first (budget.init_random), they are in Q and are the
            start instead.
  2. pop    take the cheapest measured state s from the priority queue Q (ordered by cost).
  3. expand draw rho of its unvisited legitimate neighbours g(s) at random (Space.neighbors with
            `moves`: a prime factor moved between two levels of a tile, Eq. 6; +-1 on other
            knobs) and propose them: the sampler (sampler=all) measures exactly these.
  4. push   every one measured without error goes into Q with its cost (observe). A timed-out
            one is a legitimate kernel slower than the evaluator's timeout_s: it goes into Q
            with its probe run's seconds, a lower bound of its cost (so gemm_2048's untiled s0,
            one run of 27 s on a 2-core CPU, is still expanded, as Algorithm 1 expands every s0).
            A failed build or run is not legitimate (J = 0) and is dropped.
  5. repeat until Q is empty (the run then stops: "space exhausted") or the budget is spent.

One round pops as many states as its plan needs (plan size / rho; the default plan is rho, one pop
per round, as Algorithm 1). A popped state with no unvisited legitimate neighbour left is dropped
and the next one popped. Algorithm 1 draws its rho among all neighbours and skips the visited
ones; tunelab draws among the unvisited ones, so each pop measures rho states while it has them.
"""
from __future__ import annotations

import heapq

from tuning.core.component import Hyper
from tuning.core.space import MOVES
from tuning.sampler.base import random_unvisited
from tuning.search.base import Search

STARTS = ("untiled", "random")


class GreedyBestFirst(Search):
    """G-BFS (module docstring): Zhang et al. 2019, §4.2 Algorithm 1, settings of §5."""

    requires = {"sampler": ("candidates_only",), "cost_model": ("trains_nothing",)}
    hyperparameters = {
        "rho": Hyper(5, low=1, help="neighbours measured per popped state",
                     cite="§5, \"random selection parameter rho = 5\""),
        "moves": Hyper(("factor", "nontile_index"),
                       help="the neighbourhood g(s), kinds from Space.neighbors: `factor` moves one prime factor "
                       "of a tile split between two of its levels, `nontile_index` moves every other knob (sketch, "
                       "unroll) by +-1",
                       cite="Eq. 6 doubles one level and halves another; for extents that are not powers of two "
                       "the prime is any of the extent's. The paper's GEMM state has only tile knobs "
                       "(model.space=tiling)"),
        "start": Hyper("untiled", choices=STARTS,
                       help="untiled: s0 = [[m,1,1,1],[k,1],[n,1,1,1]]; random: a random legitimate config. A run "
                       "with budget.init_random > 0 starts from those shared random configs instead (s0 unmeasured)",
                       cite="§5, \"the configuration without multi-level tiling\""),
        "default_plan_size": Hyper(5, low=1, help="configs per round unless budget.plan_size says otherwise",
                                   cite="= rho: one pop per round, as Algorithm 1 (a larger budget.plan_size pops "
                                   "several states per round before measuring: tunelab's batching, not the paper's)"),
    }

    def __init__(self, rho: int = 5, moves: list = ("factor", "nontile_index"), start: str = "untiled",
                 default_plan_size: int = 5):
        self.rho = rho
        self.moves = moves
        self.start = start
        self.default_plan_size = default_plan_size
        self.queue: list[tuple[float, int, tuple]] = []  # (cost, push order, config): a heap
        self.pushed = 0
        self.started = False
        self.last_round: dict = {}

    @classmethod
    def check(cls, params, group):
        moves = params["moves"]
        if isinstance(moves, str) or not moves or not set(moves) <= set(MOVES):
            return [f"{group}.moves: expected a list of {', '.join(MOVES)}, got {moves!r}"]
        return []

    def propose(self, space, cost_model, n, visited, rng):
        if not self.started:
            self.started = True
            if not self.queue:  # budget.init_random's shared configs, when measured first, are the start
                return self._start_state(space, visited, rng)
        proposals: list = []
        pops = 0
        while len(proposals) < n and self.queue:
            _, _, state = heapq.heappop(self.queue)
            pops += 1
            proposals += self._expand(space, state, visited | set(proposals), min(self.rho, n - len(proposals)), rng)
        self.last_round = {"pops": pops, "queue": len(self.queue)}
        return proposals

    def _start_state(self, space, visited, rng) -> list:
        start = space.untiled() if self.start == "untiled" else space.canonical(space.sample(rng))
        if start in visited or not space.is_legitimate(start):
            start = random_unvisited(space, visited, [], rng)
        return [] if start is None else [start]

    def _expand(self, space, state, taken, count, rng) -> list:
        """Up to `count` random unvisited legitimate neighbours of `state`."""
        neighbours = [c for c in space.neighbors(tuple(state), self.moves) if c not in taken]
        picks = []
        for i in rng.permutation(len(neighbours)):
            if len(picks) == count:
                break
            if space.is_legitimate(neighbours[i]):
                picks.append(neighbours[i])
        return picks

    def observe(self, configs, results):
        for config, result in zip(configs, results):
            cost = queue_cost(result)
            if cost is not None:
                heapq.heappush(self.queue, (cost, self.pushed, tuple(int(c) for c in config)))
                self.pushed += 1

    def metrics(self) -> dict:
        return dict(self.last_round)

    def state_dict(self) -> dict:
        return {"queue": [[cost, order, list(config)] for cost, order, config in self.queue],
                "pushed": self.pushed, "started": self.started}

    def load_state_dict(self, state: dict) -> None:
        self.queue = [(float(cost), int(order), tuple(int(c) for c in config))
                      for cost, order, config in state.get("queue", [])]
        heapq.heapify(self.queue)
        self.pushed = int(state.get("pushed", len(self.queue)))
        self.started = bool(state.get("started", bool(self.queue)))


def queue_cost(result) -> float | None:
    """A state's place in Q: its cost; a timed-out one's probe seconds (the worker ran it once and
    stopped, so the cost is at least that); None for a state that is not legitimate."""
    if result.ok:
        return float(result.cost)
    if result.error == "timeout" and result.run_s > 0:
        return float(result.run_s)
    return None
