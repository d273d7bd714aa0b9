"""Studies (tuning/study/): a study declared in a folder of the user's own (TUNELAB_CONF_DIRS), run
block by block on synthetic hardware through `tunelab study`; a block SIGKILLed in its middle is run
again from its start and the finished ones are untouched; the table withholds intervals below the
plan's block count; every key of a bad study file is named before any work; block files read back
are untrusted and never rewritten."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tuning.config import ConfigError
from tuning.study.files import finished_blocks, read_blocks, write_block
from tuning.study.spec import study_spec

STUDY = """
description: sa against random search on synthetic hardware
common: [hardware=synthetic, hardware.noise=0.1, hardware.delay_s={delay}, evaluator=fixed]
arms:
  sa: [search=sa, sampler=greedy, cost_model=xgb]
  random: [search=random, cost_model=none]
tasks: [gemm_64]
seeds: 6
budget: {{trials: 32, plan_size: 8}}
adjudication: {{top_k: 2, rereads: 2, confirm: 3}}
panel: {{configs: 2, drift_bound: 1.2}}
analysis:
  claims: [{{arm: sa, baseline: random, kind: difference}}]
  alpha: 0.05
  min_blocks: 5
results: {results}
"""


def declare(tmp: Path, delay: float = 0.0) -> dict:
    conf = tmp / "conf" / "study"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "toy.yaml").write_text(STUDY.format(delay=delay, results=tmp / "results"))
    env = {**os.environ, "TUNELAB_CONF_DIRS": str(tmp / "conf"), "TUNELAB_OUTPUTS": str(tmp / "outputs")}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def tunelab(env: dict, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tunelab", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.json"))}


def test_a_block_killed_in_its_middle_is_run_again_from_its_start(tmp_path):
    env = declare(tmp_path, delay=0.03)  # each reading slowed, so that a block can be cut in two
    done = tunelab(env, "study", "run", "toy", "--blocks", "3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    blocks = tmp_path / "results" / "blocks"
    first_three = digests(blocks)
    plan = json.loads(next(blocks.glob("*.json")).read_text())["plan_hash"]
    assert len(first_three) == 3
    assert finished_blocks(tmp_path / "results", "toy", ("sa", "random"), plan) == {f"gemm_64-seed{s}" for s in range(3)}

    proc = subprocess.Popen([sys.executable, "-m", "tunelab", "study", "run", "toy", "--blocks", "1"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    work = tmp_path / "outputs" / "studies" / "toy" / "work" / "gemm_64-seed3"
    deadline = time.monotonic() + 120
    while not list(work.glob("*/state/*.json")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert work.is_dir() and digests(blocks) == first_three  # nothing written for the cut block

    again = tunelab(env, "study", "run", "toy", "--blocks", "1", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "gemm_64-seed3 was started before and not finished: run again from its start" in again.stderr
    after = digests(blocks)
    assert {k: v for k, v in after.items() if k in first_three} == first_three and len(after) == 4
    assert not work.exists()

    # the redone block holds what an uninterrupted run of it measures: the same records, arm by arm
    fresh = tmp_path / "fresh"
    env_fresh = declare(fresh, delay=0.03)
    (fresh / "conf" / "study" / "toy.yaml").write_text(
        STUDY.format(delay=0.03, results=fresh / "results").replace("seeds: 6", "seeds: [3, 4, 5, 0, 1, 2]"))
    assert tunelab(env_fresh, "study", "run", "toy", "--blocks", "1", cwd=fresh).returncode == 0
    [redone] = [json.loads(p.read_text()) for p in blocks.glob("gemm_64-seed3-*.json")]
    [straight] = [json.loads(p.read_text()) for p in (fresh / "results" / "blocks").glob("gemm_64-seed3-*.json")]
    assert {a: v["records"] for a, v in redone["arms"].items()} == {a: v["records"] for a, v in straight["arms"].items()}

    table = tunelab(env, "study", "table", "toy", cwd=tmp_path)
    assert table.returncode == 0, table.stderr[-3000:]
    assert "Blocks: 4 of 6 planned" in table.stdout
    assert "What the verdicts are about: gemm_64 (full space of" in table.stdout, table.stdout
    assert "withheld" in table.stdout and "[" not in table.stdout.split("| claims |")[1].split("\n")[0], table.stdout


def test_the_table_gives_intervals_once_the_plan_s_blocks_are_in(tmp_path):
    env = declare(tmp_path)
    assert tunelab(env, "study", "run", "toy", "--blocks", "5", cwd=tmp_path).returncode == 0
    table = tunelab(env, "study", "table", "toy", cwd=tmp_path)
    row = table.stdout.split("| claims |")[1].split("\n")[0]
    assert "withheld" not in row and "[" in row, table.stdout
    assert "interim look at 5 of 6" in table.stdout and "Winner's curse" in table.stdout
    assert "Measured beside other work" in table.stdout and "not recorded" not in table.stdout, table.stdout


def test_a_changed_plan_makes_its_blocks_anew_and_its_table_says_so(tmp_path):
    env = declare(tmp_path)
    assert tunelab(env, "study", "run", "toy", "--blocks", "1", cwd=tmp_path).returncode == 0
    study = tmp_path / "conf" / "study" / "toy.yaml"
    study.write_text(study.read_text().replace("confirm: 3", "confirm: 4"))  # the plan changed after data
    again = tunelab(env, "study", "run", "toy", "--blocks", "1", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 block(s) under another plan" in again.stderr and "block gemm_64-seed0 on" in again.stderr
    table = tunelab(env, "study", "table", "toy", cwd=tmp_path)
    assert "Blocks: 1 of 6 planned" in table.stdout
    assert "Left out: 1 block(s) made under another plan" in table.stdout, table.stdout


def valid() -> dict:
    return {"common": ["hardware=synthetic"], "arms": {"a": ["search=sa"], "b": ["search=random"]},
            "tasks": ["gemm_64"], "seeds": 3, "budget": {"trials": 16, "plan_size": 8},
            "analysis": {"claims": [{"arm": "a", "baseline": "b", "kind": "difference"}], "min_blocks": 2}}


@pytest.mark.parametrize("change, key", [
    ({"arms": {"a": ["search=sa"]}}, "study.arms"),
    ({"color": 1}, "study.color"),
    ({"seeds": 0}, "study.seeds"),
    ({"seeds": [1, 1]}, "study.seeds"),
    ({"budget": {"trials": 8, "plan_size": 16}}, "study.budget.plan_size"),
    ({"budget": {"trials": 0, "plan_size": 1}}, "study.budget.trials"),
    ({"common": ["seed=3"]}, "study.common"),
    ({"arms": {"a": ["search=sa", "budget.trials=9"], "b": []}}, "study.arms.a"),
    ({"analysis": {"claims": []}}, "study.analysis.claims"),
    ({"analysis": {"claims": [{"arm": "a", "baseline": "c", "kind": "difference"}]}}, "study.analysis.claims[0].baseline"),
    ({"analysis": {"claims": [{"arm": "a", "baseline": "b", "kind": "equivalence"}]}}, "study.analysis.claims[0].margin"),
    ({"analysis": {"claims": [{"arm": "a", "baseline": "b", "kind": "difference"}], "alpha": 0.9}}, "study.analysis.alpha"),
    ({"analysis": {"claims": [{"arm": "a", "baseline": "b", "kind": "difference"}], "interim": "peek"}},
     "study.analysis.interim"),
    ({"adjudication": {"top_k": 0}}, "study.adjudication.top_k"),
    ({"budget": {"trials": 16, "plan_size": 8, "plan_sizes": {"c": 4}}}, "study.budget.plan_sizes.c"),
    ({"budget": {"trials": 16, "plan_size": 8, "plan_sizes": {"a": 32}}}, "study.budget.plan_sizes.a"),
    ({"budget": {"trials": 16, "plan_size": 8, "plan_sizes": {"a": 0}}}, "study.budget.plan_sizes.a"),
    ({"budget": {"trials": 16, "plan_size": 8, "plan_sizes": [4]}}, "study.budget.plan_sizes"),
    ({"panel": {"drift_bound": 0.9}}, "study.panel.drift_bound"),
])
def test_a_bad_study_is_refused_naming_its_key(change, key):
    """Each problem names its key (and a valid file passes: the check is not one that always fails)."""
    study_spec("good", OmegaConf.create(valid()))
    with pytest.raises(ConfigError, match=rf"(?m)^\s*{key.replace('[', '.').replace(']', '.')}"):
        study_spec("bad", OmegaConf.create({**valid(), **change}))


class CountingTuner:
    """A TaskTuner's measured / done / tune_round, measuring `n` a round until `left` runs out."""

    def __init__(self, name: str, calls: list, left: int = 10**6):
        self.name, self.calls, self.left, self.measured, self.done = name, calls, left, 0, False

    def tune_round(self, n: int) -> None:
        taken = min(n, self.left)
        self.left -= taken
        self.measured += taken
        self.calls.append((self.name, taken))


