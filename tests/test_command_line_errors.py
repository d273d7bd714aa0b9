"""What `tunelab run` says of bad input: the lab's own line before Hydra's advice, the nearest known
name ("did you mean"), exit status 2 for every input error, and what this host lacks (no GPU, no
ONNX file) before the keys that could not help (tuning/config/overrides.py, validate's runs_here)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuning.config import ConfigError
from tuning.engine.validate import validate

REPO = Path(__file__).resolve().parents[1]


def run_in_process(capsys, *argv: str) -> tuple[int, str]:
    """`tunelab run ARGV` through its entry point: (exit status, stderr); input errors stop before Hydra."""
    from tunelab.run import main

    with pytest.raises(SystemExit) as stop:
        main(list(argv), prog="tunelab run")
    return stop.value.code, capsys.readouterr().err


def run_cli(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp_path / "outputs")}
    return subprocess.run([sys.executable, "-m", "tunelab", "run", *overrides, "tracking=none",
                           f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


# argv -> a line the message holds
TYPOS = {
    "key typo": (["budget.trails=10"],
                 "budget.trails: not a key of budget; did you mean budget.trials=10?"),
    "top-level typo": (["sead=3"], "sead: not a top-level key; did you mean seed=3?"),
    "component key typo": (["search=sa", "search.n_iters=100"],
                           "search.n_iters: not a key of search; did you mean search.n_iter=100?"),
    "option typo": (["search=ppo2"], "search: no option 'ppo2'; did you mean search=ppo?"),
    "nested group typo": (["hardware/runner=rcp"], "hardware/runner: no option 'rcp'; did you mean hardware/runner=rpc?"),
    "option typo in a sweep": (["-m", "search=sa,ppo2"], "search: no option 'ppo2'; did you mean search=ppo?"),
    "key typo in a sweep": (["-m", "seed=0,1", "budget.trails=5,6"],
                            "budget.trails: not a key of budget; did you mean budget.trials=5,6?"),
    "wrong type": (["budget.trials=nan"], "budget.trials: Value 'nan' of type 'float' could not be converted"),
}


@pytest.mark.parametrize("argv,says", TYPOS.values(), ids=TYPOS.keys())
def test_a_typo_gets_the_labs_line_and_the_nearest_name_with_status_2(capsys, argv, says):
    code, err = run_in_process(capsys, *argv)
    assert code == 2, err
    assert says in err
    assert "To append to your config use" not in err and "Available options" not in err


def test_every_refused_override_is_named_at_once(capsys):
    code, err = run_in_process(capsys, "budget.trails=10", "search=ppo2", "seed=x")
    assert code == 2
    assert [line.split(":")[0].strip() for line in err.splitlines()[1:]] == ["search", "budget.trails", "seed"]


def test_a_valid_command_line_passes_the_check():
    from tuning.config.overrides import command_line_problems

    assert command_line_problems(["model=gemm_64", "search=sa", "budget.trials=8",
                                  "+experiment=chameleon_ablation_reduced"]) == []
    assert command_line_problems(["-m", "search=random,sa", "seed=0,1", "budget.trials=interval(1,5)"]) == []
    assert command_line_problems(["--help"]) == []  # not a job: Hydra's help


def test_the_python_api_says_a_typo_as_the_command_does(tmp_path, monkeypatch):
    import tunelab

    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "outputs"))
    with pytest.raises(ConfigError, match=r"budget\.trails: not a key of budget; did you mean budget\.trials=3\?"):
        tunelab.tune(["hardware=synthetic", "model=gemm_64", "budget.trails=3", f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"search: no option 'ppo2'; did you mean search=ppo\?"):
        tunelab.compose(["search=ppo2"])
    assert not (tmp_path / "run").exists()


def test_a_plus_typo_gets_the_nearest_key_too(compose_cfg):
    with pytest.raises(ConfigError, match=r"budget\.trails: not a key of budget; did you mean budget\.trials\?"):
        validate(compose_cfg("+budget.trails=100"))


def test_a_component_typo_added_with_plus_gets_the_nearest_hyperparameter(compose_cfg):
    with pytest.raises(ConfigError, match=r"search\.n_iters: not a hyperparameter of .*; did you mean search\.n_iter\?"):
        validate(compose_cfg("search=sa", "+search.n_iters=100"))


def test_typo_through_the_command_exits_2_before_hydras_advice(tmp_path):
    done = run_cli(tmp_path, "model=gemm_64", "hardware=synthetic", "budget.trails=10")
    assert done.returncode == 2, done.stderr
    assert "did you mean budget.trials=10?" in done.stderr
    assert "+budget.trails" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "outputs").exists()


# ---- what this host lacks, first ---------------------------------------------------------------
@pytest.fixture
def no_gpu_here(monkeypatch):
    """This host as one without a CUDA device, whatever it has (nvcc present: its line is not the point)."""
    import tuning.hardware.cuda_compile as cuda_compile
    import tuning.hardware.tvm_device as tvm_device

    monkeypatch.setattr(tvm_device, "device_name", lambda device: None)
    monkeypatch.setattr(cuda_compile, "nvcc_path", lambda: "/usr/local/cuda/bin/nvcc")


def test_no_gpu_is_said_before_the_missing_arch(compose_cfg, no_gpu_here):
    with pytest.raises(ConfigError) as refused:
        validate(compose_cfg("hardware=cuda", "model=gemm_64", "tracking=none"), runs_here=True)
    lines = str(refused.value).splitlines()[1:]
    assert lines[0].strip().startswith("hardware.runner.device_index: this host has no cuda:0"), lines
    assert lines[1].strip().startswith("hardware.arch:"), lines


def test_a_tool_reading_a_cuda_run_is_not_asked_for_a_gpu(compose_cfg, no_gpu_here):
    """sync, import and the offline pack read cuda configs on hosts without a GPU."""
    validate(compose_cfg("hardware=cuda", "model=gemm_64", "tracking=none", "hardware.arch=sm_90"))


def test_a_gpu_elsewhere_is_not_missing_here(compose_cfg, no_gpu_here):
    cfg = compose_cfg("hardware=cuda", "hardware/runner=rpc", "model=gemm_64", "tracking=none", "hardware.arch=sm_90")
    validate(cfg, runs_here=True)


def test_no_gpu_first_through_the_command(tmp_path):
    from tuning.hardware.tvm_device import device_name

    if device_name("cuda:0") is not None:
        pytest.skip("this host has a GPU")
    done = run_cli(tmp_path, "hardware=cuda", "model=gemm_64")
    assert done.returncode == 2, done.stderr
    first = done.stderr.splitlines()[1].strip()
    assert first.startswith("hardware.runner.device_index: this host has no cuda:0"), done.stderr


def test_a_missing_onnx_file_is_said_before_its_missing_shape(tmp_path):
    missing = tmp_path / "net.onnx"
    done = run_cli(tmp_path, "model=onnx", f"model.path={missing}")
    assert done.returncode == 2, done.stderr
    lines = [line.strip() for line in done.stderr.splitlines()[1:]]
    assert lines[0] == f"model.path: no such file {str(missing)!r}", done.stderr
    assert lines[1].startswith("model.input_shape: required"), done.stderr


def test_usage_shows_what_a_typo_prints(capsys):
    """docs/usage.md's typo transcript is what the lab prints ("..." ends a line cut short)."""
    import re
    import shlex

    text = (REPO / "docs" / "usage.md").read_text()
    block = re.search(r"^    \$ (tunelab run [^\n]*trails[^\n]*)\n((?:    [^$\n][^\n]*\n)+)", text, re.M)
    command, shown = block.group(1), [line[4:].rstrip() for line in block.group(2).splitlines()]
    code, err = run_in_process(capsys, *shlex.split(command)[2:])
    printed = err.splitlines()
    assert code == 2
    for line in shown:
        assert any(p.startswith(line[:-4]) if line.endswith("...)") else p == line for p in printed), (line, printed)
