"""Physical bounds on a reading: which costs (seconds of one kernel run) the lab accepts.

A cost is plausible when it lies within [floor, ceiling]:

    floor    the task's FLOPs at PEAK_MULTIPLE (4) times the device's peak FLOP rate, and never
             under MIN_SECONDS (1 ns): nothing runs faster than the hardware can compute
    ceiling  CEILING_S (3600 s): one run of one kernel taking an hour is a broken clock, not a
             measurement (the evaluators' timeouts are seconds; they are not kept with a reading)

The peak FLOP rate comes from the device description (the hardware fingerprint a store keeps in
its `hardware` table):

    synthetic   its stated `peak_gflops`, divided by (1 - noise): its landscape runs at most at
                that peak and its jitter shortens a reading by at most that fraction, so every
                config it answers stays plausible
    cpu         cores x SIMD lanes x FMA units x 2 x clock, with the cores from the target's
                num-cores (the threads that measure) and the widest CPU values known: 16 float32
                lanes (512-bit AVX-512 / SVE), 2 FMA units, 6.2 GHz (the fastest shipped boost clock)
    otherwise   FALLBACK_PEAK_FLOPS (1 PFLOP/s), so only absurd readings are refused

PEAK_MULTIPLE is the margin for what the description does not say: dot-product instructions (VNNI)
doing four multiply-adds per lane, and FLOP counts of padded or fused kernels that count work the
compiled code skips. A reading beyond it is a clock glitch or a corrupt file, not a fast kernel.

A peer library's reference timing (torch's eager call of the same operator, beside an exported kernel)
is held to bounds of its own, far wider, and refused as a ratio rather than dropped
(`reference_problem`): its median must be faster than REFERENCE_FLOOR_FLOPS (0.5 GFLOP/s, slower than
any CPU library's float32 operator) over its FLOPs plus REFERENCE_CALL_S (100 us, an eager call's own
cost), and its slowest reading within REFERENCE_SPREAD (3x) of its fastest (from 10 readings on, its
90th percentile within 3x of its 10th: one preempted call among many is not the library's). A reading outside them
timed the host (an oversubscribed thread pool, another job), not the library.

A cost that is not a finite positive number is never plausible. Store rows outside the bounds
are skipped and counted as unreadable (tuning/store/); records files carry neither FLOPs nor a
device description, so a record is held to the bounds that need neither (records.py), and to its
task's on resume and as tuning.database, once the run knows both (resume.py check_plausible). A result a
backend hands back outside its task's bounds becomes an `implausible` error record in the loop
(`MeasureResult.within`).
"""
from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from tuning.core.task import Task

PEAK_MULTIPLE = 4.0
MIN_SECONDS = 1e-9  # a few clock cycles: no kernel call returns sooner
CEILING_S = 3600.0
FALLBACK_PEAK_FLOPS = 1e15

REFERENCE_FLOOR_FLOPS = 0.5e9
REFERENCE_CALL_S = 100e-6
REFERENCE_SPREAD = 3.0
SPREAD_QUANTILE_AT = 10  # readings from which a spread is taken between the 10th and 90th percentiles

CPU_SIMD_LANES = 16
CPU_FMA_UNITS = 2
CPU_CLOCK_HZ = 6.2e9


@dataclass(frozen=True)
class Bounds:
    """The plausible costs of one task on one device, in seconds."""

    floor_s: float = MIN_SECONDS
    ceiling_s: float = CEILING_S

    def accepts(self, cost: Any) -> bool:
        return _number(cost) and self.floor_s <= cost <= self.ceiling_s

    def problem(self, cost: Any) -> str | None:
        """Why `cost` is not a plausible reading, or None."""
        if self.accepts(cost):
            return None
        if not _number(cost):
            return f"cost {cost!r} is not a finite number of seconds"
        if cost <= 0:
            return f"cost {cost:g} s is not positive"
        if cost < self.floor_s:
            return f"cost {cost:g} s is faster than the hardware can run it (floor {self.floor_s:.3g} s)"
        return f"cost {cost:g} s is slower than any measurement takes (ceiling {self.ceiling_s:g} s)"

    def first_problem(self, costs: Sequence[Any]) -> str | None:
        """Why the first implausible one of `costs` is not a reading ("reading i of n: ..."), or None."""
        for number, cost in enumerate(costs, start=1):
            problem = self.problem(cost)
            if problem:
                return f"reading {number} of {len(costs)}: {problem}"
        return None


