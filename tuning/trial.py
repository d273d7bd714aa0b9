"""The job's side of an Optuna sweep: `current_trial()` is the Optuna trial this Hydra job runs, or None.

The sweeper plugin (hydra_plugins/tunelab_optuna_sweeper) depends on this module, never the reverse.

The sweeper puts the trial's id in each job's environment (hydra.job.env_set) and
the study's name in its `hydra.sweeper.study_name`. A job launched in the sweeper's
process (the basic launcher) gets the live trial, so it can report and be pruned
even when the study lives in memory; a job in another process (joblib) opens the
study from `hydra.sweeper.storage`, with the sweep's pruner.
"""
from __future__ import annotations

import os

TRIAL_ID_ENV = "TUNELAB_OPTUNA_TRIAL_ID"
RESULTS_FILE = "optimization_results.yaml"  # the sweeper's summary in the sweep folder
_live: dict = {}  # trial id -> optuna.Trial, while the sweeper's own process runs it


def current_trial():
    trial_id = os.environ.get(TRIAL_ID_ENV)
    if trial_id is None:
        return None
    if int(trial_id) in _live:
        return _live[int(trial_id)]
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import instantiate

    sweeper = HydraConfig.get().sweeper
    if not sweeper.get("storage"):
        return None  # an in-memory study cannot be reached from another process
    import optuna

    study = optuna.load_study(study_name=sweeper.study_name, storage=sweeper.storage,
                              pruner=instantiate(sweeper.pruner))
    return optuna.trial.Trial(study, int(trial_id))


def hand_over(trials) -> None:
    """The sweeper's side: these live trials are the next jobs run in this process."""
    _live.clear()
    _live.update({trial._trial_id: trial for trial in trials})  # Optuna has no public trial id
