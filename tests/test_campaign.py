"""A campaign's runs, one at a time (tuning/tools/campaign.py): a signal to the campaign stops the run
in flight with it, and the campaign exits through SystemExit so what wraps it (the archive's pack)
still happens."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

STEP = """
import pathlib, signal, sys, time, os
folder = pathlib.Path(sys.argv[1])
def stopped(signum, frame):
    (folder / "stopped").write_text(signal.Signals(signum).name)
    sys.exit(1)
signal.signal(signal.SIGTERM, stopped)
(folder / "pid").write_text(str(os.getpid()))
time.sleep(60)
"""


def wait_for(path: Path, seconds: float = 60) -> None:
    limit = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < limit, f"{path} never appeared"
        time.sleep(0.05)


def start_one_step_campaign(step: Path) -> subprocess.Popen:
    """A campaign of one step that sleeps a minute, in a process of its own; its stderr piped. Its Ctrl-C
    is Python's own, as from a terminal (pytest-xdist's workers pass SIGINT on ignored)."""
    step.mkdir()
    driver = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "import sys; from pathlib import Path; from tuning.tools.campaign import Job, run_campaign; "
              f"run_campaign([Job(Path({str(step)!r}), command=('-c', {STEP!r}, {str(step)!r}))], name='test')")
    return subprocess.Popen([sys.executable, "-c", driver], cwd=REPO, text=True, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("sig, said", [(signal.SIGTERM, "SIGTERM"), (signal.SIGHUP, "SIGHUP")])
def test_a_signal_to_the_campaign_stops_its_run_and_exits_cleanly(tmp_path, sig, said):
    step = tmp_path / "step"
    campaign = start_one_step_campaign(step)
    try:
        wait_for(step / "pid")
        campaign.send_signal(sig)
        if sig == signal.SIGHUP:  # a hang-up reaches the whole terminal, the step too: the campaign waits for it
            time.sleep(0.5)
            os.kill(int((step / "pid").read_text()), signal.SIGTERM)
        _, stderr = campaign.communicate(timeout=60)
    finally:
        campaign.kill()
        if (step / "pid").exists() and not (step / "stopped").exists():
            os.kill(int((step / "pid").read_text()), signal.SIGKILL)  # the old behaviour: left running
    assert campaign.returncode == 1 and f"test: stopped by {said}" in stderr
    assert (step / "stopped").read_text() == "SIGTERM"  # stopped with the campaign, once
    assert not (step / "DONE").exists()



def test_a_second_signal_while_the_campaign_waits_for_its_run_still_stops_the_run(tmp_path):
    """Ctrl-C gives the run time to end by itself; a SIGTERM during that wait once killed the campaign
    at once and left its run measuring on its own."""
    step = tmp_path / "step"
    campaign = start_one_step_campaign(step)
    try:
        wait_for(step / "pid")
        campaign.send_signal(signal.SIGINT)  # to the campaign alone, as `kill -INT` sends it
        time.sleep(1.0)
        campaign.send_signal(signal.SIGTERM)
        _, stderr = campaign.communicate(timeout=60)
        wait_for(step / "stopped", seconds=30)
    finally:
        campaign.kill()
        if (step / "pid").exists() and not (step / "stopped").exists():
            os.kill(int((step / "pid").read_text()), signal.SIGKILL)  # the old behaviour: left running
    assert (step / "stopped").read_text() == "SIGTERM"
    assert campaign.returncode == 1 and "test: stopped by Ctrl-C; a run in flight ended KILLED" in stderr
    assert not (step / "DONE").exists()



SLOW_TO_STOP = STEP.replace("    sys.exit(1)", "    time.sleep(2)\n    sys.exit(1)")


def test_a_signal_while_a_run_is_stopped_at_hours_stops_the_campaign_after_the_run(tmp_path):
    """At `--hours` the campaign gives its run time to end KILLED; a SIGTERM meanwhile is held until the
    run has ended, then stops the campaign (no next run, no re-reads after it). The driver has a second
    thread, as numpy's give a real one, so a blocked signal mask would not have held it."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    driver = ("import threading, time; from pathlib import Path; from tuning.tools.campaign import Job, run_campaign; "
              "threading.Thread(target=time.sleep, args=(600,), daemon=True).start(); "
              f"run_campaign([Job(Path({str(first)!r}), command=('-c', {SLOW_TO_STOP!r}, {str(first)!r})), "
              f"Job(Path({str(second)!r}), command=('-c', {STEP!r}, {str(second)!r}))], hours=1 / 3600, name='test'); "
              "print('went on')")
    campaign = subprocess.Popen([sys.executable, "-c", driver], cwd=REPO, text=True, stderr=subprocess.PIPE,
                                stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        said = ""
        while "stopping the run in flight" not in said:
            line = campaign.stderr.readline()
            assert line, f"the campaign ended without stopping its run: {said}"
            said += line
        campaign.send_signal(signal.SIGTERM)
        stdout, stderr = campaign.communicate(timeout=60)
    finally:
        campaign.kill()
        for step in (first, second):
            if (step / "pid").exists() and not (step / "stopped").exists():
                os.kill(int((step / "pid").read_text()), signal.SIGKILL)
    assert (first / "stopped").read_text() == "SIGTERM"
    assert campaign.returncode == 1 and "test: stopped by SIGTERM" in stderr and "went on" not in stdout
    assert not (second / "pid").exists()


def test_a_stopped_step_takes_its_grids_workers_with_it(tmp_path):
    """SIGTERM to a step that runs a grid through run_in_group stops the grid's whole process group:
    a launcher's worker (here the grid's child, which would sleep two minutes) is not left running,
    as it was when the step ran its grid with subprocess.run."""
    worker = tmp_path / "worker.pid"
    grid = ("import subprocess, sys; w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            f"open({str(worker)!r}, 'w').write(str(w.pid)); w.wait()")
    step = subprocess.Popen([sys.executable, "-c", "import sys; from tuning.tools.campaign import run_in_group; "
                             f"run_in_group([sys.executable, '-c', {grid!r}])"], cwd=REPO,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(worker)
        time.sleep(0.2)  # the pid written
        pid = int(worker.read_text())
        step.send_signal(signal.SIGTERM)
        assert step.wait(timeout=60) != 0
        limit = time.monotonic() + 30
        while running(pid) and time.monotonic() < limit:
            time.sleep(0.05)
        assert not running(pid)
    finally:
        step.kill()
        if worker.is_file() and worker.read_text() and running(int(worker.read_text())):
            os.kill(int(worker.read_text()), signal.SIGKILL)  # the old behaviour: left running


def running(pid: int) -> bool:
    """Whether the process runs (a zombie that nobody has reaped has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("uptime_s, warned", [(12 * 60, True), (40 * 60, False), (None, False)])
def test_a_campaign_started_in_a_vms_first_minutes_says_its_readings_may_read_slow(tmp_path, monkeypatch, capsys,
                                                                                   uptime_s, warned):
    from tuning.tools import campaign

    monkeypatch.setattr(campaign, "machine_uptime_s", lambda: uptime_s)
    step = campaign.Job(tmp_path / "step", command=("-c", "pass"))
    campaign.run_campaign([step], name="test")
    assert ("test: this machine started 12 min ago" in capsys.readouterr().err) is warned
    assert campaign.is_finished(step)
    campaign.run_campaign([step], name="test")  # nothing left to measure: nothing to say
    assert "started" not in capsys.readouterr().err
