"""Models in the MLflow model registry: register a trained booster, load one back.

A registered model is named `name`; each registration is a new version. Its tags say what it was
trained on (`tunelab.tasks`, JSON), which features it reads (`tunelab.features`) and how well it
did on kernels it did not see (`tunelab.heldout_spearman`). A run refers to one as
`models:/<name>/<version>` (or `<name>/<version>`, or `<name>` for the latest version).

A registry entry is untrusted data: a booster is read back from its saved bytes alone (model.ubj,
model.json or model.xgb), never through MLflow's flavour loader, which imports the `code:` folder and
the `model_class` an entry's MLmodel file names.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path

from tuning.tracking.empty_store import seed_uri

BOOSTER_FILES = ("model.ubj", "model.json", "model.xgb")  # mlflow.xgboost.log_model's, by model_format
REFERENCE = re.compile(r"^(?:models:/)?(?P<name>[A-Za-z0-9][A-Za-z0-9_.\-]*)(?:/(?P<version>[0-9]+))?$")


class RegistryError(ValueError):
    pass


def default_registry() -> str:
    """The MLflow store runs track into when no URI is given (tuning.config.storage.mlflow_uri)."""
    from tuning.config import storage

    return storage.mlflow_uri()


def parse_reference(reference: str) -> tuple[str, str | None]:
    match = REFERENCE.match(str(reference))
    if not match:
        raise RegistryError(f"expected models:/<name>/<version>, <name>/<version> or <name>, got {reference!r}")
    return match["name"], match["version"]


def resolve(reference: str, registry_uri: str):
    """The registry's ModelVersion that `reference` names (latest when it has no version)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    name, version = parse_reference(reference)
    try:
        client = MlflowClient(tracking_uri=registry_uri, registry_uri=registry_uri)
        if version is not None:
            return client.get_model_version(name, version)
        versions = client.search_model_versions(f"name = '{name}'")
    except MlflowException as error:
        raise RegistryError(f"no registered model {reference!r} in {registry_uri} ({error.message})") from None
    except Exception as error:  # noqa: BLE001 - a URI MLflow cannot open: said as a config problem
        raise RegistryError(f"cannot open the registry {registry_uri!r} ({type(error).__name__}: {error})") from None
    if not versions:
        raise RegistryError(f"no registered model {name!r} in {registry_uri}")
    return max(versions, key=lambda v: int(v.version))


@contextlib.contextmanager
def tracking_at(registry_uri: str):
    """MLflow's fluent API pointed at `registry_uri` (tracking and registry) inside the block."""
    import mlflow

    before = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    seed_uri(registry_uri)  # a new sqlite registry: a copy of an empty store (empty_store.py)
    mlflow.set_tracking_uri(registry_uri)
    mlflow.set_registry_uri(registry_uri)
    try:
        yield mlflow
    finally:
        mlflow.set_tracking_uri(before[0])
        mlflow.set_registry_uri(before[1])


def load_booster(reference: str, registry_uri: str):
    """(xgboost Booster, tags) of a registered model, read from the saved booster's bytes only;
    RegistryError when the entry holds no readable booster."""
    import xgboost as xgb

    version = resolve(reference, registry_uri)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one small file, no bar
    with tempfile.TemporaryDirectory(prefix="tunelab-booster-") as folder:
        path = _download_booster(reference, version, registry_uri, Path(folder))
        booster = xgb.Booster()
        try:
            booster.load_model(str(path))
        except xgb.core.XGBoostError as error:
            reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
            raise RegistryError(f"{reference}: its {path.name} is not a readable xgboost booster ({reason})") from None
    return booster, dict(version.tags)


def _download_booster(reference: str, version, registry_uri: str, folder: Path) -> Path:
    """The one booster file of a model version, downloaded into `folder` (nothing else of the entry)."""
    from mlflow import MlflowClient

    try:
        with tracking_at(registry_uri) as mlflow:
            root = MlflowClient(tracking_uri=registry_uri, registry_uri=registry_uri) \
                .get_model_version_download_uri(version.name, version.version)
            check_artifact_root(reference, root, registry_uri)
            present = {info.path.rsplit("/", 1)[-1] for info in mlflow.artifacts.list_artifacts(artifact_uri=root)
                       if not info.is_dir}
            found = [name for name in BOOSTER_FILES if name in present]
            if not found:
                raise RegistryError(f"{reference} holds no saved xgboost booster ({', '.join(BOOSTER_FILES)}); "
                                    "tunelab pretrain registers one")
            return Path(mlflow.artifacts.download_artifacts(artifact_uri=f"{root.rstrip('/')}/{found[0]}",
                                                            dst_path=str(folder)))
    except RegistryError:
        raise
    except Exception as error:  # noqa: BLE001 - an entry whose files cannot be fetched: said as a config problem
        raise RegistryError(f"{reference}: cannot fetch its files ({type(error).__name__}: {error})") from None


def check_artifact_root(reference: str, root: str, registry_uri: str) -> None:
    """An entry's files are fetched from the registry's own server or a place the user names: the
    entry's source is anyone's who can register a version, and a download sends the user's MLflow or
    cloud credentials to its host (tuning/config/untrusted.py)."""
    from tuning.config.untrusted import SERVERS_VARIABLE, foreign_host, user_named_servers, without_secrets

    if foreign_host(str(root), user_named_servers(registry_uri)):
        raise RegistryError(f"{reference}: its files are at {without_secrets(root)}, a server you have not named (the "
                            f"registry is {without_secrets(registry_uri)}); list it in ${SERVERS_VARIABLE} to fetch "
                            "them. Nothing was fetched.")


def register_booster(booster, name: str, registry_uri: str, experiment: str, params: dict, metrics: dict,
                     tags: dict) -> str:
    """Log an xgboost booster in a new run of `experiment` and register it; returns models:/name/version."""
    import xgboost as xgb

    requirements = [f"xgboost=={xgb.__version__}"]  # named: inferring them loads the model in a subprocess (seconds)
    return register(lambda mlflow: mlflow.xgboost.log_model(booster, name="model", registered_model_name=name,
                                                            pip_requirements=requirements),
                    name, registry_uri, experiment, params, metrics, tags)


def register(log_model, name: str, registry_uri: str, experiment: str, params: dict, metrics: dict,
             tags: dict) -> str:
    """Run `log_model(mlflow)` (a flavour's log_model with registered_model_name=name) in a new run of
    `experiment` with the params, metrics and tags; the new version gets the tags too."""
    from mlflow import MlflowClient

    from tuning.tracking.mlflow_tracker import get_or_create_experiment, sqlite_path

    with tracking_at(registry_uri) as mlflow:
        # Not set_experiment(name): a new experiment of a sqlite store would keep its artifacts in
        # ./mlruns of this process's CWD, and lose them with it.
        client = MlflowClient(tracking_uri=registry_uri, registry_uri=registry_uri)
        mlflow.set_experiment(experiment_id=get_or_create_experiment(client, experiment, sqlite_path(registry_uri)))
        with mlflow.start_run(run_name=f"{experiment}-{name}"):
            mlflow.log_params(params)
            mlflow.log_metrics(metrics)
            mlflow.set_tags(tags)
            info = log_model(mlflow)
    version = resolve(f"{name}/{info.registered_model_version}", registry_uri)
    for key, value in tags.items():
        client.set_model_version_tag(name, version.version, key, value if isinstance(value, str) else json.dumps(value))
    return f"models:/{name}/{version.version}"
