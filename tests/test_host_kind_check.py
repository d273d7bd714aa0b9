"""experiments/host_kind_check.py's judgement: finalists are set against the archive's re-reads, not
the first reading that picked them, and only the last pass decides."""
from __future__ import annotations


def test_finalists_are_judged_against_the_re_reads_on_the_last_pass(experiment_script):
    check = experiment_script("host_kind_check")
    there = {("f", 1): [1.0, 1.2, 1.2, 1.2], ("f", 2): [2.0, 2.4, 2.4, 2.4], ("g", 1): [1.0]}
    here = {("f", 1): [3.0, 1.21], ("f", 2): [6.0, 2.38], ("g", 1): [1.1, 1.09]}  # a slow first pass
    lines, alike = check.compare_task(there, here, passes=2, margin=1.05)
    assert alike is True
    assert lines[0].startswith("  there, finalists re-read / first reading (the selection's bias): 1.200")
    assert any(line.startswith("  pass 1: finalists here / there's re-reads 2.500") for line in lines)
    assert any(line.startswith("  pass 2: the rest here / there's one reading 1.090") for line in lines)

    _, alike = check.compare_task(there, {**here, ("f", 1): [1.0, 1.5], ("f", 2): [2.0, 3.0]}, passes=2, margin=1.05)
    assert alike is False  # 1.25x on the last pass
    _, alike = check.compare_task(there, {("g", 1): [1.0]}, passes=1, margin=1.05)
    assert alike is None  # nothing re-read there: no verdict
