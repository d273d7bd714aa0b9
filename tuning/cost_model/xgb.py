"""cost_model=xgb / xgb_rank: AutoTVM's XGBoost cost model, regression or rank loss.

After TVM <= 0.19 `autotvm/tuner/xgboost_cost_model.py` with loss_type="reg":
gradient-boosted trees on the features, trained on throughput normalised by
the best seen (y / max(y)), so predictions are "fraction of the best so far"
and SA's temperature 1 -> 0 is on that scale.

AutoTVM trains up to 8000 rounds and stops when recall@plan_size on the
training set has not improved for 20 rounds. tunelab bounds that at
`num_boost_round` (400) and stops when the training RMSE has not improved for
`early_stopping_rounds` (50), keeping the best round: no plan size has to
reach the model, a fit costs well under a second at thousands of samples, and
with depth-3 trees at eta 0.3 the fit on a few hundred samples has settled
long before 400 rounds.

`objective: rank:pairwise` (cost_model=xgb_rank) is AutoTVM's loss_type="rank", the loss
AdaTune's baseline tuner used: pairwise ranking over all measured configs as one group. Its
predictions are scores with no scale, so early stopping watches what AutoTVM watched, the
training recall@N (the share of the N best measured configs among the N best predicted; AutoTVM
took N = the plan size), not RMSE. xgboost >= 2 refuses non-integer relevance labels for its
default ranking metric, which is why the default metric is switched off.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tuning.core.component import MAX_SEED
from tuning.cost_model.base import CostModel, flat

# xgboost is imported on first fit: it imports scikit-learn and SciPy (2 s of every start), which a run
# refused by validation, or one that fits nothing, never needs
if TYPE_CHECKING:
    import xgboost as xgb

OBJECTIVES = ("reg:squarederror", "rank:pairwise")


class XGBoostCostModel(CostModel):
    """Hyperparameters (AutoTVM "reg" defaults unless noted):

        max_depth 3, gamma 1e-4, min_child_weight 1, subsample 1.0, eta 0.3,
        reg_lambda 1 (xgboost `lambda`), alpha 0, objective reg:squarederror
        (AutoTVM's "reg:linear", renamed by xgboost)
        num_boost_round         cap on boosting rounds (400; AutoTVM 8000)
        early_stopping_rounds   rounds without training-RMSE gain before
                                stopping (50; AutoTVM 20 on recall@plan_size)
        recall_at               rank objective only: N of the training recall@N that early
                                stopping watches (64: AutoTVM's plan size)
        seed                    xgboost seed (from the run's seed)
        nthread                 xgboost threads (1: bit-reproducible fits)
        features                knobs | per_store | both (tuning/cost_model/base.py; flattened)
    """

    ranges = {"max_depth": (1, 64), "gamma": (0.0, None), "min_child_weight": (0.0, None), "subsample": (1e-6, 1.0),
              "eta": (1e-6, 1.0), "reg_lambda": (0.0, None), "alpha": (0.0, None), "num_boost_round": (1, None),
              "early_stopping_rounds": (1, None), "recall_at": (1, None), "seed": (0, MAX_SEED), "nthread": (1, None)}
    options = {**CostModel.options, "objective": OBJECTIVES}

    def __init__(self, max_depth: int = 3, gamma: float = 0.0001, min_child_weight: float = 1,
                 subsample: float = 1.0, eta: float = 0.3, reg_lambda: float = 1.0, alpha: float = 0.0,
                 objective: str = "reg:squarederror", num_boost_round: int = 400,
                 early_stopping_rounds: int = 50, recall_at: int = 64, seed: int = 0, nthread: int = 1,
                 features: str = "knobs"):
        self.max_depth = max_depth
        self.gamma = gamma
        self.min_child_weight = min_child_weight
        self.subsample = subsample
        self.eta = eta
        self.reg_lambda = reg_lambda
        self.alpha = alpha
        self.objective = objective
        self.num_boost_round = num_boost_round
        self.early_stopping_rounds = early_stopping_rounds
        self.recall_at = recall_at
        self.seed = seed
        self.nthread = nthread
        self.features = features
        self.booster: xgb.Booster | None = None

    @property
    def ranks(self) -> bool:
        return self.objective.startswith("rank:")

    def _params(self) -> dict:
        params = {
            "max_depth": self.max_depth, "gamma": self.gamma, "min_child_weight": self.min_child_weight,
            "subsample": self.subsample, "eta": self.eta, "lambda": self.reg_lambda, "alpha": self.alpha,
            "objective": self.objective, "seed": self.seed, "nthread": self.nthread, "verbosity": 0,
        }
        return {**params, "disable_default_eval_metric": 1} if self.ranks else params

    def fit(self, X, y):
        X = flat(X)
        y = np.asarray(y, dtype=np.float64)
        if len(y) < 2:  # nothing to learn an order from: predict zeros, as unfitted
            self.booster = None
            return self
        y = y / max(float(y.max()), 1e-8)
        import xgboost as xgb

        # the fit's threads build the matrix too: xgboost's default (every core) waits on busy cores
        self.booster = self._boost(xgb.DMatrix(X, label=y, nthread=self.nthread))
        return self

    def _boost(self, train):
        """What xgb.train(params, train, num_boost_round, evals=[(train, "train")], callbacks=
        [EarlyStopping(rounds=early_stopping_rounds, save_best=True, maximize=ranks)], custom_metric)
        does, without its callback machinery (a third of a replayed run's fitting): the same updates and
        evaluations in the same order give the same trees; the best round's model is kept."""
        import xgboost as xgb

        booster = xgb.Booster(self._params(), [train, train])
        metric = self._recall if self.ranks else None
        best_score, best_round, waited = None, 0, 0
        for round_ in range(self.num_boost_round):
            booster.update(train, iteration=round_)
            score = float(booster.eval_set([(train, "train")], round_, metric).rsplit(":", 1)[1])
            if best_score is None or (score > best_score if self.ranks else score < best_score):
                best_score, best_round, waited = score, round_, 0
            else:
                waited += 1
                if waited >= self.early_stopping_rounds:
                    break
        best = booster[:best_round + 1]
        best.set_attr(best_iteration=str(best_round), best_score=str(best_score))  # as EarlyStopping leaves them
        return best.reset()

    def _recall(self, predictions, data) -> tuple[str, float]:
        return f"recall@{self.recall_at}", top_n_recall(predictions, data.get_label(), self.recall_at)

    def predict(self, X):
        X = flat(X)
        if self.booster is None or len(X) == 0:
            return np.zeros(len(X), dtype=np.float64)
        return self.booster.inplace_predict(X).astype(np.float64)


def top_n_recall(predictions, labels, n: int) -> float:
    """The share of the n best by `labels` among the n best by `predictions` (AutoTVM's
    xgb_average_recalln_curve_score at n)."""
    n = min(n, len(labels))
    predicted = np.argsort(-np.asarray(predictions), kind="stable")[:n]
    actual = np.argsort(-np.asarray(labels), kind="stable")[:n]
    return len(set(predicted.tolist()) & set(actual.tolist())) / n
