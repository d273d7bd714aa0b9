"""The folder Hydra makes for each job (hydra.run.dir), when the job does not keep it: a job refused
before any work leaves none behind (nor a run folder locked), and a resumed run logs into its own run
folder instead."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from tuning.run_folder import release


def discard_refused(resumed: str | None, job_dir: str | None) -> None:
    """A job refused before any work: the folder it would have resumed is let go (a process that
    goes on, tunelab.tune's caller, must not keep it locked), and the folder Hydra made is removed."""
    if resumed:
        release(Path(resumed).expanduser().resolve())
    discard_untouched(job_dir)


def discard_untouched(job_dir: str | None) -> None:
    """A job refused before any work (a new run, or a resume) leaves no folder behind: the one Hydra
    made for it is removed while it holds nothing but Hydra's files, its run.log and the lock."""
    out_dir = Path(job_dir).resolve() if job_dir else None
    if out_dir is None or not out_dir.is_dir():
        return
    release(out_dir)
    made_here = {".hydra", "run.log", ".tunelab.lock"}  # run.log holds at most the refusal's own lines
    if all(p.name in made_here for p in out_dir.iterdir()):
        shutil.rmtree(out_dir, ignore_errors=True)


def continue_log_in(out_dir: Path, job_dir: str | None) -> None:
    """A resumed run logs to its own folder's run.log; the folder Hydra made for this job holds
    nothing else, and is removed rather than left behind empty."""
    if not job_dir or Path(job_dir).resolve() == out_dir:
        return
    job_dir = Path(job_dir).resolve()
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == job_dir:
            handler.close()
            handler.baseFilename = str(out_dir / Path(handler.baseFilename).name)  # reopened on the next record
            handler.mode = "a"
    leftovers = [p for p in job_dir.iterdir()
                 if p.name != ".hydra" and not (p.suffix == ".log" and p.stat().st_size == 0)]
    if not leftovers:
        shutil.rmtree(job_dir, ignore_errors=True)
