"""cost_model=xgb_ms: MetaSchedule's XGBoost cost model, on per-store features.

After TVM 0.27 `s_tir/meta_schedule/cost_model/xgb_model.py` (XGBModel), itself Ansor's model
(Zheng et al. 2020, "Ansor: generating high-performance tensor programs for deep learning", OSDI,
§6): a program is described by one feature row per buffer store (PerStoreFeature), the trees score
each row, and the program's score is the sum over its rows ("pack-sum"). The loss is the squared
error between that sum and the throughput normalised by the best measured (MetaSchedule: min cost /
cost), each program weighted by its own label, so failed programs (label 0) teach nothing.

MetaSchedule's details kept: max_depth 10, gamma 0.001, min_child_weight 0, eta 0.2; up to 10000
rounds with early stopping after 50 without a gain in training p-rmse (the rmse of the summed
scores); random scores until `num_warmup_samples` (100) programs are measured; adaptive training
(refit only when the data grew by a fifth since the last fit). Where tunelab differs, and why:
  - nthread 1 (MetaSchedule: every physical core), so a fit is bit-reproducible from the seed;
  - the warm-up scores are a hash of (seed, the program's features), not an unseeded
    np.random.uniform: the same seed proposes the same configs, and a resumed run the same ones
    (when it last refit is saved with the run's state, so a resume refits as the run did);
  - the rows come padded to one count per task (tuning/core/features.py `model_features`): all-zero rows
    are padding and are dropped, which restores MetaSchedule's ragged rows.
With `features: knobs` each program is one row of knob features (MetaSchedule's loss and trees on
AutoTVM's features); with `both` every store row carries the knob features too.

Transfer (`pretrained: models:/<name>/<version>`, from `python -m tuning.tools.pretrain`): a booster trained
on the measurement store's kernels scores the programs until the warm-up is over, in place of the
random scores, and every fit after it continues boosting from that booster on the run's own records
(fine-tuning; TenSet's and TLP's use of a pre-trained model). Loaded on first use from `registry`
(default: the embedded MLflow store under outputs/), from the saved booster's bytes only; before any
work it is read once to check it is a booster with the features' row width (per_store: 164).
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

from tuning.config import ConfigError
from tuning.core.component import MAX_SEED, external_checks
from tuning.cost_model.base import CostModel

# xgboost is imported on first fit: it imports scikit-learn and SciPy (2 s of every start), which a run
# refused by validation, or one that fits nothing, never needs
if TYPE_CHECKING:
    import xgboost as xgb

PER_STORE_WIDTH = 164  # numbers in a row of TVM's PerStoreFeature (tuning/hardware/tvm_space.py)


class MetaScheduleXGBoost(CostModel):
    """Hyperparameters (MetaSchedule XGBConfig / XGBModel defaults unless noted):

        max_depth 10, gamma 0.001, min_child_weight 0, eta 0.2
        num_boost_round         cap on boosting rounds (10000)
        early_stopping_rounds   rounds without training p-rmse gain before stopping (50)
        num_warmup_samples      programs measured before the trees are used; random scores
                                until then (100)
        adaptive_training       refit only when the data grew by a fifth since the last fit (true)
        seed                    xgboost seed and the warm-up scores' seed (from the run's seed)
        nthread                 xgboost threads (1; MetaSchedule: physical cores)
        features                per_store (MetaSchedule) | both | knobs
        pretrained              a registered model to start from (null: none)
        registry                the MLflow registry holding it (null: outputs/mlflow.db)
    """

    ranges = {"max_depth": (1, 64), "gamma": (0.0, None), "min_child_weight": (0.0, None), "eta": (1e-6, 1.0),
              "num_boost_round": (1, None), "early_stopping_rounds": (1, None), "num_warmup_samples": (0, None),
              "seed": (0, MAX_SEED), "nthread": (1, None)}

    def __init__(self, max_depth: int = 10, gamma: float = 0.001, min_child_weight: float = 0.0, eta: float = 0.2,
                 num_boost_round: int = 10000, early_stopping_rounds: int = 50, num_warmup_samples: int = 100,
                 adaptive_training: bool = True, seed: int = 0, nthread: int = 1, features: str = "per_store",
                 pretrained: str | None = None, registry: str | None = None):
        self.max_depth = max_depth
        self.gamma = gamma
        self.min_child_weight = min_child_weight
        self.eta = eta
        self.num_boost_round = num_boost_round
        self.early_stopping_rounds = early_stopping_rounds
        self.num_warmup_samples = num_warmup_samples
        self.adaptive_training = adaptive_training
        self.seed = seed
        self.nthread = nthread
        self.features = features
        self.pretrained = pretrained
        self.registry = registry
        self.booster: xgb.Booster | None = None
        self.base: xgb.Booster | None = None  # the pretrained booster, loaded on first use
        self.trained_on = 0  # programs in the last fit (adaptive training's reference)
        self.trained_records = 0  # records the last fit saw (saved: a resume refits on as many first)
        self._resume_at = 0

    @classmethod
    def check(cls, params, group):
        """A pretrained model must exist, read the same features and be a readable booster of their
        row width (looked up and read before any work)."""
        if params.get("pretrained") is None:
            return [f"{group}.registry: set, but there is no {group}.pretrained to load from it"] \
                if params.get("registry") is not None else []
        if not external_checks():
            return []
        from tuning.tracking.registry import RegistryError, default_registry, load_booster, resolve

        registry = params.get("registry") or default_registry()
        try:
            version = resolve(params["pretrained"], registry)
        except RegistryError as error:
            return [f"{group}.pretrained: {error} (tunelab pretrain registers one)"]
        trained_on = version.tags.get("tunelab.features")
        if trained_on != params["features"]:
            return [f"{group}.pretrained: {params['pretrained']} reads features {trained_on}, not "
                    f"{group}.features={params['features']}"]
        try:
            booster, _ = load_booster(params["pretrained"], registry)
        except RegistryError as error:
            return [f"{group}.pretrained: {error}"]
        if params["features"] == "per_store" and booster.num_features() != PER_STORE_WIDTH:
            return [f"{group}.pretrained: {params['pretrained']} reads rows of {booster.num_features()} features, "
                    f"not TVM's {PER_STORE_WIDTH} per-store features (tunelab pretrain registers one)"]
        return []  # knob rows have another width in every task's space: checked on first use

    def _pretrained(self, width: int) -> xgb.Booster | None:
        """The pretrained booster (None without one), refused unless it reads rows of `width`."""
        if self.pretrained is not None and self.base is None:
            from tuning.tracking.registry import default_registry, load_booster

            self.base, _ = load_booster(self.pretrained, self.registry or default_registry())
        if self.base is not None and self.base.num_features() != width:
            raise ConfigError(f"cost_model.pretrained: {self.pretrained} reads rows of {self.base.num_features()} "
                              f"features; this task's {self.features} rows have {width}")
        return self.base

    def _params(self) -> dict:
        return {"max_depth": self.max_depth, "gamma": self.gamma, "min_child_weight": self.min_child_weight,
                "eta": self.eta, "seed": self.seed, "nthread": self.nthread, "verbosity": 0,
                "disable_default_eval_metric": 1, "base_score": 0.0}  # sums start at 0 whatever the row count

    def state_dict(self) -> dict:
        return {"trained_records": self.trained_records}

    def load_state_dict(self, state: dict) -> None:
        value = state.get("trained_records", 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"cost model state: trained_records must be a count, got {value!r}")
        self._resume_at = value

    def fit(self, X, y):
        y = np.asarray(y, dtype=np.float64)
        resume_at, self._resume_at = self._resume_at, 0
        if resume_at and self.booster is None and resume_at <= len(y):
            self.fit(np.asarray(X)[:resume_at], y[:resume_at])  # the model the uninterrupted run had
        rows, ids = pack(X)
        kept = np.unique(ids)  # programs with at least one store (MetaSchedule drops the others)
        if len(kept) < max(2, self.num_warmup_samples) or float(y.max(initial=0.0)) <= 0:
            self.booster, self.trained_on, self.trained_records = None, 0, 0
            return self
        if self.adaptive_training and self.booster is not None and len(kept) - self.trained_on < self.trained_on / 5:
            return self
        self._boost(rows, ids, y / float(y.max()))
        self.trained_on, self.trained_records = len(kept), len(y)
        return self

    def fit_kernels(self, features: list, ratios: list) -> "MetaScheduleXGBoost":
        """Fit on several kernels at once (pre-training): each kernel's programs with labels already
        normalised within the kernel (best seconds / seconds), MetaSchedule's groups. Per-store rows
        only: knob features have another width for every kernel."""
        rows, ids, labels, offset = [], [], [], 0
        for X, y in zip(features, ratios):
            kernel_rows, kernel_ids = pack(X)
            rows.append(kernel_rows)
            ids.append(kernel_ids + offset)
            labels.append(np.asarray(y, dtype=np.float64))
            offset += len(np.asarray(X))
        self._boost(np.concatenate(rows), np.concatenate(ids), np.concatenate(labels))
        self.trained_on = offset
        return self

    def _boost(self, rows, ids, labels) -> None:
        """Train on packed rows, continuing from the pretrained booster when there is one."""
        base = self._pretrained(rows.shape[1])
        self.booster = train_pack_sum(self._params(), rows, ids, labels, self.num_boost_round,
                                      self.early_stopping_rounds, start=None if base is None else base.copy())

    def predict(self, X):
        rows, ids = pack(X)
        n = len(np.asarray(X))
        booster = self.booster or self._pretrained(rows.shape[1])
        if booster is None:
            return warmup_scores(X, self.seed)
        if len(rows) == 0:
            return np.zeros(n, dtype=np.float64)
        per_row = booster.inplace_predict(rows).astype(np.float64)
        return np.bincount(ids, weights=per_row, minlength=n)


def pack(X) -> tuple[np.ndarray, np.ndarray]:
    """(rows, program ids): each program's non-zero rows (a 2-D X is one row per program)."""
    X = np.asarray(X, dtype=np.float32)
    if X.ndim == 2:
        X = X[:, None, :]
    real = np.abs(X).sum(axis=2) > 0
    ids, slots = np.nonzero(real)
    return X[ids, slots], ids


