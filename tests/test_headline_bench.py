"""experiments/headline.py's plan and tables (the runs themselves take 15 minutes each on real
hardware: the script is run by hand, alone on the host)."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "headline.py"
spec = importlib.util.spec_from_file_location("headline", SCRIPT)
headline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(headline)


def test_the_arms_rotate_with_the_seed_so_drift_falls_on_all():
    arms = ["a", "b", "c"]
    assert headline.arm_order(arms, 0) == ["a", "b", "c"]
    assert headline.arm_order(arms, 1) == ["b", "c", "a"] and headline.arm_order(arms, 5) == ["c", "a", "b"]


def test_every_arm_is_the_headline_with_overrides_it_can_compose(compose_cfg):
    for arm, overrides in headline.ARMS.items():
        cfg = compose_cfg(*headline.HEADLINE, *overrides)
        assert cfg.model.network == "resnet18", arm
    assert headline.ARMS["defaults"] == ()


def test_bad_arguments_are_refused_naming_the_option(capsys):
    for argv, option in ((["--processes", "1"], "--processes"), (["--arms", "nope"], "--arms"),
                         (["--seeds", "-1"], "--seeds")):
        with pytest.raises(SystemExit):
            headline.parse_args(argv)
        assert option in capsys.readouterr().err


def test_the_table_reads_the_median_over_processes_and_the_time_after_tuning():
    row = {"arm": "defaults", "seed": 0, "wall_min": 15.2, "tuning_min": 12.0, "measurements": 900,
           "one_round_warning": False, "tuned_ms": [20.0, 22.0, 21.0], "torch_ms": [30.0, 31.0, 29.0],
           "speedup_vs_torch": 1.45, "speedup_range": [1.3, 1.5], "untuned_ms": 2000.0}
    line = headline.table([row]).splitlines()[-1]
    assert line == "| defaults | 0 | 15.2 | 12.0 | 3.2 | 900 | no | 21.00 | 30.00 | 1.45x (1.30-1.50) | 2000 |"


def test_the_curve_is_the_estimate_after_each_round_and_is_drawn_as_speed_up(tmp_path):
    rounds = tmp_path / "network_rounds.jsonl"
    rounds.write_text('{"wall_s": 10.0, "estimate_ms": null}\n{"wall_s": 60.0, "estimate_ms": 40.0}\n'
                      '{"wall_s": 120.0, "estimate_ms": 30.0}\n')
    curve = headline.estimate_curve(rounds)
    assert curve == [(60.0, 40.0), (120.0, 30.0)] and headline.estimate_curve(tmp_path / "absent") == []
    row = {"arm": "defaults", "seed": 0, "curve": curve, "estimate_ms": 30.0, "tuned_ms": [33.0], "torch_ms": [33.0]}
    headline.draw([row], tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 1000
