"""A campaign: many runs of real measuring, one folder each, that span sittings.

    jobs = [Job(Path("outputs/campaigns/x/gemm_512/sa/seed0"), ("search=sa", "model=gemm_512", "seed=0")), ...]
    run_campaign(jobs, hours=2.0)      # stops cleanly at 2 h; the same call later continues
    finished, total = progress(jobs)

Each job is one `run.py` run in its own folder (hydra.run.dir). A call goes through the jobs in
order, one at a time (they time kernels on this host): a FINISHED folder is skipped, a folder that
holds a run (stopped, killed or crashed) is resumed with `run.py resume=<folder>`, the rest start.
A job may instead be another step (`command`: a corpus build, a model's training), started again
until it exits 0, which its folder's DONE file records; such a step must itself be safe to repeat.
At `hours` the run in flight gets SIGTERM: it ends KILLED with its records and MLflow history, and
the next call resumes it. Ctrl-C, SIGTERM or SIGHUP to the campaign itself stop it the same way:
the run in flight is stopped first (never left running on its own), then the call raises
SystemExit, so whatever wraps it (campaign_archive's pack) still happens. Runs that share a
measurement store (hardware=replay on_miss=measure) measure nothing twice, so a stopped campaign
loses at most the build of one batch. A step that starts processes of its own (a Hydra grid and
its launcher's workers) starts them with `run_in_group`, so that its SIGTERM stops them all.
"""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tuning.config.untrusted import is_server
from tuning.engine.resume import SERVER_OVERRIDES
from tuning.engine.run_folder import Terminated, holds_run, read_status, signals_handled_by, terminated_by_signals

REPO = Path(__file__).resolve().parents[2]


DONE = "DONE"  # a step's folder holds it once the step has exited 0


@dataclass(frozen=True)
class Job:
    folder: Path  # the run's folder (hydra.run.dir), or a step's
    overrides: tuple = ()  # run.py's overrides for a new run there
    command: tuple = ()  # a step that is not a run: python's arguments (-m module ...)
    archived: bool = True  # False: its output lives outside its folder and the stores (campaign_archive)


def is_finished(job: Job) -> bool:
    if job.command:
        return (job.folder / DONE).is_file()
    return read_status(job.folder) == "FINISHED"


def job_command(job: Job) -> list[str]:
    """The job's command: a step's; for a run, a resume where its folder holds one, else a new run there."""
    if job.command:
        return [sys.executable, *job.command]
    run_py = [sys.executable, str(REPO / "run.py")]
    if holds_run(job.folder):  # the job's own servers named again: a saved config's are used only when named
        return [*run_py, f"resume={job.folder}", *(o for o in job.overrides
                                                    if o.startswith(SERVER_OVERRIDES) and is_server(o.split("=", 1)[1]))]
    return [*run_py, *job.overrides, f"hydra.run.dir={job.folder}"]


def run_campaign(jobs: list[Job], hours: float | None = None, name: str = "campaign") -> float:
    """Every job's run, finished ones skipped, stopped ones resumed, one at a time; stops at `hours`
    (the run in flight ends KILLED). Returns the call's wall seconds. A run that exits with an
    error stops the campaign, naming its folder."""
    deadline = time.monotonic() + hours * 3600 if hours else math.inf
    started = time.perf_counter()
    process = None
    if not all(is_finished(job) for job in jobs):
        _warn_if_just_started(name)
    with terminated_by_signals():  # around the except as well: no moment where SIGTERM kills the campaign alone
        try:
            for job in jobs:
                if is_finished(job):
                    continue
                if time.monotonic() >= deadline:
                    break
                command = job_command(job)
                print("$ " + " ".join(command), flush=True)
                process = subprocess.Popen(command, cwd=REPO)
                if not _ended_before(process, deadline, name):
                    break
                _record_exit(job, command, process.returncode, name)
        except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM/SIGHUP (Terminated)
            if process is not None:
                # a terminal's Ctrl-C or hang-up reaches the run as well: a second signal would cut its
                # KILLED bookkeeping short, so it gets time to end first; a SIGTERM is the campaign's alone
                _stop(process, name, wait_first_s=0 if getattr(interrupt, "signum", None) == signal.SIGTERM else 120)
            raise SystemExit(f"{name}: stopped by {str(interrupt) or 'Ctrl-C'}; a run in flight ended KILLED and the "
                             "same command continues the campaign") from None
    finished, total = progress(jobs)
    if finished < total:
        print(f"{name} stopped at --hours with {finished} of {total} runs finished: the same command "
              "continues it (finished runs are skipped, a stopped one resumes, the store re-measures nothing)")
    return time.perf_counter() - started


