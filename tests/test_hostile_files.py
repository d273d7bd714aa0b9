"""Hostile shared files: nothing from a shared run folder or registry entry runs code or writes outside it.

A run folder and a registry entry are delivered by whoever shares them. The script `python -m
tuning.tools.export` writes is run isolated from its folder (a numpy.py planted there is not imported); a
registered booster is read from its bytes alone (the `code:` and `model_class` of its MLmodel are not
imported), and one that is not a booster of the features' width is refused before any work; a value
function whose weights are not plain tensors is refused without advice to load it unsafely; and no file
is written through a symlink in a run folder (tuning/engine/run_folder.py `inside`).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import xgboost as xgb
import yaml
from omegaconf import OmegaConf

from tuning.config import ConfigError
from tuning.core.records import MeasureResult, Record, RecordLog
from tuning.engine.run_folder import on_run_folder

CANARY = "open({marker!r}, 'w').write('ran')\n"


def plant(folder: Path, module: str, marker: Path) -> None:
    (folder / module).write_text(CANARY.format(marker=str(marker)))


# ---- the exported script -------------------------------------------------------------------------
def test_the_exported_script_runs_isolated_from_the_folder_it_is_in(tmp_path):
    from tuning.tools.export import _run_snippet

    export = tmp_path / "run" / "export"
    export.mkdir(parents=True)
    markers = {name: tmp_path / f"ran-{name}" for name in ("numpy.py", "tvm.py", "sitecustomize.py",
                                                          "usercustomize.py")}
    for name, marker in markers.items():
        plant(export, name, marker)
    (export / "kernel.txt").write_text("beside the script")
    script = export / "run_gemm.py"
    script.write_text("import importlib.util\nfrom pathlib import Path\n\nimport numpy as np\n\n"
                      "print(Path(__file__).with_name('kernel.txt').read_text(), np.zeros(2).sum())\n"
                      "print('tvm from', importlib.util.find_spec('tvm').origin)\n")
    output, ok = _run_snippet(script, [export / "kernel.txt"])
    assert ok, output
    assert "beside the script 0.0" in output  # the script still finds its own files by __file__
    assert str(export) not in output.split("tvm from")[-1]
    assert not [name for name, marker in markers.items() if marker.exists()]


# ---- the registry: a booster is read from its bytes alone ------------------------------------------
@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """One MLflow registry holding: `hostile` (a booster of 164 per-store features whose MLmodel names
    a code folder and a model_class of its own), `narrow` (4 features tagged per_store), `garbage`
    (its model.ubj is not a booster)."""
    from tuning.tracking.registry import register_booster

    folder = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    boosters = {"hostile": small_booster(164), "narrow": small_booster(4)}
    for name in ("hostile", "narrow", "garbage"):
        register_booster(boosters.get(name, boosters["hostile"]), name, uri, "pretrain", {}, {},
                         {"tunelab.features": "per_store"})
    make_hostile(model_dir(uri, "hostile"), folder / "ran-canary")
    (model_dir(uri, "garbage") / "model.ubj").write_bytes(b"#!/bin/sh\necho not a booster\n")
    return {"uri": uri, "boosters": boosters, "folder": folder}


def small_booster(width: int) -> xgb.Booster:
    rng = np.random.default_rng(width)
    X = rng.uniform(size=(40, width)).astype(np.float32)
    return xgb.train({"max_depth": 2, "verbosity": 0, "base_score": 0.0}, xgb.DMatrix(X, label=X[:, 0]), 3)


def model_dir(uri: str, name: str) -> Path:
    from mlflow import MlflowClient
    from mlflow.utils.file_utils import local_file_uri_to_path

    location = MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version_download_uri(name, "1")
    return Path(local_file_uri_to_path(location))


def make_hostile(model: Path, marker: Path) -> None:
    """MLflow's xgboost loader puts `code/` on sys.path and instantiates `model_class`."""
    (model / "code").mkdir()
    (model / "code" / "tunelab_canary.py").write_text(CANARY.format(marker=str(marker))
                                                      + "import xgboost\n\nclass Booster(xgboost.Booster):\n    pass\n")
    mlmodel = yaml.safe_load((model / "MLmodel").read_text())
    mlmodel["flavors"]["xgboost"].update({"code": "code", "model_class": "tunelab_canary.Booster"})
    (model / "MLmodel").write_text(yaml.safe_dump(mlmodel))


