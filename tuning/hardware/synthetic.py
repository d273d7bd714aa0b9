"""hardware=synthetic: a deterministic stand-in for tests of search logic.

Never a default. It builds the same kind of Space the cpu backend reads from
MetaSchedule (multi-level tiling knobs + unroll, three sketches) from the
workload alone, and answers each config with a latency from a smooth
analytic landscape plus deterministic per-config noise, so the same config
always gets the same costs. Some configs are "invalid" (register tile too
large) so error handling is exercised. An optional noise model (per-repeat
multiplicative jitter, seeded by config) serves measurement-policy tests; an
early-stop rule in the MeasureSpec (evaluator=adaptive) is applied to those
costs as the cpu backend's run worker applies it to real timings. run_s is
the simulated seconds of running: the costs times the runs behind each.

By default the jitter is a function of (config, repeat index) alone: every reading of a config
gives the same numbers, so re-reading it (adjudication, the evaluator's re-measurement) shows
nothing new. With fresh_noise=true each reading draws its repeats' jitter from (config, how many
times this instance measured the config before, repeat index): every reading is a fresh sample
(the first is the one fresh_noise=false gives), yet the whole sequence is deterministic given the
order of measurements, so the same seed gives the same records. Studies of the winner's curse
need it: the reading that selected a config is biased low, a fresh one is not. The fingerprint
says fresh_noise when it is on, so a store does not mix its readings with the fixed kind.
"""
from __future__ import annotations

import hashlib
import math
import time

from tuning.core.records import MeasureResult
from tuning.core.space import Knob, Space, factorizations, merge_sketches
from tuning.core.task import conv2d_output_shape, pair
from tuning.hardware.base import Hardware

UNROLL_CANDIDATES = (0, 16, 64, 512)


