"""The search contract.

A search strategy proposes candidate configs each round; it never measures.

    propose(space, cost_model, n, visited, rng) -> list of configs
        At most n configs, valid in `space` (space.is_valid), distinct, best
        first by the strategy's own judgement. It may skip `visited` (a set of
        canonical configs already measured) but need not: the sampler filters.
        All randomness comes from `rng` (a numpy Generator seeded by the run).
        `cost_model` may be a model that cannot rank (cost_model=none);
        strategies that need one declare `needs_cost_model = True` and the
        config is rejected before any work.
    observe(configs, results)
        The configs measured this round (canonical) and their MeasureResults.
    state_dict() / load_state_dict(state)
        Everything needed to continue after a resume (JSON-serialisable).

__init__ stores hyperparameters only: no TVM, no I/O, no threads.
"""
from __future__ import annotations


class Search:
    needs_cost_model = False

    def propose(self, space, cost_model, n, visited, rng):
        raise NotImplementedError

    def observe(self, configs, results):
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