ABSOLUTE = Bounds()  # for readings whose task and device are unknown (a records file)


def peak_flops(description: dict[str, Any]) -> float:
    """The device's peak FLOP rate (FLOP/s) from its description, or FALLBACK_PEAK_FLOPS."""
    stated: Any = description.get("peak_gflops")
    noise: Any = description.get("noise", 0.0)
    if positive_number(stated):
        return float(stated) * 1e9 / (1.0 - noise if _fraction(noise) else 1.0)
    if description.get("device") == "cpu":
        cores = _cores(description)
        if positive_number(cores):
            return float(cores) * CPU_SIMD_LANES * CPU_FMA_UNITS * 2 * CPU_CLOCK_HZ
    return FALLBACK_PEAK_FLOPS


def bounds(flops: Any, description: dict[str, Any]) -> Bounds:
    """The plausible costs of a task of `flops` FLOPs on the described device."""
    if not positive_number(flops):
        return ABSOLUTE
    return Bounds(max(MIN_SECONDS, float(flops) / (PEAK_MULTIPLE * peak_flops(description))), CEILING_S)


class Described(Protocol):
    """What `bounds_of` reads of a hardware backend (tuning.hardware.base.Hardware)."""

    def fingerprint(self) -> dict[str, Any]: ...


def bounds_of(task: Task, hardware: Described) -> Bounds:
    """The plausible costs of a task measured on a hardware backend (its fingerprint describes it)."""
    return bounds(task.flops, hardware.fingerprint())


def reference_problem(readings: Sequence[float], flops: float) -> str | None:
    """Why a peer library's readings of an operator of `flops` FLOPs (seconds a call, each a block's
    mean) cannot stand as its latency, or None: too slow for any library, or spread too wide."""
    if not readings or not all(positive_number(r) for r in readings):
        return f"its readings are not all positive numbers of seconds ({list(readings)[:5]})"
    median = statistics.median(readings)
    bound = REFERENCE_CALL_S + max(0.0, float(flops)) / REFERENCE_FLOOR_FLOPS
    if median > bound:
        return (f"its median {median * 1e6:.1f} us is slower than {bound * 1e6:.0f} us, {REFERENCE_FLOOR_FLOPS / 1e9:g} "
                f"GFLOP/s for its {flops / 1e6:.3g} MFLOP plus {REFERENCE_CALL_S * 1e6:.0f} us a call")
    return spread_problem(readings)


def spread_problem(readings: Sequence[float]) -> str | None:
    """Why a peer's readings (seconds, positive) spread too wide to stand as one latency, or None. From
    SPREAD_QUANTILE_AT readings on, the spread is between their 10th and 90th percentiles: one reading
    a preemption stretched (a 2-core host's whole-model torch call read 96 ms once among 50 near 30 ms)
    does not make the library's timing implausible; below that, between the fastest and the slowest."""
    if len(readings) >= SPREAD_QUANTILE_AT:
        low, high = (float(q) for q in np.percentile(readings, [10, 90]))
        what = "between their 10th and 90th percentiles"
    else:
        low, high, what = min(readings), max(readings), ""
    spread = high / low
    if spread > REFERENCE_SPREAD:
        return (f"its {len(readings)} readings spread {spread:.1f}x {what + ' ' if what else ''}"
                f"({low * 1e6:.1f} to {high * 1e6:.1f} us), over {REFERENCE_SPREAD:g}x")
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive_number(value: Any) -> bool:
    """A finite number above 0, not a bool: a value read from an untrusted file checked before use."""
    return _number(value) and value > 0


def _fraction(value: Any) -> bool:
    return _number(value) and 0.0 <= value < 1.0


def _cores(description: dict[str, Any]) -> Any:
    """The target's num-cores (a backend describes its target as the text of a dict, a TVM target
    string writes -num-cores=N), else the description's num_threads."""
    found = re.search(r"num-cores['\"]?\s*[:=]\s*(\d{1,6})\b", str(description.get("target", ""))[:2000])
    return int(found.group(1)) if found else description.get("num_threads")
