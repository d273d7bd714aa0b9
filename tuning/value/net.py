"""The value function V: a kernel's state (tuning/value/encoding.py) -> the log10 seconds per loop
iteration of the best schedule that completes it.

As in the paper (Steiner et al., §3.2), an LSTM reads the state's rows in order and V is the sum of
its per-step outputs; here a step is one knob slot of a kernel rather than one layer of a network
(docs/methods.md §Value function says why). Training targets follow Alg. 2's V(s) = min(r, V(s)):
a prefix's target is the best measured config that completes it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from tuning.value.encoding import WIDTH, encode, order, prefix_of, work

STATE_DICT_FILE = "state_dict.pth"  # the file mlflow.pytorch.log_state_dict writes


class ValueNet(nn.Module):
    def __init__(self, hidden: int = 64, layers: int = 1):
        super().__init__()
        self.hidden, self.layers = hidden, layers
        self.lstm = nn.LSTM(WIDTH, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, 1)
        self.register_buffer("centre", torch.zeros(()))
        self.register_buffer("scale", torch.ones(()))

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """states (B, steps, WIDTH), mask (B, steps): standardised V of each state."""
        outputs, _ = self.lstm(states)
        return (self.head(outputs).squeeze(-1) * mask).sum(dim=1)

    def value(self, space, prefixes) -> np.ndarray:
        """V of each prefix of one kernel's space, log10 seconds per iteration."""
        if not len(prefixes):
            return np.zeros(0)
        states = torch.from_numpy(encode(space, prefixes))
        with torch.no_grad():
            standard = self(states, torch.ones(states.shape[:2]))
        return (standard * self.scale + self.centre).numpy().astype(np.float64)

    def seconds(self, space, prefixes) -> np.ndarray:
        return 10.0 ** self.value(space, prefixes) * work(space)


@dataclass
class KernelData:
    """One kernel's measured configs: its space, the configs and their median seconds."""
    name: str
    space: object
    configs: list
    seconds: np.ndarray


def kernels_of(corpus, backend) -> list[KernelData]:
    """The corpus's kernels with their spaces rebuilt by `backend` (tuning/hardware/corpus.py `spaces`)."""
    from tqdm import tqdm

    from tuning.hardware.corpus import spaces

    with tqdm(total=len(corpus.tasks), desc="spaces", unit="kernel", disable=None) as bar:
        task_spaces = spaces(corpus, backend, progress=lambda task: bar.update())
    return [KernelData(t.task.name, space, list(t.configs), np.asarray(t.seconds))
            for t, space in zip(corpus.tasks, task_spaces)]


@dataclass
class Split:
    """A corpus cut for training and evaluation (`split`)."""
    train: list  # [KernelData]
    held: list  # [KernelData]: the held-out configs of the kernels trained on
    near: int  # training configs left out for being one decision from a held-out config


def split(kernels: list[KernelData], fraction: float, seed: int) -> Split:
    """Each kernel's configs in two, the same way in every call with this seed, however the corpus
    grows: a config is held out when a hash of (seed, kernel, its group) falls under `fraction`, its
    group the first half of its decisions (`group_of`), so configs that differ only in later decisions
    (most of a walk's one-knob moves) fall on the same side. A config trained on is never held out in
    a later call, and one held out is never trained on. Training configs one decision from a held-out
    config are left out of both (`near`): a near-duplicate in training would stand in for the
    held-out config. A kernel all of whose configs fall out is held out entirely."""
    train, held, near = [], [], 0
    for kernel in kernels:
        out = np.array([held_out(seed, kernel.name, group_of(kernel.space, c), fraction) for c in kernel.configs],
                       dtype=bool)
        close = one_decision_from(kernel.configs, out) & ~out
        near += int(close.sum())
        for part, rows in ((held, np.flatnonzero(out)), (train, np.flatnonzero(~out & ~close))):
            if len(rows):
                part.append(KernelData(kernel.name, kernel.space, [kernel.configs[i] for i in rows],
                                       kernel.seconds[rows]))
    return Split(train, held, near)


