"""Fuzzing every loader of untrusted files with seeded mutations of a real run folder.

A tiny real run (synthetic hardware, gemm_64, a measurement store) gives the inputs: config.yaml,
records.jsonl, tasks.json, best_configs.json, state/<key>.json and the store's sqlite rows. Each input is one seeded
mutation of one of them (keys deleted, duplicated or swapped, types changed, `_target_`s of callables
that would create a canary file, interpolations, huge and non-finite numbers, unicode, truncation,
byte flips, nesting bombs, rows and tables changed with SQL) and goes, in this process, through the
loaders the lab reads that file with, as resume / apply / sync / compare / dataset import do.

Every input runs in a folder of its own, with HOME, TMPDIR and the working directory inside it and
the run folder copy on a read-only bind mount where mounting is permitted. Its outcome is either
accepted, or refused with the lab's own error (ConfigError, RecordError, StoreError, SystemExit
"tunelab: ...") whose message names the file or the key. Anything else is collected, never stopped
at: another exception (a traceback), a canary file created (on loading, or on instantiating what an
accepted config names, as the lab does next), a write outside the run folder copy or into it, a
changed store, a config accepted with an interpolation or an unregistered `_target_`, a hang. The
test fails with one line per distinct finding (loader, what, where it was raised, an input's seed
and mutation that reproduces it).

`make test` runs FAST_INPUTS inputs; the slow variant (`make test-full`) runs SLOW_INPUTS and prints
the counts.

What other machines hand over is fuzzed the same way: a GPU pack's manifest.json and readings.jsonl
(read_manifest, valid_reading, import_pack), a pack archive (gpu_pack.unpack) and a campaign's
archive (campaign_archive.open_view, the `--table-only --archive` reading), each mutated in its
content and, for the archives, in their tar members (names leaving the folder, links and devices,
headers declaring huge sizes, duplicates, modes, the compressed bytes). The outcome is accepted or
refused with PackError / ArchiveError naming the file; an import stores no reading its store's
readers would skip nor one measured outside the pack's window; a refused extraction leaves its scratch
folder empty, an accepted one writes only under the folder it returns (PACK_INPUTS inputs).
"""
from __future__ import annotations

import contextlib
import copy
import ctypes
import hashlib
import io
import json
import math
import os
import re
import shutil
import signal
import sqlite3
import tarfile
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
FAST_INPUTS = 60
SLOW_INPUTS = 600
KINDS = ("config", "records", "tasks", "state", "store", "chosen")
INPUT_LIMIT_S = 60  # one input longer than this is a hang, stopped...
SLOW_INPUT_S = 5.0  # ...and one longer than this a finding: a file of a few bytes should not cost seconds
HEAVY_SEEDS = 10_000  # inputs from this seed on (the slow variant) may draw the heaviest bombs
SECRET = "fuzz-secret-7f3a"  # an environment value no accepted config may carry
_current = {"canaries": None}  # the input being loaded: where the canary resolver writes


# ---- the run folder the inputs come from ---------------------------------------------------------
@dataclass
class Original:
    folder: Path  # the real run's folder (paths in config.yaml and tasks.json name it)
    store: Path
    files: dict  # name in the run folder -> bytes
    state_name: str  # state/<key>.json
    store_bytes: bytes
    store_key: tuple
    task_key: str


def _consistent_copy(source: Path, target: Path) -> None:
    """A sqlite file as one self-contained WAL-mode file (no -wal beside it)."""
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    src.backup(dst)
    src.close()
    dst.execute("PRAGMA journal_mode=WAL")
    dst.close()


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Original:
    from hydra import compose, initialize_config_dir

    from tuning.config import register
    from tuning.engine.run import main

    root = tmp_path_factory.mktemp("fuzz_source")
    folder, store = root / "run", root / "store" / "store.sqlite"
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"output_dir={folder}", "hardware=synthetic", "model=gemm_64",
                                           "tracking=none", f"hardware.store={store}", "budget.trials=24"])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(cfg)
    [state] = (folder / "state").glob("*.json")
    files = {name: (folder / name).read_bytes() for name in ("config.yaml", "records.jsonl", "tasks.json",
                                                             "best_configs.json", "run.yaml")}
    files[f"state/{state.name}"] = state.read_bytes()
    _consistent_copy(store, root / "clean.sqlite")
    [task] = json.loads(files["tasks.json"])
    return Original(folder, store, files, f"state/{state.name}", (root / "clean.sqlite").read_bytes(),
                    tuple(task["store_key"]), task["key"])


@pytest.fixture(scope="module")
def canary_resolver():
    """`${canary:}`: an interpolation with a side effect, standing for any resolver a process has
    registered; resolving it creates a canary file."""
    from omegaconf import OmegaConf

    def touch():
        Path(_current["canaries"], "resolver").touch()
        return "resolved"

    OmegaConf.register_new_resolver("canary", touch)
    yield
    OmegaConf.clear_resolver("canary")


# ---- one input's folder --------------------------------------------------------------------------
@dataclass
class Input:
    seed: int
    kind: str
    work: Path
    run: Path  # the run folder copy (its files mutated)
    store: Path  # the store copy (mutated for kind store)
    canaries: Path
    mutation: str = ""

    @property
    def victim(self) -> Path:
        return self.work / "outside" / "victim.sqlite"  # someone else's sqlite file


def lay_out(orig: Original, work: Path, seed: int, kind: str) -> Input:
    item = Input(seed, kind, work, work / "run", work / "store" / "store.sqlite", work / "canaries")
    for folder in ("run/state", "store", "home", "cwd", "tmp", "scratch", "canaries/dir", "outside", "other"):
        (work / folder).mkdir(parents=True, exist_ok=True)
    for name, data in orig.files.items():
        (item.run / name).write_bytes(_relocated(data, orig, item))
    item.store.write_bytes(orig.store_bytes)
    victim = sqlite3.connect(item.victim)
    victim.execute("CREATE TABLE notes(text TEXT)")
    victim.execute("INSERT INTO notes VALUES ('not a measurement store')")
    victim.commit()
    victim.close()
    return item


def _relocated(data: bytes, orig: Original, item: Input) -> bytes:
    """Paths of the real run rewritten to this input's copies."""
    return (data.replace(str(orig.store).encode(), str(item.store).encode())
            .replace(str(orig.folder).encode(), str(item.run).encode()))


# ---- mutations ---------------------------------------------------------------------------------------
def canary_nodes(item: Input) -> dict:
    """A `_target_` per callable that creates a file when the node is instantiated."""
    c = item.canaries
    path = lambda name: {"_target_": "pathlib.Path", "_args_": [str(c / name)]}  # noqa: E731
    return {
        "shutil.copyfile": {"_target_": "shutil.copyfile", "src": str(item.run / "config.yaml"),
                            "dst": str(c / "copyfile")},
        "os.makedirs": {"_target_": "os.makedirs", "name": str(c / "makedirs")},
        "builtins.exec": {"_target_": "builtins.exec",
                          "_args_": [f"open({str(c / 'exec')!r}, 'w').close()"]},
        "builtins.open": {"_target_": "builtins.open", "file": str(c / "open"), "mode": "w"},
        "pathlib.Path.touch": {"_target_": "pathlib.Path.touch", "_args_": [path("touch")]},
        "tuning.engine.run_folder.mark_status": {"_target_": "tuning.engine.run_folder.mark_status",
                                          "out_dir": {"_target_": "pathlib.Path", "_args_": [str(c / "dir")]},
                                          "status": "RUNNING"},
        "subprocess.run": {"_target_": "subprocess.run", "args": ["touch", str(c / "subprocess")]},
    }


CANARY_TARGETS = frozenset(canary_nodes(Input(0, "", Path("/"), Path("/"), Path("/"), Path("/"))))


def canary_files(item: Input) -> list[Path]:
    return [p for p in item.canaries.rglob("*") if p != item.canaries / "dir"]


JUNK = [None, True, False, 0, -1, 1, 1.5, "", "junk", " ", [], {}, [1, 2], {"a": 1}, [[[]]], "0", "1e3",
        "true", "null", "\u202e\u0000", "💥" * 3, "\udc80", "x" * 100_000, "../../../etc/passwd", "~/x",
        10 ** 400, -10 ** 400, 2 ** 63, -(2 ** 63) - 1, 1e308, -1e308, 5e-324, -0.0]
NUMBERS = [0, -0.0, -1, -1e-9, 1e-320, 5e-324, 1e308, 10 ** 30, 10 ** 400, -(10 ** 400), 2 ** 63, 2 ** 64,
           float("nan"), float("inf"), float("-inf"), 0.5, True]
STRINGS = ["", " ", "\u0000", "\u202eevil", "💥", "\udc80", "é" * 10_000, "a/b", "../..", "/etc/passwd",
           "${oc.env:HOME}", "nan", "inf", "-1", "[1]", "{}", "\n", "x" * 1_000_000]
BOMB = "__nesting_bomb__"
INTERPOLATIONS = ["${canary:}", "${oc.env:FUZZ_SECRET}", "x${oc.env:FUZZ_SECRET}y", "${oc.env:HOME}", "${seed}",
                  "${..seed}", "${hydra:runtime.output_dir}", "${now:%Y}", "${oc.decode:'{a: 1}'}",
                  "${oc.create:{a: 1}}", "${oc.select:nothing,${canary:}}", "${", "${}", "${a.b", "\\${escaped}",
                  "${oc.env:FUZZ_SECRET,${canary:}}"]


