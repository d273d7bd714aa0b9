"""Names that say what ran: MLflow run names, sweep parents, the workload's shape.

    run_name(cfg, choices)   "<workload>-<search>-<sampler>[-<hardware>]-<seed>", e.g.
                             gemm-512x512x256-sa-greedy-0, conv_l8-ppo-kmeans-synthetic-1,
                             onnx-mynet-sa-greedy-0 (the file's stem)
    sweep_name(sweep_dir)    a multirun's parent: the experiment or hparams_search preset it ran,
                             else the swept keys, then the sweep's start time

A model YAML that names a fixed layer (conv_l8, gemm_1024, resnet18) is its own name; the generic
`gemm`, `batch_matmul` and `conv2d` take their shape from the command line, so the name shows it.
"""
from __future__ import annotations

from pathlib import Path

from tuning.core.task import pair

DEFAULT_HARDWARE = "cpu"  # the one a run name does not mention


def workload_label(model) -> str:
    """The model's name, with its shape when the name does not fix it (the generic single-operator
    YAMLs) and its file's stem for an ONNX model."""
    name, kind = str(model["name"]), model["kind"]
    if kind == "onnx":
        return f"{name}-{Path(str(model['path'])).stem}"
    if name != kind:
        return name
    if kind == "gemm":
        return f"{name}-{model['M']}x{model['N']}x{model['K']}"
    if kind == "batch_matmul":
        return f"{name}-{model['batch']}x{model['M']}x{model['N']}x{model['K']}"
    if kind == "conv2d":
        return f"{name}-{conv2d_shape(model)}"
    return name


def conv2d_shape(model) -> str:
    """in x H x W -> out, kernel/stride/padding and groups/dilation when not 1: 64x56x56-64-k3s1p1,
    144x56x56-144-k3s1p1g144, 64x56x56-64-k1x7s1p0x3."""
    text = (f"{model['in_channels']}x{model['height']}x{model['width']}-{model['out_channels']}"
            f"-k{_size(model['kernel'])}s{_size(model['stride'])}p{_size(model['padding'])}")
    if model.get("groups", 1) != 1:
        text += f"g{model['groups']}"
    if _size(model.get("dilation", 1)) != "1":
        text += f"d{_size(model['dilation'])}"
    return text


def _size(value) -> str:
    h, w = pair(value)
    return str(h) if h == w else f"{h}x{w}"


def run_name(cfg, choices: dict) -> str:
    """`choices`: group -> option name (Hydra's runtime choices, or the saved ones on resume)."""
    hardware = choices.get("hardware") or DEFAULT_HARDWARE
    parts = [workload_label(cfg.model), choices.get("search") or "run", choices.get("sampler") or ""]
    if hardware != DEFAULT_HARDWARE:
        parts.append(hardware)
    return "-".join(p for p in parts if p) + f"-{cfg.seed}"


def _is_sweep(value: str) -> bool:
    """Hydra's sweep syntax: a comma outside brackets (a,b), range(...), choice(...), glob(...)."""
    depth = 0
    for char in value:
        depth += char in "[{(" and 1 or 0
        depth -= char in "]})" and 1 or 0
        if char == "," and depth == 0:
            return True
    return value.startswith(("range(", "choice(", "glob(", "interval("))


def sweep_name(sweep_dir: Path) -> str:
    """The parent run's name: what the sweep ran (from Hydra's multirun.yaml in its folder, read as
    untrusted input), then when it started."""
    when = "/".join(Path(sweep_dir).parts[-2:])
    try:
        from omegaconf import OmegaConf

        saved = OmegaConf.load(Path(sweep_dir) / "multirun.yaml")
        choices = dict(saved.hydra.runtime.choices)
        overrides = list(saved.hydra.overrides.task)
    except Exception:  # noqa: BLE001 - a missing or unreadable file: the folder's time alone
        return when
    for group in ("experiment", "hparams_search"):
        if choices.get(group):
            return f"{choices[group]} {when}"
    swept = [o.split("=", 1)[0].lstrip("+~") for o in overrides if _is_sweep(o.split("=", 1)[-1])]
    return f"sweep {' x '.join(swept)} {when}" if swept else f"sweep {when}"
