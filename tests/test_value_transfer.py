"""The matched value-function transfer experiment (experiments/value_transfer.py) and what it needs:
zero-measurement baselines (search=random with budget.trials=0), corpora cut to one size
(tuning/hardware/corpus.py at_most), campaign steps that are not runs, and latencies compared through a
yardstick timed beside them."""
from __future__ import annotations

import json
import math
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from test_transfer import fill_store, made_up_seconds
from tuning.core.task import gemm_task
from tuning.hardware.corpus import at_most, load_corpus
from tuning.hardware.synthetic import SyntheticHardware
from tuning.search.random import RandomSearch
from tuning.tools.campaign import Job, is_finished, run_campaign
from tuning.tools.compare.stats import paired_ratio_with_readings


# ---- search=random with no measurement ------------------------------------------------------------
class PrefersLargeUnroll:
    """A cost model that ranks: the higher the last knob's index, the better."""
    features = "knobs"
    can_rank = True

    def predict(self, X):
        return np.asarray(X, dtype=np.float64)[:, -1]


def test_a_random_schedule_is_legitimate_and_drawn_from_the_seed():
    hardware = SyntheticHardware(invalid_register_tile=2)
    space = hardware.space(gemm_task("g", 64, 64, 64))
    search = RandomSearch()
    first = search.best(space, None, np.random.default_rng([3, 1]))
    again = search.best(space, None, np.random.default_rng([3, 1]))
    other = {search.best(space, None, np.random.default_rng([s, 1]))[0] for s in range(8)}
    assert first == again and first[1] is None and space.is_legitimate(first[0])
    assert len(other) > 1  # another seed, another schedule


def test_best_of_many_is_the_cost_models_first_legitimate_pick():
    space = SyntheticHardware().space(gemm_task("g", 64, 64, 64))
    search = RandomSearch(best_of=64)
    chosen, predicted = search.best(space, PrefersLargeUnroll(), np.random.default_rng(0))
    drawn = RandomSearch().propose(space, None, 64, set(), np.random.default_rng(0))  # the same 64 draws
    assert predicted is None and chosen in drawn
    assert chosen[-1] == max(c[-1] for c in drawn)


def test_a_run_with_no_measurement_applies_a_random_legitimate_schedule(tmp_path, capsys):
    import tunelab

    tunelab.tune(["hardware=synthetic", "tracking=none", "model=gemm_64", "search=random", "budget.trials=0",
                  f"output_dir={tmp_path / 'run'}"])
    done = capsys.readouterr().out
    assert "(timed once; chosen without measuring)" in done and "measurements 0" in done
    assert (tmp_path / "run" / "records.jsonl").read_text() == ""


def test_random_schedules_without_measuring_and_best_of_needs_a_ranking_model(compose_cfg):
    from tuning.config import ConfigError
    from tuning.engine.validate import validate

    validate(compose_cfg("search=random", "budget.trials=0"))
    with pytest.raises(ConfigError, match="search.best_of: 8 random configs ranked by a cost model that ranks nothing"):
        validate(compose_cfg("search=random", "search.best_of=8", "cost_model=none", "budget.trials=0"))
    with pytest.raises(ConfigError, match="search.best_of"):
        validate(compose_cfg("search=random", "search.best_of=0", "budget.trials=0"))


# ---- corpora of one size -------------------------------------------------------------------------
def test_a_corpus_cut_to_one_size_is_a_seeded_draw_wherever_the_store_lies(tmp_path):
    path = tmp_path / "a.sqlite"
    fill_store(path, SyntheticHardware(), [(gemm_task("a", 64, 64, 64), 40), (gemm_task("b", 32, 32, 32), 6)],
               made_up_seconds)
    whole = {t.task.name: t for t in load_corpus([path], min_configs=2).tasks}
    cut = {t.task.name: t for t in at_most(load_corpus([path], min_configs=2), 10, seed=1).tasks}
    assert len(cut["a"].configs) == 10 and len(cut["b"].configs) == len(whole["b"].configs) == 6
    assert set(cut["a"].configs) < set(whole["a"].configs)
    seconds = dict(zip(whole["a"].configs, whole["a"].seconds))
    assert all(seconds[c] == s for c, s in zip(cut["a"].configs, cut["a"].seconds))
    shutil.copy(path, tmp_path / "elsewhere.sqlite")
    moved = at_most(load_corpus([tmp_path / "elsewhere.sqlite"], min_configs=2), 10, seed=1).tasks
    assert {t.task.name: t.configs for t in moved}["a"] == cut["a"].configs
    reseeded = at_most(load_corpus([path], min_configs=2), 10, seed=2).tasks
    assert {t.task.name: t.configs for t in reseeded}["a"] != cut["a"].configs
    assert at_most(load_corpus([path], min_configs=2), None, seed=1).configs == 46


