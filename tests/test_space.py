"""Space moves: the neighbourhood searches walk (index moves, and factor moves on tile splits)."""
from __future__ import annotations

import numpy as np
import pytest

from tuning.core.space import Knob, Space
from tuning.core.task import gemm_task
from tuning.hardware.synthetic import SyntheticHardware

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


# ---- store-restricted spaces (model.space=store) -------------------------------------------------
def restricted(count=40, seed=0):
    from tuning.core.space import RestrictedSpace

    base = SyntheticHardware().space(gemm_task("g", 64, 64, 64))
    rng = np.random.default_rng(seed)
    held = list(dict.fromkeys(base.canonical(base.sample(rng)) for _ in range(count)))
    return RestrictedSpace(base, held), set(held)


def test_every_move_of_a_restricted_space_lands_inside_it():
    space, held = restricted()
    rng = np.random.default_rng(1)
    assert space.size == len(held) and set(space.enumerate()) == held
    assert all(space.sample(rng) in held for _ in range(100))
    outside = [space.base.sample(rng) for _ in range(100)]
    assert all(space.canonical(c) in held for c in outside)
    starts = [space.sample(rng) for _ in range(50)]
    assert all(space.random_walk(c, rng) in held for c in starts)
    assert all(set(space.neighbors(c)) <= held for c in starts)
    configs = np.asarray(starts)
    deltas = rng.integers(-1, 2, size=configs.shape)
    moved = space.step_all(configs, deltas)
    assert all(tuple(row) in held for row in moved.tolist())


@pytest.mark.parametrize("packed", [True, False])
def test_a_restricted_space_tells_held_rows_as_its_set_does(packed):
    space, held = restricted(count=60)
    if not packed:  # a space too wide for one integer per config falls back to the set
        space._radix = space._allowed_keys = None
    rng = np.random.default_rng(1)
    rows = np.asarray([space.base.sample(rng) for _ in range(200)] + list(held)[:50], dtype=np.int64)
    assert space._held(rows).tolist() == [tuple(r) in held for r in rows.tolist()]


def test_a_restricted_space_walks_all_as_one_walk_at_a_time_would():
    space, held = restricted(count=60)
    starts = [space.sample(np.random.default_rng(i)) for i in range(128)]
    one_by_one = [space.random_walk(c, rng) for rng in [np.random.default_rng(7)] for c in starts]
    together = space.random_walk_all(starts, np.random.default_rng(7))
    assert together == one_by_one and set(together) <= held


@pytest.mark.parametrize("packed", [True, False])
def test_a_batched_restricted_step_matches_one_nearest_lookup_per_walker(packed):
    space, held = restricted(count=60)
    if not packed:
        space._radix = space._allowed_keys = None
    rng = np.random.default_rng(2)
    configs = np.asarray([space.sample(rng) for _ in range(64)])
    deltas = rng.integers(-1, 2, size=configs.shape)
    base_moved = space.base.step_all(configs, deltas)
    expected = [tuple(m) if tuple(m) in held else space.nearest(tuple(m), exclude=tuple(c))
                for c, m in zip(configs.tolist(), base_moved.tolist())]
    assert [tuple(r) for r in space.step_all(configs, deltas).tolist()] == expected
    left = [tuple(m) not in held for m in base_moved.tolist()]
    assert sum(left) > 10, "few walkers left the set: a weak test"
    # the same moves again (answered from memory), reversed, from other starts: still nearest()'s answers
    starts = configs[::-1].copy()
    starts[::2] = [space.sample(rng) for _ in range(32)]
    again = base_moved[::-1].copy()
    expected = [tuple(m) if tuple(m) in held else space.nearest(tuple(m), exclude=tuple(c))
                for c, m in zip(starts.tolist(), again.tolist())]
    assert [tuple(r) for r in space._snap(starts, again).tolist()] == expected
