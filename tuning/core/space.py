"""The knob space of one task, as plain data (no TVM here).

A MetaSchedule task has a few design spaces ("sketches"), each a trace whose
sampling instructions are the knobs. tunelab merges the sketches into one
flat list of knob *slots*: knobs of different sketches with the same
signature (kind, choices) share a slot, so a tile size means the same thing
whichever sketch is chosen. A config is a tuple of choice indices:

    config[0]   which sketch
    config[i]   index into knobs[i].choices, for the slots active in that sketch;
                inactive slots are always 0 (so one schedule has one config).

The hardware backend fills in the knobs and, optionally, a `canonicalize`
function: TVM silently repairs some invalid decisions (an illegal compute
location becomes a legal one), so a config's identity is the config read back
after replay. Searches may propose raw configs; samplers compare canonical ones.
A backend whose canonicalisation is costly may add `canonicalize_many`, the
same function over a batch (TVM's replays run on parallel threads): searches
that canonicalise many configs at once go through `canonical_many`.
It may also give a `legitimacy` check (the GEMM-tiling paper's J, Eq. 5): the
schedule replays and passes the backend's postprocessors. Neighbourhood
searches (G-BFS, N-A2C) move only to legitimate configs. And it may give
`store_features`: each config's scheduled program described by TVM's
per-store feature extractor, (stores, width) rows per config, (0, width) for a
config that does not schedule; tuning/core/features.py packs them (and the
knob `features` here) into what cost models read.

Moves between configs (docs/methods.md §G-BFS and N-A2C, "Moves"):
    neighbors(config, moves)  every config one move away
    actions() / step(config, action)
                              a fixed list of moves, so a policy network can have one output per
                              move: a tile knob's prime factor p from level i to level j (the
                              paper's Eq. 6 when p = 2), or another knob's index +-1
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Config = tuple[int, ...]  # a config: choice indices, config[0] the sketch (see above)
MOVES = ("index", "factor", "nontile_index")  # Space.neighbors' move kinds


@dataclass(frozen=True)
class Knob:
    """One slot: `choices` are the raw decisions the backend understands."""

    name: str
    kind: str  # "sketch" | "tile" | "categorical" | "location"
    choices: tuple[Any, ...]

    def feature(self, index: int) -> list[float]:
        """Numeric description of one choice, for cost models."""
        value = self.choices[index]
        if self.kind == "tile":
            return [math.log2(f) for f in value]
        if self.kind == "categorical":
            return [math.log2(1 + float(value))]
        return [float(value)]

    @property
    def feature_width(self) -> int:
        return len(self.feature(0))


@dataclass
class Space:
    """Knob slots, which slots each sketch uses, and the canonicalisation."""

    knobs: list[Knob]
    active: list[tuple[int, ...]]  # active[s] = slot indices (>=1) used by sketch s
    canonicalize: Callable[[Config], Config] | None = None
    legitimacy: Callable[[Config], bool] | None = None
    store_features: Callable[[Sequence[Config]], list[np.ndarray]] | None = None
    canonicalize_many: Callable[[list[Config]], list[Config]] | None = None
    _canonical_cache: dict[Config, Config] = field(default_factory=dict, repr=False)
    _legitimate_cache: dict[Config, bool] = field(default_factory=dict, repr=False)
    # sketch -> random_walk's slots
    _movable_cache: dict[int, tuple[int, ...]] = field(default_factory=dict, repr=False, compare=False)
    _store_rows: Any = field(default=None, repr=False, compare=False)  # tuning/core/features.py's StoreRows, made on first use

    def __post_init__(self) -> None:
        assert self.knobs[0].kind == "sketch" and len(self.knobs[0].choices) == len(self.active)
        self.dims = [len(k.choices) for k in self.knobs]
        # Derived once, used by `features` on every search step:
        # per slot (1..) a (choices, width) float32 table of Knob.feature, and which slots each sketch uses.
        self._feature_tables = [np.array([knob.feature(j) for j in range(len(knob.choices))], dtype=np.float32)
                                for knob in self.knobs[1:]]
        self._active_mask = np.zeros((len(self.active), len(self.knobs)), dtype=bool)
        for sketch, slots in enumerate(self.active):
            self._active_mask[sketch, list(slots)] = True

    @property
    def num_sketches(self) -> int:
        return len(self.active)

    @property
    def size(self) -> int:
        return sum(math.prod(len(self.knobs[i].choices) for i in slots) for slots in self.active)

    def active_slots(self, config: Config) -> tuple[int, ...]:
        return self.active[config[0]]

    def is_valid(self, config: Config) -> bool:
        if len(config) != len(self.knobs) or not 0 <= config[0] < self.num_sketches:
            return False
        active = set(self.active[config[0]]) | {0}
        return all(
            (0 <= c < d) if i in active else c == 0
            for i, (c, d) in enumerate(zip(config, self.dims))
        )

    # ---- moves -----------------------------------------------------------
    def sample(self, rng: np.random.Generator) -> Config:
        sketch = int(rng.integers(self.num_sketches))
        config = [0] * len(self.knobs)
        config[0] = sketch
        for i in self.active[sketch]:
            config[i] = int(rng.integers(self.dims[i]))
        return tuple(config)

    def sample_in(self, sketch: int, rng: np.random.Generator) -> Config:
        """A uniform random config of one sketch."""
        config = [0] * len(self.knobs)
        config[0] = sketch
        for i in self.active[sketch]:
            config[i] = int(rng.integers(self.dims[i]))
        return tuple(config)

    def enumerate(self) -> Iterator[Config]:
        """Every config, sketch by sketch (only sensible when `size` is small)."""
        for sketch, slots in enumerate(self.active):
            for values in itertools.product(*(range(self.dims[i]) for i in slots)):
                config = [0] * len(self.knobs)
                config[0] = sketch
                for slot, value in zip(slots, values):
                    config[slot] = value
                yield tuple(config)

    def switch_sketch(self, config: Config, sketch: int) -> Config:
        """Same knob values where the new sketch has the slot, zeros elsewhere."""
        keep = set(self.active[sketch])
        return tuple([sketch] + [c if i in keep else 0 for i, c in enumerate(config) if i > 0])

    def step_all(self, configs: np.ndarray, deltas: np.ndarray) -> np.ndarray:
        """Chameleon's move on every knob at once, for a batch: (B, knobs) arrays of
        indices and of deltas in {-1, 0, +1}. The sketch moves first (slots the new
        sketch lacks become 0), then every slot active in the row's sketch moves,
        clipped to its range; deltas on inactive slots do nothing."""
        configs = np.asarray(configs, dtype=np.int64)
        sketch = np.clip(configs[:, 0] + deltas[:, 0], 0, self.num_sketches - 1)
        active = self._active_mask[sketch]
        moved = np.clip(configs + deltas, 0, np.asarray(self.dims) - 1)
        out = np.where(active, moved, 0)
        out[:, 0] = sketch
        return out

    def normalized(self, configs: Iterable[Sequence[int]] | np.ndarray) -> np.ndarray:
        """Knob indices scaled to [0, 1] by each slot's size (Chameleon's state)."""
        index = np.asarray(configs, dtype=np.float32).reshape(-1, len(self.knobs))
        return index / np.maximum(np.asarray(self.dims, dtype=np.float32) - 1, 1)

    def neighbors(self, config: Config, moves: Sequence[str] = ("index",)) -> list[Config]:
        """Every config one move away, distinct, in knob order (a neighbourhood for local and graph
        searches such as G-BFS). Moves:
            index          one knob's (or the sketch's) choice index +-1, Chameleon's move
            factor         a tile knob's split with one prime factor moved between two of its levels
                           ((2, 4) -> (4, 2), (1, 8)): the GEMM-tiling paper's Eq. 6 (x2 at one level,
                           /2 at another) generalised to extents that are not powers of two
            nontile_index  index +-1 on every knob but the tile knobs (the sketch, unroll, compute
                           location): with `factor`, the paper's neighbourhood on any space"""
        unknown = set(moves) - set(MOVES)
        if unknown:
            raise ValueError(f"moves: expected some of {', '.join(MOVES)}, got {sorted(unknown)}")
        out: list[Config] = []
        for knob in (0, *self.active[config[0]]):
            tile = self.knobs[knob].kind == "tile"
            candidates = []
            if "index" in moves or ("nontile_index" in moves and not tile):
                candidates += [int(np.clip(config[knob] + delta, 0, self.dims[knob] - 1)) for delta in (-1, 1)]
            if "factor" in moves and tile:
                candidates += self._factor_choices(config, knob)
            for value in candidates:
                moved = self._with(config, knob, value)
                if moved != config and moved not in out:
                    out.append(moved)
        return out

    def _with(self, config: Config, knob: int, value: int) -> Config:
        if knob == 0:
            return self.switch_sketch(config, value)
        return (*config[:knob], value, *config[knob + 1:])

    def _factor_choices(self, config: Config, slot: int) -> list[int]:
        """The tile knob's choice indices one factor action away from `config`, ascending."""
        moved = (self.step(config, a) for a in self.actions() if a[0] == "factor" and a[1] == slot)
        return sorted({c[slot] for c in moved if c is not None})

    def actions(self) -> list[tuple[Any, ...]]:
        """Every move as data, the same list for every config of the space (a policy's outputs):
            ("factor", slot, src, dst, p)   move prime p from level src to level dst of a tile knob
            ("index", slot, delta)          another knob's (or the sketch's) index +-1
        An action that does not apply to a config (p does not divide level src, an inactive slot,
        an index at its end) is `step`'s None."""
        if "_actions" not in self.__dict__:
            actions: list[tuple[Any, ...]] = []
            for slot, knob in enumerate(self.knobs):
                if knob.kind == "tile":
                    levels = len(knob.choices[0])
                    for p in _prime_factors(math.prod(knob.choices[0])):
                        actions += [("factor", slot, src, dst, p)
                                    for src in range(levels) for dst in range(levels) if src != dst]
                elif self.dims[slot] > 1:
                    actions += [("index", slot, -1), ("index", slot, 1)]
            self.__dict__["_actions"] = actions
        return self.__dict__["_actions"]

    def step(self, config: Config, action: tuple[Any, ...]) -> Config | None:
        """The config one action away, or None when the action does not apply (see `actions`)."""
        slot = action[1]
        if slot != 0 and slot not in self.active[config[0]]:
            return None
        if action[0] == "index":
            value = config[slot] + action[2]
            return self._with(config, slot, value) if 0 <= value < self.dims[slot] else None
        _, _, src, dst, p = action
        split = list(self.knobs[slot].choices[config[slot]])
        if split[src] % p:
            return None
        split[src] //= p
        split[dst] *= p
        index = self._choice_index(slot).get(tuple(split))
        return None if index is None else self._with(config, slot, index)

    def _choice_index(self, slot: int) -> dict[Any, int]:
        cache = self.__dict__.setdefault("_choice_index_cache", {})
        if slot not in cache:
            cache[slot] = {choice: i for i, choice in enumerate(self.knobs[slot].choices)}
        return cache[slot]

    def untiled(self) -> Config:
        """The GEMM-tiling paper's start state s0 (§5): every tile knob with the whole extent at its
        outermost level ((m, 1, 1, 1): no tiling), every other knob at index 0, the first sketch."""
        config = [0] * len(self.knobs)
        for slot in self.active[0]:
            knob = self.knobs[slot]
            if knob.kind == "tile":
                whole = (math.prod(knob.choices[0]),) + (1,) * (len(knob.choices[0]) - 1)
                config[slot] = self._choice_index(slot)[whole]
        return tuple(config)

    def is_legitimate(self, config: Sequence[int]) -> bool:
        """Valid, and accepted by the backend's `legitimacy` check when it has one (cached)."""
        config = tuple(int(c) for c in config)
        if not self.is_valid(config):
            return False
        if self.legitimacy is None:
            return True
        if config not in self._legitimate_cache:
            self._legitimate_cache[config] = bool(self.legitimacy(config))
        return self._legitimate_cache[config]

    def random_walk(self, config: Config, rng: np.random.Generator) -> Config:
        """AutoTVM's SA move: one knob (or the sketch) set to another random value."""
        movable = self._movable(config[0])
        if not movable:
            return config
        knob = movable[int(rng.integers(len(movable)))]
        value = int(rng.integers(self.dims[knob] - 1))
        value += value >= config[knob]  # any value but the current one
        if knob == 0:
            return self.switch_sketch(config, value)
        new = list(config)
        new[knob] = value
        return tuple(new)

    def random_walk_all(self, configs: Iterable[Config], rng: np.random.Generator) -> list[Config]:
        """random_walk of each config in turn (the same draws, in the same order)."""
        return [self.random_walk(config, rng) for config in configs]

    def _movable(self, sketch: int) -> tuple[int, ...]:
        """The slots a random walk may move in `sketch` (the sketch slot among them), cached: SA asks
        for them some 200,000 times a run."""
        if sketch not in self._movable_cache:
            self._movable_cache[sketch] = tuple(k for k in (0, *self.active[sketch]) if self.dims[k] > 1)
        return self._movable_cache[sketch]

    # ---- identity and description -----------------------------------------
    def canonical(self, config: Sequence[int]) -> Config:
        config = tuple(int(c) for c in config)
        if self.canonicalize is None:
            return config
        if config not in self._canonical_cache:
            self._canonical_cache[config] = tuple(self.canonicalize(config))
        return self._canonical_cache[config]

    def canonical_many(self, configs: Iterable[Sequence[int]]) -> list[Config]:
        """canonical() of each config; those not known yet go to `canonicalize_many` in one batch."""
        if self.canonicalize_many is not None:
            keys = [tuple(int(c) for c in config) for config in configs]
            unknown = list(dict.fromkeys(c for c in keys if c not in self._canonical_cache))
            if len(unknown) > 1:
                for config, key in zip(unknown, self.canonicalize_many(unknown), strict=True):
                    self._canonical_cache[config] = tuple(key)
            return [self.canonical(config) for config in keys]
        return [self.canonical(config) for config in configs]

    def mark_canonical(self, configs: Iterable[Sequence[int]]) -> None:
        """Take `configs` as canonical without asking the canonicalizer (a measurement store's
        configs are canonical by its contract: replaying TVM's trace for each costs ~2 ms)."""
        for config in configs:
            config = tuple(int(c) for c in config)
            self._canonical_cache.setdefault(config, config)

    def decisions(self, config: Config) -> dict[str, Any]:
        """Raw decisions of the active knobs, by name (for records and humans)."""
        return {self.knobs[i].name: self.knobs[i].choices[config[i]] for i in (0, *self.active[config[0]])}

    @property
    def feature_width(self) -> int:
        return sum(k.feature_width for k in self.knobs[1:]) + self.num_sketches

    def unit_features(self, configs: Sequence[Config]) -> np.ndarray:
        """`features` with every column divided by its largest value in the space (a tile level's
        log2 factor by log2 of the extent), so a network's inputs lie in [0, 1]."""
        if "_feature_scale" not in self.__dict__:
            scale = np.concatenate([np.ones(self.num_sketches, dtype=np.float32)]
                                   + [np.abs(table).max(axis=0) for table in self._feature_tables])
            self.__dict__["_feature_scale"] = np.where(scale > 0, scale, 1.0).astype(np.float32)
        return self.features(configs) / self.__dict__["_feature_scale"]

    def features(self, configs: Sequence[Config]) -> np.ndarray:
        """Knob features: sketch one-hot, then each slot's numeric value (0 when inactive).

        Row r, slot i holds knobs[i].feature(configs[r][i]) when i is active in
        the row's sketch. Computed by table lookup (one table per slot, built
        once) so a search can describe thousands of configs per step."""
        out = np.zeros((len(configs), self.feature_width), dtype=np.float32)
        if len(configs) == 0:
            return out
        index = np.asarray(configs, dtype=np.int64).reshape(len(configs), len(self.knobs))
        sketch = index[:, 0]
        out[np.arange(len(index)), sketch] = 1.0
        col = self.num_sketches
        for i, table in enumerate(self._feature_tables, start=1):
            rows = self._active_mask[sketch, i]
            out[rows, col:col + table.shape[1]] = table[index[rows, i]]
            col += table.shape[1]
        return out


