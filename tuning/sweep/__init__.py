"""A multirun's side of a sweep: its MLflow parent run and summary (multirun.py, Hydra callbacks the
configs name as `tuning.sweep.multirun.SweepParent`; `tuning.sweep.SweepParent`, the name saved
sweep folders hold from before the move, stays valid)."""
from tuning.sweep.multirun import SweepParent, SweepSummary

__all__ = ["SweepParent", "SweepSummary"]
