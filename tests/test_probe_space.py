"""experiments/probe_space.py: variants of a run's best config, and the table's arithmetic (no TVM)."""
import pytest

from tuning.config import ConfigError
from tuning.space import Knob, Space


def tiny_space() -> Space:
    knobs = [Knob("sketch", "sketch", (0,)), Knob("tile0", "tile", ((1, 8), (2, 4), (4, 2), (8, 1))),
             Knob("categorical1", "categorical", (0, 1, 2, 3))]
    return Space(knobs, [(1, 2)])


def test_a_variant_sets_knobs_by_value(experiment_script):
    probe = experiment_script("probe_space")
    space = tiny_space()
    assert probe.with_settings(space, (0, 0, 0), {"tile0": "4x2", "categorical1": "3"}) == (0, 2, 3)
    assert probe.with_settings(space, (0, 1, 2), {}) == (0, 1, 2)
    assert "tile0" in probe.describe(space, (0, 2, 3)) and "4x2" in probe.describe(space, (0, 2, 3))


@pytest.mark.parametrize("settings, named", [({"tile9": "4x2"}, "tile9"), ({"tile0": "3x3"}, "tile0=3x3"),
                                             ({"tile0": "4xa"}, "tile0=4xa"), ({"categorical1": "4"}, "categorical1"),
                                             ({"categorical1": "-1"}, "categorical1")])
def test_a_variant_outside_the_space_names_the_knob(experiment_script, settings, named):
    probe = experiment_script("probe_space")
    with pytest.raises(ConfigError, match=named):
        probe.with_settings(tiny_space(), (0, 0, 0), settings)


@pytest.mark.parametrize("variants", [["nocolon"], [":tile0=1x8"], ["found:tile0=1x8"], ["torch:tile0=1x8"],
                                      ["a:tile0"], ["a:=3"], ["a:tile0=1x8,"], ["a:tile0=1x8", "a:tile0=2x4"]])
def test_malformed_variants_are_rejected_before_any_work(experiment_script, variants, tmp_path):
    probe = experiment_script("probe_space")
    with pytest.raises(SystemExit):
        probe.parse_args([str(tmp_path), *(f"--variant={v}" for v in variants)])


def test_ratios_are_paired_within_a_process(experiment_script):
    probe = experiment_script("probe_space")
    # process 2 is slower for every kernel (the host's process-level mode), torch alike
    results = [{"flop": 2e9, "errors": {}, "seconds": {"found": [2.0, 2.0], "wide": [1.0, 1.0], "torch": [1.0, 1.0]}},
               {"flop": 2e9, "errors": {"bad": "not legitimate"},
                "seconds": {"found": [4.0, 4.0], "wide": [2.0, 2.0], "torch": [1.0, 1.0]}}]
    table = probe.table(results)
    wide = next(line for line in table.splitlines() if line.strip().startswith("wide"))
    assert "2.00x [2.00, 2.00]" in wide  # vs found: paired, so the slow process does not spread it
    assert "0.75x [0.50, 1.00]" in wide  # vs torch: median and range over processes
    assert "bad" in table and "not legitimate" in table
