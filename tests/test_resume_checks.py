"""A resumed run folder is checked before any work (tuning/engine/resume.py check_records, check_budget,
check_states): a budget below its records, a lost or damaged search state, a duplicated records line
are refused naming the key or file, or, for a lost state, continued with `reset_state=true`. Also:
`tuning.tools.sync` into another store is idempotent, and Ctrl-C during a whole model's import is acted on.

Runs are made in process (tuning.engine.run.main) on the synthetic hardware with tracking off.
"""
from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
import yaml

from configs import as_job
from tuning.engine import run as tunelab_run

NEW = ("hardware=synthetic", "model=gemm_64", "tracking=none", "search=random", "cost_model=none",
       "budget.plan_size=8")


def job(compose_cfg, monkeypatch, *overrides: str):
    """The config run.py's @hydra.main would hand to tuning.engine.run.main, with its Hydra context."""
    return as_job(compose_cfg(*overrides), monkeypatch)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished run: 32 records of gemm_64 in rounds 0-3, its state saved after round 3 (made as the
    compose_cfg fixture's jobs are, for the whole module)."""
    from hydra.core.hydra_config import HydraConfig

    from configs import compose_job
    from tuning.config import register

    tmp = tmp_path_factory.mktemp("finished")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp / "outputs"))
        register()
        tunelab_run.main(job(lambda *overrides: compose_job(tmp / "run", *overrides), monkeypatch, *NEW,
                             "budget.trials=32"))
        HydraConfig.instance().cfg = None
    return tmp / "run"


@pytest.fixture
def run_job(compose_cfg, monkeypatch, capsys):
    """run_job(*overrides, code=0) -> stderr of an in-process job that must end with `code`."""
    def _run(*overrides: str, code: int = 0) -> str:
        cfg = job(compose_cfg, monkeypatch, *overrides)
        if code == 0:
            tunelab_run.main(cfg)
        else:
            with pytest.raises(SystemExit) as exit_:
                tunelab_run.main(cfg)
            assert exit_.value.code == code
        err = capsys.readouterr().err
        assert "Traceback" not in err
        return err

    return _run


@pytest.fixture
def four_rounds(finished_run, tmp_path) -> Path:
    """A copy of `finished_run` for one test to damage."""
    return Path(shutil.copytree(finished_run, tmp_path / "run"))


def lines(run_dir: Path) -> list[str]:
    return (run_dir / "records.jsonl").read_text().splitlines(keepends=True)


def state_file(run_dir: Path) -> Path:
    [path] = (run_dir / "state").glob("*.json")
    return path


def untouched(run_dir: Path) -> dict:
    """What a refused resume must leave as it was: every file of the folder but its lock."""
    return {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file() and path.name != ".tunelab.lock"}


# ---- the budget --------------------------------------------------------------------------------
def test_a_budget_below_the_records_is_refused(run_job, four_rounds):
    before = untouched(four_rounds)
    err = run_job(f"resume={four_rounds}", "budget.trials=16", code=2)
    assert "tunelab: budget.trials: 16" in err and "already holds 32 measurements" in err
    assert untouched(four_rounds) == before


def test_a_budget_equal_to_the_records_resumes(run_job, four_rounds):
    run_job(f"resume={four_rounds}", "budget.trials=32")  # guards what was right: nothing to add
    assert len(lines(four_rounds)) == 32


# ---- the saved search state --------------------------------------------------------------------
def test_a_lost_state_past_the_first_round_is_refused(run_job, four_rounds):
    path = state_file(four_rounds)
    path.unlink()
    before = untouched(four_rounds)
    err = run_job(f"resume={four_rounds}", "budget.trials=48", code=2)
    assert f"tunelab: resume: {path} is missing" in err and "round 3 of gemm_64" in err
    assert "reset_state=true" in err
    assert untouched(four_rounds) == before


@pytest.mark.parametrize("text,why", [("{not json", "JSONDecodeError"),
                                      ("[]", "expected a JSON object"),
                                      ('{"round": 4, "rng": {"state": 1}, "search": {}}', "Error"),
                                      ('{"round": "4", "rng": {}, "search": {}}', "round: expected an int")])
def test_a_corrupt_state_is_refused_naming_it(run_job, four_rounds, text, why):
    path = state_file(four_rounds)
    path.write_text(text)
    before = untouched(four_rounds)
    err = run_job(f"resume={four_rounds}", "budget.trials=48", code=2)
    assert f"tunelab: resume: {path} is not a tunelab search state" in err and why in err
    assert untouched(four_rounds) == before


def test_a_state_older_than_the_records_is_refused(run_job, four_rounds):
    path = state_file(four_rounds)
    path.write_text(json.dumps({**json.loads(path.read_text()), "round": 1}))
    err = run_job(f"resume={four_rounds}", "budget.trials=48", code=2)
    assert f"{path} is older than the records" in err and "round 3 of gemm_64" in err


