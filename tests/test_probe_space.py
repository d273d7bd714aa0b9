"""experiments/probe_space.py: variants of a run's best config, and the table's arithmetic (no TVM)."""
import pytest

from tuning.config import ConfigError
from tuning.core.space import Knob, Space


def tiny_space() -> Space:
    """Two sketches: the second has a compute location instead of the unroll knob."""
    knobs = [Knob("sketch", "sketch", (0, 1)), Knob("tile0", "tile", ((1, 8), (2, 4), (4, 2), (8, 1))),
             Knob("categorical1", "categorical", (0, 1, 2, 3)), Knob("location2", "location", (-2, -1, 0, 1))]
    return Space(knobs, [(1, 2), (1, 3)])


def test_a_variant_sets_knobs_by_value(experiment_script):
    probe = experiment_script("probe_space")
    space = tiny_space()
    assert probe.with_settings(space, (0, 0, 0, 0), {"tile0": "4x2", "categorical1": "3"}) == (0, 2, 3, 0)
    assert probe.with_settings(space, (0, 1, 2, 0), {}) == (0, 1, 2, 0)
    # the sketch first, whatever the order given: then its own knobs are the ones that can be set
    assert probe.with_settings(space, (0, 0, 0, 0), {"location2": "3", "sketch": "1"}) == (1, 0, 0, 3)
    shown = probe.describe(space, (0, 2, 3, 0))
    assert "4x2" in shown and "categorical1" in shown and "location2" not in shown


@pytest.mark.parametrize("settings, named", [({"tile9": "4x2"}, "tile9"), ({"tile0": "3x3"}, "tile0=3x3"),
                                             ({"location2": "1"}, "location2"),  # not a knob of sketch 0
                                             ({"tile0": "4xa"}, "tile0=4xa"), ({"categorical1": "4"}, "categorical1"),
                                             ({"categorical1": "-1"}, "categorical1")])
def test_a_variant_outside_the_space_names_the_knob(experiment_script, settings, named):
    probe = experiment_script("probe_space")
    with pytest.raises(ConfigError, match=named):
        probe.with_settings(tiny_space(), (0, 0, 0, 0), settings)


@pytest.mark.parametrize("variants", [["nocolon"], [":tile0=1x8"], ["found:tile0=1x8"], ["torch:tile0=1x8"],
                                      ["a:tile0"], ["a:=3"], ["a:tile0=1x8,"], ["a:tile0=1x8", "a:tile0=2x4"]])
def test_malformed_variants_are_rejected_before_any_work(experiment_script, variants, tmp_path):
    probe = experiment_script("probe_space")
    with pytest.raises(SystemExit):
        probe.parse_args([str(tmp_path), *(f"--variant={v}" for v in variants)])


def test_ratios_are_paired_within_a_process(experiment_script):
    probe = experiment_script("probe_space")
    # process 2 is slower for every kernel (the host's process-level mode), torch alike
    results = [{"flop": 2e9, "errors": {}, "seconds": {"found": [2.0, 2.0], "wide": [1.0, 1.0], "torch": [1.0, 1.0]}},
               {"flop": 2e9, "errors": {"bad": "not legitimate"},
                "seconds": {"found": [4.0, 4.0], "wide": [2.0, 2.0], "torch": [1.0, 1.0]}}]
    table = probe.table(results)
    wide = next(line for line in table.splitlines() if line.strip().startswith("wide"))
    assert "2.00x [2.00, 2.00]" in wide  # vs found: paired, so the slow process does not spread it
    assert "0.75x [0.50, 1.00]" in wide  # vs torch: median and range over processes
    assert "bad" in table and "not legitimate" in table


# ---- run folders it refuses, before any process starts --------------------------------------------
@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    import subprocess
    import sys
    from pathlib import Path

    run_dir = tmp_path_factory.mktemp("probe") / "run"
    subprocess.run([sys.executable, "run.py", "model=gemm_64", "hardware=synthetic", "search=random", "cost_model=none",
                    "budget.trials=8", "tracking=none", f"hydra.run.dir={run_dir}"],
                   cwd=Path(__file__).resolve().parents[1], check=True, capture_output=True, timeout=300)
    return run_dir


def crafted(run_dir, tmp_path, change):
    import shutil

    import yaml

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns(".tunelab.lock"))
    cfg = yaml.safe_load((copy / "config.yaml").read_text())
    change(cfg)
    (copy / "config.yaml").write_text(yaml.safe_dump(cfg))
    return copy


def refusal(probe, *argv) -> str:
    with pytest.raises(SystemExit) as stopped:
        probe.main([str(a) for a in argv])
    return str(stopped.value)


def test_runs_without_kernels_to_build_are_refused_naming_the_key(experiment_script, synthetic_run, tmp_path):
    from pathlib import Path

    import yaml

    probe = experiment_script("probe_space")
    assert "hardware" in refusal(probe, synthetic_run, "--list")
    conf = Path(__file__).resolve().parents[1] / "conf" / "model"
    cpu = yaml.safe_load((conf.parent / "hardware" / "cpu.yaml").read_text())
    cpu.pop("defaults")  # a saved config holds the composed node: its runner, no defaults list
    cpu["runner"] = yaml.safe_load((conf.parent / "hardware" / "runner" / "local.yaml").read_text())
    whole = crafted(synthetic_run, tmp_path, lambda cfg: cfg.update(
        model=yaml.safe_load((conf / "tiny_cnn.yaml").read_text()), hardware=cpu))
    assert refusal(probe, whole, "--list").startswith("tunelab: model:")
    marker = tmp_path / "executed"
    hostile = crafted(synthetic_run, tmp_path / "h", lambda cfg: cfg["search"].update(
        {"_target_": "subprocess.getoutput", "cmd": f"touch {marker}"}))
    assert "search._target_" in refusal(probe, hostile, "--list") and not marker.exists()
    assert "config.yaml" in refusal(probe, tmp_path / "nothing", "--list")
    screen = experiment_script("data_dependence")  # the same opening (tuning.tools.export.open_tvm_run)
    assert refusal(screen, synthetic_run).startswith("tunelab: hardware:")
    assert "search._target_" in refusal(screen, hostile) and not marker.exists()


