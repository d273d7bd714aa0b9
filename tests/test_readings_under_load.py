"""Numbers that would contradict themselves under load are not printed bare: a re-measured best far
from its tuning reading says the host's load then (tuning/core/host_load.py), and torch's time beside
an exported kernel is taken at the tuned runtime's threads (restored after) and used as a ratio only
when its readings can stand as a latency (tuning/core/plausible.py reference_problem). Fake timings:
no kernel is built."""
from __future__ import annotations

import contextlib
import io
from dataclasses import replace

import pytest

from tuning.core.host_load import HostLoad, disagreement
from tuning.core.outcome import TaskOutcome, summary
from tuning.core.plausible import reference_problem
from tuning.core.task import gemm_task

GEMM_64_FLOPS = 2.0 * 64 ** 3  # 0.52 MFLOP: 0.5 GFLOP/s would take 1049 us


# ---- torch's readings ---------------------------------------------------------------------------
def test_a_reference_slower_than_any_library_is_implausible():
    """torch's 64x64 matmul at 16 ms on a busy host (its OpenMP threads oversubscribed)."""
    problem = reference_problem([16.0e-3, 15.8e-3, 16.3e-3], GEMM_64_FLOPS)
    assert problem and "slower than 1149 us, 0.5 GFLOP/s for its 0.524 MFLOP plus 100 us a call" in problem


def test_a_reference_whose_readings_spread_too_wide_is_implausible():
    problem = reference_problem([8e-6, 9e-6, 30e-6], GEMM_64_FLOPS)
    assert problem and "spread 3.8x (8.0 to 30.0 us), over 3x" in problem


@pytest.mark.parametrize("readings,flops", [
    ([7.8e-6, 8.1e-6, 7.9e-6], GEMM_64_FLOPS),  # the same matmul at 1 thread on a quiet host
    ([20e-6, 22e-6], 1000.0),  # a tiny operator: the call's own cost, not its FLOPs
])
def test_a_reference_in_range_is_plausible(readings, flops):
    assert reference_problem(readings, flops) is None


def test_an_implausible_torch_time_is_no_ratio_and_says_why():
    from tuning.tools.export import torch_timing

    result = {"tuned_s": 8.2e-6, "torch_s": 16.0e-3, "torch_readings": [16.0e-3, 15.8e-3, 16.3e-3], "torch_threads": 2}
    line = torch_timing(result, GEMM_64_FLOPS)
    assert line.startswith("torch 16000.0 us at 2 threads IMPLAUSIBLE, no ratio: its median 16000.0 us is slower"), line
    assert "torch's speed" not in line and "1948" not in line


def test_a_plausible_torch_time_is_a_ratio():
    from tuning.tools.export import torch_timing

    result = {"tuned_s": 4e-6, "torch_s": 8e-6, "torch_readings": [7.8e-6, 8e-6, 8.3e-6], "torch_threads": 1}
    assert torch_timing(result, GEMM_64_FLOPS) == "torch 8.0 us at 1 thread (tuned is 2.00x torch's speed)"


def test_torch_is_timed_at_the_tuned_threads_and_given_its_own_back(monkeypatch):
    import numpy as np
    import torch

    from tuning.hardware import tvm_export

    seen = []

    def readings(call, repeat, min_repeat_ms):
        seen.append(torch.get_num_threads())
        return [1e-5] * repeat

    monkeypatch.setattr(tvm_export, "call_readings", readings)
    before = torch.get_num_threads()
    wanted = 1 if before != 1 else 2
    inputs = [np.ones((4, 4), "float32"), np.ones((4, 4), "float32")]
    got = tvm_export.torch_readings({"op": "gemm", "M": 4, "N": 4, "K": 4}, inputs, wanted)
    assert seen == [wanted] and got == [1e-5] * tvm_export.TIMING["repeat"]
    assert torch.get_num_threads() == before


