"""What a cost model reads, built from a space (cost_model.features; docs/methods.md §Features).

    knobs      the config's own choices (sketch one-hot, log2 tile factors, ...): `Space.features`,
               the space's own description of a config
    per_store  TVM's per-store features of the scheduled program, one row per buffer store: the
               hardware gives them as the space's `store_features` callable ((stores, width) rows per
               config, (0, width) for a config that does not schedule), and `store_rows` packs them
               to one (n, R, width) array, padded to the task's row count R
    both       each per-store row with the knob features appended

`model_features(space, configs, kind)` is what the cost models get (tuning/cost_model/base.py
`model_input`). The per-store rows of a space are cached in one `StoreRows` made on first use and kept
on the space (`StoreRows.of(space)`); a store-restricted space (RestrictedSpace) has its own cache but
takes its row count from the full space, whatever the store holds.
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from tuning.core.space import Config, RestrictedSpace, Space

FEATURES = ("knobs", "per_store", "both")
STORE_CACHE = 20_000  # configs whose per-store rows are kept per task (a row is 164 float32)
STORE_PROBES = 8  # legitimate configs per sketch whose store count bounds the task's rows


class StoreRows:
    """One space's per-store rows: the cache (config -> (stores, width) float32), the task's row count
    and width, and the warning, logged once, that a program has more stores than the count."""

    def __init__(self, space: Space):
        self.space = space
        self.cache: dict[Config, np.ndarray] = {}
        self._shape: tuple[int, int] | None = None
        self._overflow_logged = False

    @classmethod
    def of(cls, space: Space) -> "StoreRows":
        """The space's StoreRows, made once and reused."""
        rows = space._store_rows
        if rows is None:
            rows = space._store_rows = cls(space)
        return rows

    def rows(self, configs: Sequence[Config]) -> np.ndarray:
        """See `store_rows`."""
        if self.space.store_features is None:
            raise ValueError("per-store features need a space scheduled by TVM (hardware=cpu or replay)")
        keys = [tuple(int(c) for c in config) for config in configs]
        count, width = self.shape()
        self._fill(keys)
        out = np.zeros((len(keys), count, width), dtype=np.float32)
        for i, config in enumerate(keys):
            rows = self.cache[config]
            if len(rows) <= count:
                out[i, :len(rows)] = rows
                continue
            if not self._overflow_logged:
                self._overflow_logged = True
                logging.getLogger("tunelab").warning(
                    "a program has %d buffer stores, more than the %d this task's features hold: the extra "
                    "rows are summed into the last", len(rows), count)
            out[i, :count - 1] = rows[:count - 1]
            out[i, count - 1] = rows[count - 1:].sum(axis=0)
        return out

    def shape(self) -> tuple[int, int]:
        """(rows, width) of the task: the most stores among STORE_PROBES legitimate configs of each
        sketch (drawn with seed 0). A restricted space takes the full space's."""
        if isinstance(self.space, RestrictedSpace):
            return StoreRows.of(self.space.base).shape()  # the full space's rows, whatever the store holds
        if self._shape is None:
            space = self.space
            rng = np.random.default_rng(0)
            probes = []
            for sketch in range(space.num_sketches):
                found = 0
                for _ in range(STORE_PROBES * 8):
                    config = space.sample_in(sketch, rng)
                    if space.is_legitimate(config):
                        probes.append(config)
                        found += 1
                        if found == STORE_PROBES:
                            break
            probes = probes or [space.sample(rng)]
            self._fill(probes)
            rows = [self.cache[c] for c in probes]
            self._shape = (max(1, max(len(r) for r in rows)), rows[0].shape[1])
        return self._shape

    def _fill(self, configs: list[Config]) -> None:
        store_features = self.space.store_features
        if store_features is None:
            raise ValueError("per-store features need a space scheduled by TVM (hardware=cpu or replay)")
        missing = list(dict.fromkeys(c for c in configs if c not in self.cache))
        if not missing:
            return
        if len(self.cache) + len(missing) > STORE_CACHE:
            self.cache.clear()
            missing = list(dict.fromkeys(configs))
        for config, rows in zip(missing, store_features(missing)):
            self.cache[config] = np.asarray(rows, dtype=np.float32)


def model_features(space: Space, configs: Sequence[Config], kind: str = "knobs") -> np.ndarray:
    """The features a cost model with `cost_model.features=kind` reads.

    knobs: (n, d) `space.features`. per_store: (n, R, w) `store_rows`. both: per_store with the knob
    features appended to every real store row (padding rows stay zero). Models that want a flat
    matrix reshape (n, -1)."""
    if kind == "knobs":
        return space.features(configs)
    if kind not in FEATURES:
        raise ValueError(f"features: expected one of {', '.join(FEATURES)}, got {kind!r}")
    rows = store_rows(space, configs)
    if kind == "per_store":
        return rows
    real = (np.abs(rows).sum(axis=2, keepdims=True) > 0).astype(np.float32)
    knobs = space.features(configs)[:, None, :] * real
    return np.concatenate([rows, knobs], axis=2)


def store_rows(space: Space, configs: Sequence[Config]) -> np.ndarray:
    """Per-store rows of each config, (n, R, width), zero rows padding. R is the task's: the most
    stores among STORE_PROBES legitimate configs of each sketch (the same in every process and after
    a resume). A program with more stores has its extra rows summed into the last row, which is
    logged once."""
    return StoreRows.of(space).rows(configs)
