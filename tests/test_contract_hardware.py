"""Contract of every hardware in conf/hardware/ and of the runner seam (tuning/hardware/runners/).

Every hardware YAML (and every one in TUNELAB_CONF_DIRS) composes, validates, and passes the shipped
suite (tuning.testing.hardware_contract): it describes itself, may be closed twice, gives a small task's
space and measures a couple of configs: one result per config, in order, handed on in order. The
real-TVM ones (their spaces come from TVM) are marked `tvm`. The suite can fail: a hardware that
returns its results last first fails it, run by pytest from another folder. The seam is proven with a
stand-in remote runner with two devices (tests/fake_runner.py) behind TVMHardware's own measuring path.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from hydra.utils import instantiate
from omegaconf import OmegaConf

from configs import group_yamls, load_option
from fake_runner import RemoteSynthetic, TwoDevices
from helpers import write_and_run
from tuning.config import ConfigError
from tuning.core.measure import MeasureSpec
from tuning.core.records import MeasureResult, Record, RecordLog
from tuning.core.task import gemm_task
from tuning.engine.loop import Components, RunInfo, tune_task
from tuning.engine.run_folder import load_config
from tuning.engine.validate import import_class as _import
from tuning.engine.validate import validate
from tuning.hardware.base import Hardware
from tuning.hardware.runners.base import Runner, Setup
from tuning.testing.hardware_contract import HardwareContract

REPO = Path(__file__).resolve().parents[1]
TASK = gemm_task("gemm_64", 64, 64, 64)  # the smallest model (conf/model/gemm_64.yaml)
SPEC = MeasureSpec(number=1, repeat=2, min_repeat_ms=0, cache_flush=False, timeout_s=10.0)


def measures_with_tvm(path: Path) -> bool:
    """Its spaces come from TVM's MetaSchedule (hardware=cpu, and replay over it)."""
    return _import(load_option(path)["_target_"]).schedules_programs


HARDWARE = [pytest.param(p, id=p.stem, marks=[pytest.mark.tvm] if measures_with_tvm(p) else [])
            for p in group_yamls("hardware")]


def needed_overrides(option: str, tmp_path: Path) -> list[str]:
    """What an option cannot run without (a replay needs its measurement store, a GPU its arch)."""
    if option == "cuda":  # no GPU here: its candidates are built (nvcc) and come back as error records
        return ["hardware.arch=sm_90"]
    return [f"hardware.store={tmp_path / 'store.sqlite'}", "hardware.create=true"] if option == "replay" else []


@pytest.fixture(params=HARDWARE)
def hardware_yaml(request):
    return request.param


class TestHardwareOption(HardwareContract):
    """The shipped suite, once per conf/hardware YAML (the test ids name the option), its job config
    composed with what the option cannot run without and validated first."""

    spec = SPEC

    @pytest.fixture(autouse=True)
    def _option(self, compose_cfg, tmp_path, hardware_yaml):
        cfg = compose_cfg(f"hardware={hardware_yaml.stem}", "model=gemm_64", "tracking=none",
                          *needed_overrides(hardware_yaml.stem, tmp_path))
        validate(cfg, dict(cfg.hydra.runtime.choices))
        self.cfg = cfg

    def make_hardware(self):
        return instantiate(self.cfg.hardware)

    def make_task(self):
        return TASK


BROKEN_SUITE = '''
from tuning.hardware.synthetic import SyntheticHardware
from tuning.testing.hardware_contract import HardwareContract


class Backwards(SyntheticHardware):
    """Measures the batch and returns its results last first."""

    def measure(self, task, configs, spec, on_result=None):
        return super().measure(task, configs, spec, on_result)[::-1]


class TestFine(HardwareContract):
    def make_hardware(self):
        return SyntheticHardware()


class TestBackwards(HardwareContract):
    batch = 6

    def make_hardware(self):
        return Backwards()
'''


