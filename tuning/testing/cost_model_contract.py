"""The contract suite of a cost model (tuning/cost_model/base.py), for pytest; no TVM import here.

A cost model passes it by subclassing `CostModelContract` in a test module and saying how to make one:

    from tuning.testing.cost_model_contract import CostModelContract

    class TestMyModel(CostModelContract):
        def make_cost_model(self):
            return MyModel(seed=0)

It fits on synthetic measurements only: random configs of a 256x256x256 GEMM measured on the synthetic
hardware (tuning/hardware/synthetic.py), GFLOP/s with 0 for the invalid ones (`measured(count, seed)`).
Every test makes fresh models with `make_cost_model()`.

What it checks: `fit` returns the model and `predict` gives one finite score per row, for no rows
too; a model predicts before any fit, after fits on no row and one row, and after a fit where every
candidate failed; two models made alike and fit alike predict the same; a model that `can_rank` ranks
held-out configs (Spearman correlation above `min_rank_correlation`, by its predictive mean where it
has an uncertainty); `predict_dist` exists exactly where `has_uncertainty` says, gives zeros before a
fit and fractions of the best measured throughput after; per-store rows ((n, stores, width), as
cost_model.features=per_store|both gives) are read as well as a flat matrix.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from tuning.core.measure import MeasureSpec
from tuning.core.task import gemm_task
from tuning.cost_model.base import CostModel
from tuning.hardware.synthetic import SyntheticHardware

HARDWARE = SyntheticHardware()
TASK = gemm_task("g", 256, 256, 256)


def measured(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Features and measured GFLOP/s (0 for invalid configs) of random configs."""
    space = HARDWARE.space(TASK)
    rng = np.random.default_rng(seed)
    configs = [space.sample(rng) for _ in range(count)]
    y = np.array([r.gflops(TASK.flops) for r in HARDWARE.measure(TASK, configs, MeasureSpec())])
    return space.features(configs), y


def per_store_rows(X: np.ndarray) -> np.ndarray:
    """(n, 2, d): one store row and one padding row per program."""
    return np.stack([X, np.zeros_like(X)], axis=1)


class CostModelContract:
    """Subclass it with `make_cost_model()`; pytest collects the tests below."""

    min_rank_correlation = 0.3  # Spearman, held-out configs, for a model that can_rank

    def make_cost_model(self) -> CostModel:
        raise NotImplementedError("a cost model's contract test says how to make one")

    # ---- the contract ---------------------------------------------------------------------------
    def test_fit_predict_shapes(self):
        X, y = measured(50, seed=0)
        model = self.make_cost_model()
        assert isinstance(model, CostModel)
        assert isinstance(model.can_rank, bool)
        assert model.fit(X, y) is model, "fit returns the model"
        X_new, _ = measured(17, seed=1)
        scores = model.predict(X_new)
        assert np.shape(scores) == (17,) and np.all(np.isfinite(scores)), np.shape(scores)
        assert np.shape(model.predict(X_new[:0])) == (0,)

    def test_tiny_and_degenerate_fits(self):
        X, y = measured(5, seed=0)
        model = self.make_cost_model()
        assert np.shape(model.predict(X)) == (5,)  # before any fit
        for count in (0, 1):
            model.fit(X[:count], y[:count])
            assert np.shape(model.predict(X)) == (5,) and np.all(np.isfinite(model.predict(X)))
        model.fit(X, np.zeros(5))  # every candidate failed
        assert np.all(np.isfinite(model.predict(X)))

    def test_same_seed_same_predictions(self):
        X, y = measured(100, seed=0)
        X_new, _ = measured(50, seed=1)
        first = self.make_cost_model().fit(X, y).predict(X_new)
        second = self.make_cost_model().fit(X, y).predict(X_new)
        assert np.array_equal(first, second), "two models made and fit alike predict differently"

    def test_ranks_held_out_configs(self):
        model = self.make_cost_model()
        if not model.can_rank:
            pytest.skip("declares can_rank = False")
        X, y = measured(200, seed=0)
        X_test, y_test = measured(500, seed=1)
        model.fit(X, y)
        # a model with an uncertainty ranks by its mean; its `predict` is an acquisition (EI), which
        # ranks uncertain configs high on purpose
        predicted = model.predict_dist(X_test)[0] if model.has_uncertainty else model.predict(X_test)
        correlation = spearmanr(predicted, y_test).correlation
        assert correlation > self.min_rank_correlation, correlation

    def test_predictive_distribution_where_declared(self):
        model = self.make_cost_model()
        X, y = measured(100, seed=0)
        if not model.has_uncertainty:
            with pytest.raises(NotImplementedError):
                model.predict_dist(X)
            return
        mean, std = model.predict_dist(X)  # before a fit: zeros
        assert not mean.any() and not std.any()
        mean, std = model.fit(X, y).predict_dist(X)
        assert mean.shape == std.shape == (100,) and np.all(std >= 0) and std.any()
        best = np.argmax(y)  # fractions of the best measured: the incumbent is near 1
        assert 0.5 < mean[best] <= 1.0 + 1e-9, mean[best]

    def test_reads_per_store_rows(self):
        """cost_model.features=per_store|both gives (n, stores, width): every model takes it."""
        X, y = measured(200, seed=0)
        X_test, y_test = measured(500, seed=1)
        model = self.make_cost_model().fit(per_store_rows(X), y)
        scores = model.predict(per_store_rows(X_test))
        assert np.shape(scores) == (500,) and np.all(np.isfinite(scores))
        if model.can_rank:
            predicted = model.predict_dist(per_store_rows(X_test))[0] if model.has_uncertainty else scores
            assert spearmanr(predicted, y_test).correlation > self.min_rank_correlation