SETTLING_S = 25 * 60


def _warn_if_just_started(name: str) -> None:
    """A VM read kernels up to 2.5x slow in its first ~20 minutes, unseen by the drift gauge
    (docs/claims.md §Is a new host of an archive's kind?): a campaign started then says so."""
    up_s = machine_uptime_s()
    if up_s is not None and up_s < SETTLING_S:
        print(f"{name}: this machine started {up_s / 60:.0f} min ago; a VM's first 20 minutes or so can read "
              f"kernels up to 2.5x slow, and those readings go into the store. For timing, start "
              f"{SETTLING_S // 60} min after boot (Ctrl-C stops this call cleanly)", file=sys.stderr, flush=True)


def machine_uptime_s() -> float | None:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _ended_before(process: subprocess.Popen, deadline: float, name: str) -> bool:
    """Whether the process ended by itself before the deadline; if not, it is stopped there. A signal
    that came while it was being stopped goes on once it has ended."""
    try:
        process.wait(timeout=None if math.isinf(deadline) else max(1.0, deadline - time.monotonic()))
        return True
    except subprocess.TimeoutExpired:
        held = _stop(process, name)
        if held is not None:
            raise Terminated(held)
        return False


def _record_exit(job: Job, command: list[str], code: int, name: str) -> None:
    """A failure stops the campaign; a step that succeeded is marked DONE."""
    if code != 0:
        raise SystemExit(f"{name}: the {'step' if job.command else 'run'} in {job.folder} exited {code} "
                         f"({'its output above' if job.command else 'its run.log'} says why); the same command "
                         "resumes it")
    if job.command:
        job.folder.mkdir(parents=True, exist_ok=True)
        (job.folder / DONE).write_text(" ".join(command) + "\n")


def _stop(process: subprocess.Popen, name: str, grace_s: float = 120, wait_first_s: float = 0) -> int | None:
    """Time to end by itself (`wait_first_s`; a signal cuts it short), then SIGTERM and time to end
    KILLED with its records flushed, then SIGKILL. Signals during the grace are held, not acted on,
    so the campaign cannot die and leave its run going on alone; the first one held is returned."""
    stopping = _Stopping()
    with stopping.handling():
        try:
            process.wait(timeout=wait_first_s)
            return None
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            stopping.hold()
        print(f"{name}: stopping the run in flight (up to {grace_s:.0f} s for it to end KILLED)", file=sys.stderr,
              flush=True)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=60)
    return stopping.held[0] if stopping.held else None


class _Stopping:
    """Python-level handlers for SIGINT, SIGTERM and SIGHUP while a run is stopped: they raise until
    `hold`, then note the signal. (A blocked signal mask would not do: numpy's threads would take the
    signal and Python would still raise it in the main thread.)"""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.raising, self.held = True, []

    def __call__(self, signum, frame):
        if self.raising:
            self.raising = False  # the next one, however soon, is held
            raise Terminated(signum)
        self.held.append(signum)

    def hold(self) -> None:
        self.raising = False

    def handling(self):
        return signals_handled_by(self, self.SIGNALS)


def progress(jobs: list[Job]) -> tuple[int, int]:
    """(runs finished, runs in the campaign)."""
    return len(finished_folders(jobs)), len(jobs)


def finished_folders(jobs: list[Job]) -> list[Path]:
    return [job.folder for job in jobs if is_finished(job)]


# ---- a step's own children -----------------------------------------------------------------------
def run_in_group(command: list[str]) -> int:
    """The command in a process group of its own, its exit code. Ctrl-C, SIGTERM or SIGHUP here stop
    the whole group (a joblib launcher's workers as well, which a signal to the grid alone would leave
    running), then the interrupt goes on."""
    with terminated_by_signals():
        process = subprocess.Popen(command, cwd=REPO, start_new_session=True)
        try:
            return process.wait()
        except KeyboardInterrupt:
            stop_group(process)
            raise


def stop_group(process: subprocess.Popen, grace_s: float = 60) -> None:
    """SIGTERM to the process's group, time for every member (a launcher's workers, which outlive a
    launcher that dies at once) to end KILLED with its records, then SIGKILL to what is left. Signals
    wait meanwhile: a second Ctrl-C must not leave the group running. The grace is shorter than
    `_stop`'s, so a step stopping its group here ends before the campaign's SIGKILL could orphan it."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    try:
        _signal_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _group_runs(process) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


def _group_runs(process: subprocess.Popen) -> bool:
    """Whether a member of the process's group still runs (the leader is reaped here; a worker left a
    zombie by a parent that nobody reaps has ended)."""
    process.poll()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == process.pid and fields[0] != "Z":
            return True
    return False