class Tree:
    """A parsed document (dicts and lists) with its nodes addressed by paths."""

    def __init__(self, root):
        self.holder = {"root": root}

    @property
    def root(self):
        return self.holder["root"]

    def paths(self, want=None) -> list[tuple]:
        found = []

        def walk(node, path):
            if want is None or want(node):
                found.append(path)
            children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
            for key, child in children:
                walk(child, path + (key,))

        walk(self.root, ())
        return found

    def parent(self, path):
        keys, node = ("root",) + tuple(path), self.holder
        for key in keys[:-1]:
            node = node[key]
        return node, keys[-1]

    def get(self, path):
        parent, key = self.parent(path)
        return parent[key]

    def set(self, path, value):
        parent, key = self.parent(path)
        parent[key] = value


def pick(rng, values):
    return values[int(rng.integers(len(values)))]


def dicts(tree: Tree):
    return tree.paths(lambda n: isinstance(n, dict))


def leaves(tree: Tree, kinds=(str, int, float, bool, type(None))):
    return [p for p in tree.paths(lambda n: isinstance(n, kinds)) if p]


def show(path) -> str:
    return ".".join(map(str, path)) or "<root>"


def short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:45] + f"... ({len(text)} chars)"


# structural mutations of a parsed document; each mutates `tree` and says what it did
def m_delete_key(rng, tree, item):
    paths = [p for p in tree.paths() if p and isinstance(tree.parent(p)[0], dict)]
    path = pick(rng, paths)
    parent, key = tree.parent(path)
    del parent[key]
    return f"delete {show(path)}"


def m_duplicate_key(rng, tree, item):
    path = pick(rng, [p for p in dicts(tree) if tree.get(p)])
    node = tree.get(path)
    key = pick(rng, list(node))
    node["__duplicate__"] = pick(rng, JUNK[:16])
    tree.duplicate = str(key)
    return f"duplicate key {show(path + (key,))} = {short(node['__duplicate__'])}"


def m_swap_values(rng, tree, item):
    path = pick(rng, [p for p in dicts(tree) if len(tree.get(p)) >= 2])
    node = tree.get(path)
    a, b = rng.choice(list(node), size=2, replace=False)
    node[a], node[b] = node[b], node[a]
    return f"swap {show(path + (a,))} <-> {b}"


def m_change_type(rng, tree, item):
    path = pick(rng, tree.paths())
    value = pick(rng, JUNK)
    tree.set(path, value)
    return f"set {show(path)} = {short(value)}"


def m_number(rng, tree, item):
    paths = leaves(tree, (int, float)) or tree.paths()
    path, value = pick(rng, paths), pick(rng, NUMBERS)
    tree.set(path, value)
    return f"number {show(path)} = {short(value)}"


def m_string(rng, tree, item):
    paths = leaves(tree, (str,)) or tree.paths()
    path, value = pick(rng, paths), pick(rng, STRINGS)
    tree.set(path, value)
    return f"string {show(path)} = {short(value)}"


def m_nesting_bomb(rng, tree, item):
    path, depth = pick(rng, tree.paths()), pick(rng, [64, 5_000, 100_000])
    tree.set(path, BOMB)
    tree.bomb = "[" * depth + "]" * depth if rng.random() < 0.5 else '{"a": ' * depth + "1" + "}" * depth
    return f"nesting bomb depth {depth} at {show(path)}"


def m_wide(rng, tree, item):
    path, width = pick(rng, tree.paths()), pick(rng, [1_000, 20_000])
    tree.set(path, {f"k{i}": i for i in range(width)} if rng.random() < 0.5 else list(range(width)))
    return f"{width} children at {show(path)}"


# config only
def m_canary_target(rng, tree, item):
    name, node = pick(rng, sorted(canary_nodes(item).items()))
    group = pick(rng, ["search", "sampler", "evaluator", "cost_model", "hardware", "tracking", "scheduler",
                       "model"])
    places = {
        "group": lambda: tree.root.__setitem__(group, node),
        "target of a group": lambda: tree.root.__setitem__(group, {**(tree.root.get(group) or {}), **node}),
        "param": lambda: (tree.root.get(group) or {}).__setitem__("extra", node),
        "hardware.backend": lambda: tree.root["hardware"].__setitem__("backend", node),
        "_args_ of a group": lambda: tree.root[group].__setitem__("_args_", [node]),
        "list": lambda: tree.root["objective"].__setitem__("metrics", [node]),
        "top level": lambda: tree.root.__setitem__("callbacks", node),
        "hydra": lambda: tree.root.__setitem__("hydra", {"callbacks": {"x": node}}),
        "deep": lambda: tree.root["budget"].__setitem__("trials", {"a": {"b": [node]}}),
    }
    where = pick(rng, sorted(places))
    if not isinstance(tree.root, dict) or not isinstance(tree.root.get(group), dict):
        tree.root.update({group: {}}) if isinstance(tree.root, dict) else None
    places[where]()
    return f"canary {name} at {where} ({group})"


def m_instantiation_keys(rng, tree, item):
    path = pick(rng, [p for p in dicts(tree)])
    key, value = pick(rng, [("_partial_", True), ("_recursive_", False), ("_convert_", "all"), ("_args_", [1]),
                            ("_target_", "junk.nothing"), ("_target_", 5), ("_target_", "tuning.engine.run_folder.claim"),
                            ("_target_", "tuning.config.ConfigError"), ("_target_", "os.system"),
                            ("_target_", "tuning..x"), ("_target_", "tuning.search.sa.SimulatedAnnealing")])
    tree.get(path)[key] = value
    return f"{show(path + (key,))} = {short(value)}"


def m_interpolation(rng, tree, item):
    paths = leaves(tree) or tree.paths()
    path, value = pick(rng, paths), pick(rng, INTERPOLATIONS)
    tree.set(path, value)
    return f"interpolation {show(path)} = {value}"


def m_path_retarget(rng, tree, item):
    target = pick(rng, [str(item.victim), str(item.work / "outside" / "new.sqlite"), "~/x.sqlite", "relative.sqlite",
                        str(item.work / "outside"), f"sqlite:///{item.victim}", f"sqlite:///{item.work}/outside/m.db"])
    key = pick(rng, [("hardware", "store"), ("tracking", "uri"), ("tuning", "database"), ("resume",),
                     ("output_dir",), ("model", "path")])
    node = tree.root
    for part in key[:-1]:
        node = node.setdefault(part, {}) if isinstance(node, dict) else {}
    if isinstance(node, dict):
        node[key[-1]] = target
    return f"{'.'.join(key)} = {target}"


# records only
def m_record_edge(rng, tree, item):
    key, value = pick(rng, [
        (("result", "costs"), [0.0]), (("result", "costs"), [-1e-3]), (("result", "costs"), [1e-320]),
        (("result", "costs"), [1e308, 1e308]), (("result", "costs"), []), (("result", "error"), "build"),
        (("result", "error"), "nope"), (("result", "config"), [-1]), (("config",), [-1, 10 ** 30]),
        (("config",), []), (("index",), -5), (("round",), 10 ** 30), (("time",), -1.0), (("seed",), -1),
        (("workload_key",), ""), (("result", "reused"), 1), (("result", "gauge_s"), -1.0),
        (("result", "build_s"), -1.0), (("decisions",), {"x": [1e308] * 3}), (("result", "costs"), [True]),
        (("task",), "\udc80"), (("result", "message"), "fewer_runs" + "x" * 100_000)])
    node = tree.root
    if isinstance(node, dict) and all(isinstance(node.get(k), dict) for k in key[:-1]):
        for part in key[:-1]:
            node = node[part]
        node[key[-1]] = value
    return f"{'.'.join(key)} = {short(value)}"


# tasks.json only
def m_store_retarget(rng, tree, item):
    rows = tree.root if isinstance(tree.root, list) else []
    row = rows[0] if rows and isinstance(rows[0], dict) else {}
    key, value = pick(rng, [
        ("store", str(item.victim)), ("store", str(item.work / "outside" / "new.sqlite")), ("store", "~/x.sqlite"),
        ("store", "relative.sqlite"), ("store", str(item.work / "outside")), ("store", 5), ("store", None),
        ("store", [str(item.store)]), ("store", str(item.run / "config.yaml")), ("store", ""),
        ("store_key", [1, 2, 3]), ("store_key", "abc"), ("store_key", 5), ("store_key", ["a"] * 5),
        ("store_key", [{"a": 1}, [], None]), ("store_key", []), ("flops", "1e400"), ("flops", 0), ("weight", 1e308),
        ("weight", float("inf")), ("key", 5), ("name", ["x"])])
    row[key] = value
    return f"tasks[0].{key} = {short(value)}"


# best_configs.json only
def m_chosen_edge(rng, tree, item):
    rows = tree.root if isinstance(tree.root, list) else []
    row = rows[0] if rows and isinstance(rows[0], dict) else {}
    key, value = pick(rng, [
        ("task", 5), ("task", "no such task"), ("task", None), ("config", [1.5]), ("config", [True]),
        ("config", [10 ** 30]), ("config", [-1] * 5), ("config", []), ("config", "1,2"), ("config", [[1]]),
        ("config", {"a": 1}), ("costs", []), ("costs", [0]), ("costs", [-1e-5]), ("costs", ["1e-5"]),
        ("costs", [float("nan")]), ("costs", [float("inf")]), ("costs", [1e308]), ("costs", [True]),
        ("costs", 1e-5), ("costs", [1e-5] * 100_000)])
    row[key] = value
    return f"chosen[0].{key} = {short(value)}"


