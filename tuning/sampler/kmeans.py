"""sampler=kmeans: Chameleon's Adaptive Sampling with Sample Synthesis.

Ahn et al., ICLR 2020, §3.3, Algorithm 1 (ReLeASE 2019, §4.2):

    previous_loss = inf
    for k in k_min, k_min + k_step, ... < k_max:
        centroids, clusters, loss = k-means(candidates, k)
        if threshold * loss > previous_loss: break      # the knee of the loss curve
        previous_loss = loss
    for each centroid already visited: replace it with mode(candidates)
    measure the centroids

So the batch size adapts: the centroids of the k the loop stopped at (the k
that tripped the rule, or the last k tried) are the round's measurements, at
most b of them.

Details the paper leaves open, as tunelab fills them:
  - configs are clustered as their knob indices scaled to [0, 1] by each
    knob's size (the PPO agent's state); `cluster_dims: 2` clusters on the
    two knobs with the most choices only, as the published code did;
  - a centroid becomes the nearest valid config: for each sketch, every
    active knob rounded to its nearest index and inactive knobs 0; the
    closest of those;
  - synthesis: per knob, the most frequent value among the candidates that
    use that knob (the sketch: the most frequent sketch); a synthesised
    config that is visited or already chosen is drawn again knob by knob
    from the candidates' values (the published code's "mode or sample"),
    then a random unvisited config;
  - `synthesis_pool: cluster` takes the mode over the centroid's own
    cluster (the ReLeASE code) instead of all candidates (the paper);
  - at most b centroids are kept, those whose clusters hold the
    best-ranked candidates first (candidates arrive best first);
  - fewer distinct candidates than k (common with `cluster_dims: 2`): k
    shrinks to their number, or with `keep_k_min` stays at k_min, the
    duplicate centroids being synthesised (what the published code's
    scikit-learn k-means did: it returns duplicate centres);
  - `random_share`: the last int(random_share x b) picks are random
    unvisited configs, as AutoTVM's ModelBasedTuner.next_batch (which the
    published code inherits) fills the last 5% of a plan.
"""
from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
from threadpoolctl import threadpool_limits

from tuning.sampler.base import Sampler, random_unvisited