def interleaved(plan_sizes: dict, trials: int, plan_size: int, left=None) -> tuple[list, int]:
    from tuning.study.block import Arm, _interleave

    calls, reads = [], []
    spec = study_spec("s", OmegaConf.create({**valid(), "budget": {"trials": trials, "plan_size": plan_size,
                                                                   **({"plan_sizes": plan_sizes} if plan_sizes else {})}}))
    arms = {name: Arm(name, OmegaConf.create({}), tuner=CountingTuner(name, calls, (left or {}).get(name, 10**6)))
            for name in ("a", "b")}
    _interleave(arms, ["b", "a"], spec, type("Panel", (), {"read": lambda self: reads.append(len(calls))})())
    return calls, len(reads)


def test_arms_of_different_round_sizes_stay_level_in_measurements():
    calls, reads = interleaved({}, 16, 8)  # equal sizes: one round each in turn, the given order first
    assert calls == [("b", 8), ("a", 8), ("b", 8), ("a", 8)] and reads == 2
    calls, reads = interleaved({"a": 3}, 16, 8)
    assert calls == [("b", 8), ("a", 3), ("a", 3), ("a", 3), ("b", 8), ("a", 3), ("a", 3), ("a", 1)], calls
    assert reads == 2  # once both passed 8 measurements, once both have their 16
    calls, _ = interleaved({}, 16, 8, left={"a": 5})  # an arm with nothing left to propose stops
    assert calls == [("b", 8), ("a", 5), ("a", 0), ("b", 8)]
    spec = study_spec("s", OmegaConf.create(valid()))
    sized = study_spec("s", OmegaConf.create({**valid(), "budget": {"trials": 16, "plan_size": 8, "plan_sizes": {"a": 4}}}))
    assert spec.plan_size_of("a") == 8 and sized.plan_size_of("a") == 4 and sized.plan_size_of("b") == 8
    assert sized.plan_hash != spec.plan_hash  # an arm's round size decides what it finds