def group_of(space, config) -> tuple:
    """The first half (rounded up) of a config's decisions in V's order: the sketch and the outer
    decisions, which configs of one group share."""
    length = len(order(space, config[0]))
    return prefix_of(space, config, (length + 1) // 2)


def held_out(seed: int, kernel: str, key, fraction: float) -> bool:
    """Whether `key` of `kernel` is held out: a uniform number in [0, 1) from a hash of the three,
    which depends on nothing else (not on the corpus's size or order)."""
    digest = hashlib.blake2b(json.dumps([seed, kernel, key]).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0 ** 64 < fraction


def one_decision_from(configs: list, out: np.ndarray, chunk: int = 256) -> np.ndarray:
    """For each config: is some config marked `out` different from it in exactly one slot."""
    near = np.zeros(len(configs), dtype=bool)
    if not out.any():
        return near
    table = np.asarray(configs, dtype=np.int64)
    others = table[out]
    for start in range(0, len(table), chunk):
        rows = table[start:start + chunk]
        near[start:start + chunk] = ((rows[:, None, :] != others[None, :, :]).sum(axis=2) == 1).any(axis=1)
    return near


def prefix_targets(kernel: KernelData) -> tuple[list[tuple], np.ndarray]:
    """Every distinct prefix of the measured configs (the empty one included) and its target:
    log10 of the best seconds among the configs completing it, per loop iteration."""
    best: dict[tuple, float] = {}
    for config, seconds in zip(kernel.configs, kernel.seconds):
        for length in range(len(order(kernel.space, config[0])) + 1):
            prefix = prefix_of(kernel.space, config, length)
            best[prefix] = min(best.get(prefix, math.inf), float(seconds))
    prefixes = list(best)
    per_iteration = np.array([best[p] for p in prefixes]) / work(kernel.space)
    return prefixes, np.log10(per_iteration)


def _padded(kernels: list[KernelData]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All kernels' prefix states padded to the longest space, their masks and targets."""
    blocks = [(encode(k.space, prefixes), targets) for k in kernels for prefixes, targets in [prefix_targets(k)]]
    steps = max(states.shape[1] for states, _ in blocks)
    states = np.zeros((sum(len(t) for _, t in blocks), steps, WIDTH), dtype=np.float32)
    mask = np.zeros(states.shape[:2], dtype=np.float32)
    start = 0
    for block, _ in blocks:
        states[start:start + len(block), :block.shape[1]] = block
        mask[start:start + len(block), :block.shape[1]] = 1.0
        start += len(block)
    targets = np.concatenate([t for _, t in blocks]).astype(np.float32)
    return torch.from_numpy(states), torch.from_numpy(mask), torch.from_numpy(targets)


def fit(kernels: list[KernelData], hidden: int = 64, layers: int = 1, epochs: int = 30, lr: float = 3e-3,
        batch: int = 256, seed: int = 0, progress=None, start: ValueNet | None = None) -> tuple[ValueNet, list[float]]:
    """Train V on every prefix of the kernels' measured configs (MSE on standardised targets, Adam);
    returns the net and the mean training loss of each epoch. `start`: continue from this V (its
    architecture, weights and target scale; Alg. 2's V_i initialised to V_(i-1)), left unchanged."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    states, mask, targets = _padded(kernels)
    net = ValueNet(start.hidden, start.layers) if start is not None else ValueNet(hidden, layers)
    if start is not None:
        net.load_state_dict(start.state_dict())
    else:
        net.centre.fill_(float(targets.mean()))
        net.scale.fill_(float(targets.std()) if len(targets) > 1 and float(targets.std()) > 0 else 1.0)
    standard = (targets - net.centre) / net.scale
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    losses = []
    for epoch in range(epochs):
        permutation = torch.randperm(len(targets), generator=generator)
        total = 0.0
        for start in range(0, len(targets), batch):
            rows = permutation[start:start + batch]
            loss = nn.functional.mse_loss(net(states[rows], mask[rows]), standard[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(rows)
        losses.append(total / len(targets))
        if progress:
            progress(epoch, losses[-1])
    net.eval()
    return net, losses


def complete_errors(net: ValueNet, kernels: list[KernelData]) -> dict:
    """How well V predicts measured complete schedules: R^2 of log10 seconds, mean relative error of
    seconds, and the mean over kernels of Spearman's rank correlation within a kernel."""
    predicted = [net.seconds(k.space, [prefix_of(k.space, c, len(order(k.space, c[0]))) for c in k.configs])
                 for k in kernels]
    return prediction_metrics(predicted, [np.asarray(k.seconds, dtype=np.float64) for k in kernels])


def prediction_metrics(predicted: list[np.ndarray], measured: list[np.ndarray]) -> dict:
    """Predicted against measured seconds, one array pair per kernel: R^2 of log10 seconds, mean
    relative error, configs, and the mean over kernels (of > 2 configs) of Spearman's rank correlation."""
    from scipy.stats import spearmanr

    if not predicted:
        return {}
    ranks = [float(spearmanr(a, b).correlation) for a, b in zip(predicted, measured) if len(a) > 2]
    p, m = np.log10(np.concatenate(predicted)), np.log10(np.concatenate(measured))
    r2 = 1.0 - float(np.sum((p - m) ** 2) / max(np.sum((m - m.mean()) ** 2), 1e-30))
    relative = float(np.mean(np.abs(10 ** p - 10 ** m) / 10 ** m))
    return {"r2_log_seconds": r2, "mean_relative_error": relative, "configs": int(len(m)),
            **({"spearman_within_kernel": float(np.nanmean(ranks))} if ranks else {})}


# ---- the registry: V is registered as an MLflow pytorch model; tunelab reads back its state dict --------
def log_value(mlflow, net: ValueNet, name: str):
    """In an active MLflow run: the weights (read back by `load_value`, no pickle) and the model
    registered as `name`; returns log_model's ModelInfo."""
    import logging

    mlflow.pytorch.log_state_dict(net.state_dict(), "state_dict")
    quiet = logging.getLogger("mlflow.pytorch")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its pickle warning: tunelab loads the weights only
    try:
        return mlflow.pytorch.log_model(net, name="model", serialization_format="pickle", registered_model_name=name,
                                        pip_requirements=[f"torch=={torch.__version__}"])  # inferring: seconds
    finally:
        quiet.setLevel(level)


def shape_tag(net: ValueNet) -> dict:
    return {"tunelab.kind": "value", "tunelab.value_net": json.dumps({"hidden": net.hidden, "layers": net.layers})}


def _weights(reference: str, run_id: str, registry_uri: str) -> dict:
    """The state dict a V's run logged (state_dict/state_dict.pth), read by torch's weights-only loader
    alone; anything else in the file is refused (RegistryError), never loaded another way."""
    import tempfile

    from tuning.tracking.registry import RegistryError, tracking_at

    with tracking_at(registry_uri) as mlflow, tempfile.TemporaryDirectory(prefix="tunelab-value-") as folder:
        try:
            path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=f"state_dict/{STATE_DICT_FILE}",
                                                       dst_path=folder)
        except Exception as error:  # noqa: BLE001 - a run whose files cannot be fetched: said as a config problem
            raise RegistryError(f"{reference}: cannot fetch its weights state_dict/{STATE_DICT_FILE} "
                                f"({type(error).__name__})") from None
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - torch's message advises an unsafe full load: not repeated
            raise RegistryError(f"{reference}: its weights (state_dict/{STATE_DICT_FILE}) are not readable as plain "
                                f"tensors ({type(error).__name__}); the entry is refused and nothing in it was run") \
                from None


@functools.lru_cache(maxsize=4)  # a whole model's tasks each have a search: one download
def load_value(reference: str, registry_uri: str) -> ValueNet:
    """A registered V: its architecture from the version's tags, its weights with torch's weights-only
    loader (a registry's files are read as untrusted data)."""
    import os

    from tuning.tracking.registry import RegistryError, resolve

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one tiny file, no bar

    version = resolve(reference, registry_uri)
    try:
        shape = json.loads(version.tags["tunelab.value_net"])
        net = ValueNet(int(shape["hidden"]), int(shape["layers"]))
    except (KeyError, ValueError, TypeError) as error:
        raise RegistryError(f"{reference} has no readable tunelab.value_net tag ({error!r}); "
                            "tunelab value train registers value functions") from None
    state = _weights(reference, version.run_id, registry_uri)
    try:
        net.load_state_dict(state)
    except (RuntimeError, TypeError) as error:
        raise RegistryError(f"{reference}: its weights do not fit its tunelab.value_net tag ({error})") from None
    net.eval()
    return net
