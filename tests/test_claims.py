"""The seed papers' claims re-tested (experiments/claims.py): the command, its campaigns, and the claims'
statistics (tuning/tools/compare/statistics.py) on hand-made curves."""
from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from test_loop import component
from test_store import SYNTHETIC_BACKEND, filled
from tuning.tools.campaign import job_command
from tuning.tools.compare import (
    Claim,
    Curve,
    TaskTruth,
    claim_cell,
    claim_rows,
    claim_verdict,
    claims_markdown,
    compare,
    final_quality,
    magnitude,
    time_ratio,
)
from tuning.tools.dataset import full_readings


# ---- the claims' statistics -------------------------------------------------------------------------
def claims_result(method_speed: float, seeds: int = 10, quality: float = 1.0):
    """SA reaches the best config after 100 measurements, SA+AS after 100 / method_speed, ending at
    `quality` x the best."""
    curves = []
    for seed in range(seeds):
        jitter = 1 + 0.02 * seed
        for method, at, final in (("SA", 100, 1.0), ("SA+AS", int(100 / method_speed), quality)):
            values = np.full(200, 2e-4)
            values[int(at * jitter):] = 1e-4 * final
            curves.append(Curve("t", method, seed, f"{method}{seed}", values, np.arange(1, 201) * 0.5, "store"))
    return compare(curves, {"t": TaskTruth({}, 1e-4, "store x")}, "SA", budgets=(64,), fraction=0.95)


SA_AS = Claim("adaptive sampling cuts measurements with SA (Fig. 7b)", "SA", "SA+AS", "measurements", "1.98x")


def sa_as_rows(result) -> list[dict]:
    """The claim rows of SA+AS against SA on measurements to the target."""
    return claim_rows([SA_AS], result)


def test_a_clear_reduction_holds_and_says_where_the_paper_lies():
    [row] = sa_as_rows(claims_result(2.0))
    assert row["speed_ratio"] == pytest.approx(2.0, rel=0.05) and row["speed_low"] > 1
    assert row["verdict"] == "holds" and row["magnitude"]


def test_a_header_names_the_seeds_it_has():
    from tuning.tools.compare.report import seed_label

    assert seed_label([0]) == "seed 0"
    assert seed_label([2, 0, 1]) == "seeds 0-2 (3)"
    assert seed_label([0, 1, 3]) == "seeds 0, 1, 3 (3)"  # not "0-3": seed 2 is missing


def test_where_the_papers_number_lies():
    assert magnitude("1.98x", {"low": 1.5, "high": 2.5}) == "paper's within our CI"
    assert magnitude("1.98x", {"low": 2.5, "high": 3.0}) == "paper's below our CI"
    assert magnitude("1.3-3.9x", {"low": 0.8, "high": 1.2}) == "paper's above our CI"
    assert magnitude("", {"low": 0.8, "high": 1.2}) == ""


def test_no_difference_is_undecided_and_a_loss_does_not_hold():
    [same] = sa_as_rows(claims_result(1.0))
    assert same["verdict"] == "undecided at this power"
    [slower] = sa_as_rows(claims_result(0.5))
    assert slower["verdict"] == "does not hold" and slower["speed_high"] < 1


def test_a_quality_bound_breaks_a_faster_method():
    claim = Claim("x", "SA", "SA+AS", "measurements", "2x", quality_bound=1.02)
    result = claims_result(2.0, quality=1.5)  # twice as fast to... a 50% slower kernel
    speed = time_ratio(result, "t", claim, np.random.default_rng(0))
    speed["p_holm"] = speed["p"]  # the only row of its table
    quality = final_quality(result, "t", claim, np.random.default_rng(0))
    assert quality["ratio"] == pytest.approx(1.5) and claim_verdict(speed, quality, 1.02) == "does not hold"
    assert math.isnan(time_ratio(claims_result(2.0, seeds=1), "t", claim, np.random.default_rng(0))["ratio"])
    faster, worse = {"low": 1.5, "high": 2.5, "p_holm": 0.001}, {"low": 1.1, "high": 1.3}
    assert claim_verdict(faster, worse, 1.0) == "does not hold: slower output"
    assert claim_verdict(faster, {"low": 0.9, "high": 1.0}, 1.0) == "holds"
    assert claim_verdict(faster, {"low": 0.9, "high": 1.1}, 1.0) == "undecided at this power"


