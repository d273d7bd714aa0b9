"""Where what outlives a job is kept: MLflow runs, Optuna studies, measurement stores.

The `storage` config group names the three places (conf/storage/<option>.yaml; `storage=local`, the
default, is the embedded files under outputs/: sqlite databases, no server); this module resolves them
in one place, for a Hydra job (pass its composed cfg) and for the command-line tools (no cfg):

    mlflow_uri(explicit=None, cfg=None)   the MLflow tracking (and model registry) URI
    optuna_uri(cfg=None)                  the Optuna study storage URL (None: a study in memory)
    stores_dir(cfg=None)                  the folder measurement stores go to by default

The MLflow URI's precedence, first that is set wins:
    1. explicit: tracking.uri set on the command line or in a config, a tool's --tracking-uri
    2. the MLFLOW_TRACKING_URI environment variable (MLflow's own; a shell or a cluster job sets it)
    3. storage.mlflow_uri of the chosen storage option
    4. sqlite:///<outputs>/mlflow.db
conf/tracking/mlflow.yaml spells the same order as `${oc.env:MLFLOW_TRACKING_URI,${storage.mlflow_uri}}`.
<outputs> is $TUNELAB_OUTPUTS, else outputs/ in the folder the command started in.

`problems(node)` checks a storage node before any work (config.validate calls it): each value's
scheme, each message naming `storage.<key>`. A PostgreSQL (or MySQL) URL needs no file on any host:
the only lock files are the one-host guards of sqlite databases (tuning/tracking/mlflow_tracker.py,
the Optuna sweeper).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

MLFLOW_ENV = "MLFLOW_TRACKING_URI"
OUTPUTS_ENV = "TUNELAB_OUTPUTS"
# the databases Optuna's RDBStorage keeps studies in (SQLAlchemy URLs; `+driver` names the driver)
OPTUNA_SCHEMES = ("sqlite", "postgresql", "mysql")


@dataclass
class StorageSchema:
    """The storage group's keys (conf/storage/local.yaml says what each holds). A config saved
    before the group existed reads them as null: the defaults below."""
    mlflow_uri: Optional[str] = None
    optuna_uri: Optional[str] = None
    stores_dir: Optional[str] = None


def outputs_dir() -> Path:
    """Where the embedded stores live without a config: $TUNELAB_OUTPUTS, else ./outputs."""
    return Path(os.environ.get(OUTPUTS_ENV) or Path.cwd() / "outputs")


def register_resolver() -> None:
    """`${tunelab_outputs:}` in conf/storage: outputs_dir(), so a config composed without Hydra's
    runtime (the command-line tools, tests) resolves the same paths a job does."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("tunelab_outputs", lambda: str(outputs_dir()), replace=True)


def mlflow_uri(explicit: str | None = None, cfg=None) -> str:
    """The MLflow tracking URI: `explicit`, else $MLFLOW_TRACKING_URI, else the storage group's."""
    return (explicit or os.environ.get(MLFLOW_ENV) or _group_value(cfg, "mlflow_uri")
            or f"sqlite:///{outputs_dir()}/mlflow.db")


def optuna_uri(cfg=None) -> str:
    """The Optuna storage URL sweeps keep their studies in."""
    return _group_value(cfg, "optuna_uri") or f"sqlite:///{outputs_dir()}/optuna.db"


def stores_dir(cfg=None) -> Path:
    """The folder measurement stores go to when no path is given."""
    return Path(_group_value(cfg, "stores_dir") or outputs_dir() / "stores")


def _group_value(cfg, key: str) -> str | None:
    storage = cfg.get("storage") if cfg is not None else None
    return storage.get(key) if storage is not None else None


def problems(node, group: str = "storage") -> list[str]:
    """What is wrong with a storage node, each naming `<group>.<key>` (unknown keys are the typed
    schema's to refuse)."""
    if node is None:
        return []
    found = unresolved(node, group)
    if found:
        return found
    if node.get("mlflow_uri") is not None:
        from tuning.config.tracking_uri import uri_problems

        found += uri_problems(f"{group}.mlflow_uri", node.get("mlflow_uri"))
    if node.get("optuna_uri") is not None:
        found += _optuna_problems(f"{group}.optuna_uri", node.get("optuna_uri"))
    if node.get("stores_dir") is not None:
        found += _folder_problems(f"{group}.stores_dir", node.get("stores_dir"))
    return found


def unresolved(node, group: str = "storage") -> list[str]:
    """Values that cannot be resolved: an environment variable a storage option reads that is not set."""
    from omegaconf.errors import InterpolationResolutionError

    found = []
    for key in ("mlflow_uri", "optuna_uri", "stores_dir"):
        try:
            node.get(key)
        except InterpolationResolutionError as error:
            variable = re.search(r"Environment variable '([^']+)' not found", str(error))
            found.append(f"{group}.{key}: " + (f"the environment variable {variable[1]} is not set" if variable
                                                 else f"cannot be resolved ({str(error).splitlines()[0]})"))
    return found


def database_scheme(uri) -> str:
    """A database URL's dialect without its driver (postgresql+psycopg:// -> postgresql); '' for no URL."""
    return str(uri).split("://", 1)[0].split("+", 1)[0].lower() if uri and "://" in str(uri) else ""


def _optuna_problems(key: str, uri: str) -> list[str]:
    scheme = database_scheme(uri)
    if scheme not in OPTUNA_SCHEMES:
        return [f"{key}: {uri!r} is not a database URL Optuna keeps studies in "
                f"({', '.join(f'{s}://' for s in OPTUNA_SCHEMES)}), e.g. sqlite:////abs/path/optuna.db"]
    from tuning.config.tracking_uri import uri_problems  # the same file and driver checks

    return uri_problems(key, uri)


def _folder_problems(key: str, path: str) -> list[str]:
    if not path.strip() or "://" in path:
        return [f"{key}: expected a folder path, got {path!r}"]
    folder = Path(path)
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return [f"{key}: {folder} cannot be a folder: {blocker} is a file"]
    return []
