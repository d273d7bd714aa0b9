"""search=csa: AdaTune's contextual simulated annealing (Li et al. 2020, NeurIPS, §4.2.2, Algorithm 1
lines 5-9).

The simulated annealing of search=sa, run on the cost model's acquisition (cost_model=rf ranks by
expected improvement), with the fixed eps of eps-greedy replaced by a contextual one: after the
walk, K random unmeasured configs are drawn and

    eps_t = mean(sigma(p_1), ..., sigma(p_K)) / Perf(p*)                      (eq. 3)

where sigma is the surrogate's predictive standard deviation and Perf(p*) the best measured
throughput (the models' predict_dist is already in fractions of it). The sampler then takes
(1 - eps_t) b configs from the candidates and eps_t b at random (sampler=greedy uses eps_t in place
of its eps; samplers without a random share ignore it). Exploration grows where the model is
unsure and shrinks as it learns.

The reference code's contextual optimizer file is missing (docs/methods.md §AdaTune); its tuner
resets eps to the mean tree-std over 20 random samples / best FLOPS after each refit, and starts
from 0.05: K = 20 and `initial_eps` 0.05 here, used while the model has no spread yet (nothing
valid measured).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from tuning.core.component import Hyper
from tuning.cost_model.base import model_input
from tuning.search.base import fill_with_random
from tuning.search.sa import SimulatedAnnealing


class ContextualSimulatedAnnealing(SimulatedAnnealing):
    """search=sa's walk on the acquisition, with AdaTune's contextual eps (module docstring)."""

    requires = {"cost_model": ("can_rank", "has_uncertainty")}
    _SA = SimulatedAnnealing.hyperparameters
    hyperparameters = {
        "n_iter": replace(_SA["n_iter"], cite="AutoTVM 0.19's SA (AdaTune §5.1: \"the default settings for other "
                          "hyperparameters provided by AutoTVM\")"),
        "parallel_size": replace(_SA["parallel_size"], default=64,
                                 cite="the reference code (docs/methods.md §AdaTune): 2 x the plan size"),
        "early_stop": replace(_SA["early_stop"], cite="AutoTVM 0.19's SA (AdaTune §5.1)"),
        "temp": replace(_SA["temp"], cite="AutoTVM 0.19's SA: temperature 1 -> 0 (AdaTune §5.1)"),
        "persistent": replace(_SA["persistent"], cite="AutoTVM 0.19's SA: persistent walkers (AdaTune §5.1)"),
        "default_plan_size": replace(_SA["default_plan_size"], default=32,
                                     cite="the reference code (docs/methods.md §AdaTune); a run's budget.plan_size "
                                     "overrides it (null keeps 32)"),
        "uncertainty_samples": Hyper(20, low=1, help="K, the random unmeasured configs whose std sets eps_t",
                                     cite="the code's eps reset: mean tree-std over 20 random samples / best FLOPS "
                                     "(the paper's K has no value)"),
        "initial_eps": Hyper(0.05, low=0.0, high=1.0, help="eps before the model has any spread (AutoTVM's fixed eps)",
                             cite="the code's starting eps"),
    }
    del _SA

    def __init__(self, n_iter: int = 500, parallel_size: int = 64, early_stop: int = 50, temp=(1.0, 0.0),
                 persistent: bool = True, default_plan_size: int = 32, uncertainty_samples: int = 20,
                 initial_eps: float = 0.05):
        super().__init__(n_iter, parallel_size, early_stop, temp, persistent, default_plan_size)
        self.uncertainty_samples = uncertainty_samples
        self.initial_eps = initial_eps
        self.eps = initial_eps
        self.mean_std = 0.0

    def propose(self, space, cost_model, n, visited, rng):
        candidates = super().propose(space, cost_model, n, visited, rng)
        self.eps, self.mean_std = self._contextual_eps(space, cost_model, visited, rng)
        return candidates

    def _contextual_eps(self, space, cost_model, visited, rng) -> tuple[float, float]:
        unmeasured = fill_with_random([], space, visited, self.uncertainty_samples, rng)
        if not unmeasured:
            return self.initial_eps, 0.0
        _, std = cost_model.predict_dist(model_input(space, cost_model, unmeasured))
        mean_std = float(np.mean(std))
        if mean_std <= 0:  # an unfitted model: no context yet
            return self.initial_eps, 0.0
        return min(1.0, mean_std), mean_std  # std is in fractions of Perf(p*): eq. 3's ratio

    def exploration(self) -> float:
        return self.eps

    def metrics(self) -> dict:
        return {"eps": self.eps, "mean_std": self.mean_std}
