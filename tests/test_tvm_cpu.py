"""Real TVM on tiny workloads: spaces from MetaSchedule, kernels built and timed in workers."""
import time

import numpy as np
import pytest

from configs import QUICK_TIMING
from tuning.config.cli import tunelab_command
from tuning.core.features import StoreRows, model_features
from tuning.core.measure import MeasureSpec
from tuning.core.records import Record
from tuning.core.task import batch_matmul_task, conv2d_task, gemm_task
from tuning.hardware.cpu import CPUHardware

pytestmark = pytest.mark.tvm

GEMM = gemm_task("gemm_64", 64, 64, 64)
CONV = conv2d_task("conv_tiny", 1, 16, 14, 14, 32, 3, 1, 1)
# Warm runs (min_repeat_ms), as evaluator=fixed does: single cold runs of a ~10 us kernel
# measure thread wake-ups, not the kernel (see conf/evaluator/fixed.yaml).
SPEC = MeasureSpec(number=1, repeat=3, min_repeat_ms=20, cache_flush=False, timeout_s=10.0)


@pytest.fixture(scope="module")
def hardware():
    """One measuring thread, like the (serial) untuned kernel it is compared with: a
    2-thread kernel on a 2-core host waits whole timeslices whenever another process
    takes a core, which would make these checks depend on what else the host runs."""
    hw = CPUHardware(num_threads=1)
    yield hw
    hw.close()


def untuned_seconds(task, hardware) -> float:
    """The naive (unscheduled) kernel, built and timed in this process."""
    import tvm

    from tuning.hardware.tvm_space import arg_shapes, make_target, prim_func

    func = prim_func(task.workload)
    lib = tvm.tirx.build(tvm.IRModule({"main": func}), target=make_target(hardware.target))
    args = [tvm.runtime.tensor(np.zeros(shape, dtype)) for shape, dtype in arg_shapes(func)]
    evaluator = lib.time_evaluator(lib.entry_name, tvm.cpu(0), number=1, repeat=3, min_repeat_ms=20)
    return float(np.median(evaluator(*args).results))


def test_space_reads_the_design_spaces(hardware):
    space = hardware.space(GEMM)
    assert space.num_sketches == 3
    kinds = [k.kind for k in space.knobs]
    assert kinds.count("tile") == 3 and "categorical" in kinds
    assert space.size > 100_000
    conv_space = hardware.space(CONV)
    assert "location" in [k.kind for k in conv_space.knobs]


def test_canonical_is_the_replayed_identity(hardware):
    space = hardware.space(CONV)
    schedules = space.canonicalize.__self__  # the TaskSchedules behind the space
    rng = np.random.default_rng(0)
    configs = [space.sample(rng) for _ in range(30)]
    threads, schedules.canonical_threads = schedules.canonical_threads, 2
    try:
        canon = space.canonical_many(configs)  # the cut trace, replayed on two threads
    finally:
        schedules.canonical_threads = threads
    # the whole sketch replayed with TVM's decision callbacks, as a build does
    assert canon == [schedules.effective_config(schedules.replay(c), c[0]) for c in configs]
    assert canon == [space.canonical(c) for c in configs]
    assert any(c != k for c, k in zip(configs, canon)), "illegal compute locations should be repaired"
    assert all(space.canonical(k) == k for k in canon)
    assert all(space.is_valid(k) for k in canon)


@pytest.mark.parametrize("task", [GEMM, CONV], ids=lambda t: t.name)
def test_random_configs_build_run_and_beat_untuned(hardware, task):
    space = hardware.space(task)
    rng = np.random.default_rng(1)
    configs = list(dict.fromkeys(space.canonical(space.sample(rng)) for _ in range(8)))
    seen = []
    results = hardware.measure(task, configs, SPEC, on_result=lambda i, r: seen.append(i))
    assert seen == list(range(len(configs)))  # results are handed out one by one, in order
    ok = [r for r in results if r.ok]
    assert len(ok) >= len(configs) // 2
    for config, result in zip(configs, results):
        assert result.config == config  # the effective config comes back with the result
        if result.ok:
            assert len(result.costs) == SPEC.repeat and result.build_s > 0 and result.run_s > 0
    best = min(r.cost for r in ok)
    assert best < untuned_seconds(task, hardware)


