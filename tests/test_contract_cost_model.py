"""Contract of every cost model in conf/cost_model/: shapes, tiny fits, ranking where it can."""
from __future__ import annotations


import numpy as np
import pytest
from scipy.stats import spearmanr

from tuning.core.measure import MeasureSpec
from tuning.hardware.synthetic import SyntheticHardware
from tuning.core.task import gemm_task

from configs import group_yamls, instantiate_option

COST_MODEL_YAMLS = group_yamls("cost_model")
HARDWARE = SyntheticHardware()
TASK = gemm_task("g", 256, 256, 256)


def measured(count, seed):
    """Features and measured GFLOP/s (0 for invalid configs) of random configs."""
    space = HARDWARE.space(TASK)
    rng = np.random.default_rng(seed)
    configs = [space.sample(rng) for _ in range(count)]
    y = np.array([r.gflops(TASK.flops) for r in HARDWARE.measure(TASK, configs, MeasureSpec())])
    return space.features(configs), y


@pytest.mark.parametrize("path", COST_MODEL_YAMLS, ids=lambda p: p.stem)
def test_fit_predict_shapes(path):
    X, y = measured(50, seed=0)
    model = instantiate_option(path)
    assert isinstance(model.can_rank, bool)
    assert model.fit(X, y) is model
    X_new, _ = measured(17, seed=1)
    scores = model.predict(X_new)
    assert np.shape(scores) == (17,) and np.all(np.isfinite(scores))
    assert np.shape(model.predict(X_new[:0])) == (0,)


@pytest.mark.parametrize("path", COST_MODEL_YAMLS, ids=lambda p: p.stem)
def test_tiny_and_degenerate_fits(path):
    X, y = measured(5, seed=0)
    model = instantiate_option(path)
    assert np.shape(model.predict(X)) == (5,)  # before any fit
    for count in (0, 1):
        model.fit(X[:count], y[:count])
        assert np.shape(model.predict(X)) == (5,) and np.all(np.isfinite(model.predict(X)))
    model.fit(X, np.zeros(5))  # every candidate failed
    assert np.all(np.isfinite(model.predict(X)))


@pytest.mark.parametrize("path", COST_MODEL_YAMLS, ids=lambda p: p.stem)
def test_same_seed_same_predictions(path):
    X, y = measured(100, seed=0)
    X_new, _ = measured(50, seed=1)
    first = instantiate_option(path, seed=3).fit(X, y).predict(X_new)
    second = instantiate_option(path, seed=3).fit(X, y).predict(X_new)
    assert np.array_equal(first, second)


@pytest.mark.parametrize("path", COST_MODEL_YAMLS, ids=lambda p: p.stem)
def test_ranks_held_out_configs(path):
    model = instantiate_option(path)
    if not model.can_rank:
        pytest.skip("declares can_rank = False")
    X, y = measured(200, seed=0)
    X_test, y_test = measured(500, seed=1)
    model.fit(X, y)
    # a model with an uncertainty ranks by its mean; its `predict` is an acquisition (EI), which
    # ranks uncertain configs high on purpose
    predicted = model.predict_dist(X_test)[0] if model.has_uncertainty else model.predict(X_test)
    correlation = spearmanr(predicted, y_test).correlation
    assert correlation > 0.3, correlation


@pytest.mark.parametrize("path", COST_MODEL_YAMLS, ids=lambda p: p.stem)
def test_predictive_distribution_where_declared(path):
    model = instantiate_option(path)
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


@pytest.mark.parametrize("path", COST_MODEL_YAMLS, ids=lambda p: p.stem)
def test_reads_per_store_rows(path):
    """cost_model.features=per_store|both gives (n, stores, width): every model takes it."""
    def rows(X):  # one store row and one padding row per program
        return np.stack([X, np.zeros_like(X)], axis=1)

    X, y = measured(200, seed=0)
    X_test, y_test = measured(500, seed=1)
    model = instantiate_option(path).fit(rows(X), y)
    scores = model.predict(rows(X_test))
    assert np.shape(scores) == (500,) and np.all(np.isfinite(scores))
    if model.can_rank:
        predicted = model.predict_dist(rows(X_test))[0] if model.has_uncertainty else scores
        assert spearmanr(predicted, y_test).correlation > 0.3