def test_a_registered_booster_runs_nothing_its_entry_names(registry):
    from tuning.tracking.registry import load_booster

    try:
        booster, tags = load_booster("models:/hostile/1", registry["uri"])
    finally:
        sys.modules.pop("tunelab_canary", None)
    assert not (registry["folder"] / "ran-canary").exists()
    assert type(booster) is xgb.Booster and tags["tunelab.features"] == "per_store"
    X = np.random.default_rng(1).uniform(size=(5, 164)).astype(np.float32)
    assert np.allclose(booster.inplace_predict(X), registry["boosters"]["hostile"].inplace_predict(X))


@pytest.mark.parametrize("name, message", [
    ("garbage", "garbage/1: its model.ubj is not a readable xgboost booster"),
    ("narrow", "narrow/1 reads rows of 4 features, not TVM's 164 per-store features"),
])
def test_a_pretrained_entry_that_is_no_booster_of_the_right_width_is_refused_before_work(registry, name, message):
    from tuning.cost_model.xgb_ms import MetaScheduleXGBoost

    params = {"features": "per_store", "pretrained": f"{name}/1", "registry": registry["uri"]}
    [problem] = MetaScheduleXGBoost.check(params, "cost_model")
    assert problem.startswith("cost_model.pretrained: ") and message in problem
    assert MetaScheduleXGBoost.check({**params, "pretrained": "hostile/1"}, "cost_model") == []
    assert not (registry["folder"] / "ran-canary").exists()


def test_a_pretrained_booster_of_another_width_is_refused_on_first_use(registry):
    from tuning.cost_model.xgb_ms import MetaScheduleXGBoost

    model = MetaScheduleXGBoost(features="knobs", pretrained="narrow/1", registry=registry["uri"])
    with pytest.raises(ConfigError, match=r"^cost_model.pretrained: narrow/1 reads rows of 4 features; "
                                          r"this task's knobs rows have 6$"):
        model.predict(np.ones((3, 6), dtype=np.float32))


class Canary:
    """A pickle that would run code when unpickled by a full (not weights-only) load."""

    marker = ""

    def __reduce__(self):
        return (exec, (CANARY.format(marker=self.marker),))


def test_value_weights_that_are_not_plain_tensors_are_refused_without_unsafe_advice(registry, tmp_path):
    import torch
    from mlflow import MlflowClient
    from mlflow.utils.file_utils import local_file_uri_to_path

    from tuning.search.value import ValueSearch
    from tuning.tracking.registry import RegistryError, register
    from tuning.value.net import ValueNet, load_value, log_value, shape_tag

    uri, net = registry["uri"], ValueNet(hidden=4, layers=1)
    reference = register(lambda mlflow: log_value(mlflow, net, "v-bad"), "v-bad", uri, "value", {}, {}, shape_tag(net))
    run_id = MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version("v-bad", "1").run_id
    artifacts = MlflowClient(tracking_uri=uri, registry_uri=uri).get_run(run_id).info.artifact_uri
    weights = Path(local_file_uri_to_path(artifacts)) / "state_dict" / "state_dict.pth"
    Canary.marker = str(tmp_path / "ran-canary")
    torch.save({"weights": Canary()}, weights)
    with pytest.raises(RegistryError) as refused:
        load_value(reference, uri)
    message = str(refused.value)
    assert message.startswith(f"{reference}: its weights (state_dict/state_dict.pth) are not readable as plain "
                              "tensors (UnpicklingError)")
    assert "weights_only=False" not in message and "Traceback" not in message
    [problem] = ValueSearch.check({"model": reference, "registry": uri, "greedy": True, "beam": 1}, "search")
    assert problem.startswith(f"search.model: {reference}: its weights")
    assert not (tmp_path / "ran-canary").exists()


