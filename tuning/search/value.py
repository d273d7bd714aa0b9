"""search=value: schedules proposed by a learned value function, no cost model, no measurement to choose.

The fifth seed paper (Steiner et al., "Value function based performance optimization of deep learning
workloads"): V (`tunelab value train`, registered in MLflow) predicts the best runtime any
completion of a partial schedule can reach; a schedule is built one decision at a time, keeping the
lowest-valued states (tuning/value/beam.py). Each round:

 1. V's best completions of the empty schedule, by greedy search (Alg. 1, `greedy: true`) or by beam
    search of width `beam`, best first; those already measured or that do not schedule (the space's
    legitimacy check: TVM replays them) are passed over.
 2. While fewer than n: another search with V's values perturbed by Alg. 2's epsilon (`noise`, a
    log-normal factor exp(noise x N(0, 1)) on the predicted seconds), its best new completion taken;
    after 4n searches, random unmeasured configs fill the round.

`best(space)` is step 1's first legitimate completion: what a run with budget.trials=0 applies.
V stays fixed while the run measures (the paper refits it offline, in its improvement loop).
"""
from __future__ import annotations

from tuning.core.component import Hyper, external_checks
from tuning.search.base import Search, fill_with_random
from tuning.value.beam import beam_search, first_legitimate
from tuning.value.encoding import work

NOISY_SEARCHES_PER_PROPOSAL = 4


class ValueSearch(Search):
    """Steiner et al.'s value-function search (module docstring)."""

    schedules_without_measuring = True
    hyperparameters = {
        "model": Hyper(None, help="required: the registered V: models:/<name>/<version>, <name>/<version> or <name> "
                       "(latest)", cite="registered by `python -m tuning.value train`"),
        "registry": Hyper(None, help="the MLflow registry holding it (null: outputs/mlflow.db)",
                          cite="tunelab's: the lab's own registry, where `tunelab value train` registers V"),
        "greedy": Hyper(True, help="true: the paper's Alg. 1 (one state kept per decision); false: beam search",
                        cite="Alg. 1 (N x M values for N decisions of M choices); greedy false with beam > 1: its "
                        "beam search (the paper gives no width; Fig. 1 compares both)"),
        "beam": Hyper(1, low=1, help="the beam's width when greedy is false", cite="the paper gives no width"),
        "noise": Hyper(0.1, low=0.0, high=10.0, help="epsilon of the perturbed searches that fill a round (Alg. 2); "
                       "log-normal on the predicted seconds",
                       cite="Alg. 2's epsilon; the paper gives no value: \"a small amount of random noise\""),
        "default_plan_size": Hyper(64, low=1, help="configs measured per round in a run with a budget",
                                   cite="AutoTVM's plan size; the paper measures nothing at search time "
                                   "(budget.trials=0 applies V's best schedule)"),
    }

    def __init__(self, model: str | None = None, registry: str | None = None, greedy: bool = True, beam: int = 1,
                 noise: float = 0.1, default_plan_size: int = 64):
        self.model = model
        self.registry = registry
        self.greedy = greedy
        self.beam = beam
        self.noise = noise
        self.default_plan_size = default_plan_size
        self.net = None  # loaded on first use
        self.last: dict = {}

    @classmethod
    def check(cls, params, group):
        """The model must be given, registered, and a value function (looked up before any work)."""
        problems = []
        if params.get("greedy") and params.get("beam", 1) != 1:
            problems.append(f"{group}.beam: {params['beam']} with {group}.greedy=true (greedy keeps one state); "
                            f"set {group}.greedy=false for a beam search")
        if not params.get("model"):
            return problems + [f"{group}.model: required: a registered value function "
                               "(tunelab value train registers one)"]
        if not external_checks():
            return problems
        from tuning.tracking.registry import RegistryError, default_registry, resolve

        try:
            version = resolve(params["model"], params.get("registry") or default_registry())
        except RegistryError as error:
            return problems + [f"{group}.model: {error} (tunelab value train registers one)"]
        if version.tags.get("tunelab.kind") != "value" or "tunelab.value_net" not in version.tags:
            problems.append(f"{group}.model: {params['model']} is not a value function (its tunelab.kind tag is "
                            f"{version.tags.get('tunelab.kind')!r}); tunelab value train registers one")
            return problems
        from tuning.value.net import load_value

        try:  # its weights read now (weights only, then cached): an unreadable file is refused before any work
            load_value(params["model"], params.get("registry") or default_registry())
        except RegistryError as error:
            problems.append(f"{group}.model: {error}")
        return problems

    @property
    def width(self) -> int:
        return 1 if self.greedy else self.beam

    def _value(self):
        if self.net is None:
            from tuning.tracking.registry import default_registry
            from tuning.value.net import load_value

            self.net = load_value(self.model, self.registry or default_registry())
        return self.net.value

    def best(self, space, cost_model=None, rng=None):
        """(V's best legitimate completion, its predicted seconds); None when none of them schedules."""
        chosen = first_legitimate(space, beam_search(space, self._value(), self.width))
        return None if chosen is None else (chosen[1], float(10.0 ** chosen[0] * work(space)))

    def propose(self, space, cost_model, n, visited, rng):
        value = self._value()
        proposals, keys = [], set()

        def offer(found, limit):
            for _, config in found:
                if len(proposals) >= limit:
                    return
                key = space.canonical(config)
                if key not in visited and key not in keys and space.is_legitimate(config):
                    proposals.append(config)
                    keys.add(key)

        offer(beam_search(space, value, self.width), n)
        searches = 0
        while len(proposals) < n and self.noise > 0 and searches < NOISY_SEARCHES_PER_PROPOSAL * n:
            offer(beam_search(space, value, self.width, noise=self.noise, rng=rng), len(proposals) + 1)
            searches += 1
        self.last = {"from_value": len(proposals), "noisy_searches": searches}
        return fill_with_random(proposals, space, visited, n, rng)

    def metrics(self) -> dict:
        return dict(self.last)
