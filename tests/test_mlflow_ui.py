"""The MLflow UI as a researcher opens it, in a real headless browser (make test-full).

Two small runs of different budgets (synthetic hardware, 40 and 24 measurements) go to a fresh
sqlite store, `mlflow ui` serves it on 127.0.0.1, and Debian's chromium, driven over the DevTools
protocol at 1280x800, loads the links tunelab prints: the experiment must open on the model-training
runs table (not MLflow 3's GenAI overview) with the two runs under different names; the run's
metrics tab must show its headline (the best-so-far curve and the re-measured result) on the first
screen, the curve with one point per measurement; the compare tool's link must open MLflow's
compare-runs page on both runs. The screenshots stay in outputs/test_artifacts/mlflow_ui/.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote

import pytest

from tuning.config.naming import BEST_SO_FAR, FINAL_GFLOPS, FINAL_LATENCY_US
from tuning.tools.compare.report import compare_runs_page

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "outputs" / "test_artifacts" / "mlflow_ui"
TRIALS, FEWER_TRIALS = 40, 24
SCREEN = (1280, 800)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="needs a browser: apt-get install -y chromium")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tune(tmp: Path, store: str, trials: int) -> tuple[str, str]:
    """(the run's printed output, its MLflow run id)."""
    folder = tmp / f"run{trials}"
    done = subprocess.run([sys.executable, "run.py", "model=gemm_64", "hardware=synthetic", f"budget.trials={trials}",
                           f"tracking.uri={store}", "tracking.experiment=ui", f"hydra.run.dir={folder}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, (folder / "mlflow_run_id").read_text().strip()


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """The served store: base url, the experiment link the first run printed, the run ids by budget."""
    tmp = tmp_path_factory.mktemp("ui")
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    printed, run_id = _tune(tmp, store, TRIALS)
    _, fewer_id = _tune(tmp, store, FEWER_TRIALS)
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
        yield SimpleNamespace(base=base, link=_browse_link(printed), runs={TRIALS: run_id, FEWER_TRIALS: fewer_id})
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


@pytest.fixture
def browser():
    page = Page(CHROMIUM, *SCREEN)
    try:
        yield page
    finally:
        page.close()


def _browse_link(stdout: str) -> str:
    """The experiment link the run printed (its MLflow: line), without its host."""
    [line] = [line for line in stdout.splitlines() if "open http" in line]
    return line.split("open http://127.0.0.1:5000", 1)[1].split()[0]


def _experiment_id(link: str) -> str:
    return link.split("/experiments/")[1].split("?")[0]


class Page:
    """One tab of a headless chromium with a fresh profile, driven over the DevTools protocol on a pipe
    (--remote-debugging-pipe: commands on its fd 3, replies on its fd 4, each JSON ending in NUL),
    its viewport fixed at width x height: what "the first screen" means here."""

    def __init__(self, binary: str, width: int, height: int):
        commands_read, commands_write = os.pipe()
        replies_read, replies_write = os.pipe()
        self._profile = tempfile.TemporaryDirectory()

        def as_fd_3_and_4():
            os.dup2(commands_read, 3)
            os.dup2(replies_write, 4)

        self._process = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--window-size={width},{height}", f"--user-data-dir={self._profile.name}", "--remote-debugging-pipe",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(3, 4), preexec_fn=as_fd_3_and_4)
        os.close(commands_read)
        os.close(replies_write)
        self._commands, self._replies = os.fdopen(commands_write, "wb", buffering=0), os.fdopen(replies_read, "rb")
        self._unread = b""
        self._last_id = 0
        target = self._send("Target.createTarget", url="about:blank")["targetId"]
        self._session = self._send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self._send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def open(self, url: str) -> None:
        self._send("Page.navigate", url=url)

    def wait_for(self, expression: str, timeout_s: float = 60.0):
        """The value of a JavaScript expression once it is truthy (the UI renders after its fetches)."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.5)

    def evaluate(self, expression: str):
        result = self._send("Runtime.evaluate", expression=expression, returnByValue=True)["result"]
        return result.get("value")

    def screenshot(self, path: Path) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._send("Page.captureScreenshot", format="png")["data"]))

    def html(self) -> str:
        return self.evaluate("document.documentElement.outerHTML")

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=30)
        self._profile.cleanup()

    def _send(self, method: str, **params) -> dict:
        self._last_id += 1
        message = {"id": self._last_id, "method": method, "params": params}
        if not method.startswith("Target."):  # the browser's own domain; the rest go to the tab
            message["sessionId"] = self._session
        self._commands.write(json.dumps(message).encode() + b"\0")
        while True:
            reply = json.loads(self._read_message())
            if reply.get("id") == self._last_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def _read_message(self) -> bytes:
        while b"\0" not in self._unread:
            chunk = self._replies.read1(1 << 16)
            if not chunk:
                raise EOFError("chromium closed its DevTools pipe")
            self._unread += chunk
        message, self._unread = self._unread.split(b"\0", 1)
        return message


def _shows(texts) -> str:
    """JavaScript: whether the page shows every one of `texts`."""
    return " && ".join(f"document.body.innerText.includes({json.dumps(text)})" for text in texts)


def _chart_box(title: str) -> str:
    """JavaScript: where the chart card titled `title` is (MLflow's card shows the metric's name after
    its last "/") and the points it draws, or null until its plot is drawn."""
    return f"""(() => {{
        const heading = [...document.querySelectorAll("h1,h2,h3,h4,h5,span,div")]
            .find(e => e.childElementCount === 0 && e.textContent.trim() === {json.dumps(title)});
        const card = heading && heading.closest(".react-resizable");
        if (!card || !card.querySelector(".js-plotly-plot .scatterlayer .trace")) return null;
        const box = card.getBoundingClientRect();
        return {{top: box.top, bottom: box.bottom, screen: window.innerHeight,
                 points: card.querySelectorAll(".point").length}};
    }})()"""


def test_the_printed_link_opens_the_runs_table_with_a_name_per_budget(ui, browser):
    browser.open(ui.base + ui.link)
    names = [f"gemm_64-sa-greedy-b{TRIALS}-synthetic-0", f"gemm_64-sa-greedy-b{FEWER_TRIALS}-synthetic-0"]
    assert browser.wait_for(_shows(names)), browser.html()[-3000:]
    browser.screenshot(ARTIFACTS / "experiment.png")
    dom = browser.html()
    assert ">Runs<" in dom
    assert "Detect Issues" not in dom and ">Judges<" not in dom  # MLflow 3's GenAI overview


def test_the_headline_is_on_the_first_screen_of_the_runs_metrics(ui, browser):
    run_id = ui.runs[TRIALS]
    browser.open(f"{ui.base}/#/experiments/{_experiment_id(ui.link)}/runs/{run_id}/model-metrics"
                 "?workflowType=machine_learning")
    boxes = {key: browser.wait_for(_chart_box(key.rsplit("/", 1)[1]))
             for key in (BEST_SO_FAR, FINAL_GFLOPS, FINAL_LATENCY_US)}
    browser.screenshot(ARTIFACTS / "run_metrics.png")
    for key, box in boxes.items():
        assert box, f"no chart of {key} on the run's metrics tab"
        assert 0 <= box["top"] and box["bottom"] <= box["screen"] == SCREEN[1], (key, box)
    assert boxes[BEST_SO_FAR]["points"] == TRIALS


def test_the_curve_has_a_point_per_measurement(ui, browser):
    query = {"runs": f'["{ui.runs[TRIALS]}"]', "metric": json.dumps(BEST_SO_FAR),
             "experiments": f'["{_experiment_id(ui.link)}"]', "plot_metric_keys": json.dumps([BEST_SO_FAR]),
             "x_axis": "step", "show_point": "true", "workflowType": "machine_learning"}
    browser.open(f"{ui.base}/#/metric?" + "&".join(f"{key}={quote(value)}" for key, value in query.items()))
    points = browser.wait_for(f"document.querySelectorAll('.point').length >= {TRIALS} && "
                              "document.querySelectorAll('.point').length")
    browser.screenshot(ARTIFACTS / "best_so_far.png")
    assert BEST_SO_FAR in browser.html()
    assert points == TRIALS


def test_the_compare_link_opens_both_runs_side_by_side(ui, browser):
    runs = [SimpleNamespace(info=SimpleNamespace(run_id=run_id, experiment_id=_experiment_id(ui.link)))
            for run_id in ui.runs.values()]
    browser.open(ui.base + compare_runs_page(runs))
    names = [f"-b{TRIALS}-", f"-b{FEWER_TRIALS}-"]
    shown = browser.wait_for(_shows(names))
    browser.screenshot(ARTIFACTS / "compare_runs.png")
    assert shown, browser.html()[-3000:]
    assert ">Judges<" not in browser.html()  # the model-training view, not the GenAI one
