"""cost_model=rf: AdaTune's random-forest surrogate with expected improvement (RFEI; Li et al. 2020,
NeurIPS, §4.2.1).

A forest of regression trees, each fit on a bootstrap resample of the measurements ("m
measurements randomly sampled with repetitions"). The trees' spread is the uncertainty: a config's
predictive mean and standard deviation are the mean and standard deviation of the per-tree
predictions. Throughputs are scaled by the best measured (y / max y), so the incumbent Perf(p*) is
1.0 and `predict_dist` is in fractions of the best.

`predict` returns the acquisition the searches maximise: expected positive improvement over the
incumbent (eq. 1-2),

    EI = (mu - best) Phi(Z) + sigma phi(Z),  Z = (mu - best) / sigma     if sigma > 0
    EI = max(0, mu - best)                                                if sigma = 0

(the reference code's sigma = 0 branch is a no-op comparison, docs/methods.md §AdaTune; here it is
the formula). `acquisition: mean` ranks by the forest's mean instead.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tuning.core.component import MAX_SEED
from tuning.cost_model.base import CostModel, flat

# SciPy and scikit-learn are imported on first use (2 s of every start, which a run refused by validation
# never needs)
if TYPE_CHECKING:
    from sklearn.ensemble import RandomForestRegressor


def expected_improvement(mean, std, best: float) -> np.ndarray:
    """E[max(f - best, 0)] for f ~ N(mean, std^2); the limit max(mean - best, 0) where std = 0."""
    from scipy.stats import norm

    mean, std = np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
    improvement = mean - best
    certain = std <= 0
    z = np.divide(improvement, std, out=np.zeros_like(improvement), where=~certain)
    uncertain = improvement * norm.cdf(z) + std * norm.pdf(z)
    return np.where(certain, np.maximum(improvement, 0.0), np.maximum(uncertain, 0.0))


class RandomForestCostModel(CostModel):
    """Hyperparameters (AdaTune's code, docs/methods.md §AdaTune: RandomForestRegressor(n_estimators=10,
    max_features=10, random_state=2)):
        n_estimators   trees in the forest (10)
        max_features   features tried per split (10; capped at the feature count)
        acquisition    ei (expected positive improvement, the paper) or mean
        seed           the forest's random_state (from the run's seed)
        n_jobs         fitting threads (1: bit-reproducible fits)
        features       knobs | per_store | both (tuning/cost_model/base.py; flattened)
    """

    has_uncertainty = True
    ranges = {"n_estimators": (1, None), "max_features": (1, None), "seed": (0, MAX_SEED), "n_jobs": (1, None)}
    options = {**CostModel.options, "acquisition": ("ei", "mean")}

    def __init__(self, n_estimators: int = 10, max_features: int = 10, acquisition: str = "ei", seed: int = 0,
                 n_jobs: int = 1, features: str = "knobs"):
        self.n_estimators = n_estimators
        self.max_features = max_features
        self.acquisition = acquisition
        self.seed = seed
        self.n_jobs = n_jobs
        self.features = features
        self.forest: RandomForestRegressor | None = None

    def fit(self, X, y):
        X = flat(X)
        y = np.asarray(y, dtype=np.float64)
        best = float(y.max()) if len(y) else 0.0
        if len(y) < 2 or best <= 0:  # nothing to scale by or learn from: predict zeros, as unfitted
            self.forest = None
            return self
        from sklearn.ensemble import RandomForestRegressor

        self.forest = RandomForestRegressor(
            n_estimators=self.n_estimators, max_features=min(self.max_features, X.shape[1]),
            random_state=self.seed, n_jobs=self.n_jobs,
        ).fit(X, y / best)
        return self

    def predict_dist(self, X):
        """(mean, std) of the per-tree predictions, as fractions of the best measured."""
        X = np.ascontiguousarray(flat(X))
        if self.forest is None or len(X) == 0:
            return np.zeros(len(X)), np.zeros(len(X))
        per_tree = np.stack([tree.predict(X, check_input=False) for tree in self.forest.estimators_])
        return per_tree.mean(axis=0), per_tree.std(axis=0)

    def predict_throughput(self, X):
        return self.predict_dist(X)[0]  # the mean; `predict` ranks uncertain configs high on purpose

    def predict(self, X):
        mean, std = self.predict_dist(X)
        if self.acquisition == "mean":
            return mean
        return expected_improvement(mean, std, best=1.0)