def test_a_run_stopped_in_its_first_round_resumes_without_state(run_job, tmp_path):
    """Killed before its first round ended: records of round 0 and no state are a legitimate folder
    (guards what was right)."""
    run_dir = tmp_path / "run"
    run_job(*NEW, "budget.trials=8")
    (run_dir / "records.jsonl").write_text("".join(lines(run_dir)[:5]))
    state_file(run_dir).unlink()
    run_job(f"resume={run_dir}", "budget.trials=16")
    assert len(lines(run_dir)) == 16


def test_reset_state_continues_a_folder_whose_state_is_lost(run_job, four_rounds):
    state_file(four_rounds).unlink()
    err = run_job(f"resume={four_rounds}", "budget.trials=48", "reset_state=true")
    assert "tunelab: reset_state:" in err and "continues at round 4" in err
    rows = [json.loads(line) for line in lines(four_rounds)]
    assert len(rows) == 48 and {r["round"] for r in rows[32:]} >= {4}
    assert len({tuple(r["config"]) for r in rows}) == 48
    # the switch is this command's, not the run's: the next resume does not reset again
    assert "tunelab: reset_state:" not in run_job(f"resume={four_rounds}", "budget.trials=56")
    assert yaml.safe_load((four_rounds / "config.yaml").read_text())["reset_state"] is False


def test_reset_state_on_a_new_run_is_refused(run_job, tmp_path):
    err = run_job(*NEW, "budget.trials=8", "reset_state=true", code=2)
    assert "tunelab: reset_state: only a resumed run" in err
    assert not (tmp_path / "run" / "records.jsonl").exists()


def test_a_resume_its_saved_config_fails_leaves_its_folder_free(run_job, four_rounds):
    """Refused after its folder was claimed: a process that goes on (tunelab.tune in a notebook)
    lets the folder go, so the next resume of it is not refused as a second writer."""
    from tuning.engine.run_folder import LOCK_FILE, take_lock

    saved = yaml.safe_load((four_rounds / "config.yaml").read_text())
    saved["hardware"]["noise"] = 5.0
    (four_rounds / "config.yaml").write_text(yaml.safe_dump(saved))
    assert "hardware.noise" in run_job(f"resume={four_rounds}", "budget.trials=48", code=2)
    handle, holder = take_lock(four_rounds / LOCK_FILE)
    assert holder is None
    handle.close()


# ---- the records ---------------------------------------------------------------------------------
def test_a_duplicated_records_line_is_refused_naming_both_lines(run_job, four_rounds):
    records = four_rounds / "records.jsonl"
    records.write_text("".join(lines(four_rounds) + [lines(four_rounds)[2]]))
    before = untouched(four_rounds)
    err = run_job(f"resume={four_rounds}", "budget.trials=48", code=2)
    assert f"{records}:3 and {records}:33 are the same measurement (measurement #2 of gemm_64)" in err
    assert untouched(four_rounds) == before


def test_a_config_measured_twice_is_refused(run_job, four_rounds):
    records = four_rounds / "records.jsonl"
    again = {**json.loads(lines(four_rounds)[4]), "index": 32}  # a new index, a config already measured
    records.write_text("".join(lines(four_rounds)) + json.dumps(again) + "\n")
    err = run_job(f"resume={four_rounds}", "budget.trials=48", code=2)
    assert f"{records}:5 and {records}:33 are the same measurement (config {again['config']}" in err


# ---- tuning.tools.sync into another store ----------------------------------------------------------------
@pytest.mark.slow  # 12 s: two syncs into a new sqlite store
def test_sync_into_another_store_twice_makes_one_copy(run_job, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from tuning.tools.sync import main as sync_main

    run_dir = tmp_path / "run"
    run_job(*NEW, "budget.trials=16")
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())  # a run tracked in a store not here
    saved["tracking"] = {"_target_": "tuning.tracking.mlflow_tracker.MlflowTracker",
                         "uri": f"sqlite:///{tmp_path / 'gone' / 'mlflow.db'}", "experiment": "tunelab",
                         "retry_s": 1, "system_metrics_s": 0}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    times = run_dir / "round_times.jsonl"  # the live run's per-round seconds, which MLflow alone would lose
    searched = [json.loads(line) for line in times.read_text().splitlines()
                if json.loads(line)["key"] == "time/search_s"]
    assert [point["step"] for point in searched] == [8, 16]
    with open(times, "a") as out:  # read back from disk: what is not a time/* point is skipped
        out.write('not json\n{"key": "best/gflops_so_far", "value": 1e9, "step": 3}\n')
    other = f"sqlite:///{tmp_path / 'other' / 'mlflow.db'}"
    sync_main([str(run_dir), "--tracking-uri", other])
    assert "round time(s) added" in capsys.readouterr().out
    sync_main([str(run_dir), "--tracking-uri", other])
    again = capsys.readouterr().out
    assert "0 curve point(s) added" in again and "0 round time(s) added" in again
    client = MlflowClient(tracking_uri=other)
    experiment = client.get_experiment_by_name("tunelab")
    [copy] = client.search_runs([experiment.experiment_id])
    assert copy.data.tags["tunelab.copied_from"] == str(run_dir)
    assert len(client.get_metric_history(copy.info.run_id, "best/gflops_so_far")) == 16
    assert len(client.get_metric_history(copy.info.run_id, "best/final_gflops")) == 1
    relogged = client.get_metric_history(copy.info.run_id, "time/search_s")
    assert sorted((m.step, m.value) for m in relogged) == [(p["step"], p["value"]) for p in searched]
    assert not (run_dir / "mlflow_run_id").exists()  # the folder names its run in its own store only


