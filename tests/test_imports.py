"""The package's layers hold (tests/layers.py draws them): every import in tuning/, tunelab/ and the
plugins, at module level, inside a function, or a literal `importlib.import_module(...)`, is an edge;
no edge goes up a layer, no module circle exists, only the hardware package imports TVM, and
import-linter's contract in pyproject.toml (run by `make test`) names the same layers."""
from __future__ import annotations

import tomllib

from layers import LAYERS, REPO, against_layers, circles, import_graph, imported_names, modules


def test_no_import_goes_up_a_layer():
    assert against_layers(import_graph()) == []


def test_no_import_circle_counting_dynamic_imports():
    assert circles(import_graph()) == []


def test_the_walk_finds_function_level_and_dynamic_imports_and_circles():
    graph = import_graph()
    assert "tuning.engine.loop" in graph["tuning.engine.run"]
    assert "tuning.core.networks" in graph["tuning.config.schema"]  # imported inside _check_model
    assert "tuning.store.postgres" in graph["tuning.store.open"]  # a literal import_module
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert against_layers({"tuning.core.task": {"tuning.engine.run"}}) == [("tuning.core.task", "tuning.engine.run")]


def test_only_the_hardware_package_imports_tvm():
    offenders = [module for module, path in modules().items() if not module.startswith("tuning.hardware")
                 and any(n == "tvm" or n.startswith("tvm.") for n in imported_names(path, module, False))]
    assert offenders == []


def test_import_linter_names_the_same_layers():
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layered = next(c for c in contracts if c["type"] == "layers")
    highest_first = [set(layer.replace(" ", "").split(":")) for layer in layered["layers"]]
    assert highest_first == [set(layer) for layer in reversed(LAYERS)]
