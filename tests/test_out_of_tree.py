"""A method in the user's own package, end to end (docs/architecture.md §Adding a method).

The toy search of tests/test_extending.py lives in a temporary directory: its module on PYTHONPATH, its
YAML in <tmp>/conf/search/toy.yaml, that directory declared in TUNELAB_CONF_DIRS and nowhere else (no
`hydra.searchpath` on any command line). A run with it is stopped by SIGTERM and resumed to its
budget; the folder commands take it; a run on the CPU is applied and synced (slow). With the
directory undeclared the same folder is refused by resume, apply, export and sync, naming the key
and the class, and nothing runs.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import complete_lines, run_py
from test_extending import REPO, toy_env
from test_loop import check_resumed

TRIALS = 160
REFUSED = ("search._target_: 'toy_search.ToySearch' is not a class tunelab registers",
           "declare its config directory in TUNELAB_CONF_DIRS")


def finish(proc: subprocess.Popen, code: int = 0) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == code, f"exit {proc.returncode}\n{out[-2000:]}\n{err[-3000:]}"
    return err


def terminate_after(proc: subprocess.Popen, records: Path, lines: int) -> None:
    while complete_lines(records) < lines:
        assert proc.poll() is None, f"run ended before it was stopped:\n{proc.communicate()[1][-3000:]}"
        time.sleep(0.002)
    proc.send_signal(signal.SIGTERM)
    finish(proc, 128 + signal.SIGTERM)


def undeclared(env: dict) -> dict:
    """The same user, the module still importable, its config directory no longer declared."""
    return {k: v for k, v in env.items() if k != "TUNELAB_CONF_DIRS"}


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("out_of_tree")
    return toy_env(tmp), tmp


@pytest.fixture(scope="module")
def resumed_run(toy) -> Path:
    """A toy-search run stopped by SIGTERM once rounds were saved, then resumed to its budget."""
    env, tmp = toy
    run_dir, records = tmp / "run", tmp / "run" / "records.jsonl"
    proc = run_py("search=toy", "cost_model=none", "hardware=synthetic", "hardware.delay_s=0.005",
                  "model=gemm_64", f"budget.trials={TRIALS}", "tracking=none", f"hydra.run.dir={run_dir}",
                  env=env, stderr=subprocess.PIPE)
    terminate_after(proc, records, 24)  # in round 1, round 0's state saved
    intact = records.read_bytes()[: records.read_bytes().rfind(b"\n") + 1]
    assert (run_dir / "status").read_text().strip() == "KILLED"
    finish(run_py(f"resume={run_dir}", env=env, stderr=subprocess.PIPE))
    rows = check_resumed(records, intact, TRIALS)
    assert {r["method"] for r in rows} == {"toy+greedy"}
    return run_dir


def test_a_run_with_an_out_of_tree_search_is_killed_and_resumed(resumed_run):
    assert (resumed_run / "status").read_text().strip() == "FINISHED"
    assert (resumed_run / "state").is_dir()


def test_declared_its_folder_is_taken_by_the_folder_commands(toy, resumed_run, monkeypatch, capsys):
    """export gets past the saved config to the hardware: synthetic hardware builds no library."""
    from tuning.tools import export

    _, tmp = toy
    monkeypatch.setenv("TUNELAB_CONF_DIRS", str(tmp / "conf"))
    monkeypatch.syspath_prepend(str(tmp / "plugin"))
    with pytest.raises(SystemExit) as exit_:
        export.main([str(resumed_run)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "SyntheticHardware builds no library" in err, err


def test_undeclared_its_folder_is_refused_by_resume_and_nothing_runs(toy, resumed_run):
    env, tmp = toy
    before = {p.name: p.read_bytes() for p in resumed_run.iterdir() if p.is_file() and p.name != ".tunelab.lock"}
    err = finish(run_py(f"resume={resumed_run}", f"budget.trials={TRIALS + 32}",
                        f"hydra.run.dir={tmp / 'refused'}", env=undeclared(env), stderr=subprocess.PIPE), 2)
    assert all(part in err for part in REFUSED), err
    assert "Traceback" not in err and not (tmp / "refused").exists()
    after = {p.name: p.read_bytes() for p in resumed_run.iterdir() if p.is_file() and p.name != ".tunelab.lock"}
    assert after == before


@pytest.mark.parametrize("command", ["apply", "export", "sync"])
def test_undeclared_its_folder_is_refused_by_the_folder_commands(toy, resumed_run, command, monkeypatch, capsys):
    import importlib

    monkeypatch.delenv("TUNELAB_CONF_DIRS", raising=False)
    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(f"tuning.tools.{command}").main([str(resumed_run)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and all(part in err for part in REFUSED), err


def test_its_directory_on_this_commands_hydra_searchpath_registers_it(toy, resumed_run, compose_cfg, monkeypatch):
    """A run.py job that names the directory in `hydra.searchpath` (not in TUNELAB_CONF_DIRS) declares it too."""
    from tuning.config import ConfigError
    from tuning.engine.run_folder import load_config

    _, tmp = toy
    monkeypatch.delenv("TUNELAB_CONF_DIRS", raising=False)
    compose_cfg()
    with pytest.raises(ConfigError, match="declare its config directory"):
        load_config(resumed_run / "config.yaml", "resume")
    compose_cfg(f"hydra.searchpath=[file://{tmp / 'conf'}]")
    assert load_config(resumed_run / "config.yaml", "resume").search._target_ == "toy_search.ToySearch"


def test_a_declared_directory_is_on_hydras_search_path(toy, monkeypatch):
    """hydra_plugins/tunelab_searchpath: no `hydra.searchpath` given, the variable alone finds search=toy."""
    from hydra import compose, initialize_config_dir

    from tuning.config import register

    _, tmp = toy
    (tmp / "elsewhere").mkdir(exist_ok=True)
    monkeypatch.setenv("TUNELAB_CONF_DIRS", os.pathsep.join([str(tmp / "elsewhere"), str(tmp / "conf")]))
    register()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        assert compose("config", overrides=["search=toy"]).search._target_ == "toy_search.ToySearch"
        assert compose("config", overrides=["search=sa"]).search._target_ == "tuning.search.sa.SimulatedAnnealing"


@pytest.mark.tvm
@pytest.mark.slow
def test_a_cpu_run_with_an_out_of_tree_search_is_applied_and_synced(toy):
    env, tmp = toy
    run_dir = tmp / "cpu_run"
    finish(run_py("search=toy", "search.default_plan_size=8", "cost_model=none", "hardware=cpu",
                  "model=gemm_64", "budget.trials=8", "tracking.experiment=out_of_tree", f"hydra.run.dir={run_dir}",
                  env=env, stderr=subprocess.PIPE))
    for command, expected in (("apply", "compiled; output matches the reference"), ("sync", "8 records, status FINISHED")):
        proc = subprocess.run([sys.executable, "-m", f"tuning.tools.{command}", str(run_dir)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and expected in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    refused = subprocess.run([sys.executable, "-m", "tuning.tools.apply", str(run_dir)], cwd=REPO, env=undeclared(env),
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and all(part in refused.stderr for part in REFUSED), refused.stderr