class RestrictedSpace(Space):
    """A space cut down to the given configs (model.space=store: the configs a measurement store holds),
    Kernel Tuner's simulation mode over a sampled space. Every way a search or sampler makes a config
    lands inside: `sample` and `enumerate` draw from the configs; `canonical` maps any config to the
    nearest one held (by normalised knob indices, the sketch weighted so it changes last); a random
    walk or a PPO step that leaves the set lands on the nearest held config other than where it
    started; `neighbors` and `step` keep the held ones; the untiled start is the nearest held config.
    Its per-store rows (tuning/core/features.py) have their own cache and the full space's row count."""

    SKETCH_WEIGHT = 10.0

    def __init__(self, base: Space, configs: Iterable[Sequence[int]]):
        super().__init__(base.knobs, base.active, legitimacy=base.legitimacy, store_features=base.store_features)
        from scipy.spatial import cKDTree

        self.base = base
        self.allowed = list(dict.fromkeys(tuple(int(c) for c in config) for config in configs))
        if not self.allowed:
            raise ValueError("a restricted space needs at least one config")
        # each held config to its own stored tuple (ints): membership, and canonical() without a copy
        self._stored = {config: config for config in self.allowed}
        self._allowed_array = np.asarray(self.allowed, dtype=np.int64)
        self._tree = cKDTree(self._embed(self.allowed))
        # each config as one mixed-radix integer, for a vectorised membership test (None: too wide)
        radix = np.cumprod([1, *self.dims[:-1]], dtype=object)
        fits = math.prod(self.dims) < 2 ** 62
        self._radix = np.asarray(radix, dtype=np.int64) if fits else None
        self._allowed_keys = np.sort(self._allowed_array @ self._radix) if self._radix is not None else None
        self._nearest_memo: dict[Any, tuple[int, int]] = {}  # a row's key -> its two nearest held configs

    @property
    def size(self) -> int:
        return len(self.allowed)

    def _embed(self, configs: Iterable[Sequence[int]] | np.ndarray) -> np.ndarray:
        points = self.normalized(configs).astype(np.float64)
        points[:, 0] *= self.SKETCH_WEIGHT
        return points

    def nearest(self, config: Config, exclude: Config | None = None) -> Config:
        k = min(2, len(self.allowed))
        _, index = self._tree.query(self._embed([config]), k=k)
        for i in np.atleast_1d(index[0]):
            if self.allowed[int(i)] != exclude:
                return self.allowed[int(i)]
        return self.allowed[int(np.atleast_1d(index[0])[0])]

    def canonical(self, config: Sequence[int]) -> Config:
        # a held config as a tuple: its stored int tuple, no copy (a list or an array is no key)
        held = self._stored.get(config) if isinstance(config, tuple) else None
        if held is not None:
            return held
        key = tuple(int(c) for c in config)
        return key if key in self._stored else self.nearest(key)

    def sample(self, rng: np.random.Generator) -> Config:
        return self.allowed[int(rng.integers(len(self.allowed)))]

    def enumerate(self) -> Iterator[Config]:
        return iter(self.allowed)

    def random_walk(self, config: Config, rng: np.random.Generator) -> Config:
        moved = self.base.random_walk(config, rng)
        return moved if moved in self._stored else self.nearest(moved, exclude=tuple(config))

    def random_walk_all(self, configs: Iterable[Config], rng: np.random.Generator) -> list[Config]:
        """The base walk of each config in turn (random_walk's draws), then every one that left the
        set to its nearest held config other than its start, in one tree query (SA walks 128)."""
        moved = np.asarray([self.base.random_walk(tuple(c), rng) for c in configs], dtype=np.int64)
        return list(map(tuple, self._snap(np.asarray(configs, dtype=np.int64), moved).tolist()))

    def step_all(self, configs: np.ndarray, deltas: np.ndarray) -> np.ndarray:
        """The base move, then every row that left the set to its nearest held config other than
        its start (one batched tree query: PPO steps 128 walkers a few hundred times a round)."""
        configs = np.asarray(configs, dtype=np.int64)
        return self._snap(configs, super().step_all(configs, deltas))

    def _snap(self, configs: np.ndarray, moved: np.ndarray) -> np.ndarray:
        """`moved` with every row outside the set replaced by the nearest held config other than
        the row's start in `configs` (nearest()'s answer, for all rows at once)."""
        keys = self._keys(moved)
        outside = np.flatnonzero(~self._held_keys(keys))
        if len(outside):
            pairs = self._two_nearest(moved[outside], [keys[i] for i in outside.tolist()])
            nearest, second = self._allowed_array[pairs[:, 0]], self._allowed_array[pairs[:, 1]]
            is_start = (nearest == configs[outside]).all(axis=1)
            moved[outside] = np.where(is_start[:, None], second, nearest)
        return moved

    def _two_nearest(self, points: np.ndarray, keys: list[Any]) -> np.ndarray:
        """(rows, 2): the indices of each row's nearest and second-nearest held configs (the nearest
        twice when only one is held). Walks keep leaving the set at the same configs: each config's
        answer is asked of the tree once, in one query for the new ones, and remembered."""
        memo = self._nearest_memo
        missing = [i for i, key in enumerate(keys) if key not in memo]
        if missing:
            k = min(2, len(self.allowed))
            _, index = self._tree.query(self._embed(points[missing]), k=k)
            for i, pair in zip(missing, np.asarray(index).reshape(len(missing), k).tolist()):
                memo[keys[i]] = (pair[0], pair[-1])
        return np.asarray([memo[key] for key in keys], dtype=np.int64).reshape(len(keys), 2)

    def _keys(self, configs: np.ndarray) -> list[Any]:
        """Each row as one hashable: its mixed-radix integer, or its tuple where the space is too wide."""
        if self._radix is None:
            return list(map(tuple, configs.tolist()))
        return list((configs @ self._radix).tolist())

    def _held_keys(self, keys: list[Any]) -> np.ndarray:
        if self._radix is None or self._allowed_keys is None:
            return np.array([key in self._stored for key in keys], dtype=bool)
        values = np.asarray(keys, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._allowed_keys, values), len(self._allowed_keys) - 1)
        return np.asarray(self._allowed_keys[at] == values)

    def _held(self, configs: np.ndarray) -> np.ndarray:
        """Which rows are held configs."""
        return self._held_keys(self._keys(configs))

    def neighbors(self, config: Config, moves: Sequence[str] = ("index",)) -> list[Config]:
        return [c for c in self.base.neighbors(config, moves) if c in self._stored]

    def step(self, config: Config, action: tuple[Any, ...]) -> Config | None:
        moved = self.base.step(config, action)
        return moved if moved in self._stored else None

    def untiled(self) -> Config:
        return self.canonical(self.base.untiled())

    def is_legitimate(self, config: Sequence[int]) -> bool:
        return tuple(int(c) for c in config) in self._stored and super().is_legitimate(config)

    def decisions(self, config: Config) -> dict[str, Any]:
        return self.base.decisions(config)


