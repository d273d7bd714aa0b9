"""The package drawn as rooms and floors: every import in tuning/, tunelab/ and hydra_plugins/ (at module
level, inside a function, and `importlib.import_module("literal")`) as an edge, the layer each module
belongs to, and the counts docs/architecture.md gives.

    python tests/layers.py                 # counts of this checkout
    python tests/layers.py --tree DIR      # of another checkout (e.g. a `git worktree` of an old commit)

A room is a package folder, or a module directly under tuning/ (a loose module is a room of its own);
an arrow is one room importing another; a floor is a room's height in the rooms' graph with every
circle of rooms collapsed into one; an arrow against the layers imports from a higher layer.
"""
from __future__ import annotations

import argparse
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("tuning", "tunelab", "hydra_plugins")

# Lowest first; a module may import only from its own layer or below (siblings in one layer may import
# each other: a search imports a cost model's contract, the replay hardware the store). The same order
# is import-linter's contract in pyproject.toml; tests/test_imports.py checks they agree.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("tuning.core",),
    ("tuning.config",),
    ("tuning.store",),
    ("tuning.search", "tuning.sampler", "tuning.cost_model", "tuning.evaluator", "tuning.scheduler",
     "tuning.value", "tuning.hardware", "tuning.tracking"),
    ("tuning.engine",),
    ("tuning.sweep", "tuning.cluster", "tuning.study"),
    ("tuning.testing", "tuning.tools"),
    ("tunelab",),  # and hydra_plugins, which only Hydra imports
)

# The old names' import hook: it imports a new home only when its old name is asked for, so the names
# in its table are not its dependencies.
ALIAS_TABLE = "tuning.core.moved"
# A checkout from before the rooms: its modules placed on the layers of their new homes.
ENTRY_POINTS = {"tuning.__main__": "tunelab", "tuning": "tuning.core"}


def modules(repo: Path = REPO) -> dict[str, Path]:
    found = {}
    for root in ROOTS:
        for path in (repo / root).rglob("*.py"):
            parts = path.relative_to(repo).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _absolute(module: str, is_package: bool, level: int, name: str) -> str:
    if not level:
        return name
    parts = module.split(".")
    anchor = parts[: len(parts) - level + (1 if is_package else 0)]
    return ".".join(anchor + ([name] if name else []))


def imported_names(path: Path, module: str, is_package: bool, known: frozenset[str] = frozenset()) -> set[str]:
    """Every dotted name an import statement names, and in a file that calls `import_module` or
    `__import__`, every string that names one of the `known` modules (`"tuning.store.postgres"`, a
    `_target_`'s `"tuning.x.Class"`, the package before an f-string's `{}`): its dynamic imports."""
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.level, node.module or "")
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names | (dynamic_imports(tree, known) if known and module != ALIAS_TABLE else set())


def dynamic_imports(tree: ast.AST, known: frozenset[str]) -> set[str]:
    if not any(_calls_import(node) for node in ast.walk(tree)):
        return set()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.split(":")[0]
            while text and text not in known and "." in text:
                text = text.rsplit(".", 1)[0]
            if text in known and text.split(".")[0] in ROOTS and "." in text:
                found.add(text)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            prefix = str(node.values[0].value)
            if prefix.endswith(".") and prefix[:-1] in known:
                found |= {name for name in known if name.startswith(prefix)}
    return found


def _calls_import(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) in ("import_module", "__import__")


def import_graph(repo: Path = REPO) -> dict[str, set[str]]:
    """module -> the lab's modules it imports. A package's __init__ counts as imported with it, except by
    a module inside that package (Python initialises a module's own packages before it runs)."""
    known = modules(repo)
    graph = {}
    for module, path in known.items():
        edges = set()
        own_packages = {".".join(module.split(".")[:i]) for i in range(1, len(module.split(".")))}
        for name in imported_names(path, module, path.name == "__init__.py", frozenset(known)):
            parts = name.split(".")
            on_the_way = {".".join(parts[:i]) for i in range(1, len(parts))} - own_packages
            edges |= (on_the_way | {name}) & known.keys()
        graph[module] = edges - {module} - own_packages  # its own packages are initialised before it runs
    return graph