def test_the_cut_and_the_skipped_correlations_are_checked_options(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    fill_store(store, SyntheticHardware(), [(gemm_task("a", 64, 64, 64), 4)], made_up_seconds)
    from tuning.tools import pretrain
    from tuning.tools.pretrain import parse_args
    from tuning.tools.value import main as value_main

    for main, command in ((pretrain.main, []), (value_main, ["train"])):  # each command's main, in this process
        with pytest.raises(SystemExit) as done:
            main([*command, "--store", str(store), "--configs-per-kernel", "1"])
        assert done.value.code == 2 and "--configs-per-kernel" in capsys.readouterr().err

    args = parse_args(["--store", str(store), "--configs-per-kernel", "24", "--no-heldout"])
    assert args.configs_per_kernel == 24 and args.no_heldout


# ---- campaign steps ----------------------------------------------------------------------------
def test_a_step_runs_until_it_succeeds_once(tmp_path):
    counter = tmp_path / "count"
    script = f"import pathlib; p = pathlib.Path({str(counter)!r}); p.write_text(str(int(p.read_text() or 0) + 1) " \
             "if p.exists() else '1')"
    step = Job(tmp_path / "step", command=("-c", script))
    assert not is_finished(step)
    run_campaign([step])
    run_campaign([step])
    assert is_finished(step) and counter.read_text() == "1"
    failing = Job(tmp_path / "bad", command=("-c", "raise SystemExit(3)"))
    with pytest.raises(SystemExit, match="the step in .*bad exited 3"):
        run_campaign([failing])
    assert not is_finished(failing)


# ---- latencies through a yardstick ---------------------------------------------------------------
def test_a_drift_that_slows_the_run_and_its_yardstick_alike_cancels():
    rng = np.random.default_rng(0)
    torch = [rng.normal(10, 0.1, 20) for _ in range(6)]
    drift = [1.0, 1.3, 0.8, 1.2, 1.1, 0.9]  # the host's speed when each baseline run was made
    baseline = [t * 0.5 * d for t, d in zip(torch, drift)]
    baseline_torch = [t * d for t, d in zip(torch, drift)]
    method = [t * 0.25 for t in torch]  # twice as fast as the baseline, timed at speed 1
    found = paired_ratio_with_readings(baseline, method, rng, method_scale=baseline_torch, baseline_scale=torch)
    assert found["ratio"] == pytest.approx(2.0, rel=0.02) and found["low"] > 1.9 and found["high"] < 2.1
    raw = paired_ratio_with_readings(baseline, method, np.random.default_rng(0))
    assert raw["high"] - raw["low"] > 5 * (found["high"] - found["low"])


# ---- the experiment --------------------------------------------------------------------------------
@pytest.fixture
def transfer(experiment_script):
    return experiment_script("value_transfer")


def arguments(transfer, tmp_path, *more):
    return transfer.parse_args(["--stores", str(tmp_path / "stores"), "--campaign", str(tmp_path / "c"),
                                "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", *more])


def test_leave_one_network_out_needs_three_whole_networks(transfer, tmp_path, capsys):
    for bad, said in ((["--networks", "resnet18", "squeezenet1_0"], "at least 3 networks"),
                      (["--networks", "resnet18", "squeezenet1_0", "conv_l8"], "conv_l8: not a whole network"),
                      (["--networks", "resnet18", "squeezenet1_0", "../x"], "../x: not a whole network"),
                      (["--configs-per-kernel", "40"], "--configs-per-kernel"), (["--best-of", "0"], "--best-of")):
        with pytest.raises(SystemExit):
            arguments(transfer, tmp_path, *bad)
        assert said in capsys.readouterr().err


def test_the_campaign_builds_corpora_then_trains_then_runs_matched_rows(transfer, tmp_path):
    args = arguments(transfer, tmp_path)
    jobs = transfer.campaign_jobs(args)
    names = [str(job.folder.relative_to(args.campaign)) for job in jobs]
    steps = [i for i, job in enumerate(jobs) if job.command]
    assert names[:2] == ["resnet18/autotvm32/seed0", "resnet18/random-corpus"] and len(names) == len(set(names))
    assert max(steps) < names.index("resnet18/value-tuning/seed0")  # everything trained before any run uses it
    assert len([n for n in names if "/training/" in n]) == 3 * 2 * 3 * 2  # networks x sources x seeds x (V, xgb)
    trainings = {job.folder.relative_to(args.campaign).as_posix(): job.command for job in jobs if "training" in
                 str(job.folder)}
    for source in ("tuning", "random"):
        command = trainings[f"squeezenet1_0/training/{source}-seed1/value"]
        stores = [command[i + 1] for i, a in enumerate(command) if a == "--store"]
        assert [Path(s).name for s in stores] == [f"resnet18-{source}.sqlite", f"mobilenet_v2-{source}.sqlite"]
        assert command[command.index("--holdout-store") + 1].endswith("squeezenet1_0-random.sqlite")
        assert command[command.index("--configs-per-kernel") + 1] == "24" and "--seed" in command
        xgb = trainings[f"squeezenet1_0/training/{source}-seed1/xgb"]
        assert [xgb[i + 1] for i, a in enumerate(xgb) if a == "--store"] == stores and "--no-heldout" in xgb
    runs = {str(job.folder.relative_to(args.campaign)): job.overrides for job in jobs if not job.command}
    assert len(runs) == 3 * 3 * 7  # networks x seeds x rows
    value = runs["squeezenet1_0/value-random/seed1"]
    assert "search.model=value-transfer-value-random-without-squeezenet1_0-seed1" in value
    assert "budget.trials=0" in value and "e2e.in_model_kernels=0" in value
    assert "cost_model.pretrained=value-transfer-xgb-tuning-without-squeezenet1_0-seed1" in \
        runs["squeezenet1_0/xgb-tuning/seed1"]
    assert any(o.endswith("resnet18-tuning.sqlite") for o in runs["resnet18/autotvm32/seed0"])
    assert not any(o.endswith("-tuning.sqlite") for o in runs["resnet18/autotvm32/seed1"])


def test_a_restored_campaign_trains_only_the_models_unfinished_rows_need(transfer, tmp_path):
    args = arguments(transfer, tmp_path)
    trainings = lambda: {job.folder.relative_to(args.campaign).as_posix(): job  # noqa: E731
                         for job in transfer.campaign_jobs(args) if "/training/" in str(job.folder)}
    before = trainings()
    assert not any(job.archived for job in before.values())  # the models live in MLflow: not in an archive
    for row in ("value-tuning", "xgb-tuning"):
        folder = args.campaign / "resnet18" / row / "seed1"
        folder.mkdir(parents=True)
        (folder / "status").write_text("FINISHED")
    assert set(before) - set(trainings()) == {"resnet18/training/tuning-seed1/value",
                                              "resnet18/training/tuning-seed1/xgb"}


def test_progress_counts_the_rows_runs_against_a_fixed_total_as_training_steps_drop_out(transfer, tmp_path):
    args = arguments(transfer, tmp_path)
    before = transfer.progress_line(transfer.campaign_jobs(args), args.campaign)
    for row in ("value-tuning", "xgb-tuning"):
        folder = args.campaign / "resnet18" / row / "seed1"
        folder.mkdir(parents=True)
        (folder / "status").write_text("FINISHED")
    after = transfer.progress_line(transfer.campaign_jobs(args), args.campaign)
    runs = 3 * 7 * len(args.seeds)  # networks x rows x seeds; AutoTVM-32 of seed 0 is also a corpus
    assert before.startswith(f"0 of the experiment's {runs} runs finished")
    assert after.startswith(f"2 of the experiment's {runs} runs finished")
    assert before.split(", ")[1] != after.split(", ")[1]  # two training steps fewer


def test_every_run_row_composes_and_the_measuring_ones_validate(transfer, tmp_path, compose_cfg):
    from tuning.engine.validate import validate

    args = arguments(transfer, tmp_path)
    runs = [job for job in transfer.campaign_jobs(args) if not job.command and "/seed1" in str(job.folder)
            and "/resnet18/" in str(job.folder)]
    assert sorted(job.folder.parent.name for job in runs) == sorted(transfer.ROWS)
    for job in runs:
        cfg = compose_cfg(*job.overrides)
        assert cfg.e2e.in_model_kernels == 0 and cfg.seed == 1 and cfg.model.name == "resnet18"
        if job.folder.parent.name in ("random", "autotvm8", "autotvm32"):
            validate(cfg)  # the others look their trained models up in the registry
    autotvm = compose_cfg(*next(j for j in runs if j.folder.parent.name == "autotvm8").overrides)
    assert autotvm.budget.trials_per_task == autotvm.budget.min_trials_per_task == 8 and autotvm.budget.plan_size == 8


def e2e_file(folder: Path, tuned_ms: float, torch_ms: float, rng, kernels=()) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "status").write_text("FINISHED\n")
    calls = {"tuned": list(rng.normal(tuned_ms, tuned_ms * 0.01, 12)), "torch": list(rng.normal(torch_ms, 0.05, 12))}
    (folder / "e2e.json").write_text(json.dumps({"latencies_ms": calls, "match": True, "kernels": [
        {"task": name, "calls": 2, "predicted_us": us, "in_model_us": us} for name, us in kernels]}))


