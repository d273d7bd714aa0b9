"""Where the modules of the flat layout went when the package was given rooms by role, and the import
hook that keeps their old names working: `import tuning.run_folder`, a saved `_target_` or a Hydra
callback naming `tuning.sweep.SweepParent`, `python -m tuning.value` all reach the module's new home
(with a DeprecationWarning for imports). The hook only answers names in this table and only after
every real module failed to match, so it never shadows one."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import CodeType, ModuleType

MOVED = {
    "tuning.run": "tuning.engine.run",
    "tuning.loop": "tuning.engine.loop",
    "tuning.final": "tuning.engine.final",
    "tuning.callbacks": "tuning.engine.callbacks",
    "tuning.resume": "tuning.engine.resume",
    "tuning.budget": "tuning.engine.budget",
    "tuning.run_folder": "tuning.engine.run_folder",
    "tuning.job_folder": "tuning.engine.job_folder",
    "tuning.whole_model": "tuning.engine.whole_model",
    "tuning.model_choice": "tuning.engine.model_choice",
    "tuning.store_wiring": "tuning.engine.store_wiring",
    "tuning.tracking.job_run": "tuning.engine.job_run",
    "tuning.trial": "tuning.engine.trial",
    "tuning.storage": "tuning.config.storage",
    "tuning.objective": "tuning.config.objective",
    "tuning.naming": "tuning.config.naming",
    "tuning.conf_dir": "tuning.config.conf_dir",
    "tuning.untrusted": "tuning.config.untrusted",
    "tuning.tools.cli_common": "tuning.config.cli",
    "tuning.cluster_hosts": "tuning.cluster.hosts",
    "tuning.cpu_slots": "tuning.cluster.cpu_slots",
    "tuning.networks": "tuning.core.networks",
    "tuning.corpus": "tuning.hardware.corpus",
    "tuning.store_postgres": "tuning.store.postgres",
    "tuning.value.__main__": "tuning.tools.value",
    "tuning.value.improve": "tuning.tools.value_improve",
}
# Modules that became packages keep their old name (tuning.config, tuning.sweep, tuning.store): their
# __init__ names what the old module's users imported.


def new_name(dotted: str) -> str:
    """`dotted` (a module, or a module's attribute) under the module's new name, else unchanged."""
    for old in sorted(MOVED, key=len, reverse=True):
        if dotted == old or dotted.startswith(old + "."):
            return MOVED[old] + dotted[len(old):]
    return dotted


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        if not self.old.endswith(".__main__"):
            warnings.warn(f"{self.old} moved to {self.new}; import it from there", DeprecationWarning, stacklevel=4)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        sys.modules[self.old] = module

    def get_code(self, fullname: str) -> CodeType | None:  # `python -m OLD` runs the new module's code
        spec = importlib.util.find_spec(self.new)
        assert spec is not None and isinstance(spec.loader, importlib.abc.InspectLoader), self.new
        return spec.loader.get_code(self.new)


class MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(fullname, MOVED[fullname]))


def install() -> None:
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedFinder())
