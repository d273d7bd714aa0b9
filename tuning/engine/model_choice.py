"""A whole model's heaviest kernels chosen by their time inside the model (the in-context evaluator).

The tuner times each candidate alone, on warm caches and buffers of its own; the model calls it
after the kernel before it, on the memory planner's buffers, with what the rest of the model left
in the caches, and a kernel can take more there than alone, by an amount that differs between two
configs that are equally fast alone (docs/methods.md, "Inside the model"). At a whole-model run's
end, `choose_in_model` takes the `e2e.in_model_kernels` heaviest tasks (weight x chosen latency),
each with its `e2e.in_model_candidates` fastest configs (the chosen one first), and has the
hardware time them inside the model compiled with the run's database (hardware.time_in_model:
each candidate called in place of the model's kernel, `e2e.in_model_rounds` readings of
`e2e.in_model_runs` model runs in each of `e2e.in_model_processes` fresh processes). The loop leaves those
tasks' finalists un-re-measured alone (the candidates are read here instead); any the choice does not
take are re-measured alone after it (artifacts.py). The processes
split in two: each task reports the candidate with the lowest median over the even-numbered
processes' readings, and its costs are the odd-numbered processes' readings of that candidate, so
the model's estimate and each kernel's prediction are what the model pays, read apart from the
readings that chose (the lowest of four noisy medians is biased low: on ResNet-18 the chosen
candidates' held-out readings sat 0.4-2.5% above the ones that chose them). One process both
chooses and predicts. Every reading goes to in_model.json; best_configs.json marks the tasks
chosen this way.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tuning.core.outcome import fastest_by_config
from tuning.engine.run_folder import write_inside
from tuning.engine.spec import E2ESpec, ModelSpec

REPORT_FILE = "in_model.json"


def choose_in_model(settings: E2ESpec, model: ModelSpec, seed: int, hardware, outcomes, out_dir: Path,
                    tracker) -> dict | None:
    """{task: its readings and choice} after re-choosing the heaviest tasks (their outcomes updated
    in place); None when e2e.in_model_kernels is 0 (`settings`: e2e.*), the hardware cannot time inside
    a model, or its timing failed (a crashed or timed-out worker: said, tagged `in_model`, the choice
    left as it was)."""
    heaviest = heaviest_outcomes(outcomes, settings.in_model_kernels)
    if not heaviest:
        return None
    candidates = {o.task.name: finalists(o, settings.in_model_candidates) for o in heaviest}
    timing = {"processes": settings.in_model_processes, "rounds": settings.in_model_rounds,
              "runs": settings.in_model_runs, "timeout_s": settings.timeout_s}
    try:
        per_process = hardware.time_in_model(model.resolved(), seed, out_dir / "database",
                                             {name: [list(c) for c in configs] for name, configs in candidates.items()},
                                             timing)
    except NotImplementedError as error:
        print(f"kernels not re-chosen inside the model: {error}")
        return None
    except RuntimeError as error:  # a worker that crashed or timed out: the run keeps its standalone choice
        print(f"kernels not re-chosen inside the model, the standalone choice kept: {error}")
        last_line = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        tracker.set_tags({"in_model": f"failed: {last_line[:200]}"})
        return None
    report = {}
    choosing, predicting = split_processes(per_process)
    for outcome in heaviest:
        name = outcome.task.name
        if any(name not in process for process in per_process):
            continue  # the model does not call it (a reshape run as a view)
        configs = candidates[name]
        choice, prediction = readings_of(choosing, name, len(configs)), readings_of(predicting, name, len(configs))
        report[name] = choice_report(outcome, configs, choice, prediction)
        take_in_model(outcome, configs, choice, prediction)
    if not report:
        return None
    path = write_inside(out_dir, REPORT_FILE, json.dumps(report, indent=1))
    tracker.log_artifact(str(path))
    tracker.log_metrics(choice_metrics(report), step=0)
    print(choice_line(report))
    return report


def split_processes(per_process: list) -> tuple[list, list]:
    """(the processes whose readings choose, those whose readings predict): the even-numbered and the
    odd-numbered ones, interleaved so that the host's drift falls on both; a lone process does both."""
    return per_process[0::2], per_process[1::2] or per_process


def readings_of(processes: list, task: str, count: int) -> list[list[float]]:
    """Per candidate, its readings in every one of `processes`, process by process."""
    return [[s for process in processes for s in process[task][i]] for i in range(count)]


def heaviest_outcomes(outcomes, count: int) -> list:
    """The `count` tasks with the largest weight x chosen latency among those with measured records,
    those the loop left un-re-measured for this choice first (tuning/engine/loop.py heaviest_tuners)."""
    measured = [o for o in outcomes if o.best_config is not None and o.records and math.isfinite(o.best_cost)]
    return sorted(measured, key=lambda o: (not o.remeasure_deferred, -o.task.weight * o.best_cost))[:count]


def finalists(outcome, count: int) -> list[tuple]:
    """The chosen config, then the other validly measured configs fastest record first: `count` in all."""
    fastest = fastest_by_config(outcome.records)
    chosen = tuple(outcome.best_config)
    others = sorted((c for c in fastest if c != chosen), key=fastest.__getitem__)
    return [chosen, *others][:count]


def take_in_model(outcome, configs: list, choice: list, prediction: list | None = None) -> None:
    """The outcome reports the config whose `choice` readings have the lowest median, at its
    `prediction` readings (default: the choice's own)."""
    prediction = choice if prediction is None else prediction
    medians = _medians(choice)
    best = int(np.argmin(medians))
    if not (math.isfinite(medians[best]) and prediction[best]):
        return
    outcome.best_config = tuple(configs[best])
    outcome.final_costs = list(prediction[best])
    outcome.best_cost = float(np.median(prediction[best]))
    outcome.chosen_in_model = True
    outcome.remeasure_deferred = False
    outcome.true_cost = None  # the store's median was of the config chosen before


def choice_report(outcome, configs: list, choice: list, prediction: list) -> dict:
    """The task's choice before (its config and predicted seconds: alone, or inside the model where an
    earlier choice was made there), every candidate's readings that chose (`choice_s`, medians
    `median_s`) and that predict (`prediction_s`, medians `predicted_s`), and the one chosen."""
    return {"before": {"config": list(outcome.best_config), "seconds": outcome.best_cost,
                       "read": "while tuning" if outcome.remeasure_deferred else "re-measured"},
            "configs": [list(c) for c in configs], "choice_s": choice, "median_s": _medians(choice),
            "prediction_s": prediction, "predicted_s": _medians(prediction),
            "chosen": int(np.argmin(_medians(choice)))}


def _medians(readings: list) -> list[float]:
    return [float(np.median(r)) if r else math.inf for r in readings]


def choice_metrics(report: dict) -> dict:
    changed = sum(row["chosen"] != 0 for row in report.values())
    before_ms = sum(row["before"]["seconds"] for row in report.values()) * 1e3
    in_model_ms = sum(row["predicted_s"][row["chosen"]] for row in report.values()) * 1e3
    return {"in_model/kernels": len(report), "in_model/changed": changed,
            "in_model/before_ms": before_ms, "in_model/chosen_ms": in_model_ms}


def choice_line(report: dict) -> str:
    metrics = choice_metrics(report)
    return (f"inside the model: {metrics['in_model/kernels']} heaviest kernels' candidates timed there, "
            f"{metrics['in_model/changed']} choices changed; their predictions {metrics['in_model/before_ms']:.2f} ms "
            f"-> {metrics['in_model/chosen_ms']:.2f} ms read in the model (one call each)")
