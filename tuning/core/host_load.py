"""The host's load beside its cores, read when a reading is taken: what the lines that print readings
say when two readings of one config disagree (another job on the host), rather than printing them bare.

The load is the 1-minute load average (os.getloadavg), which counts the run's own measuring threads
too: a host running only the lab reads about its thread count; above its cores, something else ran.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

APART = 1.5  # two readings of one config further apart than this are explained, not printed bare


@dataclass(frozen=True)
class HostLoad:
    load: float  # the 1-minute load average
    cores: int

    @property
    def busy(self) -> bool:
        """More runnable work than cores: readings taken now share the cores with another job."""
        return self.load > self.cores

    def __str__(self) -> str:
        return f"load {self.load:.1f} on {self.cores} cores"


def host_load() -> HostLoad | None:
    """The load now; None where the OS does not say (no load average)."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
    return HostLoad(load, os.cpu_count() or 1)


def ratio_apart(a: float, b: float) -> float:
    """How many times the larger of two positive readings is the smaller."""
    return max(a, b) / min(a, b)


def disagreement(remeasured_s: float, tuning_s: float, load: HostLoad | None) -> str:
    """'' when a re-measured reading and the tuning reading agree within APART; else how far apart they
    are, with the host's load when it was re-measured (busy: another job shared the cores)."""
    if not (remeasured_s > 0 and tuning_s > 0) or ratio_apart(remeasured_s, tuning_s) <= APART:
        return ""
    apart = f"{ratio_apart(remeasured_s, tuning_s):.1f}x apart"
    if load is None:
        return f"; {apart}, the host's load not known"
    if load.busy:
        return f"; {apart}: re-measured on a busy host, {load}: another job shared the cores"
    return f"; {apart}, re-measured on a host not busy, {load}"
