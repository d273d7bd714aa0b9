"""The measurement store as a training corpus: every measured config of every kernel.

    load_corpus(paths, hardware=None) -> Corpus
    at_most(corpus, per_kernel, seed)      # the same number of configs of every kernel, seeded

One loader for every model trained across kernels (the pretrained cost model of `python -m
tuning.tools.pretrain`, the value function of `python -m tuning.tools.value`). Runs reach the store as they measure (hardware.store)
or afterwards (`python -m tuning.tools.dataset import`). What it reads is untrusted: rows the store
cannot parse are skipped by the store; a task without a rebuildable workload, a space that TVM no
longer generates (another version's knobs), or fewer than `min_configs` working configs is left
out and named in `skipped`.

The stores are opened read-only: training never creates, migrates or writes one.

A config's label is the median of all its readings (seconds); a kernel's throughput ratio is its
best config's seconds over each config's (1 for the best, MetaSchedule's min cost / cost), the scale
on which kernels of different sizes can be learned together.
"""
from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tuning.core.features import model_features
from tuning.core.task import Task
from tuning.store import connect_store, display_location, space_signature, store_argument


@dataclass
class TaskCorpus:
    store: str
    hardware: str
    task_key: str
    space: str
    task: Task
    configs: list[tuple]
    seconds: np.ndarray  # median reading of each config

    @property
    def ratio(self) -> np.ndarray:
        """Best seconds / seconds: 1 for the kernel's best config, in (0, 1] for the others."""
        return float(self.seconds.min()) / self.seconds


@dataclass
class Corpus:
    tasks: list[TaskCorpus] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # why each left-out kernel was left out

    @property
    def configs(self) -> int:
        return sum(len(t.configs) for t in self.tasks)


def load_corpus(paths, hardware: str | None = None, min_configs: int = 2) -> Corpus:
    """Every (hardware, kernel, space) of the stores at `paths` with at least `min_configs` configs
    that ran; `hardware` keeps one fingerprint (a prefix is enough)."""
    corpus = Corpus()
    for path in map(store_argument, map(str, paths)):  # a file, or a postgresql:// URL as it is
        store, where = connect_store(path, read_only=True), display_location(path)
        try:
            for fingerprint, task_key, space in sorted(store.keys()):
                if hardware and not fingerprint.startswith(hardware):
                    continue
                info = store.task_info(task_key) or {}
                workload, name = info.get("workload") or {}, info.get("name") or task_key
                if "op" not in workload or (workload["op"] == "tir" and "mod" not in workload):
                    corpus.skipped.append(f"{where}: {name}: no workload to rebuild the kernel from (a network "
                                          f"kernel stored before stores kept its TIR: import its run again)")
                    continue
                truths = store.truths(fingerprint, task_key, space, min_readings=1)
                if len(truths) < min_configs:
                    corpus.skipped.append(f"{where}: {name}: {len(truths)} configs that ran (< {min_configs})")
                    continue
                configs = sorted(truths)
                corpus.tasks.append(TaskCorpus(str(path), fingerprint, task_key, space,
                                               Task(name, workload, float(info.get("flops") or 0.0)), configs,
                                               np.array([truths[c] for c in configs], dtype=np.float64)))
        finally:
            store.close()
    return corpus


def at_most(corpus: Corpus, per_kernel: int | None, seed: int) -> Corpus:
    """Each kernel keeps `per_kernel` of its configs at most, drawn uniformly with a stream of (seed,
    hardware, kernel, space), wherever the store lies: two corpora cut to one size compare sources,
    not sizes. None keeps all."""
    if per_kernel is None:
        return corpus
    for task in corpus.tasks:
        if len(task.configs) > per_kernel:
            key = hashlib.sha256(f"{task.hardware}|{task.task_key}|{task.space}".encode()).digest()[:8]
            keep = np.sort(np.random.default_rng([seed, int.from_bytes(key, "little")])
                           .choice(len(task.configs), per_kernel, replace=False))
            task.configs, task.seconds = [task.configs[i] for i in keep], task.seconds[keep]
    return corpus


