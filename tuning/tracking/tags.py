"""A tuning job's MLflow run name, tags and note: what ran, by whom, from which commit, and which
metric is its result. `run_tags` fills the run page's Source, Git commit, Created by and Description
(MLflow's own `mlflow.*` tags) beside tunelab's `method` (sa+greedy+xgb: a column the runs table can
show), `choice.<group>`, `model`, `seed` and `overrides`."""
from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version as _version
from pathlib import Path

from tuning.config import naming
from tuning.core.task import is_whole_model
from tuning.tracking.base import option_name

NOTE_GROUPS = ("search", "sampler", "cost_model", "evaluator", "hardware")


def choice(hydra: dict, cfg, group: str) -> str:
    """The option a config group was given: its Hydra choice, else its class's name."""
    return option_name(hydra.get("choices", {}).get(group), cfg[group]["_target_"])


def method_name(hydra: dict, cfg) -> str:
    """search+sampler: the method a record names."""
    return f"{choice(hydra, cfg, 'search')}+{choice(hydra, cfg, 'sampler')}"


def choices(hydra: dict, cfg) -> dict:
    """Every NOTE_GROUPS group -> the option it was given."""
    return {group: choice(hydra, cfg, group) for group in NOTE_GROUPS}


def method_label(hydra: dict, cfg) -> str:
    """search+sampler+cost_model[+evaluator] (tuning/config/naming.py): the `method` param and tag."""
    return naming.method_label(choices(hydra, cfg))


def figure_title(hydra: dict, cfg) -> str:
    return naming.figure_title(cfg, choices(hydra, cfg))


def job_run_name(hydra: dict, cfg, trial=None) -> str:
    name = naming.run_name(cfg, choices(hydra, cfg))
    return name if trial is None else f"{name}-trial{trial.number}"


def run_tags(hydra: dict, cfg) -> dict:
    overrides = " ".join(hydra.get("overrides", []))
    return {
        "overrides": overrides or "(defaults)",
        # MLflow's own tags: the run page's Source, Git commit, Created by and Description
        "mlflow.source.name": str(Path(sys.argv[0]).resolve()) if sys.argv and sys.argv[0] else "run.py",
        "mlflow.source.type": "LOCAL",
        "mlflow.source.git.commit": git_commit(),
        "mlflow.user": user(),
        "mlflow.note.content": note(hydra, cfg, overrides),
        "torch_version": _version("torch"),  # its metadata: importing torch costs a second
        "model": cfg.model.name,
        "experiment": hydra.get("choices", {}).get("experiment") or "none",
        "method": method_label(hydra, cfg),
        **{f"choice.{group}": choice(hydra, cfg, group) for group in NOTE_GROUPS},
        "seed": str(cfg.seed),
        # rows of an experiment (+experiment/adatune_row=..., +experiment/chameleon_row=...): what
        # `tuning.tools.compare --method-by choice.experiment/<group>` names a method by
        **{f"choice.{group}": str(option) for group, option in hydra.get("choices", {}).items()
           if group.startswith("experiment/") and option},
    }


def note(hydra: dict, cfg, overrides: str) -> str:
    """The run page's description: what ran, where its files are, which metric is the result."""
    picked = choices(hydra, cfg)
    return (f"{naming.workload_label(cfg.model)} tuned by search={picked['search']} sampler={picked['sampler']} "
            f"(cost_model={picked['cost_model']}, evaluator={picked['evaluator']}) on hardware={picked['hardware']}: "
            f"{budget_words(cfg.budget)}, seed {cfg.seed}. Command: `tunelab run {overrides}`. "
            f"The result is {headline_names(cfg)} (the best schedule re-measured at the end"
            f"{'; `e2e/*` times the whole model' if is_whole_model(cfg.model) else ''}); `{naming.BEST_SO_FAR}` "
            f"is the best reading while tuning, one point per measurement. Records, config and log: {cfg.output_dir}.")


def budget_words(budget) -> str:
    """The budget as the note says it: a count, or minutes of wall clock (a count left null under minutes)."""
    minutes = budget.get("minutes")
    if budget.trials is None and minutes is not None:
        return f"{minutes:g} minutes in all"
    return f"{budget.trials} measurements" + (f" within {minutes:g} minutes" if minutes is not None else "")


def headline_names(cfg) -> str:
    latency = naming.FINAL_LATENCY_MS if is_whole_model(cfg.model) else naming.FINAL_LATENCY_US
    return f"`{naming.FINAL_GFLOPS}` / `{latency}`"


def user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no passwd entry and no USER
        return "unknown"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=os.path.dirname(__file__)).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
