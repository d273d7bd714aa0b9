"""search=sa: AutoTVM's parallel simulated annealing on the cost model.

After TVM <= 0.19 `autotvm/tuner/sa_model_optimizer.py`
(`SimulatedAnnealingOptimizer.find_maximums`): `parallel_size` walkers take
random-walk steps on the knob space, accepting a move with probability
exp((new - old) / temperature) on predicted scores; the best `n` distinct
unmeasured configs seen on the way are kept in a min-heap. The temperature
falls linearly from temp[0] to temp[1]; the walk ends after `n_iter` steps or
`early_stop` steps without a heap change. With `persistent` the walkers start
the next round where this one left them.

Every step predicts the walkers' configs not scored yet this round in one batch
(one `space.features` and one `cost_model.predict` call; base.CachedScores), so a
128 x 500 round is a few seconds.

A refinement share (not AutoTVM's; off by default): `refine_share` of each round's
configs are the cost model's best unmeasured neighbours (space.neighbors: a tile's
prime factor moved between two levels, another knob's index +-1) of the `refine_top`
fastest configs measured so far, ahead of the walk's own picks. The walk ranks the
whole space by the model alone and never returns to what measured fast; MetaSchedule's
evolutionary search seeds its population from the measured best for this reason.
"""
from __future__ import annotations

import numpy as np

from tuning.core.component import Hyper
from tuning.search.base import CachedScores, Search, TopN, fill_with_random