def test_an_arm_on_other_hardware_is_refused_before_any_block(tmp_path):
    from tuning.study.block import check_study

    spec = study_spec("two", OmegaConf.create({**valid(), "common": [],
                                               "arms": {"a": ["search=sa", "hardware=synthetic"],
                                                        "b": ["search=random", "hardware=synthetic",
                                                              "hardware.noise=0.2"]}}))
    with pytest.raises(ConfigError, match=r"study.arms.b: its hardware differs"):
        check_study(spec, tmp_path)


def test_arms_may_differ_in_their_evaluator_and_the_study_reads_with_common_s(tmp_path):
    from tuning.study.block import check_study, reading_config

    spec = study_spec("two", OmegaConf.create({**valid(), "common": ["hardware=synthetic", "evaluator=adatune_de"],
                                               "arms": {"a": ["search=random", "evaluator=adaptive"],
                                                        "b": ["search=random", "evaluator=adaptive"]}}))
    check_study(spec, tmp_path)
    reading = reading_config(spec, "gemm_64", 0, tmp_path).evaluator
    assert reading._target_.endswith("FixedEvaluator") and reading.number == 50  # common's, whatever the arms'


def test_a_screening_arm_records_its_screened_readings_and_the_table_its_tuning_time(tmp_path):
    env = declare(tmp_path, delay=0.01)
    study = tmp_path / "conf" / "study" / "toy.yaml"
    study.write_text(study.read_text().replace("sa: [search=sa, sampler=greedy, cost_model=xgb]",
                                               "sa: [search=random, cost_model=none, evaluator.screen=1.2]"))
    assert tunelab(env, "study", "run", "toy", "--blocks", "2", cwd=tmp_path).returncode == 0
    blocks = [json.loads(p.read_text()) for p in (tmp_path / "results" / "blocks").glob("*.json")]
    assert all(b["arms"]["sa"]["screened"] > 0 and b["arms"]["random"]["screened"] == 0 for b in blocks)
    assert all(b["arms"][arm]["tuning_s"] > 0 for b in blocks for arm in ("sa", "random"))
    for arm in (b["arms"][name] for b in blocks for name in ("sa", "random")):  # tuning seconds by round
        assert [count for count, _ in arm["rounds"]] == [8, 16, 24, 32]
        assert arm["rounds"][-1][1] == pytest.approx(arm["tuning_s"])
        reached = next((s for count, s in arm["rounds"] if arm["to_target"] and count >= arm["to_target"]), None)
        assert arm["to_target_s"] == reached
    # a screened reading is never a finalist's: adjudication reads every arm in full
    assert all(len(b["arms"]["sa"]["confirm"]) == 3 for b in blocks)
    table = tunelab(env, "study", "table", "toy", cwd=tmp_path).stdout
    assert "Tuning time, seconds per measurement" in table and "Screened (read once" in table, table
    assert "- tuning time per measurement, sa / random:" in table, table


