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
    features               What the model reads (tuning/core/features.py FEATURES), a hyperparameter of
                           the models that take it (`cost_model.features`): knobs (X is (n, d)),
                           per_store or both (X is (n, stores, width): one row per buffer store of
                           the scheduled program). A model that wants a flat matrix calls
                           `flat(X)`; one that sums per-store scores (xgb_ms) reads the rows.
                           Searches and the loop get X from `model_input`, never by hand.
    state_dict() / load_state_dict(state)
                           What a fit depends on beyond the records (JSON-serialisable), saved with
                           the search's state every round: a resumed run's first fit must give the
                           model the uninterrupted run had (xgb_ms: when it last refit). {} for
                           models that refit from all records every time.
    trains_nothing         True for cost_model=none: searches that measure every proposal and
                           use no model (search=gbfs, a2c) require it, so no run spends time
                           fitting a model nobody reads.

__init__ stores hyperparameters only; seeds come from the config.
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tuning.core.component import Component
from tuning.core.features import FEATURES, model_features

if TYPE_CHECKING:
    from tuning.core.space import Config, Space


class CostModel(Component):
    capabilities = {"can_rank": ("ranks configs", "xgb"),
                    "has_uncertainty": ("has a predictive uncertainty", "rf"),
                    "trains_nothing": ("trains nothing (the search uses no model)", "none")}
    options = {"features": FEATURES}
    can_rank = True
    has_uncertainty = False
    trains_nothing = False
    features = "knobs"

    @abstractmethod
    def fit(self, X: np.ndarray, y: np.ndarray) -> CostModel:
        """Learn from measured throughputs; returns self."""

    @abstractmethod
    def predict(self, X: np.ndarray) -> np.ndarray:
        """Scores, higher is better."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def predict_throughput(self, X: np.ndarray) -> np.ndarray:
        return self.predict(X)

    def predict_dist(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError(f"{type(self).__name__} has no predictive distribution")


def model_input(space: Space, cost_model: object, configs: Sequence[Config]) -> np.ndarray:
    """The features `cost_model` reads, for `configs` of `space` (knobs for a stand-in model that does
    not say, as tests' hand-made landscapes)."""
    return model_features(space, configs, getattr(cost_model, "features", "knobs"))


def flat(X: np.ndarray) -> np.ndarray:
    """(n, d) float32: per-store rows (n, stores, width) laid end to end."""
    X = np.asarray(X, dtype=np.float32)
    return X.reshape(len(X), int(np.prod(X.shape[1:]))) if X.ndim != 2 else X
