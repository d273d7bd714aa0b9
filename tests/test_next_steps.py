"""The next steps a run prints (resume, sync, ui, a registered model's use) run as printed: from a
checkout whose venv is not active as from an install, through one helper (tuning/config/cli.py
`tunelab_command`)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from configs import as_job
from test_clear_stops import SMALL, disk_full_after  # noqa: F401 - a fixture this module uses
from tuning.config.cli import tunelab_command
from tuning.engine import run as tunelab_run

HERE = Path(sys.executable).absolute().parent  # the running environment's bin folder


def without_here(path: str) -> str:
    return os.pathsep.join(d for d in path.split(os.pathsep) if d and Path(d).absolute() != HERE)


@pytest.fixture
def venv_not_active(monkeypatch) -> str:
    """PATH as in a shell where this environment is not activated (no `tunelab` of ours on it)."""
    path = without_here(os.environ.get("PATH", "/usr/bin:/bin"))
    monkeypatch.setenv("PATH", path)
    return path


def runs_as_printed(line: str, *more: str, path: str) -> subprocess.CompletedProcess:
    """The printed line pasted into a shell with that PATH (and `more` after it), from another folder."""
    done = subprocess.run(" ".join([line, *more]), shell=True, cwd="/", capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PATH": path})
    assert done.returncode == 0, f"{line!r}: exit {done.returncode}\n{done.stderr[-2000:]}"
    return done


def test_a_printed_command_runs_where_the_venv_is_not_active(venv_not_active):
    line = tunelab_command("sync", "outputs/runs/x")
    assert line.startswith(str(HERE / "tunelab") if (HERE / "tunelab").exists() else sys.executable), line
    assert "usage: tunelab sync" in runs_as_printed(line, "--help", path=venv_not_active).stdout


def test_a_printed_command_is_plain_tunelab_where_ours_is_on_path(monkeypatch):
    if not (HERE / "tunelab").exists():
        pytest.skip("no tunelab script beside this interpreter")
    monkeypatch.setenv("PATH", os.pathsep.join([str(HERE), without_here(os.environ.get("PATH", ""))]))
    assert tunelab_command("ui", "--tracking-uri", "sqlite:////x/mlflow.db") == \
        "tunelab ui --tracking-uri sqlite:////x/mlflow.db"


def test_an_interpreter_without_the_script_prints_python_dash_m(tmp_path, monkeypatch, venv_not_active):
    """An install whose scripts went elsewhere (or none): the running interpreter runs the module."""
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    line = tunelab_command("export", "outputs/runs/a b")
    assert line == f"{python} -m tunelab export 'outputs/runs/a b'"
    assert "usage: tunelab export" in runs_as_printed(line, "--help", path=venv_not_active).stdout


def test_the_sync_line_of_an_offline_run_runs_as_printed(tmp_path, venv_not_active):
    from tuning.engine.job_run import sync_command

    line = sync_command(SimpleNamespace(uri="http://mlflow:5000"), tmp_path / "run")
    assert line.endswith(f"sync {tmp_path / 'run'} --tracking-uri http://mlflow:5000"), line
    runs_as_printed(line, "--help", path=venv_not_active)


def test_the_browse_line_serves_the_ui_as_printed(tmp_path, venv_not_active):
    """After `make demo`: the run's `browse: tunelab ui --tracking-uri ...` line, pasted as is."""
    from tuning.tracking.mlflow_tracker import ui_command

    line = ui_command(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert line.endswith(f"ui --tracking-uri sqlite:///{tmp_path / 'mlflow.db'}"), line
    assert "usage: tunelab ui" in runs_as_printed(line, "--help", path=venv_not_active).stdout


def test_the_resume_line_of_a_stopped_run_runs_as_printed(tmp_path, compose_cfg, monkeypatch, capsys,
                                                          disk_full_after, venv_not_active):  # noqa: F811
    cfg = as_job(compose_cfg(*SMALL, "hardware.delay_s=0.0", "budget.trials=64"), monkeypatch)
    disk_full_after(20)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        tunelab_run.main(cfg)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    line = last.split("continue with: ", 1)[1]
    assert line.endswith(f"run resume={tmp_path / 'run'}"), last
    runs_as_printed(line, "--help", path=venv_not_active)