# ---- writes into a run folder never follow a symlink out of it ---------------------------------------
def test_inside_refuses_links_and_paths_that_leave_the_folder(tmp_path):
    from tuning.engine.run_folder import inside, write_inside

    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    outside.mkdir()
    (outside / "bashrc").write_text("mine")
    (run / "best_schedules").mkdir()
    (run / "best_schedules" / "gemm.py").symlink_to(outside / "bashrc")
    (run / "export").symlink_to(outside)
    os.link(outside / "bashrc", run / "e2e.json")
    (run / "summary.txt").mkdir()
    (run / "tasks.json").write_text("[]")
    for relative, message in [("best_schedules/gemm.py", "best_schedules/gemm.py is a symlink"),
                              ("export/run_gemm.py", "export is a symlink"), ("summary.txt", "summary.txt is not a file"),
                              ("tasks.json/x", "tasks.json is not a folder"),
                              ("../x", "is not a path inside"), ("/etc/x", "is not a path inside")]:
        with pytest.raises(ConfigError, match=f"^run: .*{message}"):
            write_inside(run, relative, "overwritten")
    assert write_inside(run, "e2e.json", "new").read_text() == "new"  # a hard link is replaced, not written through
    assert (outside / "bashrc").read_text() == "mine" and sorted(os.listdir(outside)) == ["bashrc"]
    assert inside(run, "database/database_workload.json") == run / "database" / "database_workload.json"
    assert (run / "database").is_dir()  # folders on the way are made
    assert write_inside(run, "status", "FINISHED\n").read_text() == "FINISHED\n"
    assert sorted(os.listdir(run)) == ["best_schedules", "database", "e2e.json", "export", "status", "summary.txt",
                                       "tasks.json"]


@pytest.mark.parametrize("plant, message", [
    (lambda run, victim: (run / "summary.txt").symlink_to(victim), "summary.txt is a symlink"),
    (lambda run, victim: (run / "state").symlink_to(victim.parent), "state is a symlink"),
    (lambda run, victim: os.mkfifo(run / "mlflow_run_id"), "mlflow_run_id is neither a file nor a folder"),
    (lambda run, victim: (run / "records.jsonl").unlink() or os.link(victim, run / "records.jsonl"),
     "records.jsonl is a hard link"),
])
def test_a_folder_with_a_link_anywhere_is_refused_before_a_command_reads_or_writes_it(tmp_path, compose_cfg,
                                                                                      plant, message):
    from tuning.engine.run_folder import claim, on_run_folder, release

    run, victim = saved_run(tmp_path, compose_cfg), tmp_path / "victim"
    victim.write_text("secret")
    plant(run, victim)
    with pytest.raises(ConfigError, match=f"^resume: .*{message}"):
        claim(run, resuming=True, key="resume")
    release(run)
    with pytest.raises(SystemExit):
        on_run_folder(run, lambda folder: pytest.fail("the command ran"))
    assert victim.read_text() == "secret"


def test_a_new_run_into_a_folder_with_a_planted_link_is_refused(tmp_path):
    from tuning.engine.run_folder import claim

    run, victim = tmp_path / "run", tmp_path / "victim"
    run.mkdir()
    victim.write_text("secret")
    (run / "summary.txt").symlink_to(victim)
    with pytest.raises(ConfigError, match="^output_dir: .*summary.txt is a symlink"):
        claim(run, resuming=False)
    assert victim.read_text() == "secret"


def test_a_copy_made_with_hard_links_gets_a_lock_of_its_own(tmp_path):
    from tuning.engine.run_folder import LOCK_FILE, claim, release

    original, copy = tmp_path / "run", tmp_path / "copy"
    original.mkdir()
    copy.mkdir()
    (original / LOCK_FILE).write_text("1")
    os.link(original / LOCK_FILE, copy / LOCK_FILE)
    claim(copy, resuming=True)
    release(copy)
    assert (original / LOCK_FILE).read_text() == "1"