class SimulatedAnnealing(Search):
    """AutoTVM's simulated annealing on the cost model's scores (module docstring)."""

    requires = {"cost_model": ("can_rank",)}
    hyperparameters = {
        "n_iter": Hyper(500, low=1, help="max SA steps per round",
                        cite="Chameleon (Ahn et al. 2020, ICLR) Table 8, step_sa = 500 steps (AutoTVM's value)"),
        "parallel_size": Hyper(128, low=1, help="number of walkers",
                               cite="Chameleon Table 8, n_sa = 128 Markov chains (AutoTVM's value)"),
        "early_stop": Hyper(50, low=1, help="stop after this many steps without a new top-n config",
                            cite="AutoTVM 0.19 defaults (docs/methods.md §AutoTVM)"),
        "temp": Hyper((1.0, 0.0), help="(start, end) temperature, linear; or one number held fixed",
                      cite="AutoTVM 0.19 defaults: temperature 1 -> 0 (linear) (docs/methods.md §AutoTVM)"),
        "persistent": Hyper(True, help="walkers continue from last round's points",
                            cite="AutoTVM 0.19 defaults: persistent walkers (docs/methods.md §AutoTVM)"),
        "default_plan_size": Hyper(64, low=1, help="configs measured per round unless budget.plan_size says otherwise",
                                   cite="Chameleon Table 8, b_GBT = 64 (a run's budget.plan_size overrides it, "
                                   "null keeps 64)"),
        "refine_share": Hyper(0.0, low=0.0, high=1.0,
                              help="share of a round's configs taken from the measured best's neighbours (0: off)",
                              cite="not AutoTVM's: a share of each round taken from the model's best unmeasured "
                              "neighbours of the fastest measured configs (search.refine_share=0.25 turns it on; "
                              "docs/methods.md §Refinement)"),
        "refine_top": Hyper(8, low=1, help="how many of the fastest measured configs' neighbourhoods are ranked",
                            cite="not AutoTVM's (tunelab's refinement, docs/methods.md §Refinement)"),
    }
    REFINE_MOVES = ("factor", "nontile_index")

    def __init__(self, n_iter: int = 500, parallel_size: int = 128, early_stop: int = 50,
                 temp=(1.0, 0.0), persistent: bool = True, default_plan_size: int = 64,
                 refine_share: float = 0.0, refine_top: int = 8):
        self.n_iter = n_iter
        self.parallel_size = parallel_size
        self.early_stop = early_stop
        self.temp = temp
        self.persistent = persistent
        self.default_plan_size = default_plan_size
        self.refine_share = refine_share
        self.refine_top = refine_top
        self.points: list[list[int]] | None = None  # walker positions after the last round
        self.fastest: list[list] = []  # [seconds, config] of the refine_top fastest measured, fastest first
        self.refined = 0  # configs the latest propose took from the neighbourhoods

    def propose(self, space, cost_model, n, visited, rng):
        score = CachedScores(space, cost_model)
        refined = self._refine(space, score, round(self.refine_share * n), visited)
        self.refined = len(refined)
        walked = self._walk(space, score, n, visited | set(refined) if refined else visited, rng)
        return fill_with_random([*refined, *walked][:n], space, visited, n, rng)

    def _refine(self, space, score, n, visited) -> list:
        """The model's n best unvisited neighbours of the fastest measured configs (canonical)."""
        if n <= 0 or not self.fastest:
            return []
        candidates = {}
        for _, config in self.fastest:
            if space.is_valid(tuple(config)):
                candidates.update(dict.fromkeys(space.canonical(c) for c in space.neighbors(tuple(config), self.REFINE_MOVES)))
        configs = [key for key in candidates if key not in visited]
        if not configs:
            return []
        ranked = np.argsort(-score(configs), kind="stable")[:n]
        return [configs[i] for i in ranked]

    def _walk(self, space, score, n, visited, rng) -> list:
        """The annealing walk's n best distinct unvisited configs, best first."""
        points = self._start_points(space, rng)
        scores = score(points)
        best = TopN(space, visited, n)
        best.offer(points, scores)

        if isinstance(self.temp, (int, float)):
            temperature, cooling = float(self.temp), 0.0
        else:
            temperature = float(self.temp[0])
            cooling = (float(self.temp[0]) - float(self.temp[1])) / (self.n_iter + 1)

        step = last_change = 0
        while step < self.n_iter and step < last_change + self.early_stop:
            # The walk never reads the heap, and every step before the early stop's horizon will run:
            # they are walked first, the candidates the heap will surely look up canonicalised in one
            # batch (TopN.prefetch), then offered in order. The same configs as stepping one by one.
            offers = []
            for _ in range(min(self.n_iter, last_change + self.early_stop) - step):
                moved = space.random_walk_all(points, rng)
                moved_scores = score(moved)
                # clipped: a better move is always taken, and exp never overflows
                exponent = np.clip((moved_scores - scores) / (temperature + 1e-5), -700.0, 0.0)
                accept = rng.random(len(points)) < np.exp(exponent)
                points = [m if a else p for p, m, a in zip(points, moved, accept)]
                scores = np.where(accept, moved_scores, scores)
                offers.append((moved, moved_scores))
                temperature -= cooling
            best.prefetch(offers)
            for moved, moved_scores in offers:
                if best.offer(moved, moved_scores):
                    last_change = step
                step += 1

        if self.persistent:
            self.points = [[int(c) for c in p] for p in points]
        return best.sorted_configs()

    def observe(self, configs, results):
        if self.refine_share <= 0:
            return
        measured = [[float(r.cost), [int(c) for c in config]] for config, r in zip(configs, results) if r.ok]
        self.fastest = sorted([*self.fastest, *measured], key=lambda item: item[0])[:self.refine_top]

    def metrics(self) -> dict:
        return {"refined": self.refined} if self.refine_share > 0 else {}

    def _start_points(self, space, rng):
        if self.persistent and self.points is not None and len(self.points) == self.parallel_size:
            points = [tuple(p) for p in self.points]
            if all(space.is_valid(p) for p in points):
                return points
        return [space.sample(rng) for _ in range(self.parallel_size)]

    def state_dict(self) -> dict:
        return {"points": self.points, "fastest": self.fastest}

    def load_state_dict(self, state: dict) -> None:
        points = state.get("points")
        self.points = None if points is None else [[int(c) for c in p] for p in points]
        self.fastest = [[float(cost), [int(c) for c in config]] for cost, config in state.get("fastest") or []]
