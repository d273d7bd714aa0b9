"""cost_model=none: no model, for searches that do not use one (search=random, gbfs, a2c)."""
from __future__ import annotations

import numpy as np

from tuning.cost_model.base import CostModel


class NoCostModel(CostModel):
    """Predicts zeros; `can_rank = False` so model-based searches are rejected with it."""

    can_rank = False
    trains_nothing = True

    def fit(self, X, y):
        return self

    def predict(self, X):
        return np.zeros(len(X), dtype=np.float64)