def test_sync_logs_the_round_times_a_run_lacks_and_skips_what_is_not_one(tmp_path):
    from tuning.tools.sync import replay_round_times

    class Tracker:
        def __init__(self, have):
            self.have, self.logged = have, []

        def logged_steps(self, key):
            return self.have.get(key, set())

        def log_metrics(self, metrics, step):
            self.logged.append((step, metrics))

        def flush(self):
            pass

    (tmp_path / "round_times.jsonl").write_text(
        '{"key": "time/search_s", "value": 0.5, "step": 8}\n{"key": "time/model_s", "value": 0.1, "step": 8}\n'
        '{"key": "time/search_s", "value": 0.9, "step": 16}\n{"key": "time/search_s", "value": NaN, "step": 24}\n'
        '{"key": "best/gflops_so_far", "value": 9.0, "step": 16}\n[1, 2]\n{"key": "time/search_s", "value": 1.0, "step": "x"}\n')
    tracker = Tracker({"time/search_s": {8}})
    assert replay_round_times(tracker, tmp_path) == 2
    assert tracker.logged == [(8, {"time/model_s": 0.1}), (16, {"time/search_s": 0.9})]
    assert replay_round_times(Tracker({}), tmp_path / "none") == 0


# ---- Ctrl-C while a whole model is imported -----------------------------------------------------
def test_an_interrupt_a_tvm_pass_swallows_still_stops_the_model_import(monkeypatch, terminal_sigint):
    """relax's FoldConstant catches whatever its constant builds raise (they are the Python
    `tirx.build`), so a Ctrl-C arriving in one would be lost and the import would go on."""
    from tuning.hardware import relax_models
    from tuning.hardware.cpu import CPUHardware

    extracted = []

    def import_that_swallows(model_cfg, seed, target):
        try:
            signal.raise_signal(signal.SIGINT)  # Python raises KeyboardInterrupt in the build callback
        except BaseException:  # noqa: BLE001 - what FoldConstant's C++ does with the build's error
            pass
        return relax_models.LoadedModel(mod="mod", example=None)

    monkeypatch.setattr(relax_models, "load_model", import_that_swallows)
    monkeypatch.setattr(relax_models, "extract_tasks", lambda mod, *a, **k: extracted.append(mod) or [])
    monkeypatch.setattr(relax_models, "as_tuning_tasks", lambda tasks: tasks)
    with pytest.raises(KeyboardInterrupt):
        CPUHardware(mcpu="x86-64").model_tasks({"kind": "network", "network": "resnet18"}, 0)
    assert extracted == []  # stopped after the import, before extracting tasks
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.tvm
@pytest.mark.slow
def test_fold_constant_swallows_an_interrupt_and_interrupts_noticed_raises_it(terminal_sigint):
    """The cause, on real TVM: an interrupt raised in FoldConstant's build is not seen by the caller."""
    import numpy as np
    import tvm
    import tvm_ffi
    from tvm import relax
    from tvm.script import relax as R

    from tuning.hardware.tvm_space import interrupts_noticed

    @tvm.script.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((4,), "float32")):
            with R.dataflow():
                y = R.add(x, R.add(R.const(np.ones(4, "float32")), R.const(np.ones(4, "float32"))))
                R.output(y)
            return y

    legalized = relax.transform.LegalizeOps()(Module)
    build = tvm_ffi.get_global_func("tirx.build")

    def interrupted_build(*args):
        signal.raise_signal(signal.SIGINT)
        return build(*args)

    tvm.register_global_func("tirx.build", interrupted_build, override=True)
    try:
        relax.transform.FoldConstant()(legalized)  # no exception: the interrupt is swallowed
        with pytest.raises(KeyboardInterrupt), interrupts_noticed():
            relax.transform.FoldConstant()(legalized)
    finally:
        tvm.register_global_func("tirx.build", build, override=True)
