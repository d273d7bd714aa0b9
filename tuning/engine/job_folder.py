"""The folder Hydra makes for each job (hydra.run.dir): a job refused before any work leaves none
behind (nor a run folder locked), a resumed run logs into its own run folder instead, Hydra's copies
of the config hold no password, and a job stopped after measuring says why in words."""
from __future__ import annotations

import errno
import logging
import re
import shutil
from contextlib import suppress
from pathlib import Path

from tuning.config.untrusted import scrub_file
from tuning.engine.run_folder import release

HYDRA_COPIES = ("config.yaml", "overrides.yaml", "hydra.yaml")
FULL = (errno.ENOSPC, errno.EDQUOT)


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
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", out_dir.parent.name):  # the default layout's day folder, if now empty
            with suppress(OSError):
                out_dir.parent.rmdir()


def continue_log_in(out_dir: Path, job_dir: str | Path | None) -> None:
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


def scrub_hydra_copies(hydra: dict) -> None:
    """Hydra's own copies of the config and overrides (.hydra/, a sweep's multirun.yaml), written
    before the job starts, without the passwords of the URLs in them and readable by their owner only."""
    folders = [Path(hydra[key]) for key in ("output_dir", "sweep_dir") if hydra.get(key)]
    copies = [folders[0] / ".hydra" / name for name in HYDRA_COPIES] if folders else []
    for path in [*copies, *(folder / "multirun.yaml" for folder in folders[1:])]:
        scrub_file(path)


def stop_reason(error: Exception, out_dir: Path) -> str | None:
    """Why a run stopped after measuring, in words (a full disk, a link where it writes, no device
    left); None for an OS error other than a full disk, which is not the run's input to mend."""
    if not isinstance(error, OSError):
        return str(error)
    if error.errno not in FULL:
        return None
    return f"{error.filename or f'the run folder {out_dir}'} could not be written ({error.strerror})"


def hydra_info() -> dict:
    """What the job's Hydra context says of it: its group choices, overrides and folder (and a sweep's)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return {}
    hc = HydraConfig.get()
    info = {"choices": dict(hc.runtime.choices), "overrides": list(hc.overrides.task),
            "output_dir": hc.runtime.output_dir}
    if hc.mode == RunMode.MULTIRUN:
        info["sweep_dir"] = str(Path(hc.sweep.dir).resolve())
    return info
