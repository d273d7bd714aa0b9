"""Bad input is a clear error before any work, naming the key, with no traceback.

Configs: NaN and infinities anywhere, keys added with `+` that nothing reads, a model dtype the
lab cannot measure, a model name that would leave the run folder, wrong types; in process
(`validate`) and through the CLI. Records files: a line that is not a record names the file and
line; a torn last line (a kill) is tolerated, and repairing it truncates in place.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from tuning.config import ConfigError
from tuning.core.records import MeasureResult, Record, RecordError, RecordLog
from tuning.engine.resume import prior_records
from tuning.engine.validate import validate

REPO = Path(__file__).resolve().parents[1]

# overrides -> the key the message must start with
REJECTED = {
    # NaN and infinities, in every group
    "nan epsilon": (["sampler.eps=nan"], "sampler.eps"),
    "nan kmeans threshold": (["sampler=kmeans", "sampler.threshold=nan"], "sampler.threshold"),
    "inf kmeans threshold": (["sampler=kmeans", "sampler.threshold=inf"], "sampler.threshold"),
    "inf time limit": (["budget.time_limit_s=inf"], "budget.time_limit_s"),
    "nan time limit": (["budget.time_limit_s=nan"], "budget.time_limit_s"),
    "nan cv threshold": (["evaluator=adaptive", "evaluator.cv_threshold=nan"], "evaluator.cv_threshold"),
    "inf cv threshold": (["evaluator=adaptive", "evaluator.cv_threshold=inf"], "evaluator.cv_threshold"),
    "nan target latency": (["objective.target_latency_us=nan"], "objective.target_latency_us"),
    "inf target latency": (["objective=measurements_to_target", "objective.target_latency_us=inf"],
                           "objective.target_latency_us"),
    "nan synthetic noise": (["hardware=synthetic", "hardware.noise=nan"], "hardware.noise"),
    "inf synthetic peak": (["hardware=synthetic", "hardware.peak_gflops=inf"], "hardware.peak_gflops"),
    "nan measure timeout": (["evaluator.timeout_s=nan"], "evaluator.timeout_s"),
    "inf measure timeout": (["evaluator.timeout_s=inf"], "evaluator.timeout_s"),
    "inf e2e seconds": (["e2e.max_seconds=inf"], "e2e.max_seconds"),
    "-inf e2e timeout": (["e2e.timeout_s=-inf"], "e2e.timeout_s"),
    "-inf sa temperature": (["search.temp=-inf"], "search.temp"),
    "nan in a list": (["search.temp=[1.0,nan]"], "search.temp[1]"),
    "nan xgb eta": (["cost_model.eta=nan"], "cost_model.eta"),
    "inf scheduler alpha": (["scheduler.alpha=inf"], "scheduler.alpha"),
    "-inf ppo learning rate": (["search=ppo", "search.learning_rate=-inf"], "search.learning_rate"),
    # keys added with `+` that nothing reads
    "top-level typo": (["+trails=3"], "trails"),
    "budget typo": (["+budget.trails=100"], "budget.trails"),
    "e2e typo": (["+e2e.run=5"], "e2e.run"),
    "objective typo": (["+objective.metric=final_gflops"], "objective.metric"),
    "tuning typo": (["+tuning.databse=x"], "tuning.databse"),
    "model typo": (["+model.group=4"], "model.group"),
    "conv key on a gemm": (["model=gemm", "+model.padding=1"], "model.padding"),
    "sampler typo": (["+sampler.epsilon=0.1"], "sampler.epsilon"),
    "evaluator typo": (["+evaluator.repeats=3"], "evaluator.repeats"),
    # dtype
    "garbage dtype": (["model.dtype=garbage"], "model.dtype"),
    "float16 dtype": (["model.dtype=float16"], "model.dtype"),
    "int8 dtype on a network": (["model=resnet18", "+model.dtype=int8"], "model.dtype"),
    # names that would leave the run folder, or are odd
    "traversal name": (["model.name=../../x"], "model.name"),
    "absolute name": (["model.name=/abs"], "model.name"),
    "empty name": (["model.name=''"], "model.name"),
    "hidden name": (["model.name=.hidden"], "model.name"),
    "name with a slash": (["model.name=a/b"], "model.name"),
    # wrong types and values
    "text for a model shape": (["model=gemm", "model.M=abc"], "model.M"),
    "text for a float": (["sampler.eps=abc"], "sampler.eps"),
    "text for synthetic noise": (["hardware=synthetic", "hardware.noise=high"], "hardware.noise"),
    "unknown space": (["model.space=everything"], "model.space"),
    "e2e timeout zero": (["e2e.timeout_s=0"], "e2e.timeout_s"),
    # combinations a method cannot run with
    "tiling space on a conv": (["model=conv_l8", "model.space=tiling"], "model.space"),
    "wide space on a network": (["model=resnet18", "model.space=wide"], "model.space"),
    "wide space on synthetic hardware": (["hardware=synthetic", "model.space=wide"], "model.space"),
    "gbfs with a sampler adding its own picks": (["search=gbfs", "sampler=greedy"], "sampler"),
    "a2c with a cost model nobody reads": (["search=a2c", "cost_model=xgb"], "cost_model"),
    "gbfs with an unknown move": (["search=gbfs", "search.moves=[swap]"], "search.moves"),
    "gbfs with rho zero": (["search=gbfs", "search.rho=0"], "search.rho"),
    "a2c epsilon above one": (["search=a2c", "search.epsilon=1.5"], "search.epsilon"),
    "a2c nan learning rate": (["search=a2c", "search.learning_rate=nan"], "search.learning_rate"),
}


def choices(cfg) -> dict:
    return {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra/")}


@pytest.mark.parametrize("overrides,key", REJECTED.values(), ids=REJECTED.keys())
def test_validate_rejects_naming_the_key(compose_cfg, overrides, key):
    cfg = compose_cfg(*overrides)
    with pytest.raises(ConfigError) as error:
        validate(cfg, choices(cfg))
    assert f"\n  {key}: " in str(error.value), str(error.value)


def test_non_finite_message_says_what_was_given(compose_cfg):
    with pytest.raises(ConfigError, match=r"sampler\.eps: expected a finite number, got nan"):
        validate(compose_cfg("sampler.eps=nan"))


def test_a_nan_in_a_ranged_key_is_reported_once(compose_cfg):
    with pytest.raises(ConfigError) as error:
        validate(compose_cfg("evaluator.timeout_s=nan"))
    assert str(error.value).count("evaluator.timeout_s") == 1


def test_unknown_key_lists_the_allowed_ones(compose_cfg):
    with pytest.raises(ConfigError) as error:
        validate(compose_cfg("model=gemm", "+model.groups=4", "+budget.trails=100"))
    message = str(error.value)
    assert "model.groups: not a key of a gemm model (allowed: name, kind, description, space, dtype, M, N, K)" in message
    assert "budget.trails: not a key of budget; did you mean budget.trials? (allowed: trials, trials_per_task" in message


# Hydra itself rejects these while composing (the CLI says so first, exit status 2: tests/test_command_line_errors.py)
HYDRA_REJECTED = {
    "top-level typo without +": ("trails=3", "trails"),
    "budget typo without +": ("budget.trails=3", "budget.trails"),
    "component typo without +": ("search.foo=1", "search.foo"),
    "nan for an int schema key": ("budget.trials=nan", "budget.trials"),
    "text for a bool schema key": ("e2e.enabled=maybe", "e2e.enabled"),
}


@pytest.mark.parametrize("override,key", HYDRA_REJECTED.values(), ids=HYDRA_REJECTED.keys())
def test_hydra_rejects_while_composing(compose_cfg, override, key):
    with pytest.raises(ConfigCompositionException, match=key.replace(".", r"\.")):
        compose_cfg(override)


# ---- through the CLI ---------------------------------------------------------------------------
def run_cli(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TUNELAB_OUTPUTS": str(tmp_path / "outputs")}
    return subprocess.run([sys.executable, "run.py", *overrides, "model=gemm_64", "hardware=synthetic",
                           "tracking=none", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


CLI_REJECTED = {  # overrides, exit code (2: every input error, Hydra's included), text of the message
    "budget typo": (["+budget.trails=100"], 2, "budget.trails: not a key of budget"),
    "nan": (["sampler.eps=nan"], 2, "sampler.eps: expected a finite number, got nan"),
    "traversal name": (["model.name=../../x"], 2, "model.name:"),
    "nan for an int (Hydra's composition)": (["budget.trials=nan"], 2, "budget.trials"),
}


@pytest.mark.parametrize("overrides,code,text", CLI_REJECTED.values(), ids=CLI_REJECTED.keys())
def test_cli_rejects_before_any_work(tmp_path, overrides, code, text):
    proc = run_cli(tmp_path, *overrides)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert text in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "run" / "records.jsonl").exists()
    assert not (tmp_path / "outputs").exists()


def test_cli_rejects_a_database_that_is_not_records(tmp_path):
    hostname = tmp_path / "hostname"
    hostname.write_text("buildhost\n")
    proc = run_cli(tmp_path, f"tuning.database={hostname}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"tuning.database: {hostname}:1: not a tunelab record" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "run" / "records.jsonl").exists()


# ---- records files -----------------------------------------------------------------------------
def record(index: int, **result) -> Record:
    return Record("gemm_64", "gemm-0123456789ab", [0, index, 2], {"sketch": 0, "tile.i": [1, 8]},
                  MeasureResult(**{"costs": [1e-5, 2e-5], **result}), 0, "test", 0, index, 1000.0 + index)


def write_records(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def good_line(index: int = 0) -> dict:
    return json.loads(record(index).to_json())


def test_records_round_trip(tmp_path):
    log = RecordLog(tmp_path / "records.jsonl")
    written = [record(0), record(1, error="timeout", costs=[], message="slow"),
               record(2, reused=True, gauge_s=0.02, config=(0, 2, 2))]
    for r in written:
        log.append(r)
    assert log.load() == written


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    path = write_records(tmp_path / "records.jsonl",
                         [record(0).to_json(), '{"task": "gemm_64", "workl', record(2).to_json()])
    with pytest.raises(RecordError, match=rf"^{re.escape(str(path))}:2: not a tunelab record \(not JSON: "):
        RecordLog(path).load()


def test_a_file_that_is_not_records(tmp_path):
    path = write_records(tmp_path / "hostname", ["buildhost"])
    with pytest.raises(RecordError, match=rf"^{re.escape(str(path))}:1: not a tunelab record"):
        RecordLog(path).load()


def test_binary_file_is_not_records(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(b"\xff\xfe\x00\n")
    with pytest.raises(RecordError, match="not UTF-8"):
        RecordLog(path).load()


def _without(data: dict, key: str) -> dict:
    return {k: v for k, v in data.items() if k != key}


def _with_result(**changes) -> dict:
    data = good_line()
    return {**data, "result": {**data["result"], **changes}}


BAD_RECORDS = {  # parsed line -> text the reason must contain
    "an array": ([1, 2], "expected a JSON object, got list"),
    "missing field": (_without(good_line(), "workload_key"), "missing field workload_key"),
    "unknown field": ({**good_line(), "colour": "red"}, "unknown field colour"),
    "unknown result field": (_with_result(speed=1), "unknown field result.speed"),
    "config of strings": ({**good_line(), "config": ["0", "1"]}, "config: expected a list of ints"),
    "config of bools": ({**good_line(), "config": [True]}, "config: expected a list of ints"),
    "round as text": ({**good_line(), "round": "0"}, "round: expected an int"),
    "result not an object": ({**good_line(), "result": [1e-5]}, "result: expected an object"),
    "nan cost": (_with_result(costs=[float("nan")]), "result.costs: expected a list of finite numbers"),
    "cost as text": (_with_result(costs=["fast"]), "result.costs: expected a list of finite numbers"),
    "unknown error kind": (_with_result(error="bad"), "result.error: expected null or one of build"),
    "infinite time": ({**good_line(), "time": float("inf")}, "time: expected a finite number"),
    "gauge as text": (_with_result(gauge_s="x"), "result.gauge_s: expected null or a finite number"),
    "screened as text": (_with_result(screened="yes"), "result.screened: expected a boolean"),
}


@pytest.mark.parametrize("data,reason", BAD_RECORDS.values(), ids=BAD_RECORDS.keys())
def test_a_line_that_is_not_a_record_says_why(tmp_path, data, reason):
    path = write_records(tmp_path / "records.jsonl", [record(0).to_json(), json.dumps(data)])
    with pytest.raises(RecordError) as error:
        RecordLog(path).load()
    assert str(error.value).startswith(f"{path}:2: not a tunelab record (")
    assert reason in str(error.value)


def test_older_records_without_the_store_fields_load(tmp_path):
    data = good_line()
    data["result"] = _without(_without(data["result"], "reused"), "gauge_s")
    path = write_records(tmp_path / "records.jsonl", [json.dumps(data)])
    [loaded] = RecordLog(path).load()
    assert loaded.result.reused is False and loaded.result.gauge_s is None


def test_torn_last_line_is_tolerated(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text(record(0).to_json() + "\n" + record(1).to_json()[:40])
    assert RecordLog(path).load() == [record(0)]


def test_repair_truncates_in_place(tmp_path):
    path = tmp_path / "records.jsonl"
    intact = (record(0).to_json() + "\n" + record(1).to_json() + "\n").encode()
    path.write_bytes(intact + record(2).to_json()[:50].encode())
    inode = path.stat().st_ino
    RecordLog(path).repair()
    assert path.stat().st_ino == inode, "repair must not replace the file"
    assert path.read_bytes() == intact


def test_repair_finds_the_last_newline_beyond_one_chunk(tmp_path):
    path = tmp_path / "records.jsonl"
    intact = (record(0).to_json() + "\n").encode()
    path.write_bytes(intact + b"x" * 200_000)  # a torn tail longer than repair's read chunk
    RecordLog(path).repair()
    assert path.read_bytes() == intact


def test_repair_leaves_a_clean_file_alone(tmp_path):
    path = write_records(tmp_path / "records.jsonl", [record(0).to_json()])
    before = path.stat()
    RecordLog(path).repair()
    assert path.read_bytes() == (record(0).to_json() + "\n").encode()
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    RecordLog(tmp_path / "absent.jsonl").repair()
    assert not (tmp_path / "absent.jsonl").exists()


def test_database_that_is_not_records_is_a_config_error(tmp_path):
    path = write_records(tmp_path / "hostname", ["buildhost"])
    cfg = OmegaConf.create({"tuning": {"database": str(path)}})
    with pytest.raises(ConfigError, match=rf"^tuning\.database: {re.escape(str(path))}:1: not a tunelab record"):
        prior_records(cfg, [], tmp_path / "run", tracker=None)
