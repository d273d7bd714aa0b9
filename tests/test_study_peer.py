"""MetaSchedule's tune_tir as a study arm on real TVM kernels: run whole in a process of its own (after
the interleaved arms at an odd seed), its database read back as the lab's configs, its finalists re-read
by the same evaluator as the lab's arm. Slow (about 3 minutes on 2 cores): `make test-full`."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tuning.study.block import run_block
from tuning.study.spec import study_spec


@pytest.mark.slow
@pytest.mark.tvm
def test_tune_tir_runs_whole_as_an_arm_and_is_adjudicated_like_the_others(tmp_path):
    spec = study_spec("peer", OmegaConf.create({
        "common": ["hardware=cpu", "evaluator=fixed"],
        "arms": {"random": ["search=random", "cost_model=none"], "tune_tir": {"peer": "metaschedule"}},
        "tasks": ["gemm_64"], "seeds": [1], "budget": {"trials": 16, "plan_size": 16},
        "adjudication": {"top_k": 2, "rereads": 2, "confirm": 2}, "panel": {"configs": 1, "drift_bound": 2.0},
        "analysis": {"claims": [{"arm": "tune_tir", "baseline": "random", "kind": "difference"}], "min_blocks": 2}}))
    block = run_block(spec, "gemm_64", 1, tmp_path / "work", {"cpu_model": "x", "cores": 2, "flags": "f"})
    assert block["order"] == ["random", "tune_tir"]  # an odd seed: the peer runs after the interleaved arms
    peer = block["arms"]["tune_tir"]
    assert peer["peer"] == "metaschedule" and len(peer["records"]) + peer["unmapped"] == 16
    assert len(peer["records"]) >= 12 and peer["final_s"] and len(peer["confirm"]) == 2
    assert peer["finalist"] in peer["top"] and block["arms"]["random"]["final_s"]
