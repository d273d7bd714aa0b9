"""tunelab: tensor-program autotuning methods on one harness (TVM 0.27, Hydra, MLflow, Optuna).

    tunelab.tune(overrides) -> Outcome        one tuning job (the same as `tunelab run OVERRIDES`)
    tunelab.compose(overrides) -> DictConfig  the config that job would run, to inspect or edit
    tunelab.compare(...) -> Comparison        tracked runs compared: paired CIs, tables, figures

The command line is `tunelab --help`; the lab's modules are the `tuning` package.
"""
from tunelab.plugins import expose_checkout_plugins

expose_checkout_plugins()  # before Hydra first lists its plugins

from tunelab.api import Best, Outcome, compose, tune  # noqa: E402
from tunelab.comparing import Comparison, compare  # noqa: E402

__all__ = ["Best", "Comparison", "Outcome", "compare", "compose", "tune"]
__version__ = "0.1.0"
