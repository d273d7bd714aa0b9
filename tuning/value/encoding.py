"""A schedule as a sequence of decisions, and the state (a prefix of it) as numbers a value function reads.

The decisions of a config, in the order a schedule is built (docs/methods.md §Value function):

    order(space, sketch) = [0, *space.active[sketch]]   the sketch first, then its knob slots
    a prefix = the choice indices of the first j decisions of that order (j = 0: nothing decided)

The state of a prefix is one row per knob slot of the space (a fixed-length sequence, the same length
for every prefix of one kernel): the paper's intrinsic features (what the slot decides over: its kind,
the extent of the loop a tile splits, how many choices it has; the kernel's size and shape of space)
and its acquired features (the decision, relative to its loop: each tile level's share of the loop's
log-extent, a categorical's position and value), zero while undecided. Everything comes from the space
alone, which TVM derives from the kernel's workload, so the same kernel inside two networks has the
same states; and knob indices never appear raw, since they mean nothing in another kernel's space.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

KINDS = ("sketch", "tile", "categorical", "location")
LEVELS = 4  # tile levels kept (MetaSchedule's CPU tiles have 2 or 4), innermost last
WIDTH = len(KINDS) + 2 + 2 + LEVELS + 3
# decided / inactive, slot intrinsic (2), acquired (LEVELS), kernel intrinsic (3)


def order(space, sketch: int) -> list[int]:
    """The slots decided by a config of `sketch`, in decision order."""
    return [0, *space.active[sketch]]


def is_complete(space, prefix: Sequence[int]) -> bool:
    return len(prefix) > 0 and len(prefix) == len(order(space, prefix[0]))


def prefix_of(space, config: Sequence[int], length: int) -> tuple:
    """The first `length` decisions of a complete config."""
    return tuple(int(config[slot]) for slot in order(space, config[0])[:length])


def config_of(space, prefix: Sequence[int]) -> tuple:
    """A complete prefix as the space's config (inactive slots 0)."""
    config = [0] * len(space.knobs)
    for slot, value in zip(order(space, prefix[0]), prefix):
        config[slot] = int(value)
    return tuple(config)


def children(space, prefix: Sequence[int]) -> list[tuple]:
    """Every prefix one decision longer."""
    prefix = tuple(prefix)
    slot = 0 if not prefix else order(space, prefix[0])[len(prefix)]
    return [prefix + (choice,) for choice in range(space.dims[slot])]


def extent(knob) -> int:
    return math.prod(knob.choices[0]) if knob.kind == "tile" else 1


def work(space) -> float:
    """The loop nest's iteration count (the product of the first sketch's tiled extents): the unit in
    which a kernel's seconds are learned (seconds per iteration), about FLOPs / 2 for a contraction."""
    return float(math.prod(extent(space.knobs[slot]) for slot in space.active[0]))


def kernel_features(space) -> list[float]:
    return [math.log2(max(work(space), 1.0)) / 40, len(space.knobs) / 16, space.num_sketches / 4]


def encode(space, prefixes: Sequence[Sequence[int]]) -> np.ndarray:
    """(len(prefixes), slots, WIDTH) float32: each prefix's state."""
    out = np.zeros((len(prefixes), len(space.knobs), WIDTH), dtype=np.float32)
    static = _static_rows(space)
    for row, prefix in enumerate(prefixes):
        out[row] = static
        if not prefix:
            continue
        slots = order(space, prefix[0])
        out[row, :, len(KINDS) + 1] = 1.0  # inactive, until shown active below
        for slot in slots:
            out[row, slot, len(KINDS) + 1] = 0.0
        for slot, choice in zip(slots, prefix):
            out[row, slot, len(KINDS)] = 1.0
            out[row, slot, len(KINDS) + 4:len(KINDS) + 4 + LEVELS] = _acquired(space.knobs[slot], int(choice))
    return out


def _static_rows(space) -> np.ndarray:
    cache = space.__dict__.setdefault("_value_static_rows", {})
    if "rows" not in cache:
        rows = np.zeros((len(space.knobs), WIDTH), dtype=np.float32)
        kernel = kernel_features(space)
        for slot, knob in enumerate(space.knobs):
            rows[slot, KINDS.index(knob.kind)] = 1.0
            size = extent(knob) if knob.kind == "tile" else len(knob.choices)
            levels = len(knob.choices[0]) if knob.kind == "tile" else 1
            rows[slot, len(KINDS) + 2:len(KINDS) + 4] = [math.log2(size) / 16, levels / LEVELS]
            rows[slot, -3:] = kernel
        cache["rows"] = rows
    return cache["rows"]


def _acquired(knob, choice: int) -> list[float]:
    """A decision relative to what it decides over (LEVELS numbers)."""
    if knob.kind == "tile":
        whole = math.log2(extent(knob))
        shares = [math.log2(f) / whole if whole > 0 else 0.0 for f in knob.choices[choice]]
        return [0.0] * (LEVELS - len(shares)) + shares[-LEVELS:]
    position = choice / max(len(knob.choices) - 1, 1)
    value = knob.choices[choice]
    magnitude = math.copysign(math.log2(1 + abs(float(value))), float(value)) / 16 \
        if isinstance(value, (int, float)) else 0.0  # a compute location is -1 (root) or -2 (inlined)
    return [position, magnitude, 1.0 if choice == 0 else 0.0, 1.0]  # last: "decided", tiles use all four


def decode(space, state: np.ndarray) -> tuple:
    """The prefix a state encodes (the inverse of `encode` on one state)."""
    decided = state[:, len(KINDS)] > 0.5
    if not decided[0]:
        return ()
    prefix = []
    for slot in order(space, _nearest(space.knobs[0], state[0]))[:int(decided.sum())]:
        if not decided[slot]:
            break
        prefix.append(_nearest(space.knobs[slot], state[slot]))
    return tuple(prefix)


def _nearest(knob, row: np.ndarray) -> int:
    acquired = row[len(KINDS) + 4:len(KINDS) + 4 + LEVELS]
    distances = [float(np.abs(np.asarray(_acquired(knob, i), dtype=np.float32) - acquired).sum())
                 for i in range(len(knob.choices))]
    return int(np.argmin(distances))