def test_a_claims_table_is_one_family_adding_a_row_raises_the_others_adjusted_p():
    result = claims_result(1.25, seeds=6)
    [alone] = claim_rows([SA_AS], result)
    control = Claim("a control on the same runs", "SA", "SA+AS", "run/run_s", "")
    others = [Claim(f"control {i}", "SA+AS", "SA", "measurements", "") for i in range(3)]
    with_more = claim_rows([SA_AS, control, *others], result)
    row = next(r for r in with_more if r["claim"] == SA_AS.text)
    assert row["speed_p"] == alone["speed_p"] and alone["speed_p_holm"] == alone["speed_p"]
    assert row["speed_p_holm"] > alone["speed_p_holm"]  # Holm across the table, not per row
    assert alone["verdict"] == "holds" and alone["speed_p"] < 0.05


def test_a_verdict_needs_the_adjusted_test_as_well_as_the_interval():
    faster, same = {"low": 1.2, "high": 1.5}, {"low": 0.95, "high": 1.0}
    assert claim_verdict({**faster, "p_holm": 0.01}, same, 1.0) == "holds"
    assert claim_verdict({**faster, "p_holm": 0.2}, same, 1.0) == "undecided at this power"
    assert claim_verdict(faster, same, 1.0) == "undecided at this power"  # no test, no verdict


def test_a_claim_with_one_seed_is_undecided_and_its_row_prints():
    [row] = claim_rows([SA_AS], claims_result(2.0, seeds=1))
    assert math.isnan(row["speed_p"]) and row["verdict"] == "undecided at this power"


def test_a_count_the_budget_fixes_is_an_identity_not_a_finding():
    made = Claim("SA+AS makes fewer measurements", "SA", "SA+AS", "made", "2x")
    result = claims_result(2.0)
    [row] = claim_rows([made], result)  # every run made 200 measurements: the ratio is 1 on every seed
    assert row["speed_identity"] and row["verdict"] == "an accounting identity: not tested"
    assert math.isnan(row["speed_p_holm"])
    assert row["magnitude"] == ""  # a fixed count is no interval to place the paper's number against


def test_the_final_kernels_interval_counts_the_stores_noise():
    rng = np.random.default_rng(3)
    a, b = (1,), (2,)  # SA+AS always ends on a, SA on b; the store read each 6 times, 5% apart
    readings = {a: list(1.008e-4 * (1 + 0.05 * rng.standard_normal(6))), b: list(1e-4 * (1 + 0.05 * rng.standard_normal(6)))}
    by_config = {c: float(np.median(r)) for c, r in readings.items()}
    curves = []
    for seed in range(8):
        for method, config in (("SA", b), ("SA+AS", a)):
            values = np.full(50, by_config[config])
            curves.append(Curve("t", method, seed, f"{method}{seed}", values, np.arange(1, 51) * 0.5, "store",
                                final_config=config))
    claim = Claim("x", "SA", "SA+AS", "measurements", "", quality_bound=1.0)
    noisy = compare(curves, {"t": TaskTruth(by_config, min(by_config.values()), "store x", readings)}, "SA", budgets=(8,))
    quality = final_quality(noisy, "t", claim, np.random.default_rng(0))
    assert quality["readings_resampled"] and quality["low"] < 1 < quality["high"]  # the store cannot tell a from b
    medians_only = compare(curves, {"t": TaskTruth(by_config, min(by_config.values()), "store x")}, "SA", budgets=(8,))
    certain = final_quality(medians_only, "t", claim, np.random.default_rng(0))
    assert certain["low"] == pytest.approx(certain["high"])  # seeds alone: every seed the same ratio, no width
    assert certain["ratio"] == pytest.approx(quality["ratio"])


def test_a_final_claim_is_the_baselines_final_latency_over_the_methods_with_its_test():
    """quantity "final": "a faster kernel at the same budget", baseline / method of the final kernels."""
    faster = Claim("a faster kernel", "SA", "SA+AS", "final", "1.1-1.5x")
    [row] = claim_rows([faster], claims_result(1.0, quality=0.8))  # SA+AS ends on a kernel 0.8x SA's
    assert row["speed_ratio"] == pytest.approx(1.25) and row["quality_ratio"] == pytest.approx(0.8)
    assert row["speed_low"] == pytest.approx(1 / row["quality_high"]) and row["speed_p"] < 0.05
    assert row["verdict"] == "holds" and row["magnitude"] == "paper's within our CI"
    [slower] = claim_rows([faster], claims_result(1.0, quality=1.3))
    assert slower["speed_ratio"] == pytest.approx(1 / 1.3) and slower["verdict"] == "does not hold"
    [same] = claim_rows([faster], claims_result(1.0))
    assert same["verdict"] == "undecided at this power"


