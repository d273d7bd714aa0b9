"""The value-function method's parts without TVM: state encoding, V's training, beam search."""
from __future__ import annotations

import numpy as np
import pytest

from configs import QUICK_TIMING
from helpers import run_py_completed, tune_run
from tuning.core.space import Knob, Space
from tuning.core.task import conv2d_task, gemm_task
from tuning.hardware.synthetic import synthetic_space
from tuning.value.beam import beam_search
from tuning.value.encoding import WIDTH, children, config_of, decode, encode, is_complete, order, prefix_of, work
from tuning.value.net import KernelData, complete_errors, fit, group_of, prefix_targets, split
from value_models import synthetic_kernels


def two_sketch_space() -> Space:
    """Sketches with different slots, so a prefix's inactive slots depend on its first decision."""
    knobs = [Knob("sketch", "sketch", (0, 1)), Knob("tile.i", "tile", ((1, 8), (2, 4), (4, 2), (8, 1))),
             Knob("tile.j", "tile", ((1, 1, 4), (1, 2, 2), (2, 1, 2), (4, 1, 1), (1, 4, 1), (2, 2, 1))),
             Knob("unroll", "categorical", (0, 16, 64)), Knob("compute_at", "location", (-2, -1, 0, 1))]
    return Space(knobs, [(1, 3), (1, 2, 3, 4)])


def random_prefixes(space, rng, count):
    for _ in range(count):
        config = space.sample(rng)
        yield prefix_of(space, config, int(rng.integers(len(order(space, config[0])) + 1)))


@pytest.mark.parametrize("space", [two_sketch_space(), synthetic_space(gemm_task("g", 64, 48, 32).workload),
                                   synthetic_space(conv2d_task("c", 1, 16, 14, 14, 32, 3, padding=1).workload)],
                         ids=["two-sketch", "gemm", "conv"])
def test_a_state_decodes_to_its_prefix(space):
    rng = np.random.default_rng(0)
    prefixes = list(random_prefixes(space, rng, 200)) + [()]
    states = encode(space, prefixes)
    assert states.shape == (len(prefixes), len(space.knobs), WIDTH)
    assert [decode(space, s) for s in states] == prefixes


def test_states_of_different_prefixes_differ_and_undecided_slots_are_marked():
    space = two_sketch_space()
    everything = sorted({prefix_of(space, c, length) for c in space.enumerate()
                         for length in range(len(order(space, c[0])) + 1)})
    states = encode(space, everything)
    assert len({s.tobytes() for s in states}) == len(everything)
    [empty, sketch0] = encode(space, [(), (0,)])
    assert not empty[:, 4].any() and not empty[:, 5].any()  # nothing decided, nothing known inactive
    assert sketch0[2, 5] == 1.0 and sketch0[0, 4] == 1.0  # sketch 0 has no tile.j; its own slot decided


def test_the_same_kernel_in_two_networks_has_the_same_states():
    """States come from the kernel's space alone: two builds of one workload encode alike, another
    workload does not."""
    a = synthetic_space(conv2d_task("resnet18.layer1", 1, 64, 56, 56, 64, 3, padding=1).workload)
    b = synthetic_space(conv2d_task("other_net.conv3", 1, 64, 56, 56, 64, 3, padding=1).workload)
    c = synthetic_space(conv2d_task("wider", 1, 64, 56, 56, 128, 3, padding=1).workload)
    prefixes = list(random_prefixes(a, np.random.default_rng(1), 50))
    assert np.array_equal(encode(a, prefixes), encode(b, prefixes))
    assert not np.array_equal(encode(a, [()]), encode(c, [()]))


def test_a_prefix_target_is_the_best_measured_completion():
    space = two_sketch_space()
    configs = [config_of(space, p) for p in [(0, 1, 0), (0, 1, 2), (1, 0, 3, 1, 1)]]
    kernel = KernelData("k", space, configs, np.array([4.0, 2.0, 8.0]))
    prefixes, targets = prefix_targets(kernel)
    best = dict(zip(prefixes, 10 ** targets * work(space)))
    assert best[()] == pytest.approx(2.0) and best[(0,)] == pytest.approx(2.0) and best[(0, 1)] == pytest.approx(2.0)
    assert best[(0, 1, 0)] == pytest.approx(4.0) and best[(1,)] == pytest.approx(8.0)


