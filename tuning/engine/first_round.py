"""A prior's first round: a task with no measurement yet gets its first round from a cost model
pre-trained on other kernels and hosts (`tuning.prior`), not from its search's first guesses.

    tuning.prior: auto | null | package:NAME (a prior shipped with tunelab, tuning/cost_model/priors/) |
                  a registered booster (cost_model.pretrained's forms: models:/NAME/VERSION)
                  auto (the default): the hardware's `default_prior` (hardware=cpu: package:cpu),
                  none on hardware that has none (synthetic, replay, cuda)

A search's cost model has seen nothing of a new task, so its first proposals are random (xgb_ms
scores a hash until its warm-up). With a prior, the first round of each task draws POOL x the
round's size random legitimate unvisited configs from the task's own generator (the same on a
resume), scores them with the prior (MetaSchedule's pack-sum XGBoost on TVM's per-store features,
tuning/cost_model/xgb_ms.py, which transfer across kernels where knob features cannot), and
measures the best scored; from the second round on the method decides as it always does, its own
model fit on what the first round measured. No prior applies to a space without per-store features
(a synthetic space, a replay without TVM: the run says so) or one measured config by config, nor to
a task that reused records (tuning.database); a common random first round (budget.init_random)
keeps its configs and the prior fills what is left of the round (nothing, where they fill it).
"""
from __future__ import annotations

import logging
from typing import Protocol, Sequence

import numpy as np

from tuning.core.space import Config, Space
from tuning.sampler.base import random_unvisited

log = logging.getLogger("tunelab")

POOL = 8  # random configs scored per config the first round measures
AUTO = "auto"


class Prior(Protocol):
    """What the loop asks of a prior."""

    def applies(self, space: Space) -> bool:
        """Whether it can score this space's configs."""
        ...

    def scores(self, space: Space, configs: Sequence[Config]) -> np.ndarray:
        """Higher is expected faster, one per config."""
        ...


class PretrainedPrior:
    """A pre-trained booster read through xgb_ms (its loading, checks and pack-sum prediction): a
    shipped one (package:NAME) read from the package, a registered one from the MLflow registry."""

    def __init__(self, reference: str, registry: str | None = None, seed: int = 0):
        from tuning.cost_model import priors
        from tuning.cost_model.xgb_ms import MetaScheduleXGBoost

        self.reference = reference
        shipped = priors.packaged(reference)
        self.model = MetaScheduleXGBoost(features="per_store", pretrained=None if shipped else reference,
                                         registry=registry, seed=seed)
        if shipped:
            self.model.base, _ = priors.load(reference)

    def applies(self, space: Space) -> bool:
        return space.store_features is not None

    def scores(self, space: Space, configs: Sequence[Config]) -> np.ndarray:
        from tuning.cost_model.base import model_input

        return np.asarray(self.model.predict(model_input(space, self.model, configs)), dtype=np.float64)


def prior_of(reference: str | None, seed: int, hardware=None) -> PretrainedPrior | None:
    """tuning.prior's prior (auto: `hardware`'s default_prior), or None where there is none."""
    chosen = resolved(reference, hardware)
    if reference == AUTO and chosen:
        log.info(f"first rounds: each kernel's first round is the shipped prior's pick ({chosen}, tuning.prior=auto "
                 f"on this hardware; tuning.prior=null for the method's own)")
    return PretrainedPrior(chosen, seed=seed) if chosen else None


def resolved(reference: str | None, hardware) -> str | None:
    """What tuning.prior names on this hardware: auto is the hardware's default_prior (None
    without one); anything else as it is."""
    return getattr(hardware, "default_prior", None) if reference == AUTO else reference


def prior_problems(reference: str) -> list[str]:
    """Why tuning.prior cannot be read as a prior (looked up and read before any work), or []."""
    from tuning.core.component import external_checks
    from tuning.cost_model import priors
    from tuning.cost_model.xgb_ms import PER_STORE_WIDTH

    if reference == AUTO:
        return []  # the hardware's default_prior, a shipped one (tests/test_package.py reads each)
    if priors.packaged(reference):
        try:
            booster, about = priors.load(reference)
        except priors.PriorError as error:
            return [f"tuning.prior: {error}"]
        tags = {"tunelab.features": about.get("features")}
    elif not external_checks():
        return []
    else:
        from tuning.tracking.registry import RegistryError, default_registry, load_booster

        try:
            booster, tags = load_booster(reference, default_registry())
        except RegistryError as error:
            return [f"tuning.prior: {error} (tunelab pretrain registers one)"]
    if tags.get("tunelab.features") != "per_store" or booster.num_features() != PER_STORE_WIDTH:
        return [f"tuning.prior: {reference} does not read TVM's {PER_STORE_WIDTH} per-store features "
                "(tunelab pretrain registers one that does)"]
    return []


def guided_round(prior: Prior, space: Space, visited: set, chosen: list, n: int,
                 rng: np.random.Generator) -> list[Config]:
    """Up to `n` unvisited configs not in `chosen`: the best scored by `prior` of POOL x n random
    ones drawn from `rng` (fewer where the space has fewer left)."""
    pool: list[Config] = []
    while len(pool) < POOL * n:
        config = random_unvisited(space, visited, [*chosen, *pool], rng)
        if config is None:
            break
        pool.append(config)
    if len(pool) <= n:
        return pool
    scores = prior.scores(space, pool)
    best = np.argsort(-scores, kind="stable")[:n]
    return [pool[i] for i in sorted(best)]
