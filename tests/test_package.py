"""The lab as a user installs and calls it: the wheel (configs and py.typed inside, runnable outside the
checkout), the `tunelab` command and its subcommands, `tunelab.tune`, and `run --help` against conf/."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
SUMMARISED = ("search", "sampler", "cost_model", "evaluator", "hardware", "scheduler", "tracking", "storage")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_tunelab_help_lists_every_subcommand():
    from tunelab.cli import COMMANDS

    done = subprocess.run([str(Path(sys.executable).with_name("tunelab")), "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    for name in COMMANDS:
        assert re.search(rf"^  {name}\s+\S", done.stdout, re.M), name


@pytest.mark.parametrize("name", ["compare", "export", "apply", "sync", "dataset", "pretrain", "value", "ui"])
def test_each_tool_answers_help_as_a_tunelab_subcommand(name, capsys):
    from tunelab.cli import main

    with pytest.raises(SystemExit) as stop:
        main([name, "--help"])
    assert stop.value.code == 0
    assert f"usage: tunelab {name}" in capsys.readouterr().out


def test_an_unknown_subcommand_is_refused_with_the_list(capsys):
    from tunelab.cli import main

    assert main(["tune"]) == 2
    assert "unknown command 'tune'" in capsys.readouterr().err


def test_run_help_names_every_option_of_every_group():
    """Hydra's list has every YAML under conf/; the summary above it names every option of the groups it
    describes (a method added to conf/search/ without a word here fails)."""
    done = subprocess.run([sys.executable, "run.py", "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary, listing = done.stdout.split("== Groups and their options")
    for group in sorted(d.name for d in CONF.iterdir() if d.is_dir() and d.name not in ("hydra", "__pycache__")):
        assert re.search(rf"^{group}: {', '.join(options(group))}$", listing, re.M), group
    entries = dict(re.findall(r"^  (\w+)\s+(.*(?:\n {15}.*)*)", summary, re.M))
    for group in SUMMARISED:
        missing = [o for o in options(group) if not re.search(rf"\b{o}\b", entries[group])]
        assert not missing, f"{group}: the summary in conf/hydra/help/tunelab.yaml does not name {missing}"


def test_tune_returns_the_outcome_of_a_job(tmp_path, monkeypatch):
    import tunelab

    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "outputs"))
    outcome = tunelab.tune(["hardware=synthetic", "model=gemm_64", "budget.trials=96", "budget.plan_size=32",
                            "tracking=none", f"output_dir={tmp_path / 'run'}"])
    [(task, best)] = outcome.best.items()
    assert task == "gemm_64" and best.config is not None and 0 < best.latency_us < 1e4
    assert outcome.folder == tmp_path / "run" and (outcome.folder / "records.jsonl").is_file()
    assert len(outcome.records["gemm_64"]) == 96 and len(outcome.records_frame()) == 96
    assert outcome.objective == pytest.approx(best.gflops) and outcome.run_id is None
    assert min(outcome.records_frame().latency_us.dropna()) == pytest.approx(best.latency_us, rel=0.5)


def test_a_tune_leaves_the_callers_logging_as_it_found_it(tmp_path, monkeypatch):
    """Notebook calls one after another: each job's run.log gets its own lines, not the next job's."""
    import logging

    import tunelab

    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "outputs"))
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    for name in ("a", "b"):
        tunelab.tune(["hardware=synthetic", "model=gemm_64", "budget.trials=8", "tracking=none",
                      f"output_dir={tmp_path / name}"])
        assert (list(root.handlers), root.level) == before
    logging.getLogger("tuning").warning("after both jobs")
    assert "after both jobs" not in (tmp_path / "a" / "run.log").read_text() + (tmp_path / "b" / "run.log").read_text()


def test_tune_refuses_bad_input_naming_the_key_before_any_work(tmp_path, monkeypatch):
    import tunelab
    from tuning.config import ConfigError

    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "outputs"))
    with pytest.raises(ConfigError, match="budget.trials"):
        tunelab.tune({"hardware": "synthetic", "model": "gemm_64", "budget.trials": -3, "tracking": "none",
                      "output_dir": str(tmp_path / "run")})
    assert not (tmp_path / "run").exists()
    with pytest.raises(TypeError, match="list of strings"):
        tunelab.tune("model=gemm_64")


def test_a_budget_of_one_round_warns_that_the_search_gets_no_feedback(tmp_path):
    done = subprocess.run([sys.executable, "run.py", "hardware=synthetic", "model=gemm_64", "budget.trials=40",
                           "tracking=none", f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "warning: budget.trials=40 is one round of budget.plan_size=64" in done.stderr
    assert "\r" not in done.stdout + done.stderr and "trial/s" not in done.stderr  # no progress-bar frames in a pipe


def test_the_wheel_carries_the_configs_and_runs_outside_the_checkout(tmp_path):
    """`pip wheel` of the checkout, unpacked with --target into a folder of its own (the dependencies
    are this venv's), runs a job from a folder that is not the checkout."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    source = tmp_path / "source"  # a copy: an in-tree build would leave build/ in the checkout
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "outputs", "multirun", "mlruns",
                                                                "build", "dist", "*.egg-info", "__pycache__",
                                                                "stores", "*.db"))
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(source), "-w", str(tmp_path / "dist")],
                   check=True, capture_output=True, timeout=300, cwd=tmp_path)
    [wheel] = (tmp_path / "dist").glob("tunelab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"tuning/conf/{p.relative_to(CONF)}" for p in CONF.rglob("*.yaml")}
    assert shipped <= names and len(shipped) > 50
    assert {"tuning/py.typed", "tunelab/py.typed", "hydra_plugins/tunelab_searchpath/__init__.py"} <= names
    priors = {f"tuning/cost_model/priors/{p.name}" for p in (REPO / "tuning/cost_model/priors").glob("*.[uj][bs][jo]*")}
    assert priors <= names and any(p.endswith(".ubj") for p in priors)  # the shipped first-round priors
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "tunelab = tunelab.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site), "TUNELAB_OUTPUTS": str(tmp_path / "outputs")}
    done = subprocess.run([sys.executable, "-c", "import tuning, tunelab.cli, sys; print(tuning.__file__); "
                           "sys.argv[0] = 'tunelab'; tunelab.cli.main(['run', 'hardware=synthetic', "
                           "'model=gemm_64', 'budget.trials=64', 'tracking=none'])"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(str(site)) and "[gemm_64] best" in done.stdout


def test_each_hardwares_default_prior_ships_reads_per_store_features_and_says_what_it_saw():
    """tuning.prior=auto names the hardware's default_prior: it must ship with the package, load as a
    booster of TVM's per-store rows, and its sidecar must say which kernels and hosts it learned from."""
    from tuning.cost_model import priors
    from tuning.cost_model.xgb_ms import PER_STORE_WIDTH
    from tuning.hardware.cpu import CPUHardware

    reference = CPUHardware.default_prior
    assert priors.packaged(reference) and reference[len(priors.PREFIX):] in priors.names()
    booster, about = priors.load(reference)
    assert booster.num_features() == PER_STORE_WIDTH and about["features"] == "per_store"
    assert about["tasks"] and all({"name", "key", "configs", "hardware"} <= set(t) for t in about["tasks"])
    assert set(about["hardware"]) == {t["hardware"] for t in about["tasks"]}