def walk_kernel(space, count: int, seed: int) -> KernelData:
    """A kernel's configs as a tuner's walk leaves them: each one decision from one before it."""
    rng = np.random.default_rng(seed)
    configs = [space.sample(rng)]
    while len(configs) < count:
        config = list(configs[int(rng.integers(len(configs)))])
        slot = int(rng.choice(order(space, config[0])[1:]))
        config[slot] = int(rng.integers(space.dims[slot]))
        if tuple(config) not in configs:
            configs.append(tuple(config))
    return KernelData("walk", space, configs, rng.uniform(1.0, 2.0, len(configs)))


def test_the_held_out_configs_stay_held_out_as_the_corpus_grows_and_are_never_trained_on():
    """The improvement loop splits a grown store each round: a config trained on in one round must
    not be held out in the next (V, warm-started, has seen it), nor the other way round."""
    space = synthetic_space(conv2d_task("c", 1, 16, 14, 14, 32, 3, padding=1).workload)
    grown = walk_kernel(space, 600, seed=3)
    small = KernelData("walk", space, grown.configs[:200], grown.seconds[:200])
    reordered = np.random.default_rng(4).permutation(len(grown.configs))
    shuffled = KernelData("walk", space, [grown.configs[i] for i in reordered], grown.seconds[reordered])
    before, after = split([small], 0.2, seed=7), split([shuffled], 0.2, seed=7)
    held_before, held_after = set(before.held[0].configs), set(after.held[0].configs)
    trained_before, trained_after = set(before.train[0].configs), set(after.train[0].configs)
    assert held_before <= held_after and not trained_before & held_after and not trained_after & held_before
    assert 0.1 < len(held_after) / len(grown.configs) < 0.3
    assert split([shuffled], 0.2, seed=8).held[0].configs != after.held[0].configs  # the seed chooses


def test_no_config_trained_on_is_one_decision_from_a_held_out_config():
    """Near-duplicates (a walk's one-knob moves) stand in for a held-out config: they are grouped with it
    (the same first decisions) or left out of training."""
    space = synthetic_space(conv2d_task("c", 1, 16, 14, 14, 32, 3, padding=1).workload)
    kernel = walk_kernel(space, 400, seed=5)
    cut = split([kernel], 0.25, seed=0)
    held = np.asarray(cut.held[0].configs)
    for config in cut.train[0].configs:
        assert ((np.asarray(config)[None, :] != held).sum(axis=1) != 1).all()
    groups = {}
    for part, kernels in (("held", cut.held), ("train", cut.train)):
        for config in kernels[0].configs:
            groups.setdefault(group_of(space, config), set()).add(part)
    assert all(len(sides) == 1 for sides in groups.values())  # a group is never split
    assert cut.near == len(kernel.configs) - len(cut.train[0].configs) - len(cut.held[0].configs) > 0


def test_training_loss_falls_and_is_seeded():
    kernels = synthetic_kernels([gemm_task(f"gemm_{n}", n, n, n) for n in (32, 64)])
    net, losses = fit(kernels, hidden=32, epochs=40, lr=1e-2, batch=64, seed=0)
    assert losses[-1] < 0.8 * losses[0] and min(losses) < 0.6 * losses[0]
    _, again = fit(kernels, hidden=32, epochs=3, lr=1e-2, batch=64, seed=0)
    assert again == losses[:3]
    errors = complete_errors(net, kernels)
    assert errors["configs"] == sum(len(k.configs) for k in kernels)
    assert errors["spearman_within_kernel"] > 0.5  # it ranks a kernel's own configs


def test_beam_search_finds_the_best_completion_where_greedy_does_not():
    """A hand-made V whose cheapest first step leads away from the best complete schedule: greedy
    (beam 1) is fooled, a wide enough beam finds the exhaustive optimum."""
    space = two_sketch_space()
    complete = [p for p in (prefix_of(space, c, len(order(space, c[0]))) for c in space.enumerate())]
    best = (1, 3, 5, 2, 0)

    def value(space, prefixes):
        out = []
        for p in prefixes:
            if is_complete(space, p):
                out.append(0.0 if p == best else 1.0 + 0.01 * sum(p))
            else:
                out.append(0.5 if p[:1] == (0,) else 0.9)  # sketch 0 looks better than it is
        return np.array(out)

    greedy = beam_search(space, value, beam=1)
    assert greedy[0][1][0] == 0 and greedy[0][1] != config_of(space, best)
    wide = beam_search(space, value, beam=len(complete))
    assert wide[0] == (0.0, config_of(space, best))
    scores = [s for s, _ in wide]
    assert scores == sorted(scores)