def test_the_suite_fails_a_hardware_that_returns_results_out_of_order(tmp_path):
    """Run by pytest from another folder against the package: the synthetic hardware passes every test,
    the one that returns its results last first fails the test that asks."""
    run = write_and_run(tmp_path, "test_broken_hardware.py", BROKEN_SUITE)
    run.assert_failed_only_in("TestBackwards", "test_measures_a_batch_in_order_handing_each_on",
                              says="results not in the order of their configs")
    assert len(run.passed_in("TestFine")) == 2, run.output


# ---- the runner as a config group ----------------------------------------------------------------
@pytest.mark.parametrize("path", group_yamls("hardware/runner"), ids=lambda p: p.stem)
def test_every_runner_yaml_is_a_runner_that_starts_nothing(path):
    node = load_option(path)
    assert not _import(node["_target_"]).check_params(
        {k: v for k, v in OmegaConf.to_container(node).items() if not k.startswith("_")}, "hardware.runner")
    runner = instantiate(node)
    assert isinstance(runner, Runner) and runner.setup is None


def test_the_runner_is_chosen_and_configured_on_the_command_line(compose_cfg):
    cfg = compose_cfg("hardware/runner=local", "hardware.runner.device_index=1", "model=gemm_64", "tracking=none")
    validate(cfg)
    hardware = instantiate(cfg.hardware)
    hardware.runner.attach(Setup(target={"kind": "llvm"}, device=hardware.device))
    assert hardware.runner.devices == ["cpu:1"]


@pytest.mark.parametrize("override,key", [
    ("+hardware.runner.devise_index=1", "hardware.runner.devise_index"),
    ("hardware.runner.device_index=-1", "hardware.runner.device_index"),
    ("hardware.runner._target_=tuning.core.records.MeasureResult", "hardware.runner._target_"),
])
def test_a_bad_runner_node_is_one_error_naming_its_key(compose_cfg, override, key):
    with pytest.raises(ConfigError) as error:
        validate(compose_cfg("model=gemm_64", "tracking=none", override))
    problems = str(error.value).splitlines()[1:]
    assert len(problems) == 1 and problems[0].strip().startswith(f"{key}: "), problems


def test_the_replay_backend_has_its_runner_checked_too(compose_cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"hardware\.backend\.runner\.device_index: "):
        validate(compose_cfg("model=gemm_64", "tracking=none", *needed_overrides("replay", tmp_path),
                             "hardware=replay", "hardware.backend.runner.device_index=-1"))