def test_rotated_passes_time_each_once_a_pass_in_a_rotated_order():
    from tuning.hardware.tvm_export import rotated_passes

    calls, passes_seen = [], []
    timers = {name: (lambda n=name: calls.append(n) or float(len(calls))) for name in "abc"}
    seconds = rotated_passes(timers, 4, after_pass=lambda step, s: passes_seen.append((step, len(s["a"]))))
    assert calls == list("abc" "bca" "cab" "abc")
    assert list(seconds) == list("abc") and seconds["b"] == [2.0, 4.0, 9.0, 11.0]
    assert passes_seen == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_profile_report_splits_tuned_kernels_from_the_rest(experiment_script):
    profile = experiment_script("profile_model")
    calls = {"fused_conv2d_add_relu_prepacked": [2e-3, 4e-3], "mean": [1e-3, 1e-3], "vm.builtin.alloc_storage": [1e-5, 3e-5]}
    text = profile.report({"calls": calls, "whole": [8e-3, 8e-3], "plain": [6e-3, 7e-3]},
                          {"fused_conv2d_add_relu", "mean"}, threads=2)
    assert "uninstrumented latency    6.500" in text and "tuned kernels             4.000  (2 functions)" in text
    assert "everything else           0.020  (1 functions)" in text
    outside = text.split("calls outside the tuned kernels")[1].split("tuned kernels (")[0]
    assert "vm.builtin.alloc_storage" in outside and "fused_conv2d" not in outside


def test_in_model_table_names_each_step_between_contexts(experiment_script):
    in_model = experiment_script("in_model")
    from tuning.hardware.kernel_context import CONTEXTS

    per_call = dict(zip(CONTEXTS, (100e-6, 120e-6, 100e-6, 110e-6, 130e-6, 150e-6, 112e-6, 180e-6, 198e-6, 200e-6),
                        strict=True))
    result = {"setting": "no_spin", "threads": 2, "flush_s": 0.02, "plain_s": [0.020, 0.022, 0.021],
              "estimate_s": 0.015, "reread_s": [0.020, 0.022], "tuner_s": {"k_prepacked": 90e-6}, "tasks": {"k_prepacked": "k"},
              "predicted_s": {"k_prepacked": 100e-6},
              "counts": {"k_prepacked": 2},
              "readings": {"k_prepacked": {c: [v, v * 1.5, v * 0.9] for c, v in per_call.items()} | {"alone": [100e-6]}}}
    text = in_model.setting_table(result)
    assert "### no_spin (2 threads; one flush 20 ms)" in text
    assert ("Model: 21.00 ms a run (median of 3); the run's estimate 15.00 ms: model / estimate 1.40; with the "
            "kernels below at their args_flushed readings 15.04 ms: model / that 1.40. The estimate re-read in "
            "this process (every task's best timed as the run's evaluator times it, weighted by calls; before and "
            "after the contexts) 20.00, 22.00 ms: model / that 1.00.") in text
    row = next(line for line in text.splitlines() if line.startswith("| k |"))
    assert row == "| k | 2 | 90.0 | 100.0 | 100.0 | 120.0 | 100.0 | 110.0 | 130.0 | 150.0 | 112.0 | 180.0 | 198.0 | 200.0 | 1.80 | 1.80 |"
    assert ("In the model against the run's prediction (each task's best re-measured at the run's end; "
            "in_model / predicted): geomean 1.800, range 1.80-1.80; 0 of 1 kernels within 1.05.") in text
    del result["predicted_s"]  # a run folder from before the per-task final metrics: the tuning's best reading
    assert "(the best reading during tuning where the run folder has no re-measured per-task value; " \
           "in_model / predicted): geomean 2.000" in in_model.setting_table(result)
    steps = {line.split(" | ")[0][2:]: line.split(" | ")[1] for line in text.splitlines() if line.startswith("| ") and "(" in line}
    assert steps["the other kernels between calls (in_model / model_only)"] == "1.607"
    assert steps["in the model against alone (in_model / alone)"] == "1.800"
    assert steps["the kernel's arguments cold, its input warm (args_flushed / alone)"] == "1.200"
    assert steps["in the model against its arguments flushed (in_model / args_flushed)"] == "1.500"
    assert steps["cold caches, every level (flushed / idle)"] == "1.154"
    assert steps["the model's input not written between runs (stale_input / in_model)"] == "1.100"


def test_in_model_refuses_a_run_without_a_database(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "experiments/in_model.py", str(tmp_path)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 2 and "has no database/" in done.stderr
    bad = subprocess.run([sys.executable, "experiments/in_model.py", str(tmp_path), "--kernels", "0"],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert bad.returncode == 2 and "--kernels: must be >= 1" in bad.stderr
