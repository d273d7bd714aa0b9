"""Every sampler in conf/sampler/ (and in the directories of TUNELAB_CONF_DIRS) passes the shipped contract
suite (tuning.testing.sampler_contract): at most b distinct, canonical, unvisited configs, exactly b
when the candidates allow, reproducible. The suite can fail: a sampler that hands back configs measured
already fails it, run by pytest from another folder."""
from __future__ import annotations

import pytest

from configs import group_yamls, instantiate_option
from helpers import write_and_run
from tuning.testing.sampler_contract import SamplerContract

SAMPLER_YAMLS = group_yamls("sampler")


@pytest.fixture(params=SAMPLER_YAMLS, ids=lambda p: p.stem)
def sampler_yaml(request):
    return request.param


class TestSamplerOption(SamplerContract):
    """The shipped suite, once per conf/sampler YAML (the test ids name the option)."""

    @pytest.fixture(autouse=True)
    def _option(self, sampler_yaml):
        self.path = sampler_yaml

    def make_sampler(self):
        return instantiate_option(self.path)


# ---- the suite can fail -------------------------------------------------------------------------------
BROKEN_SUITE = '''
from tuning.sampler.base import Sampler, take_unvisited
from tuning.testing.sampler_contract import SamplerContract


class Fine(Sampler):
    def select(self, candidates, space, visited, b, rng, exploration=None):
        return take_unvisited(candidates, space, visited, [], b)


class Revisits(Fine):
    """Takes the candidates' canonical forms as they come, measured already or not."""

    def select(self, candidates, space, visited, b, rng, exploration=None):
        return take_unvisited(candidates, space, set(), [], b)


class TestFine(SamplerContract):
    def make_sampler(self):
        return Fine()


class TestRevisits(SamplerContract):
    def make_sampler(self):
        return Revisits()
'''


def test_the_suite_fails_a_sampler_that_selects_visited_configs(tmp_path):
    """The sampler that follows the contract passes every test, the one that selects measured configs
    fails the tests that ask."""
    run = write_and_run(tmp_path, "test_broken_sampler.py", BROKEN_SUITE)
    run.assert_failed_only_in("TestRevisits", "test_never_returns_visited_even_if_all_candidates_are",
                              says="measured already")
    assert len(run.passed_in("TestFine")) >= 11, run.output