def test_the_tables_compare_rows_through_torch_with_holm(transfer, tmp_path):
    args = arguments(transfer, tmp_path, "--out", str(tmp_path / "out"))
    rng = np.random.default_rng(0)
    for network in args.networks:
        for seed in range(3):
            drift = 1 + 0.3 * rng.random()  # each run at its own host speed: torch drifts with it
            folder = args.campaign / network
            e2e_file(folder / "value-tuning" / f"seed{seed}", 10 * drift, 8 * drift, rng, [("conv_a", 50.0)])
            e2e_file(folder / "value-random" / f"seed{seed}", 40 * 1.1, 8 * 1.1, rng, [("conv_a", 200.0)])
            e2e_file(folder / "autotvm32" / f"seed{seed}", 5.0, 8.0, rng, [("conv_a", 25.0)])
    (args.campaign / "resnet18" / "random" / "seed0").mkdir(parents=True)
    (args.campaign / "resnet18" / "random" / "seed0" / "status").write_text("FINISHED\n")
    (args.campaign / "resnet18" / "random" / "seed0" / "e2e.json").write_text('{"latencies_ms": {"tuned": "x"}}')
    rows = {(r["method"], r["baseline"]): r for r in transfer.main([*sys_args(args), "--table-only"])}
    sources = rows[("value-tuning", "value-random")]
    assert sources["n"] == 9 and sources["speedup"] == pytest.approx(4.0, rel=0.03)
    assert sources["verdict"] == "the method's output is faster" and sources["p_holm"] < 0.05
    autotvm = rows[("value-tuning", "autotvm32")]
    assert autotvm["speedup"] == pytest.approx(0.5, rel=0.03) and autotvm["verdict"] == "does not hold; paper's above our CI"
    torch = rows[("value-tuning", "torch")]
    assert torch["speedup"] == pytest.approx(0.8, rel=0.03) and torch["paper"] == "5.1x"
    assert rows[("value-tuning", "random")]["n"] == 0 and rows[("value-tuning", "random")]["verdict"].startswith("undecided")
    text = (tmp_path / "out" / "value-transfer.md").read_text()
    assert "| resnet18 | value-random | 3 |" in text and "conv_a (2)" in text
    assert "random/seed0: no readable e2e.json" in text


