"""Where a whole model's tuning time goes (tuning/engine/network_time.py): the lab's estimate of the
model after every round against wall seconds, each kernel's measurements and the scheduler's gradient
as MLflow metrics, and at the end network_time.png and network_time.csv. A synthetic 'network' of
three GEMM kernels, tuned in this process in seconds."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from configs import as_job
from tuning.core.task import gemm_task
from tuning.hardware.synthetic import SyntheticHardware

KERNELS = (gemm_task("dense_big", 64, 64, 64, weight=1), gemm_task("dense_twice", 32, 64, 32, weight=2),
           gemm_task("dense_small", 16, 16, 16, weight=4))
E2E = {"latency_ms": {"tuned": 1.0, "untuned": 4.0, "torch": 2.0}, "match": True, "reference": "torch eager",
       "max_abs_diff": 1e-6, "num_threads": 1}
TRIALS = 96


class ThreeKernels(SyntheticHardware):
    """The synthetic backend, tuning a 'whole model' of three GEMM kernels."""

    model_kinds = (*SyntheticHardware.model_kinds, "network")

    def model_tasks(self, model_cfg, seed):
        return list(KERNELS)

    def evaluate_model(self, model_cfg, seed, database_dir, out_dir, timing):
        return dict(E2E)


def tune_three_kernels(compose_cfg, monkeypatch, *overrides) -> tuple[Path, str]:
    """(the run folder, its MLflow run id) of a gradient-scheduled run of the three kernels."""
    from tuning.engine import artifacts, run
    from tuning.tracking.plot import convergence_png

    conf = Path(compose_cfg().output_dir).parent / "own_conf"
    (conf / "hardware").mkdir(parents=True, exist_ok=True)
    (conf / "hardware" / "three_kernels.yaml").write_text(f"_target_: {__name__}.ThreeKernels\n")
    monkeypatch.setenv("TUNELAB_CONF_DIRS", str(conf))
    cfg = compose_cfg("model=tiny_cnn", "hardware=three_kernels", "scheduler=gradient", "search=random",
                      "cost_model=none", f"budget.trials={TRIALS}", "budget.plan_size=8",
                      "budget.min_trials_per_task=8", *overrides)
    out_dir = Path(cfg.output_dir)
    job = as_job(cfg, monkeypatch)
    monkeypatch.setattr(artifacts, "convergence_png", convergence_png)  # a tracked run logs the file as_job skips
    run.main(job)
    return out_dir, (out_dir / "mlflow_run_id").read_text().strip()


@pytest.fixture
def tuned(compose_cfg, monkeypatch):
    """A tuned run: (its folder, an MlflowClient on its store, its run id)."""
    out_dir, run_id = tune_three_kernels(compose_cfg, monkeypatch)
    uri = compose_cfg().tracking.uri
    return out_dir, MlflowClient(tracking_uri=uri), run_id


def history(client, run_id, key) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_the_estimate_falls_over_wall_time_round_by_round(tuned):
    out_dir, client, run_id = tuned
    estimate, wall = history(client, run_id, "network/estimate_ms"), history(client, run_id, "network/wall_s")
    rounds = [json.loads(line) for line in (out_dir / "network_rounds.jsonl").read_text().splitlines()]
    assert len(wall) == len(rounds) >= TRIALS // 8  # a point per round
    assert [step for step, _ in wall] == sorted({step for step, _ in wall})  # one point a step
    assert all(later > earlier for (_, earlier), (_, later) in zip(wall, wall[1:]))  # wall seconds increase
    # from the round after which every kernel had a valid reading, a point per round, never rising
    first = next(r["step"] for r in rounds if r["estimate_ms"] is not None)
    assert [step for step, _ in estimate] == [step for step, _ in wall if step >= first]
    assert len(estimate) > 3 and estimate[-1][1] < estimate[0][1]
    assert all(later <= earlier for (_, earlier), (_, later) in zip(estimate, estimate[1:]))
    assert history(client, run_id, "network/kernels_measured")[-1][1] == len(KERNELS)


def test_the_estimate_is_calls_times_each_kernels_fastest_reading(tuned):
    from tuning.core.records import RecordLog

    out_dir, client, run_id = tuned
    records = RecordLog(out_dir / "records.jsonl").load()
    fastest = {k.name: min(r.result.cost for r in records if r.task == k.name) for k in KERNELS}
    expected = sum(k.weight * fastest[k.name] for k in KERNELS) * 1e3
    assert history(client, run_id, "network/estimate_ms")[-1][1] == pytest.approx(expected)


def test_each_round_says_which_kernel_and_why(tuned):
    out_dir, client, run_id = tuned
    records = [json.loads(line) for line in (out_dir / "records.jsonl").read_text().splitlines()]
    assert len(records) == TRIALS
    for kernel in KERNELS:
        counts = history(client, run_id, f"scheduler/measurements/{kernel.name}")
        assert counts[-1] == (TRIALS, sum(r["task"] == kernel.name for r in records))
        assert all(later >= earlier for (_, earlier), (_, later) in zip(counts, counts[1:]))
    rounds = [json.loads(line) for line in (out_dir / "network_rounds.jsonl").read_text().splitlines()]
    assert {r["by"] for r in rounds} == {"minimum", "scheduler"}
    scheduled = [r for r in rounds if r["by"] == "scheduler"]
    for entry in scheduled:  # the gradient's choice is the kernel with the largest gradient
        assert entry["metric"] == "gradient_ms"
        assert entry["task"] == max(entry["scores"], key=entry["scores"].get)
    gradients = {k.name: history(client, run_id, f"scheduler/gradient_ms/{k.name}") for k in KERNELS}
    assert {len(points) for points in gradients.values()} == {len(scheduled)}


def test_the_figure_and_the_table_say_where_the_time_went(tuned):
    out_dir, client, run_id = tuned
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"network_time.png", "network_time.csv"} <= artifacts
    assert (out_dir / "network_time.png").read_bytes().startswith(b"\x89PNG")
    rows = list(csv.DictReader((out_dir / "network_time.csv").open()))
    assert [row["kernel"] for row in rows] == [row["kernel"] for row in
                                               sorted(rows, key=lambda row: -float(row["latency_ms"]))]
    assert {row["kernel"] for row in rows} == {k.name for k in KERNELS}
    assert sum(int(row["measurements"]) for row in rows) == TRIALS
    assert sum(float(row["latency_share"]) for row in rows) == pytest.approx(1, abs=1e-4)
    assert sum(float(row["tuning_time_share"]) for row in rows) == pytest.approx(1, abs=1e-4)
    final = json.loads((out_dir / "final_metrics.json").read_text())["metrics"]["tuning/weighted_latency_ms"]
    assert sum(float(row["latency_ms"]) for row in rows) == pytest.approx(final, rel=1e-4)
    for row in rows:
        assert float(row["wall_s"]) >= float(row["measure_s"]) >= 0
        assert int(row["rounds"]) >= int(row["scheduled_rounds"]) >= 0


def test_the_figure_leaves_the_callers_matplotlib_alone(tmp_path):
    """A notebook's backend (pyplot's pdf backend stands for it) survives the figure: it is drawn on a
    Figure with its own Agg canvas, and no pyplot figure is left open."""
    import subprocess

    code = ("import matplotlib; matplotlib.use('pdf'); import matplotlib.pyplot as plt\n"
            "from tuning.tracking.plot import network_time_png\n"
            "network_time_png([(0.5, 3.0), (1.0, 2.5), (2.0, 2.0)], [('a', 0.75, 0.5), ('b', 0.25, 0.5)], "
            f"{str(tmp_path / 'n.png')!r}, final=2.1, title='random on tiny_cnn, seed 0')\n"
            f"network_time_png([], [('a', None, 1.0)], {str(tmp_path / 'empty.png')!r}, final=float('inf'))\n"
            "print(matplotlib.get_backend(), len(plt.get_fignums()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["pdf", "0"], done.stderr[-2000:]
    for name in ("n.png", "empty.png"):  # with no curve: a figure that says why
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")


class Recording:
    """A tracker that keeps every metric point: {key: [(step, value), ...]}."""

    def __init__(self):
        self.points: dict = {}

    def log_metrics(self, metrics, step):
        for key, value in metrics.items():
            self.points.setdefault(key, []).append((step, value))

    def flush(self):
        pass


def tune_in_process(out_dir: Path, trials: int, tracker) -> None:
    """The three kernels through tune_tasks with the records file and NetworkTime as its callbacks;
    called again on the same folder, it resumes."""
    from dataclasses import replace

    from helpers import component, components
    from tuning.engine.callbacks import AppendRecords
    from tuning.engine.loop import RunInfo, tune_tasks
    from tuning.engine.network_time import NetworkTime
    from tuning.scheduler.gradient import Gradient

    shared = components(search="random", cost_model="none")
    run = RunInfo(seed=0, out_dir=out_dir, method="test", trials=trials, plan_size=8, min_trials_per_task=8,
                  callbacks=[AppendRecords(), NetworkTime(tracker)])
    tune_tasks(list(KERNELS), lambda i: replace(shared, search=component("search", "random", 0),
                                                sampler=component("sampler", "greedy", 0)), run, Gradient())


def test_a_resumed_run_goes_on_from_its_last_wall_second(tmp_path):
    tracker = Recording()
    tune_in_process(tmp_path, 48, tracker)
    stopped_at = tracker.points["network/wall_s"][-1]
    tune_in_process(tmp_path, TRIALS, tracker)  # resumed: the records and states are the folder's
    wall, estimate = tracker.points["network/wall_s"], tracker.points["network/estimate_ms"]
    assert wall[-1][0] == TRIALS and stopped_at in wall and stopped_at != wall[-1]
    assert all(b[0] > a[0] and b[1] > a[1] for a, b in zip(wall, wall[1:]))  # steps and seconds go on rising
    assert all(b[1] <= a[1] for a, b in zip(estimate, estimate[1:]))


def test_a_torn_last_round_is_skipped_and_ended(tmp_path):
    from tuning.engine.network_time import NetworkTime, read_rounds

    rounds = tmp_path / "network_rounds.jsonl"
    rounds.write_text(json.dumps({"step": 8, "wall_s": 40.0, "task": "a", "estimate_ms": None,
                                  "seconds": {"wall_s": 1.0}}) + "\n" + '{"step": 16, "wall_s": 4')  # torn by a kill
    callback = NetworkTime(Recording())
    callback.on_start(type("Run", (), {"out_dir": tmp_path})())
    assert callback.offset == 40.0
    with open(rounds, "a") as out:
        out.write(json.dumps({"step": 16, "wall_s": 41.0, "task": "a", "estimate_ms": 2.0, "seconds": {}}) + "\n")
    assert [r["step"] for r in read_rounds(rounds)] == [8, 16]  # the torn line skipped, the next one whole
