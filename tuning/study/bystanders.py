"""What else the machine did while a block ran: the CPU that processes other than the block's own
(this process and its descendants) used, and the time the hypervisor gave to other guests (steal), each
as a share of the machine's CPU over the block's wall time. A block timed beside other work reads
slower in bursts that no interleaving evens out; the block file records it, and the table names the
blocks where others took more than `BUSY_SHARE`.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

BUSY_SHARE = 0.05  # others' share of the CPU above which a block is named as measured beside other work


@dataclass(frozen=True)
class CpuSample:
    wall: float
    busy: float  # the machine's non-idle CPU seconds (steal excluded)
    steal: float
    own: float  # this process tree's CPU seconds
    load: float  # the 1-minute load average


def sample() -> CpuSample:
    import psutil

    times = psutil.cpu_times()
    steal = getattr(times, "steal", 0.0)
    busy = sum(times) - times.idle - getattr(times, "iowait", 0.0) - steal - getattr(times, "guest", 0.0) \
        - getattr(times, "guest_nice", 0.0)
    return CpuSample(time.monotonic(), busy, steal, _own_cpu(psutil.Process()), os.getloadavg()[0])


def _own_cpu(process) -> float:
    """CPU seconds of `process` and its descendants, those they have reaped included."""
    import psutil

    total = 0.0
    for member in (process, *process.children(recursive=True)):
        try:
            t = member.cpu_times()
        except psutil.Error:  # ended between the listing and the reading
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def shares(start: CpuSample, end: CpuSample, cores: int | None = None) -> dict[str, Any]:
    """Others' and the hypervisor's shares of the machine's CPU between two samples, with the load
    averages at both ends."""
    capacity = max(end.wall - start.wall, 1e-9) * (cores or os.cpu_count() or 1)
    others = max(0.0, (end.busy - start.busy) - (end.own - start.own))
    return {"others_cpu_share": round(min(1.0, others / capacity), 4),
            "steal_share": round(min(1.0, max(0.0, end.steal - start.steal) / capacity), 4),
            "load_start": round(start.load, 2), "load_end": round(end.load, 2)}


def others_now(seconds: float = 1.0) -> float:
    """Others' share of the CPU over the next `seconds` (this process idle meanwhile)."""
    start = sample()
    time.sleep(seconds)
    return float(shares(start, sample())["others_cpu_share"])