def test_wide_space_adds_tilings_whose_kernels_compute_the_product(hardware, tmp_path):
    wide = gemm_task("gemm_64", 64, 64, 64, space="wide")
    space = hardware.space(wide)
    assert wide.key != GEMM.key and space.num_sketches == hardware.space(GEMM).num_sketches + 3
    rng = np.random.default_rng(5)
    for sketch in range(3, 6):  # the write cache at tile level 3, at level 4, and the accumulator tile
        config = space.canonical(space.sample_in(sketch, rng))
        script = hardware.export(wide, config, tmp_path / str(sketch))[0]
        text = open(script).read()
        assert ('scope="local"' in text) == (sketch == 5) and ("SSSRS" in text) == (sketch == 5)
        checked = hardware.check_export(wide, script)
        assert checked["correct"] and checked["max_abs_error"] < 1e-3, checked


def test_adaptive_evaluator_stops_inside_the_run_worker(hardware):
    """AdaTune's rule runs in the worker: between min_batches and max_batches micro-batch costs,
    and a CV threshold of 0 (never satisfied) times every micro-batch."""
    from tuning.evaluator.adaptive import AdaptiveEvaluator

    space = hardware.space(GEMM)
    rng = np.random.default_rng(4)
    configs = list(dict.fromkeys(space.canonical(space.sample(rng)) for _ in range(4)))
    adaptive = AdaptiveEvaluator(runs=200, micro_batch=20, min_batches=3).measure(hardware, GEMM, configs)
    never = AdaptiveEvaluator(runs=200, micro_batch=20, cv_threshold=0.0).measure(hardware, GEMM, configs)
    for a, n in zip(adaptive, never):
        assert a.ok == n.ok
        if a.ok:
            assert 3 <= len(a.costs) <= 10 and len(n.costs) == 10 and all(c > 0 for c in a.costs)


def test_invalid_decisions_are_errors_and_tuning_goes_on(hardware):
    space = hardware.space(GEMM)
    good = space.canonical(space.sample(np.random.default_rng(2)))
    wrong_sketch = (99,) + good[1:]
    wrong_length = good[:2]
    results = hardware.measure(GEMM, [wrong_sketch, wrong_length, good], SPEC)
    assert [r.error for r in results[:2]] == ["invalid", "invalid"]
    assert all(r.message for r in results[:2])
    assert results[2].ok


def test_hanging_candidate_is_a_timeout(hardware):
    """A kernel slower than timeout_s is stopped and recorded, not waited for."""
    space = hardware.space(GEMM)
    config = space.canonical(space.sample(np.random.default_rng(3)))
    results = hardware.measure(GEMM, [config], MeasureSpec(repeat=3, min_repeat_ms=100, timeout_s=0.01))
    assert results[0].error == "timeout"


def test_exports_apply_through_metaschedule(hardware, tmp_path):
    """The exported database compiles with MetaSchedule and computes the right answer."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    space = hardware.space(GEMM)
    rng = np.random.default_rng(4)
    configs = list(dict.fromkeys(space.canonical(space.sample(rng)) for _ in range(4)))
    results = hardware.measure(GEMM, configs, SPEC)
    records = [Record(GEMM.name, GEMM.key, list(c), space.decisions(c), r, 0, "test", 0, i, time.time())
               for i, (c, r) in enumerate(zip(configs, results))]
    best = min((r for r in records if r.result.ok), key=lambda r: r.result.cost)
    script = hardware.export(GEMM, best.config, tmp_path / "best")
    assert "prim_func" in open(script[0]).read()

    paths = hardware.export_database([(GEMM, records)], tmp_path / "db")
    assert all(open(p).read() for p in paths)
    database = ms.database.JSONDatabase(work_dir=str(tmp_path / "db"))
    schedules = hardware.schedules(GEMM)
    sch = ms.tir_integration.compile_tir(database, schedules.mod, schedules.target)
    assert sch is not None
    lib = tvm.tirx.build(sch.mod, target=schedules.target)
    a = np.random.default_rng(0).uniform(size=(64, 64)).astype("float32")
    b = np.random.default_rng(1).uniform(size=(64, 64)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((64, 64), "float32"))
    lib[lib.entry_name](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4)


def test_database_applies_the_kernel_the_run_reports(hardware, tmp_path):
    """MetaSchedule compiles the record with the lowest mean of its run seconds; tunelab ranks by the
    median and may pick another after re-measuring. The database must lead with tunelab's choice."""
    from tvm.s_tir import meta_schedule as ms

    from tuning.core.records import MeasureResult

    space = hardware.space(GEMM)
    rng = np.random.default_rng(5)
    spiky, steady, slow = list(dict.fromkeys(space.canonical(space.sample(rng)) for _ in range(6)))[:3]
    readings = {spiky: [1e-5] * 4 + [5e-4], steady: [2e-5] * 5, slow: [3e-5] * 5}  # spiky: median 1e-5, mean 1.1e-4
    records = [Record(GEMM.name, GEMM.key, list(c), space.decisions(c), MeasureResult(costs=costs), 0, "test", 0, i,
                      time.time()) for i, (c, costs) in enumerate(readings.items())]
    schedules = hardware.schedules(GEMM)

    def applied(folder, chosen=None) -> tuple:
        hardware.export_database([(GEMM, records)], tmp_path / folder, chosen=chosen)
        database = ms.database.JSONDatabase(work_dir=str(tmp_path / folder))
        top = database.get_top_k(database.commit_workload(schedules.mod), 1)[0]
        return next(c for c in readings if str(schedules.schedule(c)[0].trace) == str(top.trace))

    assert applied("db") == spiky  # the mean of its readings would have put steady first
    # re-measured at the run's end, steady won: spiky, faster while tuning, is left out, also of the
    # rows the export before this one wrote to the same folder (a resumed run exports again)
    assert applied("db", {GEMM.name: (steady, 1.5e-5)}) == steady


