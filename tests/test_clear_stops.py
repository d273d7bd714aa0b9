"""A stop the user can act on is one line, not a traceback: a run folder that cannot be written
(read-only media), a disk that fills up mid-run (the folder's status is left FAILED, and the line
says how to continue), and `tunelab.tune` given something that is not a list of overrides.

Read-only media and a full disk are simulated in process (os.open / a record write raising the
OS's error), and met for real on a read-only bind mount and a tiny tmpfs where mounting is permitted
(the tests run as root, for whom chmod changes nothing)."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from configs import as_job
from test_store_access import fill_up, mount, unmount
from tuning.config import ConfigError, files
from tuning.core.records import RecordWriter
from tuning.engine import run as tunelab_run
from tuning.engine import run_folder

REPO = Path(__file__).resolve().parents[1]
SMALL = ("hardware=synthetic", "model=gemm_64", "search=random", "cost_model=none", "tracking=none",
         "budget.plan_size=8")


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """A finished 16-measurement run, copied by the tests that need one."""
    import tunelab

    tmp = tmp_path_factory.mktemp("small")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TUNELAB_OUTPUTS", str(tmp / "outputs"))
        tunelab.tune([*SMALL, "hardware.delay_s=0.0", "budget.trials=16", f"output_dir={tmp / 'run'}"])
    return tmp / "run"


def copy_of(run_dir: Path, tmp: Path) -> Path:
    return Path(shutil.copytree(run_dir, tmp / "run", ignore=shutil.ignore_patterns(run_folder.LOCK_FILE)))


def no_traceback(err: str) -> str:
    assert "Traceback" not in err and "During handling" not in err, err
    return err


def one_line(err: str) -> str:
    lines = no_traceback(err).strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def assert_says_unwritable(line: str, folder: Path) -> None:
    assert line.startswith("tunelab: ") and str(folder) in line, line
    assert "cannot be written" in line and "read-only" in line and f"cp -a {folder} " in line, line


# ---- a run folder on read-only media ------------------------------------------------------------
@pytest.fixture
def read_only_lock(monkeypatch):
    """os.open of any run folder's lock file fails as on read-only media."""
    real_open = os.open

    def open_on_read_only_media(path, flags, *args, **kwargs):
        if Path(path).name == run_folder.LOCK_FILE:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_on_read_only_media)


