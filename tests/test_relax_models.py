"""Whole networks through Relax: import, batch norm folding, task extraction, task keys."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import tvm
import tvm_ffi

from tuning.core.networks import build_network
from tuning.hardware.relax_models import (
    design_spaces,
    extract_tasks,
    import_network,
    tasks_as_json,
    tasks_from_json,
    workload_key,
)

pytestmark = [pytest.mark.tvm,
              pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")]

TARGET = {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(), "num-cores": 2}
# Observed with apache-tvm 0.27.0.post1 (deterministic): distinct fused kernels per network.
TASK_COUNTS = {"resnet18": 22, "alexnet": 13, "vgg16": 19, "squeezenet1_0": 33, "mobilenet_v2": 33,
               "bert_encoder_layer": 15}


def param_shapes(task):
    return [tuple(int(d) for d in p.shape) for p in task.mod["main"].params]


@pytest.fixture(scope="module")
def resnet18():
    model, example = build_network("resnet18", seed=0)
    mod = import_network(model, example, TARGET)
    return model, example, mod, extract_tasks(mod, TARGET)


def test_resnet18_tasks(resnet18):
    *_, tasks = resnet18
    assert len(tasks) == TASK_COUNTS["resnet18"]
    # 20 convolutions + max-pool + mean + reshape + classifier, all called once per distinct kernel
    assert sum(t.weight for t in tasks) == 24
    assert sum(t.weight * t.flops for t in tasks) == pytest.approx(3.64e9, rel=0.01)
    convs = [t for t in tasks if "conv2d" in t.name]
    assert len(convs) == 18 and min(t.flops for t in convs) > max(t.flops for t in tasks if t not in convs)
    # batch norm folded into the convolutions' weights, relu fused into them: no elementwise tasks left
    assert not [t for t in tasks if any(op in t.name for op in ("batch_norm", "subtract", "divide", "sqrt"))]
    assert not [t for t in tasks if "conv2d" not in t.name and "relu" in t.name]
    # the four 3x3 64->64 convs at 56x56: two kernels (with and without the residual add), twice each
    layer1 = [t for t in tasks if param_shapes(t)[:2] == [(1, 64, 56, 56), (64, 64, 3, 3)]]
    assert sorted(t.weight for t in layer1) == [2, 2]
    for task in layer1:
        assert task.flops == pytest.approx(2 * 64 * 64 * 9 * 56 * 56, rel=0.005)  # 231 MFLOP + epilogue
    assert tasks[0] in layer1  # largest weight x FLOPs first
    keys = [t.key for t in tasks]
    assert len(set(keys)) == len(keys) and all(len(k) == 16 for k in keys)


def test_tasks_round_trip_through_json(resnet18):
    *_, tasks = resnet18
    described = json.loads(json.dumps(tasks_as_json(tasks)))
    for task, back in zip(tasks, tasks_from_json(described), strict=True):
        assert tvm_ffi.structural_equal(back.mod, task.mod)
        assert workload_key(back.mod) == task.key
        assert (back.name, back.weight, back.flops) == (task.name, task.weight, task.flops)


def test_keys_equal_in_another_process(resnet18):
    """The key identifies a kernel across runs: recomputed in a fresh interpreter from the JSON."""
    *_, tasks = resnet18
    chosen = [tasks[0], tasks[-1]]
    script = ("import json, sys, tvm; from tuning.hardware.relax_models import workload_key;"
              "print(json.dumps([workload_key(tvm.ir.load_json(t)) for t in json.load(sys.stdin)]))")
    result = subprocess.run([sys.executable, "-c", script], input=json.dumps([tvm.ir.save_json(t.mod) for t in chosen]),
                            capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [t.key for t in chosen]


def test_design_spaces_of_biggest_task(resnet18):
    *_, tasks = resnet18
    spaces = design_spaces(tasks[0], TARGET)
    assert len(spaces) == 3  # multi-level tiling: write cache at two levels, or none
    kinds = {inst.kind.name for inst in spaces[0].trace.insts}
    assert {"SamplePerfectTile", "SampleCategorical"} <= kinds


def test_imported_module_matches_torch(resnet18):
    """The folded batch norm computes what torch computes (untuned build, ~2 s to run)."""
    from tvm import relax

    model, example, mod, _ = resnet18
    vm = relax.VirtualMachine(tvm.compile(mod, tvm.target.Target(TARGET)), tvm.cpu())
    output = vm["main"](tvm.runtime.tensor(example.numpy()))
    output = output[0] if not hasattr(output, "numpy") else output
    with torch.no_grad():
        expected = model(example).numpy()
    np.testing.assert_allclose(output.numpy(), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["alexnet", "vgg16", "squeezenet1_0", "mobilenet_v2", "bert_encoder_layer"])
def test_network_imports_and_extracts(name):
    model, example = build_network(name, seed=0)
    tasks = extract_tasks(import_network(model, example, TARGET), TARGET)
    assert len(tasks) == TASK_COUNTS[name]
    assert all(t.weight >= 1 and t.flops >= 0 for t in tasks)
    assert len(tasks_from_json(tasks_as_json(tasks))) == len(tasks)
    assert design_spaces(tasks[0], TARGET)
    assert any(op in tasks[0].name for op in ("conv2d", "matmul"))


@pytest.mark.slow
def test_same_kernel_same_key_across_networks():
    """AlexNet's and VGG-16's 4096x4096 classifier layer is one workload under two task names."""
    keys = {}
    for name in ("alexnet", "vgg16"):
        model, example = build_network(name, seed=0)
        keys[name] = {t.key: t.name for t in extract_tasks(import_network(model, example, TARGET), TARGET)
                      if [(1, 4096), (4096, 4096)] == param_shapes(t)[:2]}
    assert len(keys["alexnet"]) == 1 and keys["alexnet"].keys() == keys["vgg16"].keys()


def test_pooling_kernels_are_scheduled_without_a_warning(resnet18, capfd):
    """TOPI's pooling blocks name a custom rule no CPU registers; tunelab registers MetaSchedule's
    own fallback (drop the annotation) under that name: the same sketches as without it, and no
    C++ warning. "Without" runs in a fresh interpreter that never registers the fallback."""
    *_, tasks = resnet18
    pools = [t for t in tasks if "pool" in t.name]
    assert pools
    script = ("import json, sys, tvm; from tvm.s_tir import meta_schedule as ms;"
              "from tuning.hardware.tvm_space import fast_tensor_intrin_import, make_target;"
              "fast_tensor_intrin_import();"
              "target = make_target(json.loads(sys.argv[1]));"
              "mods = [tvm.ir.load_json(m) for m in json.load(sys.stdin)];"
              "print(json.dumps([[str(s.trace) for s in ms.TuneContext(mod=m, target=target, task_name='t',"
              " space_generator=ms.space_generator.PostOrderApply(), rand_state=0).generate_design_space()]"
              " for m in mods]))")
    without = subprocess.run([sys.executable, "-c", script, json.dumps(TARGET)], capture_output=True, text=True,
                             input=json.dumps([tvm.ir.save_json(t.mod) for t in pools]), check=True, timeout=300)
    assert "Unknown schedule rule" in without.stderr  # the warning this test is about
    capfd.readouterr()
    with_fallback = [[str(s.trace) for s in design_spaces(task, TARGET)] for task in pools]
    assert "Unknown schedule rule" not in capfd.readouterr().err
    assert with_fallback == json.loads(without.stdout.strip().splitlines()[-1])
