"""tunelab's Hydra sweeper on Optuna 5: `python run.py -m hydra/sweeper=optuna ...`.

The same `hydra.sweeper.params` syntax as the published hydra-optuna-sweeper
(choice / range / interval / tag(log, interval)), plus resumable named
studies, multi-objective Pareto fronts written to the sweep folder, and
pruning: a job calls `tuning.engine.trial.current_trial()` and reports to it.
"""