def test_a_median_the_method_never_reaches_reads_so_not_as_zero():
    [row] = sa_as_rows(claims_result(0.4))  # SA+AS would reach it at 250 measurements: after its 200
    assert row["speed_ratio"] == 0 and row["verdict"] == "does not hold"
    assert "the method's median not reached (method 0/10 runs, baseline 10/10)" in claims_markdown([row], [])
    [reached] = sa_as_rows(claims_result(2.0))
    assert "not reached" not in claims_markdown([reached], [])
    neither = {**row, "speed_ratio": math.nan, "speed_reached": (0, 4), "speed_n": 10}
    assert "neither median reached (method 0/10 runs, baseline 4/10)" in claims_markdown([neither], [])


def test_a_cell_keeps_an_open_ended_interval():
    assert claim_cell(0.895, 0.5, math.inf) == "0.895x [0.500, inf]"  # some resamples never reached
    assert claim_cell(1.2, 1.1, 1.3) == "1.200x [1.100, 1.300]"
    assert claim_cell(math.nan, math.nan, math.nan) == "n/a"


@pytest.mark.slow
def test_the_chameleon_command_replays_its_grid_and_prints_verdicts(tmp_path, experiment_script):
    """experiments/claims.py chameleon end to end on a synthetic store: the grid, the plan-size
    control at SA+AS's mean k, the table."""
    spec = component("evaluator", "adatune_de").spec  # chameleon_replay's evaluator: the readings' key
    store, _ = filled(tmp_path / "store.sqlite", count=200, spec=full_readings(spec))
    claims = experiment_script("claims")
    rows = claims.main(["chameleon", "--store", str(store.path), "--models", "gemm_64", "--seeds", "2",
                        "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--out", str(tmp_path / "out"),
                        *SYNTHETIC_BACKEND, "budget.trials_per_task=64",
                        f"hydra.sweep.dir={tmp_path}/multirun/${{now:%H-%M-%S-%f}}"])
    assert {r["method"] for r in rows} >= {"SA+AS", "AE+AS", "SA+AS code"}
    text = (tmp_path / "out" / "claims.md").read_text()
    assert "SA plan=k: greedy SA at plan size gemm_64" in text and "1.98x" in text



def test_a_full_space_campaign_stops_at_its_hours_and_the_same_command_continues_it(tmp_path, experiment_script, capsys,
                                                                                    monkeypatch):
    """claims.py --full-space on a synthetic backend: a stop at --hours leaves no run finished; the same
    command then runs every job; a third call measures nothing and starts no run, and packs the
    archive. Read as a file on a machine that has neither the store nor the MLflow runs, the archive
    prints the same table from a view of its own."""
    from mlflow.tracking import MlflowClient

    claims = experiment_script("claims")
    store, uri = tmp_path / "stores" / "full.sqlite", f"sqlite:///{tmp_path}/mlflow.db"
    command = ["adatune", "--full-space", "--store", str(store), "--models", "gemm_64", "--seeds", "2",
               "--campaign", str(tmp_path / "campaign"), "--tracking-uri", uri, "--out", str(tmp_path / "out"),
               *SYNTHETIC_BACKEND, "budget.trials_per_task=48"]
    with pytest.raises(SystemExit):  # no run finished: nothing to compare yet
        claims.main([*command, "--hours", str(1 / 3600)])  # SIGTERM a second in: run.py is still starting
    assert "campaign stopped at --hours with 0 of 4 runs finished" in capsys.readouterr().out
    rows = claims.main(command)
    assert {r["method"] for r in rows} == {"RFEI+CSA+AE"} and all(r["baseline"] == "XGB+SA+DE" for r in rows)
    text = (tmp_path / "out" / "claims.md").read_text()
    assert "full space, seeds 0-1 (2)" in text and "Full space (model.space=full)" in text
    folders = sorted(p.parent.relative_to(tmp_path / "campaign") for p in (tmp_path / "campaign").rglob("status"))
    assert [str(f) for f in folders] == [f"gemm_64/{row}/seed{s}" for row in ("rfei_csa_ae", "xgb_sa_de") for s in (0, 1)]
    client = MlflowClient(uri)
    [experiment] = [e for e in client.search_experiments() if e.name == "claims-adatune-full"]
    runs = len(client.search_runs([experiment.experiment_id]))
    rows_in_store = sqlite3.connect(store).execute("SELECT count(*) FROM readings").fetchone()[0]
    claims.main([*command, "--archive", str(tmp_path / "campaigns" / "full")])
    assert len(client.search_runs([experiment.experiment_id])) == runs
    assert sqlite3.connect(store).execute("SELECT count(*) FROM readings").fetchone()[0] == rows_in_store

    [packed] = (tmp_path / "campaigns" / "full").glob("*.tar.xz")
    with pytest.raises(SystemExit, match="read for its tables only"):
        claims.main([*command, "--archive", str(packed)])
    store.rename(tmp_path / "elsewhere.sqlite")  # what a clone on another machine lacks: the store and the runs
    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path / "outputs"))
    viewed = [*command[:command.index("--tracking-uri")], "--out", str(tmp_path / "view-out"), *SYNTHETIC_BACKEND,
              "budget.trials_per_task=48", "--table-only", "--archive", str(packed)]

    def table(found):
        return [(r["claim"], r["task"], str(r["speed_ratio"]), str(r["speed_low"]), r["verdict"]) for r in found]

    assert table(claims.main(viewed)) == table(rows)
    view = tmp_path / "outputs" / "archive-views" / "full" / packed.name.split(".")[0]
    assert (view / "stores" / "full.sqlite").is_file() and not store.exists()
    assert len(client.search_runs([experiment.experiment_id])) == runs  # this machine's MLflow store: untouched
    assert table(claims.main(viewed)) == table(rows)  # again: nothing re-logged twice
    in_view = MlflowClient(f"sqlite:///{view / 'mlflow.db'}")
    [copied] = [e for e in in_view.search_experiments() if e.name == "claims-adatune-full"]
    assert len(in_view.search_runs([copied.experiment_id])) == 4


