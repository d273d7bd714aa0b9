"""Which runs a comparison reads, said plainly, and refusals of input that compares nothing.

Without --parent, --tag or --all-runs a comparison reads the latest grid of the experiment (the
children of the newest multirun parent that is not an Optuna sweep), or every run where the experiment
holds no grid; the report's first line says which. A location with no runs is refused naming it, before
anything is created there (an MLflow client on a missing sqlite file would create the database)."""
from __future__ import annotations

PARENT_TAG = "mlflow.parentRunId"
TRIAL_TAG = "optuna.trial"  # an Optuna sweep's job (tuning/engine/trial.py trial_tags)


class Refused(SystemExit):
    """Input that compares nothing: exit status 2; str() is the message, which the command prints."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def refuse_missing_store(uri: str) -> None:
    """A sqlite tracking URI whose file is not there: refused naming it, nothing created."""
    from tuning.config.tracking_uri import missing_store

    problem = missing_store(uri)
    if problem:
        raise Refused(problem)


def experiment_or_refuse(client, experiment: str, uri: str) -> None:
    """The experiment is in the store, or a refusal naming the store and the experiments it holds."""
    from tuning.config.untrusted import without_secrets

    if client.get_experiment_by_name(experiment) is not None:
        return
    names = sorted(e.name for e in client.search_experiments())
    held = f"it holds {', '.join(repr(n) for n in names)}" if names else "it holds no experiment"
    raise Refused(f"--experiment: no MLflow experiment {experiment!r} in {without_secrets(uri)} ({held})")


def selected(client, runs: list, args) -> tuple[list, str]:
    """(the runs to compare, newest first; the line saying which they are). `runs`: the experiment's
    finished job runs the filters kept; `args`: the command's."""
    where = f"experiment {args.experiment!r}" + (f", model {args.model}" if args.model else "")
    tags = ", ".join(f"{k}={v}" for k, v in args.tag)
    if args.parent:
        return runs, f"Selected: the {len(runs)} finished runs under parent run {', '.join(args.parent)} in {where}."
    if args.tag or args.all_runs:
        how = f"tagged {tags}" if args.tag else "--all-runs"
        return runs, f"Selected: every finished run of {where} ({how}): {len(runs)} runs."
    grids = list(dict.fromkeys(r.data.tags[PARENT_TAG] for r in runs
                               if PARENT_TAG in r.data.tags and TRIAL_TAG not in r.data.tags))
    if not grids:
        return runs, f"Selected: every finished run of {where}: {len(runs)} runs (it holds no grid)."
    chosen = [r for r in runs if r.data.tags.get(PARENT_TAG) == grids[0]]
    others = len(runs) - len(chosen)
    return chosen, (f"Selected: the latest grid of {where}, parent run {_name(client, grids[0])!r} ({grids[0]}): "
                    f"its {len(chosen)} finished runs; {others} other finished run{'s' * (others != 1)} of the "
                    f"experiment left out ({len(grids)} grid{'s' * (len(grids) != 1)} in it; --all-runs compares "
                    "every run, --parent ID another grid).")


def _name(client, run_id: str) -> str:
    try:
        return client.get_run(run_id).info.run_name or run_id
    except Exception:  # noqa: BLE001 - a parent deleted since: its id says enough
        return run_id


def refuse_unlike_baseline(baseline: str, rows: set[str], unlike: dict) -> None:
    """--baseline names a method whose runs did not all run alike (they are rows of their own): refused,
    naming the settings they differ in and the rows to choose from."""
    if baseline in rows:
        return
    kinds = sorted(row for row in rows if row.startswith(f"{baseline}["))
    if not kinds:
        return  # compare() names the methods there are
    keys = ", ".join(unlike.get(baseline, {}))
    raise Refused(f"--baseline {baseline}: its runs did not all run alike (they differ in {keys}), so they are "
                  f"{len(kinds)} rows: {'; '.join(kinds)}. Name one of them as --baseline, select one kind of run "
                  "(--parent, --tag, --model), or pool them with --group-by name")
