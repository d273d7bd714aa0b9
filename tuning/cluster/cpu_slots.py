"""The CPUs of this node a job holds while it runs, so that two jobs never time on the same cores.

    cpus_needed(cfg)   how many a run config's measurements need on its node
    hold(count)        take that many free ones and pin this process to them, until it ends

A cluster scheduler's CPU count is bookkeeping (Ray's `num_cpus` reserves a number, not cores): two
jobs placed on one node would share its cores and time each other's noise. `hold(count)` takes
`count` of the CPUs this process may run on that no other holder on this node has, pins the process
to them (its build and timing workers inherit the pinning) and keeps them until the process ends.
Holders are OS locks on one file per CPU in a node-local folder ($TUNELAB_CPU_SLOTS, else
/dev/shm/tunelab-cpus): a holder that dies, even by SIGKILL, frees its CPUs at once. Taking them is
atomic (one node-wide lock while choosing), so jobs waiting for CPUs never split them between them,
and first come, first served (a queue of tickets), so a waiting job is not overtaken by later ones.
"""
from __future__ import annotations

import fcntl
import logging
import os
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

SLOTS_ENV = "TUNELAB_CPU_SLOTS"
log = logging.getLogger(__name__)
_held: list = []  # this process's lock files, open for its life


def slots_dir() -> Path:
    default = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    folder = Path(os.environ.get(SLOTS_ENV) or default / "tunelab-cpus")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cpus_needed(cfg) -> int:
    """The CPUs a job's measurements need on its node (a composed run config): hardware.num_threads plus
    hardware.build_workers for kernels timed on this node, build_workers for remote devices, 1 for
    synthetic hardware and for replayed readings that never measure (hardware.on_miss=error)."""
    hardware = cfg.get("hardware") or {}
    if "backend" in hardware and hardware.get("on_miss", "measure") == "measure":
        hardware = hardware.backend  # a replay measures what the store lacks on its backend
    if "num_threads" not in hardware:  # nothing timed: the job's own process only
        return 1
    builds = int(hardware.get("build_workers") or 1)
    runner = str(OmegaConf.select(hardware, "runner._target_", default="") or "")
    timed_elsewhere = runner.endswith("RPCRunner")
    return builds if timed_elsewhere else int(hardware.num_threads) + builds


def held() -> list[int]:
    """The CPUs this process holds ([] when none)."""
    return sorted(cpu for cpu, _ in _held)


def hold(count: int, wait_s: float = 24 * 3600.0, poll_s: float = 0.5) -> list[int]:
    """Hold `count` free CPUs of this process's affinity (all of them when it has fewer) and pin the
    process to them; waits while other holders have them. Raises TimeoutError after `wait_s`."""
    if _held:
        return held()
    allowed = sorted(os.sched_getaffinity(0))
    count = max(1, min(count, len(allowed)))
    folder = slots_dir()
    deadline, said = time.monotonic() + wait_s, False
    ticket = _join_queue(folder)
    try:
        while True:
            taken = _take(folder, allowed, count, ticket)
            if taken:
                _held.extend(taken)
                cpus = held()
                os.sched_setaffinity(0, cpus)
                return cpus
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} of this node's CPUs {allowed} not free within {wait_s:g} s "
                                   f"(held by other jobs: lock files in {folder})")
            if not said:
                log.info(f"waiting for {count} free CPU(s) of {allowed}: other jobs on this node hold them")
                said = True
            time.sleep(poll_s)
    finally:
        ticket.unlink(missing_ok=True)


def _join_queue(folder: Path) -> Path:
    """This process's place in the node's queue: jobs get CPUs in the order they asked for them, so
    a job that waits is not overtaken, again and again, by jobs started after it."""
    queue = folder / "queue"
    queue.mkdir(exist_ok=True)
    ticket = queue / f"{time.time_ns():020d}-{os.getpid()}"
    ticket.touch()
    return ticket


def _first_in_line(ticket: Path) -> bool:
    """Whether no live process asked before this one (tickets of dead processes are removed)."""
    for entry in sorted(ticket.parent.iterdir()):
        if entry == ticket:
            return True
        try:
            os.kill(int(entry.name.rpartition("-")[2]), 0)
            return False
        except ProcessLookupError:
            entry.unlink(missing_ok=True)
        except (ValueError, PermissionError):  # not a ticket; or a live process of another user
            if entry.name.rpartition("-")[2].isdigit():
                return False
    return True


def _take(folder: Path, allowed: list[int], count: int, ticket: Path) -> list:
    """(cpu, open lock file) for `count` free CPUs when this process is first in line, or [] (nothing
    held) when it is not or fewer are free."""
    with open(folder / "choosing.lock", "a") as choosing:
        fcntl.flock(choosing, fcntl.LOCK_EX)
        if not _first_in_line(ticket):
            return []
        taken = []
        for cpu in allowed:
            handle = open(folder / f"cpu{cpu}.lock", "a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            taken.append((cpu, handle))
            if len(taken) == count:
                return taken
        for _, handle in taken:
            handle.close()
        return []


def release() -> None:
    """Free the CPUs this process holds (its end frees them too); its pinning stays as it is."""
    for _, handle in _held:
        handle.close()
    _held.clear()
