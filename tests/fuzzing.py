"""The machinery the loader fuzz tests share (tests/test_fuzz_run_folders.py: a run folder's files and
its store; tests/test_fuzz_shipments.py: GPU packs).

- Documents to mutate: `Tree` (a parsed JSON/YAML document with its nodes addressed by paths), the
  seeded structural mutations of any tree (TREE_MUTATIONS: keys deleted, duplicated, swapped, types
  changed, huge and non-finite numbers, hostile strings, nesting bombs, wide nodes), the byte mutations
  of any file (TEXT_MUTATIONS, t_flip, t_truncate) and `dump`, which writes a mutated tree back
  (duplicate keys and nesting bombs spliced into its text).
- Running an input: `Step` (a loader call as the lab makes it, and what the lab does next with what it
  accepts), `sandboxed` (HOME, TMPDIR and the working directory in the input's folder, a time limit,
  output swallowed), `run_steps` (each outcome classified: accepted, refused by the lab's own error
  naming the file or key, or a `Finding`), `snapshot` (what was written), `Tally` (the counts and the
  report a failing test prints).
- The canary: `canary_resolver_registered` (`${canary:}`, an interpolation with a side effect) and
  `canary_files`, what a canary left in an input's folder.

An input is any object with `seed`, `mutation`, `work` (its own folder) and `canaries` (work/canaries).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import tempfile
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
INPUT_LIMIT_S = 60  # one input longer than this is a hang, stopped
SECRET = "fuzz-secret-7f3a"  # an environment value no accepted config may carry
_current = {"canaries": None}  # the input being loaded: where the canary resolver writes


# ---- the canary -----------------------------------------------------------------------------------
@contextlib.contextmanager
def canary_resolver_registered():
    """`${canary:}`: an interpolation with a side effect, standing for any resolver a process has
    registered; resolving it creates a canary file. Each test module's `canary_resolver` fixture holds it."""
    from omegaconf import OmegaConf

    def touch():
        Path(_current["canaries"], "resolver").touch()
        return "resolved"

    OmegaConf.register_new_resolver("canary", touch)
    try:
        yield
    finally:
        OmegaConf.clear_resolver("canary")


def canary_files(item) -> list[Path]:
    """What a canary created in the input's folder (its canaries/ but the folder a canary may name)."""
    return [p for p in item.canaries.rglob("*") if p != item.canaries / "dir"]


# ---- documents and their mutations -----------------------------------------------------------------
JUNK = [None, True, False, 0, -1, 1, 1.5, "", "junk", " ", [], {}, [1, 2], {"a": 1}, [[[]]], "0", "1e3",
        "true", "null", "\u202e\u0000", "💥" * 3, "\udc80", "x" * 100_000, "../../../etc/passwd", "~/x",
        10 ** 400, -10 ** 400, 2 ** 63, -(2 ** 63) - 1, 1e308, -1e308, 5e-324, -0.0]


NUMBERS = [0, -0.0, -1, -1e-9, 1e-320, 5e-324, 1e308, 10 ** 30, 10 ** 400, -(10 ** 400), 2 ** 63, 2 ** 64,
           float("nan"), float("inf"), float("-inf"), 0.5, True]


STRINGS = ["", " ", "\u0000", "\u202eevil", "💥", "\udc80", "é" * 10_000, "a/b", "../..", "/etc/passwd",
           "${oc.env:HOME}", "nan", "inf", "-1", "[1]", "{}", "\n", "x" * 1_000_000]


BOMB = "__nesting_bomb__"


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


TREE_MUTATIONS = [m_delete_key, m_duplicate_key, m_swap_values, m_change_type, m_number, m_string, m_nesting_bomb,
                  m_wide]


TEXT_MUTATIONS = [t_truncate, t_flip, t_insert, t_replace]


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


# ---- running one input ----------------------------------------------------------------------------
@dataclass
class Step:
    loader: str
    call: object  # () -> value; raising is the outcome
    then: object = None  # value -> [Step]: what the lab does next with an accepted value
    names: Path | None = None  # the file its refusal must name, when not the input (one unpacked from it)


class Refused(Exception):
    """A loader that returns its refusal as a value (tuning.tools.compare's reason a run is left out)."""


class BadValue(Exception):
    """An accepted value that breaks what its reader promises."""


def raise_if(condition, what, value):
    if condition:
        raise BadValue(f"{what} returned {short(value)}")


class Hang(BaseException):
    """One input ran past INPUT_LIMIT_S (a BaseException: no `except Exception` in a loader stops it)."""


@contextlib.contextmanager
def sandboxed(item):
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
    lab = [f for f in frames if f"{os.sep}tuning{os.sep}" in f.filename and Path(f.filename).parent != TESTS]
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

    if isinstance(error, SystemExit):
        return str(error.code).startswith(("tunelab: ", "tuning.tools.compare: "))
    return isinstance(error, (ConfigError, RecordError, StoreError, Refused, PackError))


def run_steps(steps: list[Step], item, path: Path, tally: Tally) -> None:
    """Each step's outcome into `tally`; an accepted value goes on to the steps `then` makes of it.
    `path`: the file a refusal must name (a step's own `names` where it reads another)."""
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