def test_campaign_options_belong_to_a_campaign(experiment_script, capsys):
    claims = experiment_script("claims")
    with pytest.raises(SystemExit):
        claims.parse_args(["chameleon", "--hours", "2"])
    assert "--hours, --campaign and --archive belong to a campaign (--full-space or --build)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["chameleon", "--archive", "campaigns/chameleon-full"])
    assert "--archive belong to a campaign" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["chameleon", "--full-space", "--hours", "0"])
    assert "--hours: must be > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["chameleon", "--full-space", "--jobs", "2"])
    assert "--jobs: a --full-space campaign times kernels" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["chameleon", "--full-space", "--build"])
    assert "--build: a --full-space campaign fills its own store" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["chameleon", "--build", "--table-only", "--archive", "campaigns/c/host-2c-0123abcd.tar.xz"])
    assert "a --build campaign's replays are not in its archive" in capsys.readouterr().err


def test_a_build_campaign_builds_each_task_once_then_replays_as_one_step(tmp_path, experiment_script):
    claims = experiment_script("claims")
    command = ["chameleon", "--build", "--store", str(tmp_path / "s.sqlite"), "--campaign", str(tmp_path / "c"),
               "--seeds", "3", "budget.trials=64"]
    args, paper = claims.parse_args(command)
    builds = {task: job_command(claims.build_job(args, task)) for task in claims.STORE_TASKS}
    assert builds["conv_l8"][builds["conv_l8"].index("--configs") + 1] == "2000"
    assert all(builds[t][builds[t].index("--configs") + 1] == "500" for t in ("conv_l7", "conv_l6", "gemm_512"))
    assert all(c[1:4] == ["-m", "tuning.tools.dataset", "build"] and c[-2:] == ["evaluator=adatune_de",
               "hardware.build_workers=2"] and c[c.index("--store") + 1] == args.store for c in builds.values())
    other, _ = claims.parse_args([*command, "--build-override", "hardware=synthetic", "--build-override",
                                  "hardware.noise=0.2"])
    assert job_command(claims.build_job(other, "conv_l8"))[-3:] == ["evaluator=adatune_de", "hardware=synthetic",
                                                                     "hardware.noise=0.2"]
    assert claims.build_job(other, "conv_l8").folder != claims.build_job(args, "conv_l8").folder
    replays = claims.replay_job(paper, args)
    assert not replays.archived and replays.folder.parent == tmp_path / "c" / "chameleon"
    step = job_command(replays)
    assert step[1].endswith("experiments/claims.py") and "--replays-only" in step and step[-1] == "budget.trials=64"
    (tmp_path / "s.sqlite").touch()  # built by then
    inner, _ = claims.parse_args(step[2:])  # the step's own command parses, and replays what the campaign asked
    assert (inner.replays_only, inner.seeds, inner.models, inner.store, inner.overrides) == \
        (True, 3, list(paper.models), args.store, ["budget.trials=64"])
    assert claims.replay_job(paper, claims.parse_args(command)[0]).folder == replays.folder
    assert claims.replay_job(paper, claims.parse_args([*command, "--seeds", "4"])[0]).folder != replays.folder


