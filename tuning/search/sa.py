"""search=sa: AutoTVM's parallel simulated annealing on the cost model.

After TVM <= 0.19 `autotvm/tuner/sa_model_optimizer.py`
(`SimulatedAnnealingOptimizer.find_maximums`): `parallel_size` walkers take
random-walk steps on the knob space, accepting a move with probability
exp((new - old) / temperature) on predicted scores; the best `n` distinct
unmeasured configs seen on the way are kept in a min-heap. The temperature
falls linearly from temp[0] to temp[1]; the walk ends after `n_iter` steps or
`early_stop` steps without a heap change. With `persistent` the walkers start
the next round where this one left them.

Every step predicts all walkers in one batch (one `space.features` and one
`cost_model.predict` call), so a 128 x 500 round is a few seconds.
"""
from __future__ import annotations

import heapq

import numpy as np

from tuning.sampler.base import random_unvisited
from tuning.search.base import Search


class SimulatedAnnealing(Search):
    """Hyperparameters (AutoTVM defaults):

        n_iter          max SA steps per round (500)
        parallel_size   number of walkers (128)
        early_stop      stop after this many steps without a new top-n config (50)
        temp            (start, end) temperature, linear; or one number held fixed
        persistent      walkers continue from last round's points (True)
        plan_size       configs measured per round (64), read by the loop
    """

    needs_cost_model = True
    ranges = {"n_iter": (1, None), "parallel_size": (1, None), "early_stop": (1, None), "plan_size": (1, None)}

    def __init__(self, n_iter: int = 500, parallel_size: int = 128, early_stop: int = 50,
                 temp=(1.0, 0.0), persistent: bool = True, plan_size: int = 64):
        self.n_iter = n_iter
        self.parallel_size = parallel_size
        self.early_stop = early_stop
        self.temp = temp
        self.persistent = persistent
        self.plan_size = plan_size
        self.points: list[list[int]] | None = None  # walker positions after the last round

    def propose(self, space, cost_model, n, visited, rng):
        points = self._start_points(space, rng)
        scores = self._predict(space, cost_model, points)
        best = _TopN(space, visited, n)
        best.offer(points, scores)

        if isinstance(self.temp, (int, float)):
            temperature, cooling = float(self.temp), 0.0
        else:
            temperature = float(self.temp[0])
            cooling = (float(self.temp[0]) - float(self.temp[1])) / (self.n_iter + 1)

        step = last_change = 0
        while step < self.n_iter and step < last_change + self.early_stop:
            moved = [space.random_walk(p, rng) for p in points]
            moved_scores = self._predict(space, cost_model, moved)
            # clipped: a better move is always taken, and exp never overflows
            exponent = np.clip((moved_scores - scores) / (temperature + 1e-5), -700.0, 0.0)
            accept = rng.random(len(points)) < np.exp(exponent)
            points = [m if a else p for p, m, a in zip(points, moved, accept)]
            scores = np.where(accept, moved_scores, scores)
            if best.offer(moved, moved_scores):
                last_change = step
            step += 1
            temperature -= cooling

        if self.persistent:
            self.points = [[int(c) for c in p] for p in points]
        proposals = best.sorted_configs()
        keys = [space.canonical(c) for c in proposals]
        while len(proposals) < n:  # the walk found fewer than n unmeasured configs
            config = random_unvisited(space, visited, keys, rng)
            if config is None:
                break
            proposals.append(config)
            keys.append(config)
        return proposals

    def _start_points(self, space, rng):
        if self.persistent and self.points is not None and len(self.points) == self.parallel_size:
            points = [tuple(p) for p in self.points]
            if all(space.is_valid(p) for p in points):
                return points
        return [space.sample(rng) for _ in range(self.parallel_size)]

    @staticmethod
    def _predict(space, cost_model, points):
        return np.asarray(cost_model.predict(space.features(points)), dtype=np.float64)

    def state_dict(self) -> dict:
        return {"points": self.points}

    def load_state_dict(self, state: dict) -> None:
        points = state.get("points")
        self.points = None if points is None else [[int(c) for c in p] for p in points]


class _TopN:
    """Min-heap of the n best distinct (by canonical form) unvisited configs."""

    def __init__(self, space, visited, n):
        self.space, self.visited, self.n = space, visited, n
        self.heap: list[tuple[float, tuple]] = []
        self.keys: set = set()

    def offer(self, configs, scores) -> bool:
        changed = False
        for config, score in zip(configs, scores):
            score = float(score)
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

    def sorted_configs(self) -> list:
        return [config for _, config in sorted(self.heap, reverse=True)]
