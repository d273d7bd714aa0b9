"""The MLflow UI as a researcher opens it, in a real headless browser (make test-full).

A small run (synthetic hardware, 40 measurements) goes to a fresh sqlite store, `mlflow ui` serves it
on 127.0.0.1, and Debian's chromium loads the link tunelab prints: the experiment must open on the
model-training runs table (not MLflow 3's GenAI overview) and the run's `tuning/best_gflops` chart
must have one point per measurement. The screenshots stay in outputs/test_artifacts/mlflow_ui/.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "outputs" / "test_artifacts" / "mlflow_ui"
TRIALS = 40
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="needs a browser: apt-get install -y chromium")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """(base url, experiment id, run id) of a store holding one small run, served by `mlflow ui`."""
    tmp = tmp_path_factory.mktemp("ui")
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    done = subprocess.run([sys.executable, "run.py", "model=gemm_64", "hardware=synthetic", f"budget.trials={TRIALS}",
                           f"tracking.uri={store}", "tracking.experiment=ui", f"hydra.run.dir={tmp / 'run'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = (tmp / "run" / "mlflow_run_id").read_text().strip()
    port = _free_port()
    server = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "ui", "--backend-store-uri", store,
                               "--host", "127.0.0.1", "--port", str(port)], cwd=tmp,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("mlflow ui did not answer within 60 s")
        yield base, _browse_link(done.stdout), run_id
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


def _browse_link(stdout: str) -> str:
    """The experiment link the run printed (its MLflow: line), without its host."""
    [line] = [line for line in stdout.splitlines() if "open http" in line]
    return line.split("open http://127.0.0.1:5000", 1)[1].split()[0]


def _browser(url: str, screenshot: Path) -> str:
    """Load the page (JS run for up to 20 s of virtual time), save a screenshot, return the DOM."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    common = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              "--window-size=1400,900", "--virtual-time-budget=20000"]
    subprocess.run([*common, f"--screenshot={screenshot}", url], capture_output=True, timeout=120)
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    return dom.stdout


def test_the_printed_link_opens_the_runs_table(ui):
    base, link, run_id = ui
    dom = _browser(base + link, ARTIFACTS / "experiment.png")
    assert (ARTIFACTS / "experiment.png").stat().st_size > 10_000
    assert "gemm_64-sa-greedy-synthetic-0" in dom and ">Runs<" in dom
    assert "Detect Issues" not in dom and ">Judges<" not in dom  # MLflow 3's GenAI overview


def test_the_curve_has_a_point_per_measurement(ui):
    base, link, run_id = ui
    experiment = link.split("/experiments/")[1].split("?")[0]
    query = {"runs": f'["{run_id}"]', "metric": '"tuning/best_gflops"', "experiments": f'["{experiment}"]',
             "plot_metric_keys": '["tuning/best_gflops"]', "x_axis": "step", "show_point": "true",
             "workflowType": "machine_learning"}
    url = f"{base}/#/metric?" + "&".join(f"{key}={quote(value)}" for key, value in query.items())
    dom = _browser(url, ARTIFACTS / "best_gflops.png")
    assert "tuning/best_gflops" in dom
    assert dom.count('class="point"') == TRIALS
