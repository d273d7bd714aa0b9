"""The in-context evaluator's reading plan (tuning/hardware/in_context.py), without TVM: which
candidate each task's calls go to in each pass, and how a pass's call seconds become a reading."""
from __future__ import annotations

import pytest

from tuning.hardware.in_context import median_per_call, pass_slots

KERNELS = {"stem": [0, 1, 2, 3], "conv": [0, 1, 2, 3], "small": [0, 1], "one": [0]}  # candidates per task
WIDTH = 4


def passes(round_: int) -> list[dict]:
    return [pass_slots(KERNELS, WIDTH, slot, round_) for slot in range(WIDTH)]


def test_each_candidate_is_read_once_a_round():
    for round_ in range(5):
        for name, built in KERNELS.items():
            assert sorted(p[name] for p in passes(round_) if name in p) == list(range(len(built))), (round_, name)
        # a task with fewer candidates than the widest sits out (the model's own kernel runs) in the other passes
        assert sum("one" not in p for p in passes(round_)) == 3


def test_the_plan_is_the_same_every_time_and_turns_between_rounds():
    assert passes(1) == passes(1)  # seeded by the round: each process reads in the same plan
    assert len({passes(round_)[0]["stem"] for round_ in range(3)}) == 3  # drift does not fall on one candidate first
    pairing = [frozenset((p["stem"], p["conv"]) for p in passes(round_)) for round_ in range(3)]
    assert len(set(pairing)) >= 2  # the neighbours a candidate is read beside change


def test_a_reading_is_the_median_over_the_read_runs_of_each_runs_mean_call():
    # 3 runs + 1 unread first run, 2 calls a run: the first run's calls are not read
    seconds = [9.0, 9.0, 1.0, 3.0, 2.0, 2.0, 5.0, 7.0]
    assert median_per_call(seconds, 3) == pytest.approx(2.0)  # run means 2, 2, 6
    assert median_per_call([9.0, 1.0, 4.0, 2.0], 3) == pytest.approx(2.0)  # one call a run