@pytest.mark.parametrize("tool", ["sync", "export"])
def test_a_tool_on_a_read_only_run_folder_says_so_in_one_line(tmp_path, small_run, read_only_lock, capsys, tool):
    import importlib

    folder = copy_of(small_run, tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(f"tuning.tools.{tool}").main([str(folder)])
    assert exit_.value.code == 2
    assert_says_unwritable(one_line(capsys.readouterr().err), folder)


def test_a_resume_of_a_read_only_run_folder_says_so_in_one_line(tmp_path, small_run, read_only_lock,
                                                              compose_cfg, monkeypatch, capsys):
    folder = copy_of(small_run, tmp_path / "media")
    cfg = as_job(compose_cfg(f"resume={folder}"), monkeypatch)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        tunelab_run.main(cfg)
    assert exit_.value.code == 2
    assert_says_unwritable(one_line(capsys.readouterr().err), folder)


def test_the_commands_on_a_read_only_mount_say_so_in_one_line(tmp_path, small_run):
    source, view = copy_of(small_run, tmp_path), tmp_path / "read-only"
    view.mkdir()
    mount("--bind", str(source), str(view))
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        for command in (["run", f"resume={view}"], ["sync", str(view)], ["export", str(view)]):
            done = subprocess.run([sys.executable, "-m", "tunelab", *command], cwd=REPO, capture_output=True,
                                  text=True, timeout=120, env={**os.environ, "TUNELAB_OUTPUTS": str(tmp_path / "out")})
            assert done.returncode == 2, (command, done.stderr)
            assert_says_unwritable(one_line(done.stderr), view)
    finally:
        unmount(view)


# ---- a disk that fills up mid-run --------------------------------------------------------------
@pytest.fixture
def disk_full_after(monkeypatch):
    """disk_full_after(n): the n+1-th record written, and from then on any new file, fails as on a
    full disk (a file already there can still be rewritten within its blocks)."""
    def fill_after(records: int) -> None:
        written, real_write, real_mkstemp = [0], RecordWriter.write, files.tempfile.mkstemp

        def write(self, record):
            written[0] += 1
            if written[0] > records:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_write(self, record)

        def mkstemp(*args, **kwargs):
            if written[0] > records:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_mkstemp(*args, **kwargs)

        monkeypatch.setattr(RecordWriter, "write", write)
        monkeypatch.setattr(files.tempfile, "mkstemp", mkstemp)

    return fill_after


def assert_stopped_for_a_full_disk(err: str, folder: Path) -> None:
    line = no_traceback(err).strip().splitlines()[-1]  # after the job's budget and estimate lines
    assert line.startswith("tunelab: ") and "No space left on device" in line, line
    assert line.endswith(f"tunelab run resume={folder}"), line
    assert (folder / run_folder.STATUS_FILE).read_text() == "FAILED\n"


def test_a_disk_full_mid_run_stops_in_one_line_and_leaves_the_run_failed(tmp_path, compose_cfg, monkeypatch,
                                                                          capsys, disk_full_after):
    cfg = as_job(compose_cfg(*SMALL, "hardware.delay_s=0.0", "budget.trials=64"), monkeypatch)
    disk_full_after(20)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        tunelab_run.main(cfg)
    assert exit_.value.code == 1
    assert_stopped_for_a_full_disk(capsys.readouterr().err, tmp_path / "run")


def test_the_status_is_marked_in_place_when_no_new_file_fits(tmp_path, monkeypatch):
    run_folder.mark_status(tmp_path, "RUNNING")

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.tempfile, "mkstemp", no_space)
    run_folder.mark_status(tmp_path, "FAILED")
    assert run_folder.read_status(tmp_path) == "FAILED"
    assert sorted(p.name for p in tmp_path.iterdir()) == [run_folder.STATUS_FILE]


def test_a_real_disk_full_mid_run_stops_in_one_line(tmp_path):
    from helpers import wait_for_records

    disk = tmp_path / "disk"
    disk.mkdir()
    mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk))
    try:
        folder = disk / "run"
        proc = subprocess.Popen([sys.executable, "run.py", *SMALL, "hardware.delay_s=0.005", "budget.trials=100000",
                                 f"hydra.run.dir={folder}"], cwd=REPO, text=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env={**os.environ, "TUNELAB_OUTPUTS": str(tmp_path / "out")})
        wait_for_records(folder / "records.jsonl", 32, proc)
        fill_up(disk)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 1, err
        assert_stopped_for_a_full_disk(err, folder)
    finally:
        unmount(disk)


# ---- tunelab.tune's argument -------------------------------------------------------------------
@pytest.mark.parametrize("overrides, error, says", [
    (["hardware=synthetic", 5], TypeError, r"overrides\[1\].*5.*not a string"),
    (["hardware=synthetic", None], TypeError, r"overrides\[1\].*None.*not a string"),
    (["-m", "hardware=synthetic"], ConfigError, r"overrides\[0\].*'-m'.*tunelab run -m"),
    (["hardware=synthetic", "--multirun"], ConfigError, r"overrides\[1\].*'--multirun'.*tunelab run -m"),
    (["hardware=synthetic", "model"], ConfigError, r"overrides\[1\].*'model'.*key=value"),
    (["model=gemm_64,gemm_128"], ConfigError, r"overrides\[0\].*'model=gemm_64,gemm_128'.*tunelab run -m"),
    (5, TypeError, r"list of strings"),
])
def test_tune_names_a_bad_override_and_its_position_before_any_work(tmp_path, monkeypatch, overrides, error, says):
    import tunelab

    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "outputs"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=says):
        tunelab.tune(overrides)
    assert list(tmp_path.iterdir()) == []


def test_tune_of_none_is_a_job_without_overrides():
    from omegaconf import OmegaConf

    import tunelab

    assert OmegaConf.to_container(tunelab.compose(None)) == OmegaConf.to_container(tunelab.compose(()))