def test_describe_names_target_and_cpu(hardware):
    info = hardware.describe()
    assert info["hardware"] == "cpu" and "llvm" in info["target"] and info["num_threads"] == 1
    assert info["cpu_model"] and info["tvm_version"].startswith("0.27")


def test_cli_real_run_end_to_end(tmp_path, capsys):
    """`python run.py` on real hardware: records, best schedule, database and MLflow artifacts; the
    run folder applied and exported."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from mlflow.tracking import MlflowClient

    from tuning.tools import apply, export

    repo = Path(__file__).resolve().parents[1]
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.run(
        [sys.executable, "run.py", "model=gemm_64", "budget.trials=8", "budget.plan_size=4", *QUICK_TIMING,
         f"hydra.run.dir={tmp_path / 'run'}", f"tracking.uri={store}", "tracking.experiment=real"],
        cwd=repo, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GFLOP/s" in proc.stdout and "MLflow:" in proc.stdout
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 8 and len({tuple(r["config"]) for r in records}) == 8
    assert {r["round"] for r in records} == {0, 1}
    client = MlflowClient(store)
    run = client.search_runs([client.get_experiment_by_name("real").experiment_id])[0]
    assert run.info.status == "FINISHED" and run.data.metrics["best/gflops_so_far"] > 0
    assert "time/build_s" in run.data.metrics and "cpu_model" in run.data.tags
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"records.jsonl", "config.yaml", "convergence.png", "best_schedules", "database"} <= artifacts
    # the tools' own CLIs are run as processes in test_tool_flags and test_e2e; here, on this real run
    apply.main([str(tmp_path / "run")])
    applied = capsys.readouterr().out
    assert "compiled; output matches the reference" in applied and "GFLOP/s" in applied
    export.main([str(tmp_path / "run")])
    exported = capsys.readouterr().out
    assert "output matches numpy" in exported and "torch" in exported
    library = tmp_path / "run" / "export" / "gemm_64.so"
    assert library.stat().st_size > 0 and "matches the reference" in exported
    # export ran its snippet copied elsewhere with its library (tuning/tools/export.py _run_snippet)
    assert "run_gemm_64.py: ran:" in exported and "us per call" in exported


def test_parallel_build_workers_keep_results_in_order():
    hardware = CPUHardware(num_threads=2, build_workers=2)
    try:
        space = hardware.space(GEMM)
        rng = np.random.default_rng(5)
        configs = list(dict.fromkeys(space.canonical(space.sample(rng)) for _ in range(5)))
        results = hardware.measure(GEMM, configs, SPEC)
        assert [r.config for r in results] == configs
        assert all(r.ok for r in results) and len(hardware.runner.builds.workers) == 2
    finally:
        hardware.close()


@pytest.mark.parametrize("task", [
    conv2d_task("depthwise", 1, 16, 14, 14, 16, 3, 1, 1, groups=16),
    conv2d_task("grouped_dilated", 2, 8, 13, 11, 12, [3, 1], [2, 1], [2, 0], dilation=[2, 1], groups=4),
    conv2d_task("asymmetric", 1, 4, 9, 12, 6, [1, 5], 1, [0, 2]),
    batch_matmul_task("bmm", 3, 16, 24, 8),
], ids=lambda t: t.name)
def test_new_shapes_compute_what_torch_computes(hardware, task):
    """The TIR of every new shape option (untuned, and one random schedule of its MetaSchedule space)
    gives torch's / numpy's answer; its output shape is the one the FLOPs were counted on."""
    import tvm

    from tuning.core.task import conv2d_output_shape, reference_output
    from tuning.hardware.tvm_space import arg_shapes, make_target, prim_func

    func = prim_func(task.workload)
    shapes = arg_shapes(func)
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, size=shape).astype(dtype) for shape, dtype in shapes[:-1]]
    expected = reference_output(task.workload, inputs)
    assert tuple(shapes[-1][0]) == expected.shape
    if task.workload["op"] == "conv2d":
        assert expected.shape[2:] == conv2d_output_shape(task.workload)
    space = hardware.space(task)
    sch, _ = hardware.schedules(task).schedule(space.canonical(space.sample(rng)))
    for mod in (tvm.IRModule({"main": func}), sch.mod):
        lib = tvm.tirx.build(mod, target=make_target(hardware.target))
        args = [tvm.runtime.tensor(a) for a in inputs] + [tvm.runtime.tensor(np.zeros(*shapes[-1]))]
        lib[lib.entry_name](*args)
        np.testing.assert_allclose(args[-1].numpy(), expected, rtol=1e-4, atol=1e-4)


def test_ctrl_c_stops_quietly_with_a_resume_hint(tmp_path):
    """Ctrl-C reaches the whole process group (the run and its build/run workers): one line saying
    where the measurements are and how to continue, no traceback from any process."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "run.py", "model=gemm_64", "budget.trials=400", "budget.plan_size=4",
                             *QUICK_TIMING, f"hydra.run.dir={run_dir}", "tracking=none"], cwd=repo,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # a suite started in the background (`make test &`, nohup) inherits SIGINT
                            # ignored, which Python keeps: the run must get it as a terminal would give it
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            env={**os.environ, "PYTHONFAULTHANDLER": "1"})  # SIGABRT: every thread's stack
    records = run_dir / "records.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (records.exists() and records.read_text().count("\n") >= 4):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGABRT)  # the run's threads' stacks, to say where it was stuck
        time.sleep(5)
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"still running 120 s after Ctrl-C; its last output and stacks:\n{stderr[-12000:]}")
    lines = records.read_text().count("\n") if records.exists() else 0  # once seen: exit 0, no word, under load
    assert proc.returncode == 130, f"{lines} records; stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
    assert f"continue with: {tunelab_command('run', f'resume={run_dir}')}" in stderr  # runs as printed
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]


