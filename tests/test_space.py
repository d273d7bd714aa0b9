"""Space moves: the neighbourhood searches walk (index moves, and factor moves on tile splits)."""
from __future__ import annotations

import numpy as np
import pytest

from tuning.hardware.synthetic import SyntheticHardware
from tuning.space import Knob, Space
from tuning.task import gemm_task

SPLITS_OF_8 = ((1, 8), (2, 4), (4, 2), (8, 1))


def tiny_space() -> Space:
    knobs = [Knob("sketch", "sketch", (0, 1)), Knob("tile", "tile", SPLITS_OF_8), Knob("unroll", "categorical", (0, 16, 64))]
    return Space(knobs, [(1, 2), (1,)])


def test_index_moves_are_one_step_on_each_active_knob_and_the_sketch():
    space = tiny_space()
    assert space.neighbors((0, 1, 0)) == [(1, 1, 0), (0, 0, 0), (0, 2, 0), (0, 1, 1)]
    assert space.neighbors((1, 3, 0)) == [(0, 3, 0), (1, 2, 0)]  # the second sketch has no unroll knob
    assert all(space.is_valid(c) for c in space.neighbors((0, 0, 2)))


def test_factor_moves_shift_one_prime_factor_between_two_levels():
    space = tiny_space()
    # (2, 4) -> (1, 8) and (4, 2); (8, 1) is a factor 4 away
    assert space.neighbors((1, 1, 0), moves=("factor",)) == [(1, 0, 0), (1, 2, 0)]
    assert space.neighbors((1, 0, 0), moves=("factor",)) == [(1, 1, 0)]
    both = space.neighbors((0, 1, 0), moves=("index", "factor"))
    assert len(both) == len(set(both)) and (0, 2, 0) in both and (1, 1, 0) in both


def test_factor_moves_on_a_real_tiling_space_keep_the_extent():
    space = SyntheticHardware().space(gemm_task("g", 64, 64, 64))
    rng = np.random.default_rng(0)
    tiles = [i for i, knob in enumerate(space.knobs) if knob.kind == "tile"]
    assert tiles
    for _ in range(20):
        config = space.sample(rng)
        for moved in space.neighbors(config, moves=("factor",)):
            assert space.is_valid(moved)
            (knob,) = [i for i in range(len(config)) if moved[i] != config[i]]
            old, new = space.knobs[knob].choices[config[knob]], space.knobs[knob].choices[moved[knob]]
            assert np.prod(old) == np.prod(new) and sum(a != b for a, b in zip(old, new)) == 2


def test_unknown_move_is_rejected():
    with pytest.raises(ValueError, match="moves"):
        tiny_space().neighbors((0, 0, 0), moves=("swap",))