# ---- a re-measured best far from the tuning reading -------------------------------------------
def outcome(best_us: float, tuning_us: float, load: HostLoad | None) -> TaskOutcome:
    return TaskOutcome(gemm_task("gemm_64", 64, 64, 64), records=[], best_config=(0,), best_cost=best_us * 1e-6,
                       tuning_best_cost=tuning_us * 1e-6, remeasure_load=load)


def test_a_re_reading_far_from_the_tuning_reading_says_the_load_of_a_busy_host():
    line = summary([outcome(446.6, 201.5, HostLoad(3.9, 2))])
    assert ("best 446.6 us (re-measured; 201.5 us while tuning; 2.2x apart: re-measured on a busy host, "
            "load 3.9 on 2 cores: another job shared the cores)") in line


def test_a_re_reading_far_from_the_tuning_reading_on_a_quiet_host_says_so():
    assert "2.2x apart, re-measured on a host not busy, load 0.7 on 2 cores)" in summary([outcome(446.6, 201.5,
                                                                                                 HostLoad(0.7, 2))])
    assert "2.2x apart, the host's load not known)" in summary([outcome(446.6, 201.5, None)])


def test_readings_that_agree_are_printed_as_before():
    assert "best 142.7 us (re-measured; 132.0 us while tuning)  " in summary([outcome(142.7, 132.0, HostLoad(9.0, 2))])
    assert disagreement(1.0, 1.5, HostLoad(9.0, 2)) == ""


def test_a_run_reads_the_load_when_it_re_measures(tmp_path, compose_cfg, monkeypatch):
    """The job's own line: re-measured readings 3x the tuning ones on a host at load 5 of 2 cores."""
    from configs import as_job
    from tuning.engine import loop
    from tuning.engine.run import main
    from tuning.evaluator.fixed import FixedEvaluator

    real = FixedEvaluator.remeasure

    def three_times_slower(self, hardware, task, configs):
        return [replace(r, costs=[c * 3 for c in r.costs]) for r in real(self, hardware, task, configs)]

    monkeypatch.setattr(FixedEvaluator, "remeasure", three_times_slower)
    monkeypatch.setattr(loop, "host_load", lambda: HostLoad(5.0, 2))
    cfg = as_job(compose_cfg("hardware=synthetic", "model=gemm_64", "search=random", "cost_model=none",
                             "tracking=none", "hardware.delay_s=0.0", "budget.trials=16"), monkeypatch)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(cfg)
    assert "x apart: re-measured on a busy host, load 5.0 on 2 cores: another job shared the cores" \
        in printed.getvalue(), printed.getvalue()


def test_a_whole_model_s_torch_timing_spread_too_wide_gives_no_ratio():
    from tuning.engine.whole_model import e2e_line, e2e_metrics

    verdict = {"latency_ms": {"tuned": 20.0, "untuned": 900.0, "torch": 30.0}, "match": True, "reference": "torch",
               "max_abs_diff": 0.0, "num_threads": 2,
               "latencies_ms": {"tuned": [19.0, 20.0, 21.0], "torch": [9.0, 30.0, 160.0]}}
    line = e2e_line(verdict)
    assert "torch eager 30.00 ms  IMPLAUSIBLE, no ratio: its 3 readings spread 17.8x" in line, line
    assert "speed-up vs torch" not in line and "e2e/speedup_vs_torch" not in e2e_metrics(verdict)
    steady = {**verdict, "latencies_ms": {"tuned": [20.0], "torch": [29.0, 30.0, 31.0]}}
    assert "speed-up vs torch 1.50x" in e2e_line(steady)
    assert e2e_metrics(steady)["e2e/speedup_vs_torch"] == 1.5


def test_one_stretched_reading_among_many_does_not_make_a_reference_implausible():
    from tuning.core.plausible import spread_problem

    steady = [30e-3 + i * 1e-5 for i in range(49)] + [96e-3]  # a whole model's torch call, one preempted
    assert spread_problem(steady) is None
    bimodal = [10e-3] * 25 + [40e-3] * 25  # threads fighting half the time
    problem = spread_problem(bimodal)
    assert problem and "spread 4.0x between their 10th and 90th percentiles" in problem, problem
