"""The package's import graph has no circle: every import statement in tuning/ and the sweeper plugin,
at module level or inside a function, is an edge; a package's __init__ counts as imported with it,
except by a module inside that package (Python initialises a module's own packages before it)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("tuning", "hydra_plugins")


def modules() -> dict[str, Path]:
    found = {}
    for root in ROOTS:
        for path in (REPO / root).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_names(path: Path, module: str, is_package: bool) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph = {}
    for module, path in known.items():
        edges = set()
        own_packages = {".".join(module.split(".")[:i]) for i in range(1, len(module.split(".")))}
        for name in imported_names(path, module, path.name == "__init__.py"):
            parts = name.split(".")
            # the packages on the way are imported too, but a module's own packages are already being
            # imported when it runs (tuning/store/base.py naming tuning.store.base is no edge to tuning.store)
            on_the_way = {".".join(parts[:i]) for i in range(1, len(parts))} - own_packages
            edges |= (on_the_way | {name}) & known.keys()
        graph[module] = edges - {module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_walk_finds_function_level_imports_and_circles():
    graph = import_graph()
    assert "tuning.loop" in graph["tuning.run"]
    assert "tuning.networks" in graph["tuning.config"]  # imported inside _check_model
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_only_the_hardware_package_imports_tvm():
    graph_sources = modules()
    offenders = [module for module, path in graph_sources.items() if not module.startswith("tuning.hardware")
                 and any(n == "tvm" or n.startswith("tvm.") for n in imported_names(path, module, False))]
    assert offenders == []