def saved_config(cfg, folder: Path) -> Path:
    """The job's config as a run folder keeps it (config.yaml: resolved, without Hydra's node)."""
    cfg = OmegaConf.create(OmegaConf.to_container(cfg))
    del cfg["hydra"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return folder / "config.yaml"


def test_a_saved_config_naming_the_runner_loads_and_one_without_it_gets_this_hosts(compose_cfg, tmp_path):
    cfg = compose_cfg("model=gemm_64", "tracking=none", "hardware.mcpu=x86-64")
    path = saved_config(cfg, tmp_path / "new")
    assert load_config(path, "resume").hardware.runner._target_ == "tuning.hardware.runners.local.LocalRunner"
    old = yaml.safe_load(path.read_text())
    del old["hardware"]["runner"]  # a folder saved before runners were a config group
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.yaml").write_text(yaml.safe_dump(old))
    old = load_config(tmp_path / "old" / "config.yaml", "resume")
    validate(old)
    hardware = instantiate(old.hardware)
    assert isinstance(hardware.runner, Runner) and hardware.attached().devices == ["cpu:0"]


# ---- the seam: a remote runner with two devices ---------------------------------------------------
def batch(n: int, seed: int = 0) -> list[tuple]:
    space = RemoteSynthetic().space(TASK)
    rng = np.random.default_rng(seed)
    configs: dict = {}
    while len(configs) < n:
        configs[space.canonical(space.sample(rng))] = None
    return list(configs)


def overlapping(busy) -> bool:
    first = [(s, e) for d, s, e in busy if d.endswith(":0")]
    second = [(s, e) for d, s, e in busy if d.endswith(":1")]
    return any(s0 < e1 and s1 < e0 for s0, e0 in first for s1, e1 in second)


def test_a_batch_is_timed_in_parallel_over_both_devices():
    runner = TwoDevices()
    configs, handed = batch(8), []
    results = RemoteSynthetic(runner).measure(TASK, configs, SPEC, on_result=lambda i, r: handed.append(i))
    assert [r.config for r in results] == configs and handed == list(range(8))
    assert all(r.ok for r in results if r.error != "invalid")
    assert {r.device for r in results} == {"remote:0", "remote:1"}
    assert overlapping(runner.busy), runner.busy
    assert runner.prepared == [TASK.key]


def test_a_device_lost_mid_batch_costs_its_config_and_the_rest_is_measured():
    runner = TwoDevices(lose="remote:1", lose_after=1)
    configs, handed = batch(8), []
    results = RemoteSynthetic(runner).measure(TASK, configs, SPEC, on_result=lambda i, r: handed.append(i))
    lost = [r for r in results if r.error == "device_lost"]
    assert len(lost) == 1 and lost[0].device == "remote:1" and "connection reset" in lost[0].message
    assert [r.config for r in results] == configs and handed == list(range(8))
    assert [r.device for r in results if r.error != "device_lost"].count("remote:1") == 1  # before it was lost
    assert len(runner.busy) == 7  # every other config was timed, on the device left


def test_with_every_device_lost_the_rest_of_the_batch_is_device_lost():
    class OneDevice(TwoDevices):
        @property
        def devices(self):
            return [d for d in ("remote:0",) if d not in self.lost]

    results = RemoteSynthetic(OneDevice(lose="remote:0", lose_after=2)).measure(TASK, batch(5), SPEC)
    assert [r.error == "device_lost" for r in results] == [False, False, True, True, True]


def component(group: str, name: str):
    return instantiate(OmegaConf.create({"seed": 0, "node": load_option(REPO / "conf" / group / f"{name}.yaml")}).node)


def loop(tmp_path: Path, hardware: Hardware, trials: int) -> list[dict]:
    parts = Components(component("search", "random"), component("sampler", "greedy"), component("evaluator", "fixed"),
                       component("cost_model", "none"), hardware, component("tracking", "none"))
    tune_task(TASK, parts, RunInfo(seed=0, out_dir=tmp_path, method="test", trials=trials, plan_size=8))
    return [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]


def test_the_loop_records_which_device_timed_each_config_and_goes_on_after_a_loss(tmp_path):
    rows = loop(tmp_path, RemoteSynthetic(TwoDevices(lose="remote:1", lose_after=2, pause_s=0.005)), trials=24)
    assert len(rows) == 24 and [r["index"] for r in rows] == list(range(24))
    assert {r["result"]["device"] for r in rows} == {"remote:0", "remote:1"}
    assert [r["result"]["error"] for r in rows].count("device_lost") == 1
    assert RecordLog(tmp_path / "records.jsonl").load()[0].result.device in ("remote:0", "remote:1")


def test_a_result_without_a_device_is_written_as_before():
    record = Record("t", "k", [0], {}, MeasureResult(costs=[1e-3]), 0, "m", 0, 0, 0.0)
    assert '"device"' not in record.to_json()
    record.result.device = "cuda:1"
    assert Record.from_json(record.to_json()).result.device == "cuda:1"


def test_only_the_local_runner_names_itself_or_a_device_index():
    """TVM's own MetaSchedule LocalRunner (ms.runner.LocalRunner, tvm_peers.py) is not ours."""
    pattern = re.compile(r"tvm\.cpu\(0\)|tvm\.device\([^)]*, 0\)|(?<!ms\.runner\.)LocalRunner")
    local = REPO / "tuning" / "hardware" / "runners" / "local.py"
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}" for path in sorted((REPO / "tuning").rglob("*.py"))
             if path != local for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found