# state only
def m_state_edge(rng, tree, item):
    root = tree.root if isinstance(tree.root, dict) else {}
    key, value = pick(rng, [
        (("rng", "bit_generator"), "MT19937"), (("rng", "bit_generator"), "os.system"), (("rng", "state", "state"), -1),
        (("rng", "state", "state"), 2 ** 200), (("rng", "state", "inc"), "x"), (("rng", "state"), None),
        (("rng",), []), (("round",), -1), (("round",), 10 ** 30), (("round",), 1.5), (("round",), "1"),
        (("search", "points"), [["x"]]), (("search", "points"), [[1e308]]), (("search", "points"), 5),
        (("search", "points"), [[-1, -2, -3, -4, -5]]), (("search",), None), (("cost_model",), [1]),
        (("cost_model",), {"booster": "not base64"})])
    node = root
    for part in key[:-1]:
        node = node.setdefault(part, {}) if isinstance(node, dict) else {}
    if isinstance(node, dict):
        node[key[-1]] = value
    return f"{'.'.join(key)} = {short(value)}"


# text of any file
def t_truncate(rng, data):
    cut = int(rng.integers(len(data) + 1))
    return data[:cut], f"truncated at byte {cut} of {len(data)}"


def t_flip(rng, data):
    data = bytearray(data)
    count = int(rng.integers(1, 9))
    for _ in range(count):
        if data:
            data[int(rng.integers(len(data)))] ^= int(rng.integers(1, 256))
    return bytes(data), f"{count} byte flips"


def t_insert(rng, data):
    junk = pick(rng, [b"\x00", b"\xff\xfe", b"\xef\xbb\xbf", b"\r", b"\n", b"{", b"[", b"]", b"}", b"\"", b":",
                      b"- ", b"!!python/object/apply:os.system ['true']", b"&a ", b"*a", b"%TAG", b"\t", b"NaN"])
    at = int(rng.integers(len(data) + 1))
    return data[:at] + junk + data[at:], f"inserted {junk!r} at byte {at}"


def t_replace(rng, data):
    new = pick(rng, [b"", b" ", b"\n", b"null", b"[]", b"{}", b"42", b"\"text\"", b"\xef\xbb\xbf" + data,
                     data.replace(b"\n", b"\r\n"), b"\x00" * 1000, bytes(range(256)), b"- a\n- b\n",
                     b"!!python/object/apply:os.system ['touch canary']\n", b"[" * 100_000, b"{\"a\":" * 50_000,
                     b"a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
                     b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c]\n"
                     b"e: [*d, *d, *d, *d, *d, *d, *d, *d]\n"])
    return new, f"replaced by {short(new)}"


def t_yaml_tag(rng, data):
    tag = pick(rng, [b"!!python/object/apply:os.system", b"!!python/name:os.system", b"!!binary", b"!!set",
                     b"!!omap", b"!!timestamp", b"!custom"])
    text = data.replace(b"seed: 0", b"seed: " + tag + b" 'x'", 1)
    return text, f"seed tagged {tag.decode()}"


def t_alias_bomb(rng, data, item):
    levels = int(rng.integers(2, 6 if item.seed >= HEAVY_SEEDS else 4))
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return data + ("\n".join(["extra:"] + ["  " + line for line in lines]) + "\n").encode(), \
        f"alias bomb 10^{levels} leaves under extra"


TREE_MUTATIONS = [m_delete_key, m_duplicate_key, m_swap_values, m_change_type, m_number, m_string, m_nesting_bomb,
                  m_wide]
TEXT_MUTATIONS = [t_truncate, t_flip, t_insert, t_replace]
KIND_MUTATIONS = {
    "config": TREE_MUTATIONS + [m_canary_target] * 6 + [m_instantiation_keys] * 2 + [m_interpolation] * 3
    + [m_path_retarget] + TEXT_MUTATIONS + [t_yaml_tag, t_alias_bomb],
    "records": TREE_MUTATIONS + [m_record_edge] * 4 + TEXT_MUTATIONS,
    "tasks": TREE_MUTATIONS + [m_store_retarget] * 4 + TEXT_MUTATIONS,
    "state": TREE_MUTATIONS + [m_state_edge] * 3 + TEXT_MUTATIONS,
    "chosen": TREE_MUTATIONS + [m_chosen_edge] * 4 + TEXT_MUTATIONS,
}


def dump(kind: str, tree: Tree) -> bytes:
    """The document as its file holds it; a nesting bomb and a duplicate key are spliced into the text
    (no serialiser writes them)."""
    marker = "__duplicate__"
    if kind == "config":
        text = yaml.safe_dump(tree.root, sort_keys=False, allow_unicode=True, width=1 << 30)
        text = text.replace(f"{marker}:", f"{json.dumps(getattr(tree, 'duplicate', marker))}:")
    else:
        text = json.dumps(tree.root)
        text = text.replace(f'"{marker}":', f"{json.dumps(getattr(tree, 'duplicate', marker))}:")
    text = text.replace(BOMB, getattr(tree, "bomb", BOMB), 1)
    return text.encode("utf-8", "surrogatepass")


def file_of(kind: str, orig: Original) -> str:
    return {"config": "config.yaml", "records": "records.jsonl", "tasks": "tasks.json",
            "chosen": "best_configs.json", "state": orig.state_name}[kind]


def mutate_file(rng, item: Input, orig: Original) -> None:
    name = file_of(item.kind, orig)
    path = item.run / name
    data = path.read_bytes()
    mutation = pick(rng, KIND_MUTATIONS[item.kind])
    if mutation is t_alias_bomb:
        data, what = mutation(rng, data, item)
    elif mutation.__name__.startswith("t_"):
        data, what = mutation(rng, data)
    elif item.kind == "records":
        lines = data.splitlines(keepends=True)
        at = int(rng.integers(len(lines)))
        tree = Tree(json.loads(lines[at]))
        what = f"line {at + 1}: {mutation(rng, tree, item)}"
        lines[at] = dump("records", tree) + b"\n"
        data = b"".join(lines)
    else:
        loaded = yaml.safe_load(data) if item.kind == "config" else json.loads(data)
        tree = Tree(loaded)
        what = mutation(rng, tree, item)
        data = dump(item.kind, tree)
    path.write_bytes(data)
    item.mutation = f"{name}: {mutation.__name__[2:]}: {what}"


def m_records_lines(rng, item: Input) -> None:
    path = item.run / "records.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    i, j = int(rng.integers(len(lines))), int(rng.integers(len(lines)))
    op = pick(rng, ["delete", "duplicate", "swap", "blank", "junk", "torn", "nul", "long", "array", "crlf"])
    if op == "delete":
        del lines[i]
    elif op == "duplicate":
        lines.insert(j, lines[i])
    elif op == "swap":
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "blank":
        lines.insert(i, b"\n")
    elif op == "junk":
        lines.insert(i, b"not json\n")
    elif op == "torn":
        lines[-1] = lines[-1][: int(rng.integers(1, len(lines[-1])))]
    elif op == "nul":
        lines[i] = b"\x00" * 64 + b"\n"
    elif op == "long":
        lines.insert(i, b"{\"task\": \"" + b"x" * 5_000_000 + b"\"}\n")
    elif op == "array":
        lines[i] = b"[" + lines[i].rstrip(b"\n") + b"]\n"
    else:
        lines = [line.replace(b"\n", b"\r\n") for line in lines]
    path.write_bytes(b"".join(lines))
    item.mutation = f"records.jsonl: lines: {op} (line {i + 1}, {j + 1})"


# ---- store mutations (SQL on the copy, then bytes) -----------------------------------------------------
STORE_TEXT = ["", "junk", "null", "[", "{\"a\":", "NaN", "[NaN]", "[Infinity]", "[-Infinity]", "[-1]", "[0]",
              "[1e-320]", "[true]", "[\"x\"]", "[1e999]", "[" * 5_000 + "]" * 5_000, "[" * 100_000, "[1.5]", "[-5, 2]",
              "[99999999999999999999999]", "{}", "[[1]]", "\"text\"", "x" * 1_000_000, b"\xff\xfe\x00",
              b"[0.001]", 5, 1.5, -1, None]
STORE_NUMBERS = [-1.0, 0.0, 1e308, float("inf"), float("-inf"), 5e-324, 2 ** 63 - 1, -(2 ** 63), "NaN", "abc",
                 b"\x00\x01", "1e-3", None]
READING_TEXT = ("config", "costs", "decisions", "error", "message", "source", "hardware", "task", "space")
READING_NUMBERS = ("build_s", "run_s", "gauge_s", "measured_at")


def _loosen(conn, table: str) -> None:
    """The table without its NOT NULL constraints (a file written by anything may hold NULLs)."""
    columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
    conn.execute(f"CREATE TABLE loose AS SELECT * FROM {table}")
    conn.execute(f"DROP TABLE {table}")
    conn.execute(f"CREATE TABLE {table}({', '.join(columns)})")
    conn.execute(f"INSERT INTO {table} SELECT * FROM loose")
    conn.execute("DROP TABLE loose")


def s_reading_text(rng, conn, item):
    column, value = pick(rng, READING_TEXT), pick(rng, STORE_TEXT)
    where = pick(rng, ["", " WHERE id = (SELECT min(id) FROM readings)"])
    if value is None:
        _loosen(conn, "readings")
    conn.execute(f"UPDATE readings SET {column} = ?{where}", (value,))
    return f"readings.{column} = {short(value)} ({'every row' if not where else 'first row'})"