def test_ctrl_c_inside_a_tvm_callback_stops_the_check_and_is_not_cached(hardware):
    """A KeyboardInterrupt raised in the decision callback TVM calls while replaying a config comes
    out of TVM as a RuntimeError; `legitimate` must not take that for "illegitimate" (CI once saw a
    run go on tuning after Ctrl-C). Injected with a trace hook: the interrupt lands inside the
    callback every time, where a real Ctrl-C lands only sometimes."""
    import sys

    import tvm_ffi

    def raises():
        raise KeyboardInterrupt

    with pytest.raises(RuntimeError):  # what the FFI does on its own: the reason for interrupts_kept
        tvm_ffi.convert(raises)()

    space = hardware.space(GEMM)
    schedules = hardware.schedules(GEMM)
    config = space.canonical(space.sample(np.random.default_rng(7)))
    schedules._scheduled.pop(config, None)

    def interrupt_in_provide(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "provide":
            raise KeyboardInterrupt
        return None

    sys.settrace(interrupt_in_provide)
    try:
        with pytest.raises(KeyboardInterrupt):
            schedules.legitimate(config)
    finally:
        sys.settrace(None)
    assert config not in schedules._scheduled
    assert schedules.legitimate(config)


def test_per_store_features_describe_the_scheduled_program(hardware):
    """TVM's PerStoreFeature on each config's schedule: 164 numbers a store, one count per task,
    different programs differ, a config TVM cannot schedule has only zero (padding) rows."""
    space = hardware.space(CONV)
    rng = np.random.default_rng(0)
    configs = [space.canonical(space.sample(rng)) for _ in range(12)]
    X = model_features(space, configs, "per_store")
    assert X.shape[0] == 12 and X.shape[2] == 164 and X.shape[1] >= 1
    assert np.abs(X[:, 0]).sum(axis=1).min() > 0  # every program has a store
    assert len({x.tobytes() for x in X}) > 6
    both = model_features(space, configs[:3], "both")
    assert both.shape == (3, X.shape[1], 164 + space.feature_width)
    schedules = hardware.schedules(CONV)
    unseen = next(c for c in (space.sample(np.random.default_rng(100 + i)) for i in range(50))
                  if c not in StoreRows.of(space).cache and c not in schedules._scheduled)
    original = schedules._schedule
    schedules._schedule = lambda config: (_ for _ in ()).throw(ValueError("cannot schedule"))
    try:
        assert not np.abs(model_features(space, [unseen], "per_store")).any()
    finally:
        schedules._schedule = original
        schedules._scheduled.pop(unseen, None)
        StoreRows.of(space).cache.pop(unseen, None)


def test_metaschedule_row_tunes_for_real(tmp_path, capsys):
    """`search=evolutionary cost_model=xgb_ms` (per-store features) on a real kernel: records, the
    search's saved state (its best measured configs) and a model fitted after its warm-up."""
    import json

    import tunelab

    tunelab.tune(["model=gemm_64", "search=evolutionary", "cost_model=xgb_ms", *QUICK_TIMING,
                  "cost_model.num_warmup_samples=4", "search.population_size=64", "budget.trials=8",
                  "budget.plan_size=2", f"output_dir={tmp_path / 'run'}", "tracking=none"])
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 8 and len({tuple(r["config"]) for r in records}) == 8
    assert {r["round"] for r in records} == {0, 1, 2, 3}  # round 0 alone is below the warm-up
    assert "GFLOP/s" in capsys.readouterr().out
    [state] = [json.loads(p.read_text()) for p in (tmp_path / "run" / "state").glob("*.json")]
    assert len(state["search"]["measured"]) == 8  # every working kernel, best first
    assert state["cost_model"]["trained_records"] >= 4  # fit once past the 4-sample warm-up


def test_a_kernel_with_a_re_laid_out_weight_is_timed_on_nonzero_data(hardware):
    """No reference exists in the re-laid-out layout, so the output goes unchecked, but the timing
    still runs on seeded uniform data: on some CPUs a kernel reads up to 100x faster on zeros."""
    import tvm

    from tuning.hardware.tvm_worker import check_and_time

    timed = []

    class Library:
        entry_name = "main"

        def __getitem__(self, name):
            return lambda *tensors: None

        def time_evaluator(self, name, dev, **options):
            def evaluate(*tensors):
                timed.append([t.numpy() for t in tensors])
                return type("Result", (), {"results": [1e-3, 1e-3]})()
            return evaluate

    reference = ([np.ones((4, 4), "float32")], np.ones((4,), "float32"))
    args = [[[2, 8], "float32"], [[4], "float32"]]  # a layout the reference does not have
    spec = {"check_correctness": True, "cv_stop": None, "cache_flush": False, "number": 1, "repeat": 2,
            "min_repeat_ms": 0, "timeout_s": 10.0, "slow_kernels": "fewer_runs"}
    result = check_and_time(Library(), tvm.cpu(0), "cpu", reference, args, spec, time.perf_counter())
    assert result["error"] is None
    [(weight, output)] = timed
    assert weight.shape == (2, 8) and np.all(weight != 0) and np.all(np.abs(weight) < 1)
    assert not output.any()
    assert "uniform" in hardware.describe()["timed_on"]  # in the store's key


def test_a_config_is_timed_on_zeros_and_on_the_uniform_data_timings_use(hardware):
    from tuning.hardware.kernel_context import zeros_and_uniform_seconds

    config = hardware.space(GEMM).canonical(hardware.space(GEMM).sample(np.random.default_rng(0)))
    zeros, uniform = zeros_and_uniform_seconds(GEMM.workload, hardware.target, config, "cpu", repeat=2,
                                               min_repeat_ms=5)
    assert 0 < zeros < 0.1 and 0 < uniform < 0.1