def saved_run(tmp_path, compose_cfg, *overrides) -> Path:
    """A run folder as run.py leaves it: config.yaml and one valid record of its task."""
    from tuning.core.task import build_tasks

    composed = compose_cfg("tracking=none", *overrides)
    OmegaConf.set_struct(composed, False)
    composed.pop("hydra")  # run.py saves the job's config, resolved
    cfg = OmegaConf.to_container(composed, resolve=True)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    [task] = build_tasks(cfg["model"])
    RecordLog(run / "records.jsonl").append(Record(task.name, task.key, [0] * 4, {}, MeasureResult(costs=[1e-3]),
                                                   0, "test", 0, 0, 1000.0))
    return run


@pytest.mark.parametrize("command, planted", [("apply", "best_schedules/gemm_64.py"), ("export", "export")])
def test_apply_and_export_refuse_a_symlink_in_the_run_folder_before_any_work(tmp_path, compose_cfg, capsys,
                                                                              command, planted):
    from tuning.tools.apply import apply_run
    from tuning.tools.export import export_run

    run = saved_run(tmp_path, compose_cfg, "model=gemm_64", "hardware=cpu")
    target = tmp_path / "bashrc"
    target.write_text("mine")
    link = run / planted
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(target if planted.endswith(".py") else tmp_path)
    with pytest.raises(SystemExit) as stopped:
        on_run_folder(run, apply_run if command == "apply" else export_run)
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"tunelab: run: {link} is a symlink") and "Traceback" not in error
    assert target.read_text() == "mine" and not list(tmp_path.glob("gemm_64*"))


def test_the_lock_file_of_a_run_folder_is_not_written_through_a_link(tmp_path, capsys):
    run, target = tmp_path / "run", tmp_path / "bashrc"
    run.mkdir()
    (run / "config.yaml").write_text("model: {}\n")
    target.write_text("mine")
    (run / ".tunelab.lock").symlink_to(target)
    with pytest.raises(SystemExit):
        on_run_folder(run, lambda run_dir: pytest.fail("worked on a folder it could not claim"))
    assert capsys.readouterr().err.startswith(f"tunelab: run: {run / '.tunelab.lock'} is a symlink")
    assert target.read_text() == "mine"


def test_end_to_end_files_are_checked_before_the_model_is_compiled(tmp_path):
    from tuning.engine.spec import E2ESpec, ModelSpec
    from tuning.engine.whole_model import evaluate_end_to_end
    from tuning.tracking.base import NoTracker

    class Hardware:
        def evaluate_model(self, *args):
            pytest.fail("compiled a model whose e2e.json is a link")

    run, target = tmp_path / "run", tmp_path / "bashrc"
    run.mkdir()
    target.write_text("mine")
    (run / "e2e.json").symlink_to(target)
    e2e = E2ESpec(enabled=True, runs=1, min_runs=1, max_seconds=1.0, timeout_s=1.0, fresh_input=True,
                  in_model_kernels=0, in_model_candidates=1, in_model_processes=1, in_model_rounds=1, in_model_runs=1)
    with pytest.raises(ConfigError, match=r"^run: .*e2e.json is a symlink"):
        evaluate_end_to_end(e2e, ModelSpec.of(OmegaConf.create({"kind": "network"})), 0, Hardware(), NoTracker(), run)
    assert target.read_text() == "mine"


@pytest.mark.tvm
def test_tvm_exports_refuse_a_symlink_in_the_run_folder(tmp_path):
    from tuning.core.task import gemm_task
    from tuning.hardware.cpu import CPUHardware

    task, hardware = gemm_task("g", 32, 32, 32), CPUHardware(num_threads=1)
    run, target = tmp_path / "run", tmp_path / "bashrc"
    (run / "best_schedules").mkdir(parents=True)
    target.write_text("mine")
    (run / "best_schedules" / "g.py").symlink_to(target)
    (run / "database").symlink_to(tmp_path)
    config = hardware.space(task).sample(np.random.default_rng(0))
    with pytest.raises(ConfigError, match="best_schedules/g.py is a symlink"):
        hardware.export(task, config, run / "best_schedules")
    with pytest.raises(ConfigError, match="database is a symlink"):
        hardware.export_database([(task, [])], run / "database")
    assert target.read_text() == "mine" and not list(tmp_path.glob("database_*"))
    hardware.close()
