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


@pytest.mark.parametrize("sig, said", [(signal.SIGTERM, "SIGTERM"), (signal.SIGHUP, "SIGHUP")])
def test_a_signal_to_the_campaign_stops_its_run_and_exits_cleanly(tmp_path, sig, said):
    step = tmp_path / "step"
    step.mkdir()
    driver = ("import sys; from pathlib import Path; from tuning.tools.campaign import Job, run_campaign; "
              f"run_campaign([Job(Path({str(step)!r}), command=('-c', {STEP!r}, {str(step)!r}))], name='test')")
    campaign = subprocess.Popen([sys.executable, "-c", driver], cwd=REPO, text=True, stderr=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
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