def sys_args(args) -> list[str]:
    return ["--stores", str(args.stores), "--campaign", str(args.campaign), "--tracking-uri", args.tracking_uri,
            "--out", str(args.out)]


def test_a_claim_added_to_the_table_raises_the_others_holm_p(transfer, monkeypatch):
    # fewer bootstrap draws: they make the intervals; Holm adjusts the Wilcoxon p, which draws nothing
    monkeypatch.setattr(transfer, "paired_ratio_with_readings", partial(paired_ratio_with_readings, resamples=100))
    rng = np.random.default_rng(1)
    readings = {}
    for network in ("a", "b", "c"):
        for seed in range(3):
            for row, ms in (("value-tuning", 10.0), ("value-random", 13.0), ("autotvm32", 9.0), ("autotvm8", 12.0)):
                readings[(network, row, seed)] = {"tuned": list(rng.normal(ms, 0.2, 10)),
                                                  "torch": list(rng.normal(8.0, 0.05, 10)), "match": True, "kernels": {}}
    before = {r["claim"]: r["p_holm"] for r in transfer.claim_rows(readings, np.random.default_rng(0)) if r["n"]}
    for seed in range(3):
        for network in ("a", "b", "c"):
            readings[(network, "random", seed)] = {"tuned": list(rng.normal(30.0, 0.2, 10)),
                                                   "torch": list(rng.normal(8.0, 0.05, 10)), "match": True, "kernels": {}}
    after = {r["claim"]: r["p_holm"] for r in transfer.claim_rows(readings, np.random.default_rng(0)) if r["n"]}
    assert len(after) == len(before) + 2  # both V rows against a random schedule
    assert all(after[claim] >= before[claim] for claim in before) and any(after[c] > before[c] for c in before)
    assert all(math.isfinite(p) for p in after.values())