def s_reading_number(rng, conn, item):
    column, value = pick(rng, READING_NUMBERS), pick(rng, STORE_NUMBERS)
    if value is None:
        _loosen(conn, "readings")
    conn.execute(f"UPDATE readings SET {column} = ?", (value,))
    return f"readings.{column} = {short(value)}"


def s_other_table(rng, conn, item):
    table, column, value = pick(rng, [("tasks", "name"), ("tasks", "flops"), ("tasks", "workload"),
                                      ("hardware", "description"), ("spaces", "size"), ("meta", "value")]) + \
        (pick(rng, STORE_TEXT + STORE_NUMBERS),)
    if value is None:
        _loosen(conn, table)
    conn.execute(f"UPDATE {table} SET {column} = ?", (value,))
    return f"{table}.{column} = {short(value)}"


def s_schema(rng, conn, item):
    change = pick(rng, [
        "DROP TABLE readings", "DROP TABLE tasks", "DROP TABLE hardware", "DROP TABLE spaces", "DROP TABLE meta",
        "DELETE FROM meta", "DROP INDEX readings_key",
        "ALTER TABLE readings RENAME COLUMN costs TO costs_old", "ALTER TABLE readings DROP COLUMN source",
        "ALTER TABLE tasks RENAME COLUMN flops TO size", "ALTER TABLE hardware RENAME TO hardware_old",
        "ALTER TABLE readings RENAME TO readings_old; CREATE VIEW readings AS SELECT * FROM readings_old",
        "UPDATE readings SET costs = config, config = costs",
        "UPDATE readings SET hardware = task, task = hardware",
        "INSERT INTO readings SELECT NULL, hardware, task, space, config, decisions, costs, error, message, "
        "build_s, run_s, gauge_s, measured_at, source FROM readings",
        "CREATE TABLE extra(x); INSERT INTO extra VALUES (1)",
        "CREATE TRIGGER wipe AFTER INSERT ON meta BEGIN DELETE FROM readings; END; DELETE FROM meta"])
    conn.executescript(change)
    return change if len(change) < 90 else change[:85] + "..."