def _loops(workload: dict) -> list[tuple[str, int, bool]]:
    """(name, extent, is_reduction) of the operator's loop nest."""
    if workload["op"] == "gemm":
        return [("i", workload["M"], False), ("j", workload["N"], False), ("k", workload["K"], True)]
    if workload["op"] == "batch_matmul":
        return [("b", workload["batch"], False), ("i", workload["M"], False), ("j", workload["N"], False),
                ("k", workload["K"], True)]
    if workload["op"] == "conv2d":
        w = workload
        out_h, out_w = conv2d_output_shape(w)
        kh, kw = pair(w["kernel"])
        return [("n", w["batch"], False), ("f", w["out_channels"], False), ("y", out_h, False),
                ("x", out_w, False), ("rc", w["in_channels"] // w.get("groups", 1), True), ("ry", kh, True),
                ("rx", kw, True)]
    raise ValueError(f"synthetic hardware: unsupported op {workload['op']!r}")


def synthetic_space(workload: dict) -> Space:
    """MetaSchedule-like: spatial loops in 4 tiles, reductions in 2, plus unroll. With
    workload["space"] == "tiling" the GEMM-tiling paper's space, as hardware=cpu builds it: one
    sketch, no innermost cap, unroll fixed at 512."""
    tiling = workload.get("space") == "tiling"
    knobs = []
    for name, extent, reduction in _loops(workload):
        parts = 2 if reduction else 4
        knobs.append(Knob(f"tile.{name}", "tile", tuple(factorizations(extent, parts, 0 if tiling else 64))))
    unroll = (UNROLL_CANDIDATES.index(512),) if tiling else tuple(range(len(UNROLL_CANDIDATES)))
    knobs.append(Knob("unroll", "categorical", unroll))
    slots, active = merge_sketches([knobs] if tiling else [knobs, knobs, knobs])
    return Space(slots, active)


def _unit(*parts) -> float:
    """A deterministic number in [0, 1) from its arguments."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


class SyntheticHardware(Hardware):
    """Analytic latency landscape; `noise` is the per-repeat relative jitter; `store` and `reuse` as
    hardware=cpu's (tests of the measurement store); `delay_s` a real pause before each result comes
    back (fault tests need a run that is still going when they kill it); `fresh_noise` each reading of a
    config a fresh draw of its jitter (see the module doc)."""

    model_kinds = ("gemm", "batch_matmul", "conv2d")
    ranges = {"peak_gflops": (1e-6, None), "noise": (0.0, 0.99), "invalid_register_tile": (1, None),
              "delay_s": (0.0, 10.0)}

    def __init__(self, peak_gflops: float = 100.0, noise: float = 0.0, invalid_register_tile: int = 1024,
                 store: str | None = None, reuse: bool = False, delay_s: float = 0.0, fresh_noise: bool = False):
        self.store = store
        self.reuse = reuse
        self.delay_s = delay_s
        self.peak_gflops = peak_gflops
        self.noise = noise
        self.invalid_register_tile = invalid_register_tile
        self.fresh_noise = fresh_noise
        self._spaces: dict = {}
        self._readings: dict = {}  # (task key, config) -> readings taken so far (fresh_noise)

    def space(self, task):
        if task.key not in self._spaces:
            self._spaces[task.key] = synthetic_space(task.workload)
        return self._spaces[task.key]

    def efficiency(self, space: Space, config) -> float | None:
        """Fraction of peak in (0, 1], or None if the config is invalid."""
        decisions = [space.knobs[i].choices[config[i]] for i in space.active_slots(config)]
        tiles, unroll = decisions[:-1], UNROLL_CANDIDATES[decisions[-1]]
        register_tile = math.prod(t[-1] for t in tiles)
        if register_tile > self.invalid_register_tile:
            return None
        vector = tiles[-2][-1] if len(tiles) > 1 else tiles[0][-1]
        score = (
            -abs(math.log2(max(register_tile, 1)) - 6) / 6  # ~64 values in registers is best
            - abs(math.log2(vector) - 3) / 6  # vector width 8
            - abs(math.log2(1 + unroll) - 6) / 12
            - 0.15 * config[0]  # sketches differ a little
        )
        jitter = 0.1 * _unit("config", tuple(config))
        return max(0.02, min(1.0, math.exp(score) * (1 - jitter)))

    def measure(self, task, configs, spec, on_result=None):
        results = [self._measure_one(task, tuple(config), spec) for config in configs]
        for i, result in enumerate(results):
            time.sleep(self.delay_s)
            if on_result:
                on_result(i, result)
        return results

    def _measure_one(self, task, config, spec) -> MeasureResult:
        efficiency = self.efficiency(self.space(task), config)
        if efficiency is None:
            return MeasureResult.failed("invalid", "register tile too large", config=config)
        cost = task.flops / (self.peak_gflops * 1e9 * efficiency)
        reading = 0
        if self.fresh_noise:
            reading = self._readings.get((task.key, config), 0)
            self._readings[(task.key, config)] = reading + 1
        if spec.screen_above_s is not None and cost > spec.screen_above_s:  # one reading, as the run worker screens
            return MeasureResult(costs=[cost], config=config, run_s=cost, screened=True,
                                 message=f"screened: a short reading took {cost:.3g} s, over the round's cut of "
                                         f"{spec.screen_above_s:.3g} s")
        costs: list[float] = []
        while len(costs) < spec.repeat and not (spec.cv_stop and spec.cv_stop.finished(costs)):
            draw = _unit("noise", config, len(costs)) if reading == 0 else _unit("noise", config, reading, len(costs))
            costs.append(cost * (1 + self.noise * (2 * draw - 1)))
        return MeasureResult(costs=costs, config=config, build_s=0.0, run_s=sum(costs) * max(spec.number, 1))

    def describe(self) -> dict:
        return {"hardware": "synthetic", "peak_gflops": self.peak_gflops}

    def fingerprint(self) -> dict:
        fresh = {"fresh_noise": True} if self.fresh_noise else {}  # absent when off: older stores stay valid
        return {**self.describe(), "noise": self.noise, "invalid_register_tile": self.invalid_register_tile, **fresh}

