"""A new sqlite MLflow store starts as a copy of an empty one, not from MLflow's migrations.

MLflow makes a new sqlite store by creating its first schema and then running every alembic
migration since (about 1.6 s on a 2-core host, paid by each fresh outputs/ folder, each test's).
An empty store made once per MLflow version, with its Default experiment removed (MLflow adds it
again with the new store's own artifact location when it finds none), is kept in the user's cache
and copied into place instead: MLflow then finds its tables at the current schema and only adds
the Default experiment (0.04 s). The copy is linked into place only while no file is there, so a
database another process has started is never replaced; anything that goes wrong leaves MLflow to
create the store itself, as before.
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("TUNELAB_CACHE") or Path.home() / ".cache" / "tunelab")


def seed_uri(uri: str) -> None:
    """`seed` for the file of a `sqlite:///` tracking URI (other URIs: nothing)."""
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):].split("?", 1)[0]
        if path and path != ":memory:" and Path(path).parent.is_dir():
            seed(Path(path))


def seed(db: Path) -> None:
    """Put an empty store at `db` when nothing is there (best effort: MLflow creates it otherwise)."""
    if db.exists():
        return
    try:
        template = empty_store()
        staged = db.with_name(f".{db.name}.{os.getpid()}.seed")
        shutil.copyfile(template, staged)
        try:
            os.link(staged, db)  # fails if a file appeared meanwhile: that database is left alone
        except FileExistsError:
            pass
        finally:
            staged.unlink(missing_ok=True)
    except Exception:  # noqa: BLE001 - a cache only: MLflow then creates the store itself, as before
        return


def empty_store() -> Path:
    """The cached empty store of this MLflow version (made on first use)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    path = cache_dir() / f"mlflow-{mlflow.__version__}-empty.db"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        made = Path(scratch) / "empty.db"
        MlflowClient(tracking_uri=f"sqlite:///{made}").search_experiments()
        with sqlite3.connect(made) as conn:
            conn.execute("DELETE FROM experiments")
        os.replace(made, path)
    return path