def test_beam_search_from_a_prefix_keeps_it_and_noise_needs_a_seeded_rng():
    space = two_sketch_space()

    def value(space, prefixes):
        return np.array([float(sum(p)) for p in prefixes])

    found = beam_search(space, value, beam=2, prefix=(1, 2))
    assert all(config[0] == 1 and config[1] == 2 for _, config in found)
    assert found[0][1] == config_of(space, (1, 2, 0, 0, 0))
    with pytest.raises(ValueError, match="rng"):
        beam_search(space, value, noise=0.1)
    one = beam_search(space, value, beam=2, noise=0.5, rng=np.random.default_rng(3))
    assert one == beam_search(space, value, beam=2, noise=0.5, rng=np.random.default_rng(3))
    assert len(children(space, ())) == 2


# ---- registry, search=value in runs ---------------------------------------------------------------------
def test_a_registered_value_function_loads_back_with_the_same_values(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from tuning.tracking.registry import RegistryError, register, resolve
    from tuning.value.net import load_value, log_value, shape_tag

    registry = f"sqlite:///{tmp_path / 'mlflow.db'}"
    task = gemm_task("g", 64, 64, 64)
    net, _ = fit(synthetic_kernels([task]), hidden=8, layers=2, epochs=2, seed=0)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the model's files go beside the store, not under the CWD of whoever trained it
    reference = register(lambda mlflow: log_value(mlflow, net, "vf"), "vf", registry, "value", {}, {}, shape_tag(net))
    assert reference == "models:/vf/1" and resolve("vf", registry).tags["tunelab.kind"] == "value"
    experiment = MlflowClient(tracking_uri=registry).get_experiment_by_name("value")
    assert experiment.artifact_location.startswith((tmp_path / "mlartifacts").as_uri())
    assert not list(elsewhere.iterdir())
    loaded = load_value("vf", registry)
    assert (loaded.hidden, loaded.layers) == (8, 2)
    space = synthetic_space(task.workload)
    prefixes = list(random_prefixes(space, np.random.default_rng(0), 20))
    assert np.array_equal(net.value(space, prefixes), loaded.value(space, prefixes))
    register(lambda mlflow: log_value(mlflow, net, "vf"), "vf", registry, "value", {}, {},
             {**shape_tag(net), "tunelab.value_net": '{"hidden": 9}'})
    with pytest.raises(RegistryError, match="tunelab.value_net"):
        load_value("vf/2", registry)


SYNTHETIC = ("hardware=synthetic", "tracking=none")


def test_budget_zero_applies_the_value_functions_choice_without_a_record(tmp_path, monkeypatch, capsys):
    from value_models import shared_value_model

    reference, registry = shared_value_model()
    value = ("model=gemm_64", "search=value", f"search.model={reference}", f"search.registry={registry}")
    run_dir = tune_run(tmp_path, monkeypatch, *SYNTHETIC, *value, "budget.trials=0")
    done = capsys.readouterr().out
    assert "chosen without measuring, predicted" in done and "measurements 0" in done
    assert (run_dir / "records.jsonl").read_text() == ""
    tune_run(tmp_path / "measured", monkeypatch, *SYNTHETIC, *value, "search.greedy=false", "search.beam=4",
             "budget.trials=24", "budget.plan_size=8")
    assert "measurements 24" in capsys.readouterr().out


@pytest.mark.parametrize("overrides, message", [
    (("search=sa", "budget.trials=0"), "budget.trials: 0 measurements needs a search that schedules without measuring"),
    (("search=value", "search.model=models:/absent/1"), "search.model: no registered model"),
    (("search=value", "search.model=x", "search.beam=4"), "search.beam: 4 with search.greedy=true"),
    (("budget.trials=-1",), "budget.trials"),
])
def test_bad_value_search_configs_are_rejected_before_any_work(compose_cfg, overrides, message, tmp_path):
    from tuning.config import ConfigError
    from tuning.engine.validate import validate

    registry = f"search.registry=sqlite:///{tmp_path / 'r.db'}" if "search=value" in overrides else "seed=0"
    with pytest.raises(ConfigError, match=message):
        validate(compose_cfg("model=gemm_64", "hardware=synthetic", "tracking=none", *overrides, registry))


@pytest.mark.parametrize("overrides", [("search=value", "search.model=models:/absent/1"),
                                       ("cost_model=xgb_ms", "cost_model.features=knobs",
                                        "cost_model.pretrained=models:/absent/1")])
def test_a_registered_model_is_not_needed_to_re_log_a_run(compose_cfg, overrides, tmp_path):
    """`tuning.tools.sync` re-logs a restored run whose model is not in this machine's registry."""
    from tuning.config import ConfigError
    from tuning.core.component import local_checks_only
    from tuning.engine.validate import validate

    group = overrides[0].split("=")[0]
    cfg = compose_cfg("model=gemm_64", "hardware=synthetic", "tracking=none", *overrides,
                      f"{group}.registry=sqlite:///{tmp_path / 'r.db'}")
    with pytest.raises(ConfigError, match=f"{group}.*no registered model"):
        validate(cfg)
    with local_checks_only():
        validate(cfg)
    cfg.seed = -1
    with local_checks_only(), pytest.raises(ConfigError, match="seed"):  # the config's own rules still hold
        validate(cfg)


def test_run_py_refuses_a_value_search_without_its_model(tmp_path):
    done = run_py_completed(*SYNTHETIC, f"hydra.run.dir={tmp_path / 'run'}", "model=gemm_64", "search=value",
                            f"search.registry=sqlite:///{tmp_path / 'r.db'}", timeout=600)
    assert done.returncode == 2 and "search.model: required" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "run" / "records.jsonl").exists()


