"""Fuzzing what other machines hand over, with seeded mutations of a GPU pack.

A GPU pack's manifest.json and readings.jsonl (read_manifest, valid_reading, import_pack) and a pack
archive (gpu_pack.unpack), each mutated in its content and, for the archive, in its tar members (names
leaving the folder, links and devices, headers declaring huge sizes, duplicates, modes, the
compressed bytes). The outcome is accepted or refused with PackError naming the file;
an import stores no reading its store's readers would skip nor one measured outside the pack's window;
a refused extraction leaves its scratch folder empty, an accepted one writes only under the folder it
returns (PACK_INPUTS inputs). The fuzz machinery is tests/fuzzing.py's; a run folder's own files are
fuzzed in tests/test_fuzz_run_folders.py.
"""
from __future__ import annotations

import copy
import io
import json
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from fuzzing import (
    TEXT_MUTATIONS,
    TREE_MUTATIONS,
    BadValue,
    Finding,
    Step,
    Tally,
    Tree,
    canary_files,
    canary_resolver_registered,
    dump,
    pick,
    raise_if,
    run_steps,
    sandboxed,
    short,
    snapshot,
    t_flip,
    t_truncate,
)

PACK_INPUTS = 32


SHIPPED_KINDS = ("manifest", "readings", "pack archive")


FUZZ_GPU = "Fuzz GPU"


# ---- the shipped files the inputs come from -------------------------------------------------------------
@dataclass
class Shipped:
    """A GPU pack folder of the synthetic backend's gemm_64 as a GPU host's run leaves it, and that pack
    as an archive."""
    pack: Path
    pack_archive: bytes


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


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Shipped:
    root = tmp_path_factory.mktemp("shipped")
    folder = _synthetic_pack(root / "gemm_64")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return Shipped(folder, archive.getvalue())


@pytest.fixture(scope="module")
def canary_resolver():
    """`${canary:}` registered (tests/fuzzing.py) while this module's tests run."""
    with canary_resolver_registered():
        yield


@dataclass
class Shipment:
    """One input: the shipped files copied into a folder of its own, one of them mutated."""
    seed: int
    kind: str
    work: Path
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
    def scratch(self) -> Path:
        return self.work / "scratch"  # where the loaders may write: extractions, the import's store

    @property
    def target(self) -> Path:
        return {"manifest": self.pack / "manifest.json", "readings": self.pack / "readings.jsonl",
                "pack archive": self.pack_archive}[self.kind]


def lay_out_shipment(shipped: Shipped, work: Path, seed: int, kind: str) -> Shipment:
    item = Shipment(seed, kind, work)
    for folder in ("home", "cwd", "tmp", "scratch", "canaries/dir", "outside", "packs"):
        (work / folder).mkdir(parents=True, exist_ok=True)
    shutil.copytree(shipped.pack, item.pack)
    item.pack_archive.write_bytes(shipped.pack_archive)
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
    """A member's header declaring just over the cap, or 8 GiB (a size under the cap is extracted: seconds)."""
    from tuning.hardware.gpu_pack import PACK_MAX_BYTES

    i = pick(rng, _files(entries))
    size = pick(rng, [PACK_MAX_BYTES + 1, 1 << 33])
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


ARCHIVE_MUTATIONS = [a_rename, a_special, a_huge, a_duplicate, a_nested, a_mode, a_content]


def mutate_shipment(rng, item: Shipment) -> None:
    path = item.target
    if item.kind == "pack archive":
        mutation = pick(rng, ARCHIVE_MUTATIONS + [t_flip, t_truncate])
        if mutation.__name__.startswith("t_"):
            data, what = mutation(rng, path.read_bytes())
            path.write_bytes(data)
        else:
            entries = tar_entries(path.read_bytes())
            what = mutation(rng, entries, item)
            write_tar(path, entries, "w:gz")
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


# ---- the loaders, and running one input -----------------------------------------------------------------
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
    raise_if(outside, "extracted outside the pack's folder", outside[:3])
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
    raise_if(skipped, "rows its readers skip", skipped)
    late = [t for t in times if not made - CLOCK_SLACK_S <= t <= time.time() + CLOCK_SLACK_S]
    raise_if(late, "rows measured outside the pack's window", late[:3])


def shipment_steps(item: Shipment, shipped: Shipped) -> list[Step]:
    from tuning.hardware.gpu_pack import unpack
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
    into = item.scratch / "into"
    return [Step("gpu_pack.unpack", lambda: _only_under(_leaving_nothing(lambda: unpack(item.target, into), into), into),
                 lambda folder: [Step("gpu_batch.read_manifest (unpacked)", lambda: read_manifest(folder),
                                      names=folder / "manifest.json")])]


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


# ---- the tests -----------------------------------------------------------------------------------------
def test_unmutated_shipments_are_accepted_and_write_only_scratch(shipped, tmp_path):
    """The harness's own check: the pack and its archive pass every loader."""
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