def b_store_bytes(rng, item):
    data = item.store.read_bytes()
    how = pick(rng, ["truncate", "flip", "header", "text", "empty", "page"])
    if how == "truncate":
        cut = int(rng.integers(len(data)))
        data, what = data[:cut], f"truncated at byte {cut} of {len(data)}"
    elif how == "flip":
        data, what = t_flip(rng, data)
    elif how == "header":
        at = int(rng.integers(16, 100))
        data, what = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:], f"header byte {at} flipped"
    elif how == "text":
        data, what = b"hardware: not a store\n", "a text file"
    elif how == "empty":
        data, what = b"", "an empty file"
    else:
        page = int(rng.integers(1, max(2, len(data) // 4096)))
        data = data[:page * 4096] + bytes(rng.integers(0, 256, 4096, dtype=np.uint8)) + data[(page + 1) * 4096:]
        what = f"page {page} random"
    item.store.write_bytes(data)
    return what


def mutate_store(rng, item: Input) -> None:
    mutation = pick(rng, [s_reading_text] * 4 + [s_reading_number] * 2 + [s_other_table] * 3 + [s_schema] * 3
                    + [b_store_bytes] * 2)
    if mutation is b_store_bytes:
        what = mutation(rng, item)
    else:
        conn = sqlite3.connect(item.store, isolation_level=None)
        what = mutation(rng, conn, item)
        conn.close()
    item.mutation = f"store.sqlite: {mutation.__name__[2:]}: {what}"


# ---- the loaders, as the lab calls them -----------------------------------------------------------------
class Artifacts:
    """An MLflow client whose run's artifacts are the files of a folder (tuning.tools.compare reads them)."""

    def __init__(self, folder: Path):
        self.folder = folder

    def download_artifacts(self, run_id, path, dst):
        source = self.folder / path
        if not source.is_file():
            raise OSError(f"no artifact {path}")
        target = Path(dst) / path
        shutil.copyfile(source, target)
        return str(target)


def mlflow_run() -> SimpleNamespace:
    tags = {"choice.search": "sa", "choice.sampler": "greedy", "choice.cost_model": "xgb",
            "choice.evaluator": "fixed", "choice.hardware": "synthetic"}
    params = {"seed": "0", "model.name": "gemm_64", "budget.init_random": "0",
              "hardware._target_": "tuning.hardware.synthetic.SyntheticHardware"}
    return SimpleNamespace(info=SimpleNamespace(run_id="f" * 32, run_name="fuzz", start_time=0),
                           data=SimpleNamespace(params=params, tags=tags, metrics={}))


@dataclass
class Step:
    loader: str
    call: object  # () -> value; raising is the outcome
    then: object = None  # value -> [Step]: what the lab does next with an accepted value
    names: Path | None = None  # the file its refusal must name, when not the input (one unpacked from it)


def loaders(item: Input, orig: Original, clean) -> list[Step]:
    from tuning.engine import resume
    from tuning.tools import compare
    from tuning.tools import sync
    from tuning.engine.validate import validate
    from tuning.tools.dataset import saved_config
    from tuning.core.records import RecordLog
    from tuning.engine.run_folder import load_config

    run = item.run

    def config_then(cfg):
        return [Step("accepted config: no interpolation or unregistered _target_ kept", lambda: unsafe(cfg)),
                Step("accepted config: its canary _target_s instantiated, as the lab does next",
                     lambda: instantiate_canaries(cfg))]

    def records_then(records):
        return [Step("sync.history(loaded records)", lambda: sync.history(clean.tasks, {}, records)),
                Step("compare.run_curves(loaded records)",
                     lambda: compare.run_curves(records, clean.task_rows, {}, "m", 0, "r", 0.0, 0))]

    def load_run():
        found = compare.load_run(Artifacts(run), mlflow_run(), item.work / "scratch", compare.GROUPS)
        if isinstance(found, str):
            raise Refused(found)
        return found

    def loaded_run_then(found):
        return [Step("compare.task_truths(loaded run)", lambda: compare.task_truths([found], None),
                     lambda truths: [Step("compare.run_curves(loaded run)", lambda: compare.run_curves(
                         found.records, found.tasks, truths[0], "m", 0, "r", 0.0, 0))])]

    def database_cfg():
        cfg = copy.deepcopy(clean.cfg)
        cfg.tuning.database = str(run)
        return cfg

    if item.kind == "config":
        return [Step("run_folder.load_config + config.validate",
                     lambda: _validated(load_config(run / "config.yaml", "resume"), validate), config_then),
                Step("dataset.saved_config", lambda: saved_config(run / "config.yaml", []), config_then)]
    if item.kind == "records":
        checked = ([Step("resume.check_records", lambda: resume.check_records(run), records_then)]
                   if hasattr(resume, "check_records") else [])  # resume's own check, where the lab has one
        return checked + [Step("records.RecordLog.load", lambda: RecordLog(run / "records.jsonl").load(), records_then),
                Step("resume.prior_records (tuning.database)",
                     lambda: resume.prior_records(database_cfg(), clean.tasks, item.work / "other", None)),
                Step("compare.load_run (records.jsonl)", load_run,
                     lambda found: [Step("compare.run_curves(loaded run)", lambda: compare.run_curves(
                         found.records, found.tasks, {}, "m", 0, "r", 0.0, 0))])]
    if item.kind == "tasks":
        return [Step("sync.load_tasks", lambda: sync.load_tasks(run, clean.cfg),
                     lambda tasks: [Step("sync.history(loaded tasks)",
                                         lambda: sync.history(tasks, {}, clean.records))]),
                Step("compare.load_run (tasks.json)", load_run, loaded_run_then)]
    if item.kind == "chosen":
        return [Step("sync.load_chosen", lambda: sync.load_chosen(run),
                     lambda chosen: [Step("sync.best_as_reported(loaded choices)",
                                          lambda: _reported(clean, chosen, run))])]
    if item.kind == "state":
        if hasattr(resume, "check_states"):  # resume checks every state before any work, where the lab does
            return [Step("resume.check_states, then restore_state", lambda: _checked_and_restored(run, clean))]
        return [Step("resume.restore_state", lambda: _restored(run, clean))]
    return store_steps(item, orig)


def _reported(clean, chosen: dict, run: Path):
    from tuning.core.outcome import TaskOutcome
    from tuning.tools.sync import best_as_reported

    outcome = TaskOutcome(clean.tasks[0], clean.records)
    best_as_reported(outcome, chosen, run)
    return outcome.best_config


def _validated(cfg, validate):
    validate(cfg)
    return cfg


def _fresh_parts(clean):
    from hydra.utils import instantiate

    return instantiate(clean.cfg.search), instantiate(clean.cfg.cost_model)


def _checked_and_restored(run: Path, clean):
    from tuning.engine.resume import check_states

    check_states(clean.cfg, run, clean.tasks, clean.records, lambda index: _fresh_parts(clean))
    return _restored(run, clean)


def _restored(run: Path, clean):
    from tuning.engine.resume import restore_state

    search, cost_model = _fresh_parts(clean)
    task = SimpleNamespace(key=clean.tasks[0].key, name=clean.tasks[0].name)
    return restore_state(run, task, search, 0, 0, cost_model)


def store_steps(item: Input, orig: Original) -> list[Step]:
    from tuning.store import connect_store

    hardware, task, space = orig.store_key
    store = connect_store(item.store, read_only=True)
    item.opened = store

    def every_key():
        return [store.rows(*key) for key in store.keys()]

    return [Step(f"store.{name}", call, check) for name, call, check in [
        ("keys", store.keys, None),
        ("rows", lambda: store.rows(hardware, task, space), check_rows),
        ("rows(every key)", every_key, None),
        ("rows(config)", lambda: [store.rows(hardware, task, space, c)
                                  for c in store.configs(hardware, task, space)[:3]],
         None),
        ("configs", lambda: store.configs(hardware, task, space), None),
        ("truths", lambda: store.truths(hardware, task, space), check_truths),
        ("decisions", lambda: store.decisions(hardware, task, space), None),
        ("task_info", lambda: store.task_info(task), check_task_info),
        ("hardware_info", lambda: store.hardware_info(hardware), check_hardware_info),
        ("space_size", lambda: store.space_size(space), None),
        ("gauge_median", lambda: store.gauge_median(hardware), None),
        ("count", store.count, None),
        ("unreadable", store.unreadable, None)]]


class Refused(Exception):
    """A loader that returns its refusal as a value (tuning.tools.compare's reason a run is left out)."""


class BadValue(Exception):
    """An accepted value that breaks what its reader promises."""


def _finite(value, low=0.0, strict=False) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (value > low if strict else value >= low))


def check_rows(rows):
    bad = [r for r in rows if not (all(_finite(c, strict=True) for c in r.costs) and _finite(r.build_s)
                                   and _finite(r.run_s) and _finite(r.measured_at))]
    return [Step("store.rows: finite positive costs, finite timings", lambda: _raise_if(bad, "rows", bad[:1]))]


def check_truths(truths):
    bad = {c: v for c, v in truths.items() if not _finite(v, strict=True)}
    return [Step("store.truths: finite positive seconds", lambda: _raise_if(bad, "truths", bad))]


def check_task_info(info):
    ok = info is None or (isinstance(info, dict) and isinstance(info.get("name"), str)
                          and _finite(info.get("flops")) and isinstance(info.get("workload"), dict))
    return [Step("store.task_info: name, finite flops, workload mapping", lambda: _raise_if(not ok, "task_info", info))]


def check_hardware_info(info):
    return [Step("store.hardware_info: a mapping", lambda: _raise_if(not isinstance(info, dict), "hardware_info",
                                                                     info))]


def _raise_if(condition, what, value):
    if condition:
        raise BadValue(f"{what} returned {short(value)}")


def unsafe(cfg) -> None:
    """An accepted config keeps no interpolation, no Hydra instantiation key but `_target_`, no
    `_target_` the lab does not register, and no value from the environment."""
    from omegaconf import OmegaConf

    from tuning.engine.run_folder import is_registered_target

    found = []

    def walk(node, where):
        if isinstance(node, dict):
            for key, value in node.items():
                here = f"{where}.{key}" if where else str(key)
                if key == "_target_" and not is_registered_target(value):
                    found.append(f"{here} = {value!r}")
                elif str(key).startswith("_") and key != "_target_":
                    found.append(here)
                walk(value, here)
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")
        elif isinstance(node, str) and ("${" in node or SECRET in node):
            found.append(f"{where} = {node!r}")

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    if found:
        raise BadValue("accepted with " + "; ".join(found[:3]))


def instantiate_canaries(cfg) -> None:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    def walk(node):
        if isinstance(node, dict):
            if node.get("_target_") in CANARY_TARGETS:
                with contextlib.suppress(Exception):
                    instantiate(OmegaConf.create(node))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(OmegaConf.to_container(cfg, resolve=False))


@dataclass
class Clean:
    """The unmutated run folder, read back: what a loader of one file needs of the others."""
    cfg: object
    tasks: list
    task_rows: list
    records: list


def clean_inputs(run: Path) -> Clean:
    from tuning.core.records import RecordLog
    from tuning.engine.run_folder import load_config
    from tuning.tools.sync import load_tasks

    cfg = load_config(run / "config.yaml", "resume")
    return Clean(cfg, load_tasks(run, cfg), json.loads((run / "tasks.json").read_text()),
                 RecordLog(run / "records.jsonl").load())


# ---- running one input ----------------------------------------------------------------------------------
class Hang(BaseException):
    """One input ran past INPUT_LIMIT_S (a BaseException: no `except Exception` in a loader stops it)."""


@contextlib.contextmanager
def sandboxed(item: Input):
    """HOME, TMPDIR and the working directory in the input's folder; a time limit; output swallowed."""
    saved = {k: os.environ.get(k) for k in ("HOME", "TMPDIR", "FUZZ_SECRET")}
    cwd = os.getcwd()
    os.environ.update(HOME=str(item.work / "home"), TMPDIR=str(item.work / "tmp"), FUZZ_SECRET=SECRET)
    tempfile.tempdir = None
    os.chdir(item.work / "cwd")
    _current["canaries"] = item.canaries

    def hang(signum, frame):
        raise Hang(f"over {INPUT_LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.setitimer(signal.ITIMER_REAL, INPUT_LIMIT_S)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(cwd)
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        tempfile.tempdir = None


class ReadOnly:
    """A read-only bind mount of a folder onto itself (tests run as root, where chmod does not stop a
    write); `available` is False where mounting is not permitted."""

    MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.available = True

    def _mount(self, path: Path, flags: int) -> bool:
        return self.libc.mount(str(path).encode(), str(path).encode(), None, flags, None) == 0

    @contextlib.contextmanager
    def __call__(self, path: Path):
        mounted = self.available and self._mount(path, self.MS_BIND)
        if mounted and not self._mount(path, self.MS_REMOUNT | self.MS_BIND | self.MS_RDONLY):
            self.libc.umount2(str(path).encode(), 0)
            mounted = False
        self.available = mounted
        try:
            yield mounted
        finally:
            if mounted and self.libc.umount2(str(path).encode(), 0) != 0:
                self.libc.umount2(str(path).encode(), 2)  # MNT_DETACH: a handle is still open


def snapshot(work: Path) -> dict:
    """Every path under the input's folder with its size and mtime, but the loaders' own scratch and
    sqlite's side files of the store (the store's bytes are compared by hash)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(work):
        here = Path(dirpath)
        if here == work / "scratch":
            dirnames.clear()
            continue
        for name in dirnames + filenames:
            path = here / name
            if path.parent == work / "store" and name.startswith("store.sqlite"):
                continue
            stat = path.lstat()  # a folder's mtime changes with what is created in it: its files say that
            found[str(path.relative_to(work))] = "folder" if name in dirnames else (stat.st_size, stat.st_mtime_ns)
    return found


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"


@dataclass
class Finding:
    seed: int
    mutation: str
    loader: str
    what: str  # traceback / canary / outside write / run folder write / store changed / unnamed refusal / ...
    error: str  # exception type and first line
    where: str  # file:line where it was raised (the lab's innermost frame, and the innermost frame)

    @property
    def signature(self) -> tuple:
        """One cause: what happened, the exception type and where it was raised (or, for an effect on
        the files, the first word of the mutation that caused it)."""
        mutation_kind = self.mutation.split(": ")[1] if ": " in self.mutation else self.mutation
        return self.what, self.error.split(":")[0], self.where or (self.loader if self.what == "bad value"
                                                                     else mutation_kind)


@dataclass
class Tally:
    inputs: int = 0
    calls: int = 0
    outcomes: Counter = field(default_factory=Counter)  # accepted / refused
    findings: list = field(default_factory=list)
    seconds: float = 0.0
    read_only: bool = False
    times: list = field(default_factory=list)  # (seconds, seed, mutation) of every input

    def count(self, what: str) -> int:
        return sum(f.what == what for f in self.findings)

    def line(self) -> str:
        return (f"{self.inputs} inputs, {self.calls} loader calls in {self.seconds:.1f} s "
                f"({'run folder read-only' if self.read_only else 'no read-only mount'}): "
                f"{self.outcomes['refused']} refused, {self.outcomes['accepted']} accepted, "
                f"{self.count('traceback')} tracebacks, {self.count('canary')} canary hits, "
                f"{self.count('outside write')} outside writes, {self.count('run folder write')} run folder writes, "
                f"{self.count('store changed')} stores changed, {self.count('unnamed refusal')} unnamed refusals, "
                f"{self.count('bad value')} bad values accepted, {self.count('hang')} hangs, {self.count('slow')} slow")

    def report(self) -> str:
        groups: dict = {}
        for finding in self.findings:
            groups.setdefault(finding.signature, []).append(finding)
        slowest = ", ".join(f"{s:.1f} s seed {seed} ({m[:60]})" for s, seed, m in sorted(self.times)[-3:][::-1])
        lines = [self.line(), f"slowest: {slowest}", f"{len(groups)} distinct findings:"]
        for (what, _, _), found in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[1][0].loader)):
            first, loaders_hit = found[0], sorted({f.loader for f in found})
            at = f" at {first.where}" if first.where else ""
            lines.append(f"- [{what}] {first.error}{at}; {len(found)}x in {', '.join(loaders_hit)} "
                         f"(e.g. seed {first.seed}: {first.mutation})")
        return "\n".join(lines)


def where_raised(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    lab = [f for f in frames if f"{os.sep}tuning{os.sep}" in f.filename and "test_fuzz" not in f.filename]
    inner = frames[-1] if frames else None

    def text(frame) -> str:
        name = frame.filename
        return f"{Path(name).relative_to(REPO) if name.startswith(str(REPO)) else Path(name).name}:{frame.lineno}"

    if not lab:
        return text(inner) if inner else "?"
    return text(lab[-1]) + ("" if lab[-1] is inner else f" (raised in {text(inner)})")


def names_file_or_key(message: str, path: Path) -> bool:
    text = re.sub(r"^(tunelab|tuning\.compare): ", "", message.strip())
    if path.name in text or str(path) in text:
        return True
    return re.search(r"(^|\n)\s*[A-Za-z_]\w*(\.[\w\[\]-]+)*: ", text) is not None


def lab_refusal(error: BaseException) -> bool:
    from tuning.config import ConfigError
    from tuning.core.records import RecordError
    from tuning.hardware.gpu_pack import PackError
    from tuning.store import StoreError
    from tuning.tools.campaign_archive import ArchiveError

    if isinstance(error, SystemExit):
        return str(error.code).startswith(("tunelab: ", "tuning.tools.compare: "))
    return isinstance(error, (ConfigError, RecordError, StoreError, Refused, PackError, ArchiveError))


def run_steps(steps: list[Step], item: Input, path: Path, tally: Tally) -> None:
    for step in steps:
        tally.calls += 1
        try:
            value = step.call()
        except Hang as error:
            tally.findings.append(Finding(item.seed, item.mutation, step.loader, "hang", str(error),
                                          where_raised(error)))
            continue
        except (Exception, SystemExit) as error:  # noqa: BLE001 - classifying every outcome is the point
            first = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:200]
            if isinstance(error, BadValue):
                tally.findings.append(Finding(item.seed, item.mutation, step.loader, "bad value", first, ""))
            elif not lab_refusal(error):
                tally.findings.append(Finding(item.seed, item.mutation, step.loader, "traceback", first,
                                              where_raised(error)))
            elif not names_file_or_key(str(error.code if isinstance(error, SystemExit) else error),
                                       step.names or path):
                tally.findings.append(Finding(item.seed, item.mutation, step.loader, "unnamed refusal", first,
                                              where_raised(error)))
            else:
                tally.outcomes["refused"] += 1
            continue
        if not step.loader.startswith(("accepted config", "store.rows:", "store.truths:", "store.task_info:",
                                       "store.hardware_info:")):
            tally.outcomes["accepted"] += 1
        if step.then is not None:
            run_steps(step.then(value), item, path, tally)


def fuzz_one(orig: Original, clean: Clean, root: Path, seed: int, kind: str, tally: Tally, read_only: ReadOnly,
             mutate: bool = True) -> str:
    item = lay_out(orig, root / f"input_{seed}", seed, kind)
    rng = np.random.default_rng(seed)
    if not mutate:
        item.mutation = "none"
    elif kind == "store":
        mutate_store(rng, item)
    elif kind == "records" and rng.random() < 0.25:
        m_records_lines(rng, item)
    else:
        mutate_file(rng, item, orig)
    path = item.store if kind == "store" else item.run / file_of(kind, orig)
    before, store_hash = snapshot(item.work), digest(item.store)
    tally.inputs += 1
    with sandboxed(item), read_only(item.run) if kind != "store" else contextlib.nullcontext(False):
        try:
            run_steps(loaders(item, orig, clean), item, path, tally)
        finally:
            if getattr(item, "opened", None) is not None:
                item.opened.close()
    tally.read_only |= read_only.available and kind != "store"
    check_effects(item, before, store_hash, tally)
    shutil.rmtree(item.work, ignore_errors=True)
    return item.mutation


def check_effects(item: Input, before: dict, store_hash: str, tally: Tally) -> None:
    def add(what: str, text: str) -> None:
        tally.findings.append(Finding(item.seed, item.mutation, "(any loader)", what, text, ""))

    for canary in canary_files(item):
        add("canary", f"created {canary.relative_to(item.work)}")
    after = snapshot(item.work)
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p)
                     and not p.startswith("canaries"))
    for path in changed:
        what = "run folder write" if path.startswith("run") else "outside write"
        add(what, f"{'created' if path not in before else 'removed' if path not in after else 'changed'} {path}")
    if digest(item.store) != store_hash:
        add("store changed", f"store.sqlite's bytes changed by reading ({item.mutation.split(':')[0]})")


def fuzz(orig: Original, root: Path, count: int, first_seed: int = 0) -> Tally:
    clean = clean_inputs(_clean_folder(orig, root))
    tally, read_only, started = Tally(), ReadOnly(), time.monotonic()
    for i in range(count):
        seed, began = first_seed + i, time.monotonic()
        mutation = fuzz_one(orig, clean, root, seed, KINDS[seed % len(KINDS)], tally, read_only)
        took = time.monotonic() - began
        tally.times.append((took, seed, mutation))
        if took > SLOW_INPUT_S:
            tally.findings.append(Finding(seed, mutation, "(every loader of the file)", "slow", f"{took:.0f} s", ""))
    tally.seconds = time.monotonic() - started
    return tally


def _clean_folder(orig: Original, root: Path) -> Path:
    item = lay_out(orig, root / "clean", -1, "config")
    return item.run


# ---- the tests -----------------------------------------------------------------------------------------
def test_unmutated_files_are_accepted_by_every_loader_and_nothing_is_written(original, canary_resolver, tmp_path):
    """The harness's own check: the real run folder passes every loader with no finding."""
    clean = clean_inputs(_clean_folder(original, tmp_path))
    tally, read_only = Tally(), ReadOnly()
    for seed, kind in enumerate(KINDS):
        fuzz_one(original, clean, tmp_path, seed, kind, tally, read_only, mutate=False)
    assert not tally.findings, tally.report()
    assert tally.outcomes["refused"] == 0 and tally.outcomes["accepted"] >= 20, tally.line()


def test_a_canary_target_is_caught_when_a_loader_lets_it_through(original, canary_resolver, tmp_path):
    """The harness's own check: a config accepted with a canary `_target_` is a canary hit."""
    item = lay_out(original, tmp_path / "input", 0, "config")
    cfg = yaml.safe_load((item.run / "config.yaml").read_text())
    cfg["hardware"] = canary_nodes(item)["pathlib.Path.touch"]
    from omegaconf import OmegaConf

    with sandboxed(item):
        instantiate_canaries(OmegaConf.create(cfg))
    assert [p.name for p in canary_files(item)] == ["touch"]


def test_fuzzed_inputs_are_refused_by_name_or_accepted(original, canary_resolver, tmp_path):
    tally = fuzz(original, tmp_path, FAST_INPUTS)
    assert not tally.findings, tally.report()


@pytest.mark.slow
def test_many_fuzzed_inputs_are_refused_by_name_or_accepted(original, canary_resolver, tmp_path):
    tally = fuzz(original, tmp_path, SLOW_INPUTS, first_seed=10_000)
    print("\n" + tally.report())
    assert not tally.findings, tally.report()


# ---- what other machines hand over: GPU packs and campaign archives ------------------------------------
PACK_INPUTS = 32
SHIPPED_KINDS = ("manifest", "readings", "pack archive", "campaign archive")
ARCHIVE_HOST = {"cpu_model": "Fuzz CPU @ 1 GHz", "cores": 2, "flags": "abc"}
FUZZ_GPU = "Fuzz GPU"


@dataclass
class Shipped:
    """A GPU pack folder of the synthetic backend's gemm_64 as a GPU host's run leaves it, that pack as
    an archive, and a small campaign's archive (two runs and a store)."""
    pack: Path
    pack_archive: bytes
    campaign_archive: bytes
    campaign_name: str


def _synthetic_pack(folder: Path) -> Path:
    from hydra.utils import instantiate

    from tuning.hardware.gpu_pack import PACK_FORMAT
    from tuning.tools.run_config import compose, model_tasks

    cfg = compose(["model=gemm_64", "hardware=synthetic"])
    hardware = instantiate(cfg.hardware)
    [task] = model_tasks(cfg, hardware)
    space, rng = hardware.space(task), np.random.default_rng(0)
    configs = [list(c) for c in dict.fromkeys(space.canonical(space.sample(rng)) for _ in range(40))][:5]
    made = time.time() - 600
    kernels = [{"name": f"k0_{i}", "task": task.key, "config": c, "build_s": 0.1} for i, c in enumerate(configs[:4])]
    manifest = {"format": PACK_FORMAT, "id": folder.name, "device": "cpu", "overrides": ["hardware=synthetic"],
                "made_on": {"host": "fuzz", "time": made}, "tasks": {task.key: {"name": "gemm_64", "model": "gemm_64"}},
                "libraries": [{"file": "kernels/lib0000.so", "kernels": kernels}],
                "invalid": [{"task": task.key, "config": configs[4], "message": "rejected"}], "build_errors": []}
    readings = [{"kernel": k["name"], "error": None, "costs": [1e-4 * (i + 1)] * 3, "message": "", "run_s": 0.01,
                 "gauge_s": 2e-5, "measured_at": made + 60 + i, "pack": folder.name,
                 "device": {"kind": "cpu", "name": FUZZ_GPU}} for i, k in enumerate(kernels)]
    readings[3].update(error="run", costs=[], message="did not load")
    (folder / "kernels").mkdir(parents=True)
    (folder / "kernels" / "lib0000.so").write_bytes(b"\x7fELF not really")
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (folder / "run_pack.py").write_text("print('the runner')\n")
    (folder / "readings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in readings))
    return folder


def _campaign_archive(root: Path) -> Path:
    from tuning.core.measure import MeasureSpec
    from tuning.core.task import gemm_task
    from tuning.hardware.synthetic import SyntheticHardware
    from tuning.store import connect_store, TaskRows
    from tuning.tools.campaign import Job
    from tuning.tools.campaign_archive import pack

    jobs = []
    for seed in range(2):
        folder = root / "campaign" / "gemm_64" / f"seed{seed}"
        folder.mkdir(parents=True)
        (folder / "status").write_text("FINISHED")
        (folder / "records.jsonl").write_text('{"x": 1}\n' * (seed + 1))
        (folder / "e2e.json").write_text("{}")  # one content in both folders: one blob
        jobs.append(Job(folder, (f"seed={seed}",)))
    store = connect_store(root / "stores" / "lab.sqlite")
    backend, task, spec = SyntheticHardware(), gemm_task("gemm_64", 64, 64, 64), MeasureSpec(repeat=3)
    table = TaskRows(store, backend, spec, task, backend.space(task))
    rng = np.random.default_rng(0)
    configs = list(dict.fromkeys(table.space.canonical(table.space.sample(rng)) for _ in range(8)))
    for config, result in zip(configs, backend.measure(task, configs, spec)):
        table.add(config, result, "dataset")
    store.close()
    return pack(jobs, root / "campaign", [root / "stores" / "lab.sqlite"], root / "campaigns" / "grid", ARCHIVE_HOST)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Shipped:
    root = tmp_path_factory.mktemp("shipped")
    folder = _synthetic_pack(root / "gemm_64")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    campaign = _campaign_archive(root)
    return Shipped(folder, archive.getvalue(), campaign.read_bytes(), campaign.name)


@dataclass
class Shipment:
    """One input: the shipped files copied into a folder of its own, one of them mutated."""
    seed: int
    kind: str
    work: Path
    campaign_name: str
    mutation: str = ""

    @property
    def canaries(self) -> Path:
        return self.work / "canaries"

    @property
    def pack(self) -> Path:
        return self.work / "pack" / "gemm_64"

    @property
    def pack_archive(self) -> Path:
        return self.work / "packs" / "gemm_64.tar.gz"

    @property
    def campaign_archive(self) -> Path:
        return self.work / "campaigns" / "grid" / self.campaign_name

    @property
    def scratch(self) -> Path:
        return self.work / "scratch"  # where the loaders may write: extractions, views, the import's store

    @property
    def target(self) -> Path:
        return {"manifest": self.pack / "manifest.json", "readings": self.pack / "readings.jsonl",
                "pack archive": self.pack_archive, "campaign archive": self.campaign_archive}[self.kind]


def lay_out_shipment(shipped: Shipped, work: Path, seed: int, kind: str) -> Shipment:
    item = Shipment(seed, kind, work, shipped.campaign_name)
    for folder in ("home", "cwd", "tmp", "scratch", "canaries/dir", "outside", "packs", "campaigns/grid"):
        (work / folder).mkdir(parents=True, exist_ok=True)
    shutil.copytree(shipped.pack, item.pack)
    item.pack_archive.write_bytes(shipped.pack_archive)
    item.campaign_archive.write_bytes(shipped.campaign_archive)
    return item


# mutations of a pack's manifest and readings (their trees), and of an archive's members
def m_manifest_edge(rng, tree, item):
    root = tree.root
    kernels, invalid = root["libraries"][0]["kernels"], root["invalid"]
    later = time.time() + 10 * 24 * 3600
    what, change = pick(rng, [
        ("kernel named twice", lambda: kernels[1].__setitem__("name", kernels[0]["name"])),
        ("config twice", lambda: kernels[1].__setitem__("config", list(kernels[0]["config"]))),
        ("a kernel's config invalid too", lambda: invalid[0].__setitem__("config", list(kernels[0]["config"]))),
        ("made_on.time 1e300", lambda: root["made_on"].__setitem__("time", 1e300)),
        ("made_on.time in 10 days", lambda: root["made_on"].__setitem__("time", later)),
        ("made_on.time -1", lambda: root["made_on"].__setitem__("time", -1)),
        ("made_on []", lambda: root.__setitem__("made_on", [])),
        ("kernel of no task", lambda: kernels[0].__setitem__("task", "gemm-000000000000")),
        ("config of huge ints", lambda: kernels[0].__setitem__("config", [10 ** 30] * 5)),
        ("config too short", lambda: kernels[0].__setitem__("config", [0])),
        ("build_s NaN", lambda: invalid[0].__setitem__("build_s", float("nan"))),
        ("build_s text", lambda: invalid[0].__setitem__("build_s", "1")),
        ("invalid task a list", lambda: invalid[0].__setitem__("task", [1])),
        ("model with a path", lambda: next(iter(root["tasks"].values())).__setitem__("model", "../hardware/cuda")),
        ("model interpolated", lambda: next(iter(root["tasks"].values())).__setitem__("model", "${canary:}")),
        ("overrides hostile", lambda: root.__setitem__("overrides", ["hardware=synthetic",
                                                                    "+hardware.x=${oc.env:FUZZ_SECRET}"])),
        ("overrides another model", lambda: root.__setitem__("overrides", ["hardware=synthetic", "model=gemm_1024"])),
        ("device gpu", lambda: root.__setitem__("device", "gpu")),
        ("tasks a list", lambda: root.__setitem__("tasks", [1]))])
    change()
    return what


def m_reading_edge(rng, tree, item):
    now, made = time.time(), tree.root.get("measured_at", 0) if isinstance(tree.root, dict) else 0
    key, value = pick(rng, [
        ("measured_at", 1e300), ("measured_at", -1.0), ("measured_at", now + 10 * 24 * 3600),
        ("measured_at", made - 10 * 24 * 3600), ("measured_at", "1.8e9"), ("costs", [2e-9] * 3),
        ("costs", [1e-4, 7200.0]), ("costs", [1e308]), ("costs", [0.0]), ("costs", ["1e-4"]), ("costs", [True]),
        ("costs", []), ("error", "nope"), ("error", "implausible"), ("kernel", [1]), ("kernel", "k9_9"),
        ("kernel", None), ("device", {"name": ""}), ("device", {"name": "x" * 1000}), ("device", "GPU"),
        ("gauge_s", 0), ("gauge_s", -1.0), ("run_s", 1e308), ("message", 5), ("message", "x" * 100_000)])
    if isinstance(tree.root, dict):
        tree.root[key] = value
    return f"{key} = {short(value)}"


def tar_entries(data: bytes) -> list[list]:
    """Each member as [TarInfo, its bytes (None for what is not a file)]."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [[m, tar.extractfile(m).read() if m.isfile() else None] for m in tar.getmembers()]


def write_tar(path: Path, entries: list, mode: str) -> None:
    """The members as a tar; a member whose data is a number is a hole its header declares that many
    bytes of, and the tar is then written uncompressed (tarfile reads a tar by its bytes, not its name)."""
    if any(isinstance(data, int) for _, data in entries):
        with open(path, "wb") as out:
            for info, data in entries:
                info.size = data if isinstance(data, int) else len(data or b"")
                out.write(info.tobuf())
                out.write(data or b"") if not isinstance(data, int) else out.seek(data, io.SEEK_CUR)
                out.seek(-out.tell() % tarfile.BLOCKSIZE, io.SEEK_CUR)
            out.write(b"\0" * 2 * tarfile.BLOCKSIZE)
        return
    with tarfile.open(path, mode) as tar:
        for info, data in entries:
            info.size = len(data or b"")
            tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _files(entries):
    return [i for i, (info, _) in enumerate(entries) if info.isfile()]


def a_rename(rng, entries, item):
    i = pick(rng, _files(entries))
    top = entries[i][0].name.split("/")[0]
    name = pick(rng, [f"{top}/../../../../outside/escaped", "/abs/escaped", "other/x", "", ".", "./x",
                      f"{top}/./{top}", "x" * 300, "é/ü", "a\\..\\b", f"{top}//x", f"{top}/.."])
    old, entries[i][0].name = entries[i][0].name, name
    return f"{old} renamed {short(name)}"


def a_special(rng, entries, item):
    top = entries[0][0].name.split("/")[0]
    info = tarfile.TarInfo(f"{top}/special")
    kind, info.type, info.linkname = pick(rng, [("symlink to /etc/passwd", tarfile.SYMTYPE, "/etc/passwd"),
                                                 ("symlink up", tarfile.SYMTYPE, "../../../outside"),
                                                 ("hard link", tarfile.LNKTYPE, entries[_files(entries)[0]][0].name),
                                                 ("character device", tarfile.CHRTYPE, ""),
                                                 ("fifo", tarfile.FIFOTYPE, "")])
    entries.insert(int(rng.integers(len(entries) + 1)), [info, None])
    return f"{kind} added"


def a_huge(rng, entries, item):
    """A member's header declaring just over a cap, or 8 GiB (a size under the caps is extracted: seconds)."""
    from tuning.hardware.gpu_pack import PACK_MAX_BYTES
    from tuning.tools.campaign_archive import MAX_ARCHIVE_BYTES, MAX_FILE_BYTES

    i = pick(rng, _files(entries))
    caps = [PACK_MAX_BYTES] if item.kind == "pack archive" else [MAX_FILE_BYTES, MAX_ARCHIVE_BYTES]
    size = pick(rng, [cap + 1 for cap in caps] + [1 << 33])
    entries[i][1] = size
    return f"{entries[i][0].name} declares {size:,} bytes"


def a_duplicate(rng, entries, item):
    i = pick(rng, _files(entries))
    info = copy.copy(entries[i][0])
    entries.append([info, b"a second member of this name"])
    return f"{info.name} twice"


def a_nested(rng, entries, item):
    i = pick(rng, _files(entries))
    entries.append([tarfile.TarInfo(entries[i][0].name + "/inside"), b"x"])
    return f"a member under the file {entries[i][0].name}"


def a_mode(rng, entries, item):
    i = int(rng.integers(len(entries)))
    mode = pick(rng, [0, 0o7777, 0o4755, 0o222])
    entries[i][0].mode = mode
    return f"{entries[i][0].name} mode {mode:o}"


def a_content(rng, entries, item):
    i = pick(rng, _files(entries))
    data = entries[i][1]
    entries[i][1], what = pick(rng, [(b"", "emptied"), (data[: len(data) // 2], "halved"),
                                     (bytes(rng.integers(0, 256, 200, dtype=np.uint8)), "random bytes")])
    return f"{entries[i][0].name} {what}"


def a_manifest(rng, entries, item):
    """The campaign manifest's tree mutated, or one of its hostile edges."""
    i = next(i for i, (info, _) in enumerate(entries) if info.name == "manifest.json")
    tree = Tree(json.loads(entries[i][1]))
    root, folders = tree.root, tree.root["folders"]
    first_blob = next(iter(root["files"][folders[0]].values()))
    edges = [("a folder outside", lambda: root.__setitem__("folders", ["../../outside/x"])),
             ("a store outside", lambda: root.__setitem__("stores", ["../../outside/x.sqlite"])),
             ("a store twice", lambda: root.__setitem__("stores", root["stores"] * 2)),
             ("one blob named 50 times", lambda: root["files"][folders[0]].update(
                 {f"copy{n}": first_blob for n in range(50)})),
             ("nested folders", lambda: (folders.append(folders[0] + "/inner"),
                                         root["files"].__setitem__(folders[0] + "/inner", {"x": first_blob}))),
             ("format 1", lambda: root.__setitem__("format", 1)),
             ("another host", lambda: root.__setitem__("host", {**ARCHIVE_HOST, "cores": 3}))]
    if rng.random() < 0.5:
        what, change = pick(rng, edges)
        change()
    else:
        what = pick(rng, TREE_MUTATIONS)(rng, tree, item)
    entries[i][1] = dump("manifest", tree)
    return f"manifest.json: {what}"


ARCHIVE_MUTATIONS = [a_rename, a_special, a_huge, a_duplicate, a_nested, a_mode, a_content]


def mutate_shipment(rng, item: Shipment) -> None:
    path = item.target
    if item.kind in ("pack archive", "campaign archive"):
        mutation = pick(rng, ARCHIVE_MUTATIONS + [t_flip, t_truncate]
                        + ([a_manifest] * 3 if item.kind == "campaign archive" else []))
        if mutation.__name__.startswith("t_"):
            data, what = mutation(rng, path.read_bytes())
            path.write_bytes(data)
        else:
            entries = tar_entries(path.read_bytes())
            what = mutation(rng, entries, item)
            write_tar(path, entries, "w:gz" if item.kind == "pack archive" else "w:xz")
    elif item.kind == "manifest":
        mutation = pick(rng, TREE_MUTATIONS + [m_manifest_edge] * 6 + TEXT_MUTATIONS)
        if mutation.__name__.startswith("t_"):
            data, what = mutation(rng, path.read_bytes())
        else:
            tree = Tree(json.loads(path.read_bytes()))
            what = mutation(rng, tree, item)
            data = dump("manifest", tree)
        path.write_bytes(data)
    else:
        lines = path.read_bytes().splitlines(keepends=True)
        mutation = pick(rng, TREE_MUTATIONS + [m_reading_edge] * 6 + TEXT_MUTATIONS)
        at = int(rng.integers(len(lines)))
        if mutation.__name__.startswith("t_"):
            lines[at], what = mutation(rng, lines[at])
        else:
            tree = Tree(json.loads(lines[at]))
            what = mutation(rng, tree, item)
            lines[at] = dump("readings", tree) + b"\n"
        what = f"line {at + 1}: {what}"
        path.write_bytes(b"".join(lines))
    item.mutation = f"{path.name}: {mutation.__name__[2:]}: {what}"


def _leaving_nothing(call, folder: Path):
    """call(), or its refusal once `folder` (where it extracts) is checked to be empty."""
    try:
        return call()
    except BaseException:
        left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []
        if left:
            raise BadValue(f"refused, and left {left[:3]} in {folder.name}") from None
        raise


def _only_under(folder: Path, into: Path) -> Path:
    outside = [p for p in into.rglob("*") if p != folder.parent and folder not in (p, *p.parents)]
    _raise_if(outside, "extracted outside the pack's folder", outside[:3])
    return folder


def _imported(item: Shipment):
    from tuning.store import connect_store
    from tuning.tools.gpu_batch import import_pack

    store = connect_store(item.scratch / "imported.sqlite")
    try:
        return import_pack(store, item.pack)
    finally:
        store.close()


def _stored_as_read(item: Shipment, made: float):
    """Every row the import wrote is one the store's readers accept, measured within the pack's window."""
    from tuning.store import connect_store
    from tuning.tools.gpu_batch import CLOCK_SLACK_S

    if not (item.scratch / "imported.sqlite").exists():
        return  # nothing written: a store is made with its first row
    store = connect_store(item.scratch / "imported.sqlite", read_only=True)
    try:
        skipped = store.unreadable()
        times = [row.measured_at for key in store.keys() for row in store.rows(*key)]
    finally:
        store.close()
    _raise_if(skipped, "rows its readers skip", skipped)
    late = [t for t in times if not made - CLOCK_SLACK_S <= t <= time.time() + CLOCK_SLACK_S]
    _raise_if(late, "rows measured outside the pack's window", late[:3])


def shipment_steps(item: Shipment, shipped: Shipped) -> list[Step]:
    from tuning.hardware.gpu_pack import unpack
    from tuning.tools.campaign_archive import open_view
    from tuning.tools.gpu_batch import measuring_window, read_manifest, valid_reading

    made = json.loads((shipped.pack / "manifest.json").read_text())["made_on"]["time"]

    def import_then(_):
        return [Step("gpu_batch.import_pack: rows as its readers take them", lambda: _stored_as_read(item, made))]

    if item.kind == "manifest":
        return [Step("gpu_batch.read_manifest", lambda: read_manifest(item.pack),
                     lambda manifest: [Step("gpu_batch.import_pack (accepted manifest)", lambda: _imported(item),
                                            import_then)])]
    if item.kind == "readings":
        manifest = read_manifest(item.pack)
        kernels = {k["name"]: k for library in manifest["libraries"] for k in library["kernels"]}
        lines = item.target.read_text(errors="replace").splitlines()
        return [Step("gpu_batch.valid_reading (each line)",
                     lambda: [valid_reading(line, kernels, measuring_window(manifest)) for line in lines]),
                Step("gpu_batch.import_pack", lambda: _imported(item), import_then)]
    if item.kind == "pack archive":
        into = item.scratch / "into"
        return [Step("gpu_pack.unpack", lambda: _only_under(_leaving_nothing(lambda: unpack(item.target, into), into),
                                                            into),
                     lambda folder: [Step("gpu_batch.read_manifest (unpacked)", lambda: read_manifest(folder),
                                          names=folder / "manifest.json")])]
    views = item.scratch / "views"
    return [Step("campaign_archive.open_view", lambda: _leaving_nothing(lambda: open_view(item.target, views), views))]


def fuzz_shipment(shipped: Shipped, root: Path, seed: int, kind: str, tally: Tally, mutate: bool = True) -> str:
    item = lay_out_shipment(shipped, root / f"shipment_{seed}", seed, kind)
    if mutate:
        mutate_shipment(np.random.default_rng(seed), item)
    else:
        item.mutation = "none"
    before = snapshot(item.work)
    tally.inputs += 1
    with sandboxed(item):
        run_steps(shipment_steps(item, shipped), item, item.target, tally)
    for canary in canary_files(item):
        tally.findings.append(Finding(seed, item.mutation, "(any loader)", "canary", str(canary.name), ""))
    after = snapshot(item.work)
    for path in sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p)):
        what = "created" if path not in before else "removed" if path not in after else "changed"
        tally.findings.append(Finding(seed, item.mutation, "(any loader)", "outside write", f"{what} {path}", ""))
    shutil.rmtree(item.work, ignore_errors=True)
    return item.mutation


def test_unmutated_shipments_are_accepted_and_write_only_scratch(shipped, tmp_path):
    """The harness's own check: the pack, its archive and the campaign's archive pass every loader."""
    tally = Tally()
    for seed, kind in enumerate(SHIPPED_KINDS):
        fuzz_shipment(shipped, tmp_path, seed, kind, tally, mutate=False)
    assert not tally.findings, tally.report()
    assert tally.outcomes["refused"] == 0 and tally.outcomes["accepted"] >= 8, tally.line()


def test_fuzzed_packs_and_archives_are_refused_by_name_or_accepted(shipped, canary_resolver, tmp_path):
    tally, started = Tally(), time.monotonic()
    for seed in range(PACK_INPUTS):
        began = time.monotonic()
        mutation = fuzz_shipment(shipped, tmp_path, seed, SHIPPED_KINDS[seed % len(SHIPPED_KINDS)], tally)
        tally.times.append((time.monotonic() - began, seed, mutation))
    tally.seconds = time.monotonic() - started
    assert not tally.findings, tally.report()
