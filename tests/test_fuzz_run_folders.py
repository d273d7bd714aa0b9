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

The fuzz machinery itself (mutations of any document, sandbox, outcomes) is tests/fuzzing.py's;
what other machines hand over (GPU packs) is fuzzed in tests/test_fuzz_shipments.py.
"""
from __future__ import annotations

import contextlib
import copy
import ctypes
import hashlib
import io
import json
import math
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from fuzzing import (
    SECRET,
    TEXT_MUTATIONS,
    TREE_MUTATIONS,
    BadValue,
    Finding,
    Refused,
    Step,
    Tally,
    Tree,
    canary_files,
    canary_resolver_registered,
    dicts,
    dump,
    leaves,
    pick,
    raise_if,
    run_steps,
    sandboxed,
    short,
    show,
    snapshot,
    t_flip,
)

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
FAST_INPUTS = 60
SLOW_INPUTS = 600
KINDS = ("config", "records", "tasks", "state", "store", "chosen")
SLOW_INPUT_S = 5.0  # an input longer than this is a finding: a file of a few bytes should not cost seconds
HEAVY_SEEDS = 10_000  # inputs from this seed on (the slow variant) may draw the heaviest bombs


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
    """`${canary:}` registered (tests/fuzzing.py) while this module's tests run."""
    with canary_resolver_registered():
        yield


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


INTERPOLATIONS = ["${canary:}", "${oc.env:FUZZ_SECRET}", "x${oc.env:FUZZ_SECRET}y", "${oc.env:HOME}", "${seed}",
                  "${..seed}", "${hydra:runtime.output_dir}", "${now:%Y}", "${oc.decode:'{a: 1}'}",
                  "${oc.create:{a: 1}}", "${oc.select:nothing,${canary:}}", "${", "${}", "${a.b", "\\${escaped}",
                  "${oc.env:FUZZ_SECRET,${canary:}}"]


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


# text of a config
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


KIND_MUTATIONS = {
    "config": TREE_MUTATIONS + [m_canary_target] * 6 + [m_instantiation_keys] * 2 + [m_interpolation] * 3
    + [m_path_retarget] + TEXT_MUTATIONS + [t_yaml_tag, t_alias_bomb],
    "records": TREE_MUTATIONS + [m_record_edge] * 4 + TEXT_MUTATIONS,
    "tasks": TREE_MUTATIONS + [m_store_retarget] * 4 + TEXT_MUTATIONS,
    "state": TREE_MUTATIONS + [m_state_edge] * 3 + TEXT_MUTATIONS,
    "chosen": TREE_MUTATIONS + [m_chosen_edge] * 4 + TEXT_MUTATIONS,
}


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


def loaders(item: Input, orig: Original, clean) -> list[Step]:
    from tuning.core.records import RecordLog
    from tuning.engine import resume
    from tuning.engine.run_folder import load_config
    from tuning.engine.validate import validate
    from tuning.tools import compare, sync
    from tuning.tools.dataset import saved_config

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


def _finite(value, low=0.0, strict=False) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (value > low if strict else value >= low))


def check_rows(rows):
    bad = [r for r in rows if not (all(_finite(c, strict=True) for c in r.costs) and _finite(r.build_s)
                                   and _finite(r.run_s) and _finite(r.measured_at))]
    return [Step("store.rows: finite positive costs, finite timings", lambda: raise_if(bad, "rows", bad[:1]))]


def check_truths(truths):
    bad = {c: v for c, v in truths.items() if not _finite(v, strict=True)}
    return [Step("store.truths: finite positive seconds", lambda: raise_if(bad, "truths", bad))]


def check_task_info(info):
    ok = info is None or (isinstance(info, dict) and isinstance(info.get("name"), str)
                          and _finite(info.get("flops")) and isinstance(info.get("workload"), dict))
    return [Step("store.task_info: name, finite flops, workload mapping", lambda: raise_if(not ok, "task_info", info))]


def check_hardware_info(info):
    return [Step("store.hardware_info: a mapping", lambda: raise_if(not isinstance(info, dict), "hardware_info",
                                                                     info))]


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


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"


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
