"""Helpers several test modules share to run the lab and watch a run (configs.py has the config options):

- the tuning loop's parts from conf/ (`component`, `components`), for tests that call `tune_task` themselves;
- a whole job in this process, as run.py's (`tune_job`: its Outcome; `tune_run`: into <tmp>/run, its folder);
- run.py in a fresh process (`run_py`: started, `run_py_completed`: to its end);
- a run under way (`wait_for_records`: until its records.jsonl holds so many lines);
- pytest over a module in another folder, in a fresh process (`run_pytest_elsewhere`; `write_and_run`
  writes the module first): its PytestRun, the PASSED/FAILED lines sorted.

Where a helper is given `tmp`, the run's TUNELAB_OUTPUTS is <tmp>/outputs: nothing lands in the
repository's outputs/ (MLflow's default store, the Optuna database).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


# ---- the loop's parts ----------------------------------------------------------------------------
def component(group: str, name: str, seed: int = 0, **overrides):
    """Instantiate conf/<group>/<name>.yaml (with `${seed}` resolved) plus overrides."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from configs import load_option

    node = OmegaConf.merge(load_option(CONF / group / f"{name}.yaml"), overrides)
    return instantiate(OmegaConf.create({"seed": seed, "x": node}).x)


def components(search="sa", sampler="greedy", cost_model="xgb", seed=0, search_overrides=None,
               hardware_overrides=None, evaluator="fixed", hardware=None):
    """The loop's Components from conf/: the synthetic hardware (with `hardware_overrides`) unless a
    `hardware` object is given, no tracking."""
    from tuning.engine.loop import Components

    return Components(
        search=component("search", search, seed, **(search_overrides or {})),
        sampler=component("sampler", sampler, seed),
        evaluator=component("evaluator", evaluator, seed),
        cost_model=component("cost_model", cost_model, seed),
        hardware=hardware if hardware is not None else component("hardware", "synthetic", seed,
                                                                 **(hardware_overrides or {})),
        tracker=component("tracking", "none", seed),
    )


# ---- a job in this process -----------------------------------------------------------------------
def tune_job(tmp: Path, monkeypatch, *overrides: str):
    """run.py's job in this process (tunelab.tune): its Outcome."""
    import tunelab

    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp / "outputs"))  # never the repo's outputs/
    return tunelab.tune(list(overrides))


def tune_run(tmp: Path, monkeypatch, *overrides: str) -> Path:
    """tune_job into <tmp>/run (output_dir): that run's folder."""
    return tune_job(tmp, monkeypatch, *overrides, f"output_dir={tmp / 'run'}").folder


# ---- run.py in a fresh process -------------------------------------------------------------------
def _environment(tmp: Path | None, env: dict | None) -> dict:
    environment = dict(os.environ if env is None else env)
    if tmp is not None:
        environment["TUNELAB_OUTPUTS"] = str(tmp / "outputs")  # never the repo's outputs/
    return environment


def run_py(*args: str, tmp: Path | None = None, env: dict | None = None,
           stderr=subprocess.STDOUT) -> subprocess.Popen:
    """`python run.py *args` started from the repository root, its stdout piped (text), stderr into
    it unless `stderr` says otherwise (subprocess.PIPE: apart). `env`: the process's environment
    (default: this one's)."""
    return subprocess.Popen([sys.executable, str(REPO / "run.py"), *args], cwd=REPO, env=_environment(tmp, env),
                            text=True, stdout=subprocess.PIPE, stderr=stderr)


def run_py_completed(*args: str, tmp: Path | None = None, cwd: Path = REPO,
                     timeout: float = 300) -> subprocess.CompletedProcess:
    """`python run.py *args` run to its end from `cwd`: its exit code, stdout and stderr (text). The
    caller asserts the exit code it expects."""
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=cwd, env=_environment(tmp, None),
                          capture_output=True, text=True, timeout=timeout)


# ---- a run under way -----------------------------------------------------------------------------
def complete_lines(path: Path) -> int:
    """Lines of `path` that end in a newline (a run's records.jsonl may end in one being written)."""
    return path.read_bytes().count(b"\n") if path.exists() else 0


def wait_for_records(records: Path, lines: int, proc: subprocess.Popen, timeout: float = 90,
                     poll_s: float = 0.005, output=None) -> None:
    """Wait until `records` (a run's records.jsonl) holds `lines` complete lines, written by `proc`. Fails
    if the process ends first (the message: `output()`, default the tail of what the process printed)
    or after `timeout` seconds without them."""
    stop = time.monotonic() + timeout
    while complete_lines(records) < lines:
        assert proc.poll() is None, f"run ended before {lines} records:\n{(output or _printed(proc))()}"
        assert time.monotonic() < stop, f"run made no progress: fewer than {lines} records after {timeout} s"
        time.sleep(poll_s)


def _printed(proc: subprocess.Popen):
    def tail() -> str:
        out, err = proc.communicate()
        return ((out or "") + (err or ""))[-3000:]

    return tail


# ---- pytest in another folder --------------------------------------------------------------------
@dataclass(frozen=True)
class PytestRun:
    """A finished pytest run (`-rA`): its exit code and what it printed."""
    returncode: int
    stdout: str
    stderr: str

    def tail(self, stdout_chars: int = 6000, stderr_chars: int = 2000) -> str:
        """The ends of stdout and stderr, for an assertion's message."""
        return self.stdout[-stdout_chars:] + self.stderr[-stderr_chars:]

    @property
    def output(self) -> str:
        return self.tail()

    def _lines(self, outcome: str) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.startswith(outcome)]

    @property
    def failed(self) -> list[str]:
        """The summary's FAILED lines."""
        return self._lines("FAILED")

    @property
    def passed(self) -> list[str]:
        """The summary's PASSED lines."""
        return self._lines("PASSED")

    def passed_in(self, cls_name: str) -> list[str]:
        return [line for line in self.passed if cls_name in line]

    def assert_failed_only_in(self, cls_name: str, test_name: str, says: str | None = None) -> None:
        """The run failed (exit code 1), every FAILED line in `cls_name` and one of them `test_name`; it
        printed `says` where given. The message: `output`."""
        assert self.returncode == 1, self.output
        assert self.failed and all(cls_name in line for line in self.failed), self.output
        assert any(test_name in line for line in self.failed), self.output
        if says is not None:
            assert says in self.stdout, self.output


def run_pytest_elsewhere(folder: Path, test_file: str, pythonpath: list[Path], timeout: float = 300) -> PytestRun:
    """`pytest -q -rA test_file` run from `folder` in a fresh process, with PYTHONPATH `pythonpath` only
    (no cache, no xdist). The caller asserts the exit code it expects."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(path) for path in pythonpath)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist",
                           test_file], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    return PytestRun(done.returncode, done.stdout, done.stderr)


def write_and_run(folder: Path, name: str, source: str, pythonpath: list[Path] | None = None) -> PytestRun:
    """Write `source` (dedented) to <folder>/<name> and run pytest over it from `folder`; PYTHONPATH:
    `folder` and the repository unless `pythonpath` says otherwise."""
    (folder / name).write_text(textwrap.dedent(source))
    return run_pytest_elsewhere(folder, name, [folder, REPO] if pythonpath is None else pythonpath)
