"""`tunelab.compare`: tracked runs compared from Python, as `tunelab compare` does on the command line
(docs/compare.md): the same selection, statistics and files, returned as pandas frames and figures."""
from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence


@dataclass(frozen=True)
class Comparison:
    """The tables as pandas DataFrames (`budgets`: the incumbents' ratios to the baseline at each budget,
    with CIs; `targets`: measurements to reach the target; `metrics`: --metric pairs; `scores`: the
    methodology score), the figures (one curves PNG per task), the markdown report and its folder."""
    tables: dict
    figures: list[Path]
    report: str
    folder: Path
    result: object = field(repr=False)  # tuning.tools.compare.statistics.Comparison: curves, truths, notes

    @property
    def notes(self) -> list[str]:
        return list(self.result.notes)

    def plot(self, task: str | None = None):
        """A task's curves (the first task when none is named) as a matplotlib Figure: a notebook shows it as
        the cell's value. Drawn without pyplot, so the notebook's own backend and figures stay as they were."""
        from tuning.tools.compare.report import curves_figure

        tasks = self.result.tasks()
        if task is not None and task not in tasks:
            raise ValueError(f"task: no task {task!r} in the comparison (tasks: {', '.join(tasks)})")
        return curves_figure(self.result, task or tasks[0])

    def _repr_markdown_(self) -> str:  # a notebook shows the report
        return self.report


def compare(baseline: str, experiment: str = "tunelab", *, tracking_uri: str | None = None,
            budgets: Sequence[int] | None = None, parents: Sequence[str] = (), tags: Mapping[str, str] | None = None,
            model: str | None = None, metrics: Sequence[str] = (), seconds: Sequence[float] = (),
            fraction: float = 1.0, method_by: Sequence[str] | None = None, store: str | None = None,
            out: str | Path | None = None, log_run: bool = False, seed: int = 0, all_runs: bool = False,
            group_by: str = "identity") -> Comparison:
    """Compare the runs of `experiment` (narrowed by parent runs, tags, model) against `baseline`;
    every argument is the command's flag of the same name (`tunelab compare --help`). The
    comparison's own MLflow run is logged only with log_run=True. Input that compares nothing (no
    runs there, a baseline whose runs did not run alike) raises ValueError with the command's message."""
    import pandas as pd

    from tuning.config.storage import mlflow_uri
    from tuning.tools.compare.cli import default_out_dir, main
    from tuning.tools.compare.selection import Refused

    folder = Path(out) if out else default_out_dir(mlflow_uri(tracking_uri))
    argv = ["--baseline", baseline, "--experiment", experiment, "--out", str(folder), "--seed", str(seed),
            "--fraction", str(fraction)]
    argv += ["--tracking-uri", tracking_uri] if tracking_uri else []
    argv += ["--budgets", *map(str, budgets)] if budgets else []
    argv += [f"--parent={p}" for p in parents] + [f"--tag={k}={v}" for k, v in (tags or {}).items()]
    argv += ["--model", model] if model else []
    argv += [f"--metric={m}" for m in metrics] + (["--seconds", *map(str, seconds)] if seconds else [])
    argv += ["--method-by", ",".join(method_by)] if method_by else []
    argv += ["--store", str(store)] if store else []
    argv += ["--group-by", group_by] + (["--all-runs"] if all_runs else [])
    argv += [] if log_run else ["--no-mlflow-run"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the report is returned, not printed
            result = main(argv)
    except SystemExit as stop:  # the command's refusal (Refused: its message), or argparse's (on stderr)
        raise ValueError(str(stop) if isinstance(stop, Refused) else "tunelab.compare: invalid arguments") from None
    tables = {"budgets": pd.DataFrame(result.budget_table), "targets": pd.DataFrame(result.target_table),
              "metrics": pd.DataFrame(result.metric_table),
              "scores": pd.DataFrame([{"method": m, **row} for m, row in result.scores.items()])}
    return Comparison(tables, sorted(folder.glob("curves_*.png")), (folder / "compare.md").read_text(), folder, result)
