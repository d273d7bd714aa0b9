"""Names that say what ran: MLflow run names, sweep parents, the workload's shape.

    run_name(cfg, choices)   "<workload>-<search>-<sampler>-b<budget>[-<hardware>]-<seed>", e.g.
                             gemm-512x512x256-sa-greedy-b256-0, conv_l8-ppo-kmeans-b40-synthetic-1,
                             onnx-mynet-sa-greedy-b704-0 (the file's stem); b<budget> is budget.trials,
                             the measurements of the whole run (left out where the config has none),
                             before the hardware so that MLflow's runs table, which cuts names at
                             about 20 characters, still shows it for a short workload name
    method_label(choices)    "<search>+<sampler>+<cost_model>[+<evaluator>]", e.g. sa+greedy+xgb,
                             sa+kmeans+xgb+adaptive: the evaluator only when it is not the default one
    figure_title(cfg, choices)  what a run's figure shows: "sa+greedy+xgb on gemm_64, seed 0"

and the run's headline metric names (BEST_SO_FAR, FINAL_GFLOPS, FINAL_LATENCY_US, FINAL_LATENCY_MS),
which MLflow's run page shows first.
    sweep_name(sweep_dir)    a multirun's parent: the experiment or hparams_search preset it ran,
                             else the swept keys, then the sweep's start time

A model YAML that names a fixed layer (conv_l8, gemm_1024, resnet18) is its own name; the generic
`gemm`, `batch_matmul` and `conv2d` take their shape from the command line, so the name shows it.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from tuning.core.task import pair

DEFAULT_HARDWARE = "cpu"  # the one a run name does not mention
DEFAULT_EVALUATOR = "fixed"  # the one a method label does not mention
METHOD_GROUPS = ("search", "sampler", "cost_model")

# MLflow's UI groups a run's metric charts by the text before the last "/" and shows the groups in
# sorted order, names without a "/" last: "best" sorts before every other group tunelab logs (e2e,
# evaluator, hardware, model, round, run, sampler, search, task, time, tuning, system), so the run's
# result and its curve are the first charts on its page.
BEST_SO_FAR = "best/gflops_so_far"  # the best reading while tuning, a point per measurement
FINAL_GFLOPS = "best/final_gflops"  # the best schedule re-measured at the end: the run's result
FINAL_LATENCY_US = "best/final_latency_us"  # a single operator's
FINAL_LATENCY_MS = "best/final_latency_ms"  # a whole model's, its kernels' weighted latency
RENAMED_METRICS = {"tuning/best_gflops": BEST_SO_FAR, "final_gflops": FINAL_GFLOPS,
                   "final_latency_us": FINAL_LATENCY_US, "final_latency_ms": FINAL_LATENCY_MS}


def with_current_names(metrics: dict) -> dict:
    """A run's metrics, those of a run logged before the headline's names changed (RENAMED_METRICS)
    also under their current names."""
    return {**{RENAMED_METRICS[k]: v for k, v in metrics.items() if k in RENAMED_METRICS}, **metrics}


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
    trials, minutes = OmegaConf.select(cfg, "budget.trials"), OmegaConf.select(cfg, "budget.minutes")
    budget = f"b{trials}" if trials is not None else f"m{minutes:g}" if minutes is not None else ""
    parts = [workload_label(cfg.model), choices.get("search") or "run", choices.get("sampler") or "",
             budget,  # runs that differ only in budget must not share a name
             hardware if hardware != DEFAULT_HARDWARE else ""]
    return "-".join(p for p in parts if p) + f"-{cfg.seed}"


def method_label(choices: dict) -> str:
    """The method as one word for the runs table: the search, sampler and cost model options, and the
    evaluator's when it is not DEFAULT_EVALUATOR (a method that changes how configs are timed is a
    different method; the default one says nothing). `choices`: group -> option name."""
    parts = [choices.get(group) or "?" for group in METHOD_GROUPS]
    evaluator = choices.get("evaluator")
    if evaluator and evaluator != DEFAULT_EVALUATOR:
        parts.append(evaluator)
    return "+".join(parts)


def figure_title(cfg, choices: dict) -> str:
    """A run's figures say which run they are: method, workload and seed."""
    return f"{method_label(choices)} on {workload_label(cfg.model)}, seed {cfg.seed}"


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