def layer_of(module: str) -> int | None:
    from tuning.core.moved import new_name

    home = ENTRY_POINTS.get(module) or new_name(module)
    best = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if home == prefix or home.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    return best[0] if best else None


def against_layers(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Each import of a module from a higher layer than its own."""
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if layer_of(a) is not None and layer_of(b) is not None and layer_of(b) > layer_of(a))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def room_of(module: str, packages: set[str]) -> str:
    if module in packages:
        return module
    parent = module.rsplit(".", 1)[0]
    return module if parent == "tuning" else parent


def room_graph(graph: dict[str, set[str]], packages: set[str]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        room = room_of(module, packages)
        rooms.setdefault(room, set())
        rooms[room] |= {room_of(t, packages) for t in targets} - {room}
    return rooms


def floors(rooms: dict[str, set[str]]) -> int:
    """How many storeys the rooms stand on: the longest chain of arrows, a circle of rooms as one."""
    merged = {room: room for room in rooms}
    for part in circles(rooms):
        for room in part:
            merged[room] = part[0]
    dag: dict[str, set[str]] = {}
    for room, targets in rooms.items():
        dag.setdefault(merged[room], set()).update(merged[t] for t in targets if merged[t] != merged[room])
    height: dict[str, int] = {}

    def storey(room: str) -> int:
        if room not in height:
            height[room] = 1 + max((storey(t) for t in dag.get(room, ())), default=0)
        return height[room]

    return max(storey(room) for room in dag)


def counts(repo: Path = REPO) -> dict:
    known = modules(repo)
    packages = {m for m, p in known.items() if p.name == "__init__.py"}
    graph = import_graph(repo)
    rooms = room_graph(graph, packages)
    folders: dict[str, int] = {}
    for module, path in known.items():
        if path.name != "__init__.py" and module.startswith("tuning."):
            folder = str(path.parent.relative_to(repo))
            folders[folder] = folders.get(folder, 0) + 1
    arrows = sum(len(t) for t in rooms.values())
    folder_of = {m: str(p.parent.relative_to(repo)) for m, p in known.items()}
    folder_arrows = {(folder_of[a], folder_of[b]) for a, targets in graph.items() for b in targets
                     if folder_of[a] != folder_of[b]}
    room_circles = circles(rooms)
    return {
        "modules": len(known),
        "folders": dict(sorted(folders.items())),
        "loose": folders.get("tuning", 0),
        "rooms": len(rooms),
        "floors": floors(rooms),
        "arrows": arrows,
        "folder_arrows": len(folder_arrows),
        "against": against_layers(graph),
        "circles": circles(graph),
        "room_circles": room_circles,
        "dynamic": sum(len(dynamic_imports(ast.parse(p.read_text()), frozenset(known)) - {m}) for m, p in known.items()
                       if m != ALIAS_TABLE),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=REPO, help="a checkout's root (default: this one)")
    found = counts(parser.parse_args(argv).tree)
    print(f"modules {found['modules']}, of them loose in tuning/ {found['loose']}")
    print(f"rooms {found['rooms']} on {found['floors']} floors, {found['arrows']} arrows between rooms")
    print(f"folders {len(found['folders'])}, {found['folder_arrows']} arrows between folders")
    print(f"literal dynamic imports {found['dynamic']}")
    print(f"arrows against the layers {len(found['against'])}:")
    for a, b in found["against"]:
        print(f"    {a} -> {b}")
    print(f"module circles {len(found['circles'])}: {found['circles']}")
    print(f"room circles {len(found['room_circles'])}: {found['room_circles']}")
    print("modules per folder:")
    for folder, n in found["folders"].items():
        print(f"    {folder:<28} {n}")


if __name__ == "__main__":
    main()