def factorizations(extent: int, parts: int, max_innermost: int = 0) -> list[tuple[int, ...]]:
    """All ordered ways to write extent as a product of `parts` factors.

    MetaSchedule's SamplePerfectTile draws from exactly this set (innermost
    factor capped by max_innermost when > 0)."""
    if parts == 1:
        return [(extent,)] if (max_innermost <= 0 or extent <= max_innermost) else []
    out: list[tuple[int, ...]] = []
    for first in range(1, extent + 1):
        if extent % first == 0:
            out += [(first, *rest) for rest in factorizations(extent // first, parts - 1, max_innermost)]
    return out


def merge_sketches(sketch_knobs: list[list[Knob]]) -> tuple[list[Knob], list[tuple[int, ...]]]:
    """Merge per-sketch knob lists into shared slots (see the module docstring).

    Knobs with the same (kind, choices) signature share a slot, matched in order
    of appearance, so sketch 1's second 1024-tile is the same slot as sketch 0's."""
    slots: list[Knob] = [Knob("sketch", "sketch", tuple(range(len(sketch_knobs))))]
    active: list[tuple[int, ...]] = []
    for knobs in sketch_knobs:
        used: list[int] = []
        for knob in knobs:
            match = next(
                (i for i, s in enumerate(slots)
                 if i > 0 and i not in used and (s.kind, s.choices) == (knob.kind, knob.choices)),
                None,
            )
            if match is None:
                slots.append(knob)
                match = len(slots) - 1
            used.append(match)
        active.append(tuple(used))
    return slots, active


def _prime_factors(n: int) -> list[int]:
    return [p for p in range(2, n + 1) if n % p == 0 and _is_prime(p)]


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))
