"""tunelab's library: core < config < store < the components (search, sampler, cost_model, evaluator,
scheduler, value, hardware, tracking) < engine < sweep, cluster < tools, testing (docs/architecture.md)."""
from tuning.core.moved import install as _install_moved

_install_moved()
