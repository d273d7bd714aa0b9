"""Every sampler in conf/sampler/ (and in the directories of TUNELAB_CONF_DIRS) passes the shipped contract
suite (tuning.testing.sampler_contract): at most b distinct, canonical, unvisited configs, exactly b
when the candidates allow, reproducible. The suite can fail: a sampler that hands back configs measured
already fails it, run by pytest from another folder."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from configs import group_yamls, instantiate_option
from tuning.testing.sampler_contract import SamplerContract

REPO = Path(__file__).resolve().parents[1]
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


def run_broken_suite(tmp_path, source: str, name: str) -> subprocess.CompletedProcess:
    """pytest, from another folder against the package, over the module `source`."""
    (tmp_path / name).write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist",
                           name], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_the_suite_fails_a_sampler_that_selects_visited_configs(tmp_path):
    """The sampler that follows the contract passes every test, the one that selects measured configs
    fails the tests that ask."""
    done = run_broken_suite(tmp_path, BROKEN_SUITE, "test_broken_sampler.py")
    output = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 1, output
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    assert failed and all("TestRevisits" in line for line in failed), output
    assert any("test_never_returns_visited_even_if_all_candidates_are" in line for line in failed), output
    assert "measured already" in done.stdout, output
    fine = [line for line in done.stdout.splitlines() if line.startswith("PASSED") and "TestFine" in line]
    assert len(fine) >= 11, output