def spaces(corpus: Corpus, backend, progress=None) -> list:
    """Each task's space from `backend` (rebuilt by TVM from its workload), or from `backend[(store,
    hardware)]` where it is a mapping (`each_backend`: a corpus of several hosts); a task whose space
    is not the one its rows were measured in is dropped from the corpus, and configs outside the space
    are left out (both named in `skipped`)."""
    out, kept = [], []
    for task in corpus.tasks:
        space = (backend[task.store, task.hardware] if isinstance(backend, dict) else backend).space(task.task)
        if space_signature(space) != task.space:
            corpus.skipped.append(f"{display_location(task.store)}: {task.task.name}: its space is not the one TVM "
                                  "generates now")
            continue
        valid = [c for c in task.configs if space.is_valid(c)]
        if len(valid) != len(task.configs):
            corpus.skipped.append(f"{display_location(task.store)}: {task.task.name}: "
                                  f"{len(task.configs) - len(valid)} configs "
                                  f"outside the space left out")
            keep = [space.is_valid(c) for c in task.configs]
            task.configs, task.seconds = valid, task.seconds[keep]
        out.append(space)
        kept.append(task)
        if progress:
            progress(task)
    corpus.tasks = kept
    return out


def features(corpus: Corpus, backend, kind: str, progress=None) -> list[np.ndarray]:
    """Each task's model features (tuning/core/features.py `model_features`), after `spaces`' checks."""
    task_spaces = spaces(corpus, backend)  # first: it drops tasks from corpus.tasks
    out = []
    for task, space in zip(corpus.tasks, task_spaces):
        out.append(model_features(space, task.configs, kind))
        if progress:
            progress(task)
    return out


def one_backend(corpus: Corpus):
    """(the hardware backend whose spaces the corpus was measured in, its fingerprint); exits naming
    the fingerprints when the stores hold several, or what was skipped when nothing is left."""
    fingerprints = sorted({(t.store, t.hardware) for t in corpus.tasks})
    if len({h for _, h in fingerprints}) > 1:
        raise SystemExit("tunelab: the stores hold readings of several hardware fingerprints; pick one with "
                         "--hardware: " + ", ".join(sorted({h for _, h in fingerprints})))
    _something_left(corpus)
    store, fingerprint = fingerprints[0]
    return backend_for(store_argument(store), fingerprint), fingerprint


def each_backend(corpus: Corpus) -> dict:
    """{(store, fingerprint): the hardware backend its rows were measured in} for every task of a
    corpus of one or several hosts (`spaces` rebuilds each task's space in its own); exits where
    nothing is left, naming what was skipped."""
    _something_left(corpus)
    return {(store, hardware): backend_for(store_argument(store), hardware)
            for store, hardware in sorted({(t.store, t.hardware) for t in corpus.tasks})}


def _something_left(corpus: Corpus) -> None:
    if not corpus.tasks:
        raise SystemExit("tunelab: no kernel to train on:\n  " + "\n  ".join(corpus.skipped or ["the stores are empty"]))


def backend_for(store_path: Path, fingerprint: str):
    """The hardware backend whose spaces the store's rows were measured in (its target's mcpu and cores)."""
    from tuning.hardware.cpu import CPUHardware
    from tuning.store import connect_store

    store = connect_store(store_path, read_only=True)
    try:
        description = store.hardware_info(fingerprint)
    finally:
        store.close()
    if description.get("hardware") != "cpu":
        raise SystemExit(f"tunelab: {display_location(store_path)}: hardware {fingerprint} is "
                         f"{description.get('hardware')!r}; pre-training rebuilds spaces for hardware=cpu only")
    try:
        target = ast.literal_eval(description.get("target", ""))
        return CPUHardware(mcpu=str(target["mcpu"]), num_threads=int(target["num-cores"]))
    except (ValueError, SyntaxError, KeyError, TypeError):
        raise SystemExit(f"tunelab: {display_location(store_path)}: hardware {fingerprint} has no readable "
                         "target") from None