def test_the_plan_hash_follows_what_decides_a_verdict():
    base = study_spec("s", OmegaConf.create(valid()))
    same = study_spec("s", OmegaConf.create({**valid(), "description": "reworded", "results": "elsewhere"}))
    other = study_spec("s", OmegaConf.create({**valid(), "seeds": 4}))
    assert base.plan_hash == same.plan_hash != other.plan_hash


def block(study: str = "toy", seed: int = 0, final: float | None = 1e-5) -> dict:
    return {"study": study, "plan_hash": "h", "task": "gemm_64", "seed": seed, "block": f"gemm_64-seed{seed}",
            "host": {"cpu_model": "x", "cores": 2, "flags": "f"}, "order": ["a", "b"],
            "arms": {"a": {"final_s": final}, "b": {"final_s": 2e-5}}, "panel": {"drift": 1.0}}


def test_a_block_file_is_never_rewritten_and_foreign_files_are_left_out_by_name(tmp_path):
    write_block(tmp_path, block())
    with pytest.raises(FileExistsError):
        write_block(tmp_path, block())
    folder = tmp_path / "blocks"
    (folder / "junk-seed9-h.json").write_text("{not json")
    (folder / "other-seed1-h.json").write_text(json.dumps({**block("elsewhere", 1), "format": 1}))
    (folder / "nan-seed2-h.json").write_text(json.dumps({**block(seed=2), "format": 1}).replace("1e-05", "NaN"))
    (folder / "neg-seed3-h.json").write_text(json.dumps({**block(seed=3, final=-1.0), "format": 1}))
    (folder / "link-seed4-h.json").symlink_to(folder / "junk-seed9-h.json")
    files, problems = read_blocks(tmp_path, "toy", ("a", "b"))
    assert [f.block for f in files] == ["gemm_64-seed0"]
    said = "\n".join(problems)
    for name in ("junk-seed9", "other-seed1", "nan-seed2", "neg-seed3", "link-seed4"):
        assert name in said, said