def train_pack_sum(params, rows, ids, labels, num_boost_round, early_stopping_rounds, start=None) -> xgb.Booster:
    """xgboost with MetaSchedule's pack-sum squared error (PackSum.obj_square_error): the gradient of
    (sum of a program's row scores - label)^2, weighted by the label, on every row of the program.
    `start`: a booster to continue boosting from (fine-tuning a pretrained model)."""
    import xgboost as xgb

    row_labels = labels[ids]
    data = xgb.DMatrix(rows, label=row_labels, weight=row_labels, nthread=params["nthread"])

    def summed(row_scores):
        return np.bincount(ids, weights=row_scores, minlength=len(labels))[ids]

    def objective(row_scores, _data):
        gradient = summed(row_scores) - row_labels
        return gradient * row_labels, row_labels.copy()

    def p_rmse(row_scores, _data):
        return "p-rmse", float(np.sqrt(np.mean(np.square(summed(row_scores) - row_labels))))

    stop = xgb.callback.EarlyStopping(rounds=early_stopping_rounds, metric_name="p-rmse", save_best=True)
    return xgb.train(params, data, num_boost_round=num_boost_round, obj=objective, custom_metric=p_rmse,
                     evals=[(data, "tr")], verbose_eval=False, callbacks=[stop], xgb_model=start)


def warmup_scores(X, seed: int) -> np.ndarray:
    """MetaSchedule's random scores before the warm-up, as a deterministic hash of the seed and each
    program's real (non-padding) rows (`pack`): uniform in [0, 1), the same whatever the padding."""
    n = len(np.asarray(X))
    rows, ids = pack(X)
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    scores = []
    for real in np.split(rows, np.searchsorted(ids, np.arange(1, n))):  # ids ascend: one piece a program
        digest = hashlib.sha256(seed.to_bytes(8, "little") + np.ascontiguousarray(real).tobytes()).digest()
        scores.append(int.from_bytes(digest[:8], "little") / 2**64)
    return np.array(scores, dtype=np.float64)
