"""The matched value-function transfer experiment (experiments/value_transfer.py) and its campaign steps
that are not runs."""
from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from tuning.tools.campaign import Job, is_finished, run_campaign
from tuning.tools.compare.stats import paired_ratio_with_readings


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
