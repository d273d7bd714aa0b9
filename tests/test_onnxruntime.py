"""An ONNX model is timed beside onnxruntime: the worker's session computes what torch computes on the
same input, its calls are timed like the other variants', its output is the reference the tuned
build is checked against, and the end-to-end line and metrics carry it (no TVM here; the whole run
with TVM is tests/test_e2e.py's ONNX test, in make test-full)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tuning.core.networks import build_network
from tuning.engine.whole_model import e2e_line, e2e_metrics
from tuning.hardware import e2e, e2e_worker

pytestmark = pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")
pytest.importorskip("onnxruntime", reason="onnxruntime is the optional extra tunelab[onnxruntime] (in .[test])")


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    model, example = build_network("tiny_cnn", seed=5)
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    torch.onnx.export(model, (example,), str(path), dynamo=True, verbose=False)
    with torch.no_grad():
        return path, example.numpy(), model(example).numpy()


def test_session_computes_what_torch_computes_and_is_timed(tiny_onnx):
    path, example, expected = tiny_onnx
    side = e2e_worker.prepare_onnxruntime(str(path), example, 1)
    np.testing.assert_allclose(side["outputs"]["onnxruntime"], expected, rtol=1e-4, atol=1e-5)
    assert side["version"]
    times = e2e_worker.time_block("onnxruntime", 3, 3, 10.0)
    assert len(times) == 3 and all(t > 0 for t in times)


def test_each_timed_call_gets_its_input_written_first_unless_stale(monkeypatch):
    events = []
    monkeypatch.setitem(e2e_worker._variants, "probe", lambda: events.append("call"))
    monkeypatch.setitem(e2e_worker._input_writers, "probe", lambda: events.append("write"))
    assert len(e2e_worker.time_block("probe", 2, 2, 10.0)) == 2
    assert events == ["call", "write", "call", "write", "call"]  # the warm-up call, then each timed call
    events.clear()
    e2e_worker.time_block("probe", 2, 2, 10.0, False)
    assert events == ["call"] * 3
    verdict = {"latency_ms": {"tuned": 1.0, "untuned": 2.0}, "match": True, "reference": "untuned",
               "max_abs_diff": 0.0, "num_threads": 2, "fresh_input": False}
    assert e2e_line(verdict).endswith("[2 threads; one input, untouched between calls]")
    assert e2e_line({**verdict, "fresh_input": True}).endswith("[2 threads]")


def test_onnxruntime_is_the_reference_and_in_the_line(tiny_onnx):
    _, _, expected = tiny_onnx
    outputs = {"tuned": expected + 1e-6, "untuned": expected, "onnxruntime": expected}
    times = {"tuned": [0.002, 0.002], "onnxruntime": [0.003, 0.003], "untuned": [0.5]}
    verdict = e2e._verdict(outputs, times, 2, {"compile_tuned_s": 1.0, "compile_untuned_s": 1.0})
    assert verdict["reference"] == "onnxruntime" and verdict["match"]
    line = e2e_line(verdict)
    assert "onnxruntime 3.00 ms" in line and "speed-up vs onnxruntime 1.50x" in line
    assert e2e_metrics(verdict)["e2e/speedup_vs_onnxruntime"] == pytest.approx(1.5)
    outputs["tuned"] = expected + 1.0  # a wrong tuned build is caught against onnxruntime
    assert not e2e._verdict(outputs, times, 2, {"compile_tuned_s": 1.0, "compile_untuned_s": 1.0})["match"]