# ---- real TVM: a pre-trained cost model's pick with no measurement ---------------------------------
@pytest.mark.tvm
def test_a_pretrained_cost_models_pick_of_random_schedules_is_applied_with_no_measurement(tmp_path, capsys):
    """`tunelab pretrain --configs-per-kernel --no-heldout` on a store of real TVM spaces, then
    run.py model=conv_tiny search=random search.best_of=16 cost_model=xgb_ms budget.trials=0: a kernel the
    model never saw (a network's kernels go the same way: tests/test_value.py's scheduled_network)."""
    import tunelab
    from configs import QUICK_TIMING
    from tuning.hardware.cpu import CPUHardware
    from tuning.tools import pretrain

    hardware, store = CPUHardware(num_threads=2), tmp_path / "store.sqlite"
    fill_store(store, hardware, [(gemm_task(f"gemm_{n}", n, n, n), 30) for n in (32, 64)], made_up_seconds)
    registry = f"sqlite:///{tmp_path / 'mlflow.db'}"
    pretrain.main(["--store", str(store), "--no-heldout", "--configs-per-kernel", "24", "--name", "x",
                   "--tracking-uri", registry])  # in this process: its command line is tests/test_tool_flags.py's
    trained = capsys.readouterr().out
    assert "trained on 2 kernels, 48 measured configs" in trained and "held out" not in trained
    tunelab.tune(["model=conv_tiny", "search=random", "search.best_of=16", "cost_model=xgb_ms",  # run.py's job
                  "cost_model.pretrained=x", f"cost_model.registry={registry}", "budget.trials=0", "tracking=none",
                  "e2e.enabled=false", *QUICK_TIMING, f"output_dir={tmp_path / 'run'}"])
    run = capsys.readouterr()
    assert "scheduled 1 kernel without measuring" in run.err + run.out
    assert (tmp_path / "run" / "records.jsonl").read_text() == ""
    assert (tmp_path / "run" / "database" / "database_tuning_record.json").read_text().count("\n") == 1