# ---- real TVM: train on a store, schedule a network with no measurement -----------------------------------
def in_process(main, argv):
    """A command's `main(argv)` run in this process, as its process would end: (exit status, stdout, stderr);
    a SystemExit message is status 1 and goes to stderr, as the interpreter does it."""
    import contextlib
    import io
    import subprocess

    out, err, status = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as stopped:
            code = stopped.code
            status = 0 if code is None else code if isinstance(code, int) else 1
            if not isinstance(code, (int, type(None))):
                print(code, file=err)
    return subprocess.CompletedProcess(argv, status, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def scheduled_network(tmp_path_factory):
    """`python -m tuning.tools.value train` on a store of real TVM spaces (made-up seconds: a landscape in the
    inner tile of i), then `run.py model=tiny_cnn search=value budget.trials=0`, both in this process:
    (run folder, outputs)."""
    import tunelab
    from test_transfer import fill_store
    from tuning.hardware.cpu import CPUHardware
    from tuning.tools.value import main as value_main

    tmp_path = tmp_path_factory.mktemp("value_network")
    store, other, hardware = tmp_path / "store.sqlite", tmp_path / "other.sqlite", CPUHardware(num_threads=2)
    kernels = [(gemm_task(f"gemm_{n}", n, n, n), 40) for n in (32, 64)]

    def seconds(task, config):
        decisions = hardware.space(task).decisions(config)
        return 1e-4 * (1 + abs(list(decisions.values())[1][-1] - 4))

    fill_store(store, hardware, kernels, seconds)
    fill_store(other, hardware, [(gemm_task("gemm_48", 48, 48, 48), 40)], seconds)  # another "network"
    registry = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # the refused call stops at --holdout, before the registry
    bad = in_process(value_main, ["train", "--store", str(store), "--tracking-uri", registry, "--holdout", "resnet*"])
    train = in_process(value_main, ["train", "--store", str(store), "--tracking-uri", registry, "--name", "v",
                                    "--epochs", "5", "--holdout-store", str(other)])
    # timing: QUICK_TIMING's short repeats (each chosen kernel is timed once; no reading is checked)
    run = in_process(tunelab.tune, ["model=tiny_cnn", "search=value", "search.model=models:/v/1",
                                    f"search.registry={registry}", "budget.trials=0", "tracking=none", *QUICK_TIMING,
                                    # applied and checked against torch below, once (the run's own end-to-end
                                    # step calls the same hardware.evaluate_model: tests/test_replay_models.py)
                                    "e2e.enabled=false", "e2e.runs=5", "e2e.min_runs=1", "e2e.max_seconds=2",
                                    f"output_dir={tmp_path / 'run'}"])
    return tmp_path / "run", train, bad, run


@pytest.mark.tvm
def test_value_train_then_a_network_scheduled_with_zero_trials(scheduled_network):
    """The trained network schedules every kernel of tiny_cnn without a measurement; the result is
    applied and matches torch."""
    from tuning.tools import apply

    run_dir, train, bad, run = scheduled_network
    assert train.returncode == 0, train.stderr[-3000:]
    assert "trained on 2 kernels" in train.stdout and "heldout kernels: r2_log_seconds" in train.stdout
    assert "registered models:/v/1" in train.stdout
    assert bad.returncode != 0 and "--holdout: no kernel matches resnet*" in bad.stderr
    assert run.returncode == 0, run.stderr[-3000:]
    assert "scheduled 7 kernels without measuring" in run.stderr + run.stdout
    assert (run_dir / "records.jsonl").read_text() == ""
    assert (run_dir / "database" / "database_tuning_record.json").read_text().count("\n") >= 5
    applied = in_process(apply.main, [str(run_dir)])
    assert applied.returncode == 0 and "outputs match torch" in applied.stdout, applied.stderr[-3000:]


@pytest.mark.tvm
@pytest.mark.slow  # the profiler's report is checked fast (tests/test_probe_space.py); this is the real run
def test_a_scheduled_network_is_profiled(scheduled_network):
    import subprocess
    import sys
    from pathlib import Path

    run_dir = scheduled_network[0]
    repo = Path(__file__).resolve().parents[1]
    profile = subprocess.run([sys.executable, "experiments/profile_model.py", str(run_dir), "--runs", "2"],
                             cwd=repo, capture_output=True, text=True, timeout=600)
    assert profile.returncode == 0, profile.stderr[-3000:]
    assert "vm.builtin.alloc_storage" in profile.stdout and "uninstrumented latency" in profile.stdout
    assert "(0 functions)" not in profile.stdout.split("tuned kernels")[1].splitlines()[0]


# ---- Algorithm 2: the improvement loop ----------------------------------------------------------------------
def improve(tmp_path, *extra) -> list[str]:
    """`python -m tuning.tools.value improve ...`'s arguments, for its main in this process."""
    from value_models import shared_value_model

    reference, registry = shared_value_model()
    return ["improve", "--model", reference, "--tracking-uri", registry, "--store", str(tmp_path / "store.sqlite"),
            "--network", "gemm_64", "conv2d", "--schedules", "2", "--epochs", "2",
            "--name", f"improved-{tmp_path.name}", "--out", str(tmp_path / "loop"), "--override", "hardware=synthetic",
            *extra]


def test_the_improvement_loop_measures_into_the_store_registers_each_round_and_resumes(tmp_path, capsys):
    import json

    from tuning.store import connect_store
    from tuning.tools.value import main
    from tuning.tracking.registry import resolve
    from value_models import shared_value_model

    main(improve(tmp_path, "--rounds", "1"))
    first = capsys.readouterr().out
    assert "round 1:" in first and "greedy_latency_ms/gemm_64" in first
    store = connect_store(tmp_path / "store.sqlite")
    rows = store.count()
    store.close()
    assert rows > 2
    main(improve(tmp_path, "--rounds", "1"))  # the same command again: nothing left to do
    again = capsys.readouterr().out
    assert "round 1:" not in again and "1 rounds done" in again
    main(improve(tmp_path, "--rounds", "2"))  # continues with round 2, from round 1's V
    second = capsys.readouterr().out
    assert "round 2:" in second and "round 1:" not in second
    progress = json.loads((tmp_path / "loop" / "progress.json").read_text())
    assert progress["rounds_done"] == 2 and progress["model"].endswith("/2")
    _, registry = shared_value_model()
    version = resolve(progress["model"], registry)
    assert version.tags["tunelab.round"] == "2" and version.tags["tunelab.kind"] == "value"
    with pytest.raises(SystemExit) as other:
        main(improve(tmp_path, "--rounds", "3", "--model", "models:/elsewhere/1"))
    assert "not --model models:/elsewhere/1" in str(other.value.code)


def test_the_improvement_loop_never_trains_on_what_any_round_holds_out(tmp_path, monkeypatch):
    """Each round refits V from the last round's weights on a grown store: the configs and kernels held
    out are the same in every round and never trained on in any."""
    from tuning.tools.value import parse_args
    from tuning.tools.value_improve import improve as improve_loop
    from tuning.value import net as value_net
    from value_models import shared_value_model

    trained, held = [], []
    real_fit, real_split = value_net.fit, value_net.split

    def recording_split(kernels, fraction, seed):
        cut = real_split(kernels, fraction, seed)
        held.append({(k.name, c) for k in cut.held for c in k.configs})
        return cut

    def recording_fit(kernels, *args, **kwargs):
        trained.append({(k.name, c) for k in kernels for c in k.configs})
        return real_fit(kernels, *args, **kwargs)

    monkeypatch.setattr(value_net, "split", recording_split)
    monkeypatch.setattr(value_net, "fit", recording_fit)
    reference, registry = shared_value_model()
    improve_loop(parse_args(["improve", "--model", reference, "--tracking-uri", registry, "--store",
                             str(tmp_path / "store.sqlite"), "--network", "gemm_64", "conv2d", "--schedules", "2",
                             "--epochs", "2", "--rounds", "3", "--val-fraction", "0.5", "--holdout", "gemm*",
                             "--name", f"held-{tmp_path.name}", "--out", str(tmp_path / "loop"),
                             "--override", "hardware=synthetic"]))
    assert len(trained) == len(held) == 3 and all(trained) and held[0]
    assert not set().union(*trained) & set().union(*held)
    assert not any(name.startswith("gemm") for name, _ in set().union(*trained))  # --holdout: in no round
    assert held[0] <= held[1] <= held[2]  # the store grows; what was held out stays held out


def test_improvement_loop_arguments_are_checked(tmp_path, capsys):
    from tuning.tools.value import main
    from value_models import shared_value_model

    reference, registry = shared_value_model()
    command = ["improve", "--model", reference, "--tracking-uri", registry, "--store", str(tmp_path / "store.sqlite"),
               "--network", "gemm_64", "conv2d", "--schedules", "2", "--epochs", "2", "--out", str(tmp_path / "loop"),
               "--override", "hardware=synthetic"]
    for extra, message in ((["--noise", "nan"], "--noise"), (["--override", "search=sa"], "--override: only hardware")):
        with pytest.raises(SystemExit) as stopped:
            main([*command, *extra])
        assert stopped.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        main([*command, "--holdout", "resnet*"])
    assert "--holdout: no kernel matches resnet*" in str(stopped.value.code)
    assert not (tmp_path / "store.sqlite").exists()  # refused before any round


def test_a_choice_that_fails_is_not_applied():
    """budget.trials=0: a kernel whose chosen schedule does not run stays untuned and says why."""
    from types import SimpleNamespace

    from tuning.engine.loop import schedule_without_measuring
    from tuning.evaluator.fixed import FixedEvaluator
    from tuning.hardware.synthetic import SyntheticHardware

    class Chooses:
        def __init__(self, config):
            self.config = config

        def best(self, space, cost_model, rng):
            return self.config(space), 1e-3

    hardware = SyntheticHardware(invalid_register_tile=2)  # most register tiles fail
    task = gemm_task("g", 64, 64, 64)
    space = hardware.space(task)
    failing = next(c for c in space.enumerate() if not hardware.measure(task, [c], _spec())[0].ok)
    working = next(c for c in space.enumerate() if hardware.measure(task, [c], _spec())[0].ok)
    outcomes = schedule_without_measuring(
        [task, task], lambda i: SimpleNamespace(search=Chooses(lambda s: (failing, working)[i]), hardware=hardware,
                                                evaluator=FixedEvaluator(), cost_model=None), seed=0)
    assert outcomes[0].best_config is None and "its choice failed" in outcomes[0].stopped_because
    assert outcomes[1].best_config == working and outcomes[1].predicted_cost == 1e-3
    assert outcomes[1].best_cost > 0 and not outcomes[1].records


def _spec():
    from tuning.core.measure import MeasureSpec

    return MeasureSpec(repeat=1)
