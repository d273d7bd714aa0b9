"""Where a whole model's tuning time goes: the lab's estimate of the model over wall time, which kernel
each round went to and why, and each kernel's share of the tuning seconds beside its share of the latency.

While tuning, `NetworkTime` (a measure callback, whole models only) logs after every round, at
step = measurements so far:

    network/estimate_ms               the model's latency as the lab estimates it: the sum over kernels
                                      of calls x fastest valid reading so far (tuning/core/outcome.py
                                      estimate_so_far_ms); from the first round after which every kernel
                                      has a valid reading, and never rising from there
    network/wall_s                    wall seconds since tuning began (a resumed run goes on from the
                                      last it logged): as the x axis, the estimate over wall time
    network/kernels_measured          kernels with a valid reading so far
    scheduler/measurements/<kernel>   each kernel's measurements so far
    scheduler/<metric>/<kernel>       in a round the scheduler chose, what it ranked the live kernels by
                                      (scheduler=gradient: gradient_ms, what one more round is expected
                                      to take off the model's latency)

and appends the round to the run folder's network_rounds.jsonl: its step, wall seconds, kernel, why
("minimum" or "scheduler", with the scores), the estimate, and the round's seconds by kind (the task's
ROUND_TIMES, tuning/engine/loop.py). At the end `export_network_time` writes, from that file and the
final outcomes, network_time.csv (per kernel: calls, measurements, rounds, seconds by kind, its share
of the tuning time and of the final estimate) and network_time.png (the estimate over wall seconds,
and the two shares side by side).
"""
from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

from tuning.core.outcome import estimate_so_far_ms, fastest_reading, weighted_latency_ms
from tuning.engine.callbacks import MeasureCallback, RoundReport
from tuning.tracking.plot import network_time_png

ROUNDS_FILE = "network_rounds.jsonl"
TABLE_FILE = "network_time.csv"
FIGURE_FILE = "network_time.png"
ROUND_SECONDS = ("search_s", "model_s", "measure_s", "build_s", "run_s", "wall_s")  # a round's, by kind
TABLE_COLUMNS = ("kernel", "calls", "measurements", "reused", "rounds", "scheduled_rounds", *ROUND_SECONDS,
                 "tuning_time_share", "best_us", "latency_ms", "latency_share")


class NetworkTime(MeasureCallback):
    """A whole model's per-round metrics and network_rounds.jsonl (the module's docstring)."""

    def __init__(self, tracker):
        self.tracker = tracker

    def on_start(self, run) -> None:
        self.path = Path(run.out_dir) / ROUNDS_FILE
        _end_torn_line(self.path)
        self.offset = max((r["wall_s"] for r in read_rounds(self.path)), default=0.0)
        self.started = time.perf_counter()
        self.seen: dict[str, dict[str, float]] = {}  # each task's times at its last round in this process

    def after_round(self, report: RoundReport) -> None:
        entry = self._round(report)
        with open(self.path, "a") as out:
            out.write(json.dumps(entry) + "\n")
        self.tracker.log_metrics(round_metrics(entry, report.outcomes), step=report.measured)
        self.tracker.flush()

    def _round(self, report: RoundReport) -> dict:
        choice, tuner = report.choice, report.tuner
        return {"step": report.measured, "wall_s": self.offset + time.perf_counter() - self.started,
                "task": tuner.task.name, "measurements": len(report.results),
                "by": choice.by if choice else "", "metric": choice.metric if choice else "",
                "scores": dict(choice.scores) if choice else {},
                "estimate_ms": estimate_so_far_ms(report.outcomes), "seconds": self._seconds_of(tuner)}

    def _seconds_of(self, tuner) -> dict[str, float]:
        """The round's seconds by kind: the task's times now less its times at its last round."""
        now = {kind: float(tuner.times.get(kind, 0.0)) for kind in ROUND_SECONDS}
        before = self.seen.get(tuner.task.name, dict.fromkeys(ROUND_SECONDS, 0.0))
        self.seen[tuner.task.name] = now
        return {kind: now[kind] - before[kind] for kind in ROUND_SECONDS}