def test_measurements_to_target_count_only_fresh_readings():
    from tuning.study.block import measurements_to_target

    arm = {"records": [[[0, 1], 3.0, None], [[0, 2], 1.0, None], [[0, 3], 0.9, None]],
           "rereads": {"0,2": [1.04, 1.05, 1.06], "0,3": [1.2, 1.3, 1.25]}}
    assert measurements_to_target(arm, 1.05) == 2  # [0, 2] re-reads within the target; [0, 3] read 0.9 once only
    assert measurements_to_target(arm, 1.0) is None  # censored: no re-read config is within it
    assert measurements_to_target(arm, None) is None


def test_a_peer_arm_is_declared_by_its_kind_and_enters_the_plan():
    spec = study_spec("p", OmegaConf.create({**valid(), "arms": {"a": ["search=sa"], "tir": {"peer": "metaschedule"}},
                                             "analysis": {"claims": [{"arm": "tir", "baseline": "a",
                                                                      "kind": "difference"}], "min_blocks": 2}}))
    assert spec.peers == (("tir", "metaschedule"),) and spec.plan()["arms"]["tir"] == {"peer": "metaschedule"}
    with pytest.raises(ConfigError, match=r"study.arms.tir: a list of overrides, or \{peer: metaschedule\}"):
        study_spec("p", OmegaConf.create({**valid(), "arms": {"a": ["search=sa"], "tir": {"peer": "autotvm"}}}))


def test_a_peer_arm_needs_hardware_that_tunes_with_tvm(tmp_path):
    from tuning.study.block import run_block

    spec = study_spec("p", OmegaConf.create({**valid(), "arms": {"a": ["search=random", "cost_model=none"],
                                                                  "tir": {"peer": "metaschedule"}},
                                             "analysis": {"claims": [{"arm": "tir", "baseline": "a",
                                                                      "kind": "difference"}], "min_blocks": 2}}))
    with pytest.raises(ConfigError, match=r"study.arms.tir: a metaschedule peer tunes with TVM: hardware=cpu"):
        run_block(spec, "gemm_64", 0, tmp_path, {"cpu_model": "x", "cores": 2, "flags": "f"})


def test_the_table_says_what_its_verdicts_are_about_and_shows_avx512_and_avx2_hosts_apart(tmp_path):
    from tuning.study.run import study_table

    spec = study_spec("toy", OmegaConf.create({**valid(), "seeds": 4, "results": str(tmp_path)}))
    for seed in range(4):
        isa, model = ("avx512", "xeon") if seed % 2 else ("avx2", "epyc")
        write_block(tmp_path, {**block(seed=seed, final=1e-5 * (1 + seed / 10)), "plan_hash": spec.plan_hash,
                               "host": {"cpu_model": model, "cores": 2, "flags": isa}, "isa": isa,
                               "space_size": 1234, "format": 1})
    table = study_table(spec)
    assert "gemm_64 (full space of 1,234 configs); 16 measurements an arm" in table, table
    assert "2 kind(s) drawn: 2-core, avx2; 2-core, avx512" in table, table
    assert "AVX-512 and AVX2 hosts apart" in table, table
    assert "- avx2: a / b: 2 block(s), 0.548 [" in table and "- avx512: a / b: 2 block(s), 0.598 [" in table, table
    assert "| gemm_64-seed3 | - | xeon-2c-" in table and "| 11.0 | 20.0 |" in table, table  # each block listed


def test_one_vector_isa_gives_no_second_table(tmp_path):
    from tuning.study.run import study_table

    spec = study_spec("toy", OmegaConf.create({**valid(), "results": str(tmp_path)}))
    write_block(tmp_path, {**block(), "plan_hash": spec.plan_hash, "format": 1})  # a block of before the ISA was kept
    table = study_table(spec)
    assert "apart" not in table and "space size not recorded" in table and "ISA not recorded" in table, table