class KMeansSampler(Sampler):
    """Hyperparameters:

        threshold       knee rule: stop when threshold * loss > previous loss (2.5: the published
                        code's constant; the value in the paper's Table 7 is not legible)
        k_min, k_max    k runs over range(k_min, k_max, k_step) (8 and 64, Algorithm 1)
        k_step          1 (Algorithm 1: range(8, 64)); the published code used 8
        max_iter        Lloyd iterations per k-means (100, code)
        cluster_dims    null: all knobs (the paper); 2: the two largest knobs (the code)
        synthesis_pool  "candidates" (paper: mode(s_Θ)) or "cluster" (ReLeASE code)
        synthesis_tries draws of a knob-by-knob sample before a random config (100)
        keep_k_min      false: k shrinks to the number of distinct candidates when there are
                        fewer than k_min; true: k stays >= k_min (the code)
        random_share    the last int(random_share x b) picks are random unvisited configs (0;
                        the code's inherited next_batch: 0.05)
    """

    adaptive = True
    ranges = {"threshold": (1e-6, None), "k_min": (1, None), "k_max": (2, None), "k_step": (1, None),
              "max_iter": (1, None), "cluster_dims": (1, None), "synthesis_tries": (0, None),
              "random_share": (0.0, 1.0)}
    options = {"synthesis_pool": ("candidates", "cluster")}

    def __init__(self, threshold: float = 2.5, k_min: int = 8, k_max: int = 64, k_step: int = 1,
                 max_iter: int = 100, cluster_dims: int | None = None, synthesis_pool: str = "candidates",
                 synthesis_tries: int = 100, keep_k_min: bool = False, random_share: float = 0.0):
        self.threshold = threshold
        self.k_min = k_min
        self.k_max = k_max
        self.k_step = k_step
        self.max_iter = max_iter
        self.cluster_dims = cluster_dims
        self.synthesis_pool = synthesis_pool
        self.synthesis_tries = synthesis_tries
        self.keep_k_min = keep_k_min
        self.random_share = random_share
        self.last_k = 0  # the k of the latest select, how many of its samples were synthesised, random
        self.last_synthesised = 0
        self.last_random = 0

    @classmethod
    def check(cls, params, group):
        if params["k_min"] >= params["k_max"]:
            return [f"{group}.k_min: must be below {group}.k_max (got k_min={params['k_min']}, "
                    f"k_max={params['k_max']}): k runs over range(k_min, k_max)"]
        return []

    def measured_per_round(self, plan_size: int) -> tuple[int, int]:
        """k of the loss curve's knee, from k_min (fewer where the candidates are fewer) to below k_max;
        with random picks added, up to the whole plan."""
        most = plan_size if self.random_share else min(self.k_max - 1, plan_size)
        return min(self.k_min, plan_size), most

    def select(self, candidates, space, visited, b, rng, exploration=None):
        if b <= 0:
            return []
        configs = _distinct([space.canonical(c) for c in candidates])
        if not configs:
            pick = random_unvisited(space, visited, [], rng)
            return [] if pick is None else [pick]
        normalized = space.normalized(configs).astype(np.float64)
        clustered = self._clustered_knobs(space)
        k, labels, centers = self.knee(normalized[:, clustered], rng)
        self.last_k, self.last_synthesised, self.last_random = k, 0, 0
        background = normalized.mean(axis=0)  # knobs left out of the clustering: their mean over the candidates
        chosen: list = []
        for cluster in _clusters_best_first(labels, k)[:b]:
            members = [c for c, label in zip(configs, labels) if label == cluster]
            pool = members if self.synthesis_pool == "cluster" and members else configs  # a duplicate centre: no members
            centre = background.copy()
            centre[clustered] = centers[cluster]
            centroid = space.canonical(snap(space, centre))
            if centroid in visited or centroid in chosen:
                centroid = self._synthesise(pool, space, visited, chosen, rng)
                self.last_synthesised += 1
            if centroid is not None:
                chosen.append(centroid)
        return self._random_tail(chosen, int(self.random_share * b), space, visited, rng)

    def metrics(self) -> dict:
        return {"k": self.last_k, "synthesised": self.last_synthesised, "random": self.last_random}

    def _random_tail(self, chosen: list, count: int, space, visited, rng) -> list:
        """The last `count` picks replaced by random unvisited configs (AutoTVM's next_batch)."""
        if count <= 0:
            return chosen
        kept = chosen[:max(len(chosen) - count, 0)]
        while len(kept) < len(chosen):
            pick = random_unvisited(space, visited, kept, rng)
            if pick is None:
                break
            kept.append(pick)
            self.last_random += 1
        return kept

    # ---- Algorithm 1, lines 2-6 ------------------------------------------------------------
    def knee(self, points: np.ndarray, rng) -> tuple[int, np.ndarray, np.ndarray]:
        """Run k-means for growing k until the loss stops falling by `threshold`x;
        returns (k, labels, centres) of the last k run. On one OpenMP thread: scikit-learn sums
        the loss in an order that follows its thread count (the last bits of the loss the knee
        rule reads would follow the host's cores), and its threads spin-wait on cores another
        job holds (a replay grid runs one job a core: 90x slower beside one)."""
        with threadpool_limits(limits=1, user_api="openmp"):
            return self._knee(points, rng)

    def _knee(self, points: np.ndarray, rng) -> tuple[int, np.ndarray, np.ndarray]:
        distinct = len(np.unique(points, axis=0))
        previous_loss, result = np.inf, None
        for k in range(self.k_min, self.k_max, self.k_step):
            if k > distinct and (result is not None or not self.keep_k_min or k > len(points)):
                break
            result = self._kmeans(points, k, rng)
            if self.threshold * result[3] > previous_loss:
                break
            previous_loss = result[3]
        if result is None:  # fewer distinct candidates than k_min: each is its own cluster
            result = self._kmeans(points, distinct, rng)
        return result[:3]

    def _kmeans(self, points, k, rng):
        # imported here: scikit-learn is 2 s of every start, which a run refused by validation never needs
        from sklearn.cluster import KMeans
        from sklearn.exceptions import ConvergenceWarning

        seed = int(rng.integers(2**31 - 1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            fitted = KMeans(n_clusters=k, n_init=1, max_iter=self.max_iter, random_state=seed).fit(points)
        return k, fitted.labels_, fitted.cluster_centers_, float(fitted.inertia_)

    def _clustered_knobs(self, space) -> list[int]:
        """All knobs, or (cluster_dims) the ones with the most choices."""
        if self.cluster_dims is None:
            return list(range(len(space.knobs)))
        return sorted(np.argsort(-np.asarray(space.dims), kind="stable")[:self.cluster_dims].tolist())

    # ---- Algorithm 1, lines 7-9 ------------------------------------------------------------
    def _synthesise(self, pool, space, visited, chosen, rng):
        taken = set(chosen) | set(visited)
        mode = space.canonical(per_knob_mode(space, pool))
        if mode not in taken:
            return mode
        for _ in range(self.synthesis_tries):
            drawn = space.canonical(per_knob_draw(space, pool, rng))
            if drawn not in taken:
                return drawn
        return random_unvisited(space, visited, chosen, rng)


def snap(space, vector: np.ndarray) -> tuple:
    """The valid config nearest (Euclidean, in normalised indices) to `vector`."""
    dims = np.asarray(space.dims)
    scale = np.maximum(dims - 1, 1)
    best, best_distance = None, np.inf
    for sketch, slots in enumerate(space.active):
        config = np.zeros(len(dims), dtype=np.int64)
        config[0] = sketch
        slots = list(slots)
        config[slots] = np.clip(np.rint(vector[slots] * scale[slots]), 0, dims[slots] - 1)
        distance = float(((config / scale - vector) ** 2).sum())
        if distance < best_distance:
            best, best_distance = tuple(int(c) for c in config), distance
    return best


def per_knob_mode(space, pool) -> tuple:
    """The most frequent sketch, then per active knob its most frequent value among the
    configs of that sketch (ties: the value seen first)."""
    sketch = Counter(c[0] for c in pool).most_common(1)[0][0]
    same = [c for c in pool if c[0] == sketch]
    config = [0] * len(space.knobs)
    config[0] = sketch
    for slot in space.active[sketch]:
        config[slot] = Counter(c[slot] for c in same).most_common(1)[0][0]
    return tuple(config)


def per_knob_draw(space, pool, rng) -> tuple:
    """Like per_knob_mode, but every knob drawn from the values the pool shows."""
    sketch = pool[int(rng.integers(len(pool)))][0]
    same = [c for c in pool if c[0] == sketch]
    config = [0] * len(space.knobs)
    config[0] = sketch
    for slot in space.active[sketch]:
        config[slot] = same[int(rng.integers(len(same)))][slot]
    return tuple(config)


def _distinct(configs) -> list:
    return list(dict.fromkeys(configs))


def _clusters_best_first(labels, k) -> list[int]:
    """Cluster ids ordered by the rank of their best member (labels are in candidate order)."""
    first_seen = {}
    for rank, label in enumerate(labels):
        first_seen.setdefault(int(label), rank)
    return sorted(range(k), key=lambda cluster: first_seen.get(cluster, len(labels)))