def test_a_build_campaigns_options_are_checked(tmp_path, experiment_script, capsys):
    claims = experiment_script("claims")
    with pytest.raises(SystemExit):
        claims.parse_args(["adatune", "--build-override", "hardware=synthetic"])
    assert "--build-override belongs to --build" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a step is run by the campaign, never a campaign itself
        claims.parse_args(["adatune", "--build", "--replays-only", "--store", str(tmp_path / "s.sqlite")])
    assert "--replays-only: a --build campaign's own step, alone" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        claims.parse_args(["adatune", "--build", "--store", "postgresql://lab@db:5432/tunelab"])
    assert "--store: a campaign's store is a sqlite file" in capsys.readouterr().err
    assert not (Path.cwd() / "postgresql:").exists()


@pytest.mark.slow
def test_a_build_campaign_builds_replays_and_carries_its_store_to_a_new_machine(tmp_path, experiment_script, capsys):
    """claims.py adatune --build on a synthetic backend: a stop at --hours prints no table; the same
    command builds the store, replays and prints it; a third call builds and replays nothing; on a
    new machine (a fresh campaign folder, store folder and MLflow) the archive brings the store and
    the finished build back, and only the replays run again."""
    from mlflow.tracking import MlflowClient

    claims = experiment_script("claims")

    def command(machine: str) -> list[str]:
        return ["adatune", "--build", "--store", str(tmp_path / machine / "stores" / "lab.sqlite"), "--models",
                "gemm_64", "--seeds", "2", "--campaign", str(tmp_path / machine / "c"), "--archive",
                str(tmp_path / "archive"), "--tracking-uri", f"sqlite:///{tmp_path}/{machine}/mlflow.db",
                "--out", str(tmp_path / machine / "out"), "--build-override", "hardware=synthetic",
                "--build-override", "hardware.noise=0.2", *SYNTHETIC_BACKEND, "budget.trials_per_task=48",
                f"hydra.sweep.dir={tmp_path}/{machine}/multirun/${{now:%H-%M-%S-%f}}"]

    assert claims.main([*command("a"), "--hours", str(1 / 3600)]) == []
    assert "no table yet" in capsys.readouterr().out
    rows = claims.main(command("a"))
    assert {r["method"] for r in rows} >= {"RFEI+CSA+AE"}
    assert "restricted to the store's configs" in (tmp_path / "a" / "out" / "claims.md").read_text()
    store = tmp_path / "a" / "stores" / "lab.sqlite"
    readings = sqlite3.connect(store).execute("SELECT count(*) FROM readings").fetchone()[0]
    client = MlflowClient(f"sqlite:///{tmp_path}/a/mlflow.db")
    runs = len(client.search_runs([client.get_experiment_by_name("claims-adatune").experiment_id]))
    claims.main(command("a"))
    assert len(client.search_runs([client.get_experiment_by_name("claims-adatune").experiment_id])) == runs
    assert sqlite3.connect(store).execute("SELECT count(*) FROM readings").fetchone()[0] == readings
    capsys.readouterr()
    rows_b = claims.main(command("b"))
    out = capsys.readouterr().out
    assert f"{readings:,} store readings" in out and "tuning.tools.dataset" not in out  # nothing built again
    assert sqlite3.connect(tmp_path / "b" / "stores" / "lab.sqlite").execute(
        "SELECT count(*) FROM readings").fetchone()[0] == readings

    def table(found):  # str: an interval that is nan on both machines reads alike
        return [(r["claim"], r["task"], str(r["speed_ratio"]), str(r["speed_low"]), r["verdict"]) for r in found]

    assert table(rows_b) == table(rows)  # the same readings and seeds: the same replays


def test_a_job_whose_folder_holds_a_run_resumes_it(tmp_path, experiment_script):
    claims = experiment_script("claims")
    args, paper = claims.parse_args(["chameleon", "--full-space", "--store", str(tmp_path / "s.sqlite"),
                                     "--campaign", str(tmp_path / "c"), "budget.trials_per_task=8"])
    folder = tmp_path / "c" / "conv_l8" / "sa" / "seed0"
    jobs = claims.campaign_jobs(paper, args)
    assert jobs[0].folder == folder
    new = job_command(jobs[0])
    assert "+experiment/chameleon_row=sa" in new and "model.space=full" in new and "hardware.on_miss=measure" in new
    assert new.index("budget.trials_per_task=500") < new.index("budget.trials_per_task=8")  # the user's wins
    assert new[-1] == f"hydra.run.dir={folder}"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("{}")
    assert job_command(jobs[0])[2:] == [f"resume={folder}"]
    assert [job.folder.parent.name for job in jobs[:4]] == ["sa", "sa_as", "ae", "ae_as"]
