"""The contract suite of a search strategy (tuning/search/base.py), for pytest.

A search passes it by subclassing `SearchContract` in a test module and saying how to make one:

    from tuning.testing.search_contract import SearchContract

    class TestMySearch(SearchContract):
        def make_search(self):
            return MySearch(default_plan_size=16)

It runs on synthetic spaces only (tuning/hardware/synthetic.py: a GEMM and a conv2d, `tasks`), with
a cost model fitted on synthetic measurements (a random forest for a search that needs an
uncertainty, xgboost otherwise), and never imports TVM. Every test makes fresh searches with
`make_search()`; `make_space(task)` and `make_cost_model(search, task)` may be overridden too.

What it checks: `propose` returns at most n valid, distinct configs, none of them visited, round
after round, and never measures (the hardware and the model's `fit` are out of reach while it runs);
the same rng seed gives the same proposals; a fresh instance loaded from the JSON of `state_dict()`
proposes what the original would; `observe` accepts error results (a failed build, a failed run, a
timeout) and the search goes on; a search that does not need a ranking model runs on cost_model=none;
one that `schedules_without_measuring` answers `best` with a legitimate config; an out-of-range value of
each hyperparameter with a range (and a value outside each one's options) is refused naming the key;
a class that declares `hyperparameters` has the `__init__` defaults it declares.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tuning.core.component import declaration_problems
from tuning.core.measure import MeasureSpec
from tuning.core.records import MeasureResult
from tuning.core.task import conv2d_task, gemm_task
from tuning.hardware.synthetic import SyntheticHardware
from tuning.search.base import Search

TASKS = {"gemm64": gemm_task("g", 64, 64, 64), "conv": conv2d_task("c", 1, 16, 14, 14, 32, 3, 1, 1)}
HARDWARE = SyntheticHardware()
N = 16  # configs asked of each propose
_MODELS: dict = {}


def visited_of(space, count: int = 20, seed: int = 99) -> set:
    """`count` random canonical configs, as if measured before."""
    rng = np.random.default_rng(seed)
    return {space.canonical(space.sample(rng)) for _ in range(count)}


def fitted_model(kind: str, task, hardware=HARDWARE, samples: int = 64, seed: int = 0):
    """A cost model of `kind` (xgb, rf) fitted on `samples` random configs of the task measured on the
    synthetic hardware; one per kind and task for the process (searches only read it)."""
    key = (kind, task.key, id(hardware))
    if key not in _MODELS:
        if kind == "rf":
            from tuning.cost_model.rf import RandomForestCostModel as Model
        else:
            from tuning.cost_model.xgb import XGBoostCostModel as Model  # type: ignore[assignment]  # either model class
        space = hardware.space(task)
        rng = np.random.default_rng(seed)
        configs = [space.sample(rng) for _ in range(samples)]
        y = [r.gflops(task.flops) for r in hardware.measure(task, configs, MeasureSpec())]
        _MODELS[key] = Model().fit(space.features(configs), np.array(y))
    return _MODELS[key]


def with_errors(results: list) -> list:
    """The results with every third a failed build, every third after the first a failed run, every
    third after the second a timeout (its probe run's seconds kept)."""
    out = []
    for i, result in enumerate(results):
        if i % 3 == 0:
            out.append(MeasureResult.failed("build", "synthetic build failure"))
        elif i % 3 == 1:
            out.append(MeasureResult.failed("run", "synthetic run failure"))
        else:
            out.append(MeasureResult.failed("timeout", "synthetic timeout", run_s=max(result.run_s, 1e-3)))
    return out


class SearchContract:
    """Subclass it with `make_search()`; pytest collects the tests below."""

    tasks: dict = TASKS
    hardware = HARDWARE

    def make_search(self) -> Search:
        raise NotImplementedError("a search's contract test says how to make one")

    def make_space(self, task):
        return self.hardware.space(task)

    def make_cost_model(self, search, task):
        """The model the search ranks with: one with an uncertainty when it needs one."""
        return fitted_model("rf" if search.needs("cost_model", "has_uncertainty") else "xgb", task, self.hardware)

    # ---- helpers --------------------------------------------------------------------------------
    def one_round(self, search, task, model, n, visited, rng, errors: bool = False) -> list:
        """propose, check the proposals, 'measure' them, observe them; returns the proposals."""
        space = self.make_space(task)
        proposals = search.propose(space, model, n, set(visited), rng)
        self.assert_proposals(space, proposals, n, visited)
        batch = [space.canonical(c) for c in proposals]
        results = self.hardware.measure(task, batch, MeasureSpec())
        search.observe(batch, with_errors(results) if errors else results)
        visited |= set(batch)
        return proposals

    @staticmethod
    def assert_proposals(space, proposals, n, visited) -> None:
        assert len(proposals) <= n, f"{len(proposals)} proposals, asked for at most {n}"
        invalid = [c for c in proposals if not space.is_valid(tuple(c))]
        assert not invalid, f"configs not valid in the space: {invalid[:3]}"
        keys = [space.canonical(c) for c in proposals]
        assert len(set(keys)) == len(keys), "the same config proposed twice"
        again = [c for c in keys if c in visited]
        assert not again, f"{len(again)} configs proposed that were measured already: {again[:3]}"

    # ---- the contract ---------------------------------------------------------------------------
    def test_it_is_a_search_with_a_default_plan_size(self):
        search = self.make_search()
        assert isinstance(search, Search)
        assert isinstance(search.default_plan_size, int) and search.default_plan_size > 0
        assert all(isinstance(c, str) for needs in search.requires.values() for c in needs)

    def test_proposals_are_at_most_n_valid_distinct_and_unvisited(self):
        for task in self.tasks.values():
            search, space = self.make_search(), self.make_space(task)
            model, visited, rng = self.make_cost_model(search, task), visited_of(space), np.random.default_rng(0)
            first = self.one_round(search, task, model, N, visited, rng)
            assert first, f"{task.name}: nothing proposed on a fresh space"
            self.one_round(search, task, model, N, visited, rng)

    def test_propose_never_measures(self, monkeypatch):
        def refuse(*args, **kwargs):
            raise AssertionError("propose measured (hardware.measure) or trained the model (cost_model.fit)")

        for task in self.tasks.values():
            search, space = self.make_search(), self.make_space(task)
            model = self.make_cost_model(search, task)
            with monkeypatch.context() as patch:
                patch.setattr(type(self.hardware), "measure", refuse)
                patch.setattr(model, "fit", refuse)
                proposals = search.propose(space, model, N, visited_of(space), np.random.default_rng(0))
            self.assert_proposals(space, proposals, N, visited_of(space))

    def test_the_same_seed_gives_the_same_proposals(self):
        for task in self.tasks.values():
            runs = []
            for _ in range(2):
                search, visited, rng = self.make_search(), set(), np.random.default_rng(7)
                model = self.make_cost_model(search, task)
                runs.append([self.one_round(search, task, model, N, visited, rng) for _ in range(2)])
            assert runs[0] == runs[1], f"{task.name}: the same seed proposed other configs"

    def test_a_state_dict_round_trip_proposes_what_the_original_would(self):
        task = next(iter(self.tasks.values()))
        original, visited = self.make_search(), set()
        model = self.make_cost_model(original, task)
        self.one_round(original, task, model, N, visited, np.random.default_rng(1))
        state = json.loads(json.dumps(original.state_dict()))
        resumed = self.make_search()
        resumed.load_state_dict(state)
        space = self.make_space(task)
        expected = original.propose(space, model, N, set(visited), np.random.default_rng(2))
        assert resumed.propose(space, model, N, set(visited), np.random.default_rng(2)) == expected
        json.dumps(resumed.state_dict())

    def test_observe_accepts_error_results(self):
        for task in self.tasks.values():
            search, visited, rng = self.make_search(), set(), np.random.default_rng(3)
            model = self.make_cost_model(search, task)
            self.one_round(search, task, model, N, visited, rng, errors=True)
            self.one_round(search, task, model, N, visited, rng)
            self.one_round(search, task, model, N, visited, rng, errors=True)
            json.dumps(search.state_dict())
            assert isinstance(search.metrics(), dict)

    def test_without_a_ranking_model_it_runs_on_none(self):
        from tuning.cost_model.none import NoCostModel

        search = self.make_search()
        if search.needs("cost_model", "can_rank"):
            pytest.skip("needs a cost model that ranks; config validation rejects cost_model=none")
        task = next(iter(self.tasks.values()))
        space = self.make_space(task)
        proposals = search.propose(space, NoCostModel(), 8, set(), np.random.default_rng(0))
        assert proposals
        self.assert_proposals(space, proposals, 8, set())

    def test_best_without_measuring_is_legitimate(self):
        search = self.make_search()
        if not search.schedules_without_measuring:
            pytest.skip("does not schedule without measuring")
        task = next(iter(self.tasks.values()))
        space = self.make_space(task)
        chosen = search.best(space, self.make_cost_model(search, task), np.random.default_rng(0))
        assert chosen is not None, "no schedule chosen"
        config, seconds = chosen
        assert space.is_legitimate(tuple(config))
        assert seconds is None or (math.isfinite(seconds) and seconds > 0)

    def test_an_out_of_range_hyperparameter_is_refused_naming_its_key(self):
        cls = type(self.make_search())
        for key, (low, high) in cls.ranges.items():
            bad = low - 1 if low is not None else high + 1
            problems = cls.check_params({key: bad}, "search")
            assert any(p.startswith(f"search.{key}:") for p in problems), (key, bad, problems)
        for key in cls.options:
            problems = cls.check_params({key: "no such choice"}, "search")
            assert any(p.startswith(f"search.{key}:") for p in problems), (key, problems)
        problems = cls.check_params({"no_such_key": 1}, "search")
        assert any(p.startswith("search.no_such_key:") for p in problems), problems

    def test_declared_hyperparameters_are_the_init_defaults(self):
        assert declaration_problems(type(self.make_search())) == []