def test_the_vector_isa_is_the_widest_extension_the_cpu_names():
    from tuning.cluster.host_identity import vector_isa

    assert vector_isa("model name: x\nflags: sse avx2 avx512f\n") == "avx512"
    assert vector_isa("model name: x\nflags: sse avx2\n") == "avx2"
    assert vector_isa("model name: x\nflags: neon\n") == "other"


def test_each_block_is_a_run_in_mlflow_once_and_blocks_from_elsewhere_are_logged_later(tmp_path):
    from mlflow.tracking import MlflowClient

    env = declare(tmp_path)
    uri = f"sqlite:///{tmp_path}/elsewhere/mlflow.db"
    made = tunelab(env, "study", "run", "toy", "--blocks", "1", "--tracking-uri", uri, cwd=tmp_path)
    assert made.returncode == 0, made.stderr[-3000:]
    [path] = (tmp_path / "results" / "blocks").glob("*.json")
    client = MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([client.get_experiment_by_name("study-toy").experiment_id])
    assert run.info.run_name == path.stem and run.data.tags["tunelab.block_file"] == path.stem
    assert run.data.params["arm.sa"] == "search=sa sampler=greedy cost_model=xgb" and run.data.params["seed"] == "0"
    block = json.loads(path.read_text())
    assert run.data.metrics["final_us.sa"] == pytest.approx(block["arms"]["sa"]["final_s"] * 1e6)
    assert "panel_drift" in run.data.metrics and "wall_min" in run.data.metrics

    other = f"sqlite:///{tmp_path}/other/mlflow.db"  # a store that has none of them: the blocks are logged once
    for expected in ("1 block(s) logged", "0 block(s) logged"):
        logged = tunelab(env, "study", "log", "toy", "--tracking-uri", other, cwd=tmp_path)
        assert logged.returncode == 0 and expected in logged.stdout, logged.stdout + logged.stderr[-2000:]
    assert len(MlflowClient(tracking_uri=other).search_runs(
        [MlflowClient(tracking_uri=other).get_experiment_by_name("study-toy").experiment_id])) == 1


def test_a_look_schedule_is_part_of_the_plan_only_where_declared():
    base = study_spec("s", OmegaConf.create(valid()))
    analysis = {**valid()["analysis"], "interim": "obrien_fleming", "looks": [2, 3]}
    scheduled = study_spec("s", OmegaConf.create({**valid(), "analysis": analysis}))
    assert "looks" not in base.plan()["analysis"] and scheduled.plan()["analysis"]["looks"] == [2, 3]
    assert scheduled.plan_hash != base.plan_hash and scheduled.analysis.looks == (2, 3)
    with pytest.raises(ConfigError, match=r"study.analysis.looks: the last look is at the planned 3"):
        study_spec("s", OmegaConf.create({**valid(), "analysis": {**analysis, "looks": [2]}}))
    with pytest.raises(ConfigError, match=r"study.analysis.looks: a list of block counts"):
        study_spec("s", OmegaConf.create({**valid(), "analysis": {**analysis, "looks": "often"}}))


def test_others_share_of_the_cpu_is_what_the_machine_did_beyond_the_block_s_own_processes():
    from tuning.study.bystanders import CpuSample, sample, shares

    start = CpuSample(wall=100.0, busy=1000.0, steal=5.0, own=50.0, load=0.5)
    end = CpuSample(wall=110.0, busy=1016.0, steal=6.0, own=62.0, load=1.5)  # 2 cores x 10 s: 16 busy, 12 ours
    assert shares(start, end, cores=2) == {"others_cpu_share": 0.2, "steal_share": 0.05, "load_start": 0.5,
                                           "load_end": 1.5}
    quiet = CpuSample(wall=110.0, busy=1012.0, steal=5.0, own=62.0, load=0.4)
    assert shares(start, quiet, cores=2)["others_cpu_share"] == 0.0
    now = sample()
    assert now.busy > 0 and now.own > 0 and now.wall > 0
    from tuning.study.bystanders import others_now

    assert 0.0 <= others_now(0.2) <= 1.0