def round_metrics(entry: dict, outcomes) -> dict[str, float]:
    """A round's metrics (the module's docstring) from its network_rounds.jsonl entry and every task."""
    metrics = {"network/wall_s": entry["wall_s"],
               "network/kernels_measured": sum(math.isfinite(fastest_reading(o)) for o in outcomes),
               **{f"scheduler/measurements/{o.task.name}": len(o.records) for o in outcomes},
               **{f"scheduler/{entry['metric']}/{name}": score for name, score in entry["scores"].items()}}
    if entry["estimate_ms"] is not None:
        metrics["network/estimate_ms"] = entry["estimate_ms"]
    return metrics


def read_rounds(path: Path) -> list[dict]:
    """The rounds of a network_rounds.jsonl, in order; a line that is not one (a torn last line after a
    kill, a file from elsewhere) is skipped."""
    if not path.is_file():
        return []
    rounds = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if _is_round(entry):
            rounds.append(entry)
    return rounds


def _is_round(entry) -> bool:
    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    return (isinstance(entry, dict) and isinstance(entry.get("task"), str) and number(entry.get("wall_s"))
            and (entry.get("estimate_ms") is None or number(entry.get("estimate_ms")))
            and isinstance(entry.get("seconds"), dict) and all(map(number, entry["seconds"].values())))


def _end_torn_line(path: Path) -> None:
    """A kill can leave the last line unfinished: end it, so the next round starts a line of its own."""
    if path.is_file() and path.stat().st_size:
        with open(path, "rb+") as handle:
            handle.seek(-1, 2)
            if handle.read(1) != b"\n":
                handle.write(b"\n")


# ---- at the end ------------------------------------------------------------------------------------
def export_network_time(outcomes, out_dir: Path, tracker, title: str = "") -> list[str]:
    """network_time.csv and network_time.png from the folder's rounds and the final outcomes (each
    kernel's chosen best), logged as artifacts; nothing where no round was tuned."""
    rounds = read_rounds(Path(out_dir) / ROUNDS_FILE)
    if not rounds:
        return []
    rows = kernel_rows(outcomes, rounds)
    curve = [(r["wall_s"], r["estimate_ms"]) for r in rounds if r.get("estimate_ms") is not None]
    paths = [write_table(rows, Path(out_dir) / TABLE_FILE),
             network_time_png(curve, [(r["kernel"], r["latency_share"], r["tuning_time_share"]) for r in rows],
                              str(Path(out_dir) / FIGURE_FILE), final=weighted_latency_ms(outcomes), title=title)]
    for path in paths:
        tracker.log_artifact(path)
    return paths


def kernel_rows(outcomes, rounds: list[dict]) -> list[dict]:
    """One row per kernel (TABLE_COLUMNS), the largest share of the model's latency first (kernels
    without a valid reading, whose latency is unknown, before them, as the task table has them);
    shares are fractions, None where the total is not known."""
    seconds = {o.task.name: dict.fromkeys(ROUND_SECONDS, 0.0) for o in outcomes}
    rounds_of = dict.fromkeys(seconds, 0)
    scheduled = dict.fromkeys(seconds, 0)
    for entry in rounds:
        name = entry["task"]
        if name in seconds:
            for kind in ROUND_SECONDS:
                seconds[name][kind] += entry["seconds"].get(kind, 0.0)
            rounds_of[name] += 1
            scheduled[name] += entry.get("by") == "scheduler"
    total_ms = weighted_latency_ms(outcomes)
    total_s = sum(s["wall_s"] for s in seconds.values())
    rows = [{"kernel": o.task.name, "calls": o.task.weight, "measurements": len(o.records), "reused": o.reused,
             "rounds": rounds_of[o.task.name], "scheduled_rounds": scheduled[o.task.name], **seconds[o.task.name],
             "tuning_time_share": _share(seconds[o.task.name]["wall_s"], total_s),
             "best_us": o.best_cost * 1e6 if math.isfinite(o.best_cost) else None,
             "latency_ms": o.task.weight * o.best_cost * 1e3 if math.isfinite(o.best_cost) else None,
             "latency_share": _share(o.task.weight * o.best_cost * 1e3, total_ms)}
            for o in outcomes]
    return sorted(rows, key=lambda row: (row["latency_ms"] is not None, -(row["latency_ms"] or 0.0)))


def _share(part: float, total: float) -> float | None:
    return part / total if math.isfinite(part) and math.isfinite(total) and total > 0 else None


def write_table(rows: list[dict], path: Path) -> str:
    """The rows as CSV (numbers to 6 significant digits, an empty cell where a value is not known)."""
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=TABLE_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})
    return str(path)
