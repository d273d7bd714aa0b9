"""The cost-model contract.

A cost model predicts the throughput of configs from their features.

    fit(X, y) -> self      X: (n, d) float features (space.features), y: (n,)
                           measured GFLOP/s with 0 for failed candidates.
                           Higher is better. Must accept n == 0 or 1.
    predict(X) -> (n,)     Scores where higher is better; any scale, only the
                           order matters to searches.
    predict_throughput(X) -> (n,)   The model's estimate of throughput itself
                           (higher is better), for judging the model against
                           measurements (model/rank_corr). `predict` by default;
                           a model whose `predict` is an acquisition (rf's EI)
                           returns its predictive mean.
    predict_dist(X) -> (mean, std)   where the model has an uncertainty
                           (`has_uncertainty = True`): predictive mean and
                           standard deviation as fractions of the best
                           throughput it was fit on (the incumbent is 1.0);
                           zeros before a fit with a valid measurement.
    can_rank               False for cost_model=none (predictions carry no
                           information); searches that need a model are
                           rejected with it.
    has_uncertainty        True where predict_dist exists; searches that need it
                           (search=csa) are rejected with other models.
    trains_nothing         True for cost_model=none: searches that measure every proposal and
                           use no model (search=gbfs, a2c) require it, so no run spends time
                           fitting a model nobody reads.

__init__ stores hyperparameters only; seeds come from the config.
"""
from __future__ import annotations

from abc import abstractmethod

import numpy as np

from tuning.component import Component


class CostModel(Component):
    capabilities = {"can_rank": ("ranks configs", "xgb"),
                    "has_uncertainty": ("has a predictive uncertainty", "rf"),
                    "trains_nothing": ("trains nothing (the search uses no model)", "none")}
    can_rank = True
    has_uncertainty = False
    trains_nothing = False

    @abstractmethod
    def fit(self, X: np.ndarray, y: np.ndarray) -> "CostModel":
        """Learn from measured throughputs; returns self."""

    @abstractmethod
    def predict(self, X: np.ndarray) -> np.ndarray:
        """Scores, higher is better."""

    def predict_throughput(self, X: np.ndarray) -> np.ndarray:
        return self.predict(X)

    def predict_dist(self, X: np.ndarray):
        raise NotImplementedError(f"{type(self).__name__} has no predictive distribution")
