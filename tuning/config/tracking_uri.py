"""An MLflow tracking URI checked before any work: a database or a server, a sqlite file that is one,
a driver that is installed. The MLflow tracker (tuning/tracking/mlflow_tracker.py) and the storage
settings (storage.py) read the same rules."""
from __future__ import annotations

from pathlib import Path

DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
SERVER_SCHEMES = ("http", "https")
SQLITE_MAGIC = b"SQLite format 3\x00"
SQLITE_HINT = "tracking.uri=sqlite:////abs/path/mlflow.db"


def uri_problems(key: str, uri) -> list[str]:
    """What is wrong with a tracking URI, before any work: a store other than a database or a
    server (MLflow 3's file store, `file:` or a bare path, is in maintenance mode and refuses to
    open by default), a sqlite path that is a folder or a file that is not a database, a database
    driver that is not installed."""
    if not isinstance(uri, str) or not uri.strip():
        return [f"{key}: expected an MLflow tracking URI ({SQLITE_HINT} or http://host:5000), got {uri!r}"]
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if scheme in SERVER_SCHEMES:
        return []
    if scheme not in DATABASE_SCHEMES:
        what = "a path (MLflow 3 no longer keeps runs in folders)" if scheme in ("", "file") else f"a {scheme}: URI"
        return [f"{key}: {uri} is {what}; tunelab tracks to a database or a server "
                f"({', '.join(f'{s}://' for s in (*DATABASE_SCHEMES, *SERVER_SCHEMES))}): use {SQLITE_HINT}, "
                "or http://host:5000, or tracking=none"]
    if scheme != "sqlite":
        return _driver_problems(key, uri)
    return _sqlite_problems(key, uri)


def _sqlite_problems(key: str, uri: str) -> list[str]:
    if not uri.startswith("sqlite:///") and uri.split("?", 1)[0] != "sqlite://":
        return [f"{key}: {uri} names no file; a sqlite URI has three slashes before the path ({SQLITE_HINT})"]
    db = sqlite_path(uri)
    if db is None:
        return [f"{key}: {uri} is an in-memory database: the run's history would vanish with the process "
                f"({SQLITE_HINT})"]
    if db.is_dir():
        return [f"{key}: {db} is a folder, not a sqlite database file (e.g. tracking.uri=sqlite:///{db}/mlflow.db)"]
    if db.is_file():
        try:
            with db.open("rb") as handle:
                head = handle.read(len(SQLITE_MAGIC))
        except OSError as error:
            return [f"{key}: cannot read {db} ({error.strerror})"]
        if head and head != SQLITE_MAGIC:
            return [f"{key}: {db} is not a sqlite database (it does not start with {SQLITE_MAGIC[:-1].decode()!r}); "
                    "point at a database file or a new path"]
        return []
    blocker = next((p for p in db.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return [f"{key}: {db} cannot be created: {blocker} is a file, not a folder"]
    return []


def _driver_problems(key: str, uri: str) -> list[str]:
    """A server database's SQLAlchemy driver, imported now rather than failing every call later."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        make_url(uri).get_dialect().import_dbapi()
    except (ArgumentError, NoSuchModuleError, ValueError) as error:
        return [f"{key}: not a database URL SQLAlchemy reads ({error})"]
    except ImportError as error:
        hint = " (pip install 'tunelab[cluster]' installs psycopg)" if uri.startswith("postgres") else ""
        return [f"{key}: {uri.split(':', 1)[0]} needs its Python driver, which is not installed ({error}){hint}"]
    return []


def sqlite_path(uri: str | None) -> Path | None:
    """The file of a `sqlite:///` URI (None for other URIs, None and :memory:)."""
    if not uri or not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def missing_store(uri: str, what: str = "runs") -> str | None:
    """Why a read-only command has nothing to read at `uri`: a sqlite file that is not there (an MLflow client
    would create it), naming it; None otherwise."""
    from tuning.config.untrusted import without_secrets

    db = sqlite_path(uri)
    if db is None or db.is_file():
        return None
    return (f"no {what} in {without_secrets(uri)} (it does not exist): tune first (tunelab run ...), or name the "
            "MLflow store with --tracking-uri or MLFLOW_TRACKING_URI")
