"""Which backend a store's location names, and opening it.

    connect_store(location, read_only)   the store: its backend by the location's URL scheme, a sqlite
                                         file for a path; it connects on first use
    open_store(location, key)            the same, opened now (a bad store refused naming `key`)
    register_backend(scheme, target)     another backend for `scheme://...` locations: a class, or
                                         "module:Class" imported when a location first names it
    is_store_url / display_location / store_argument   a location as a URL, in messages, from a flag

The backends the lab ships are registered here by name and imported on first use (PostgreSQL needs
psycopg); an installed package adds its own through the entry-point group `tunelab.store_backends`
(name: the scheme, value: "module:Class"), or a program calls `register_backend`.
"""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from pathlib import Path

from tuning.store.base import MeasurementStore, StoreError

BACKENDS: dict[str, object] = {scheme: "tuning.store.postgres:PostgresStore"
                               for scheme in ("postgresql", "postgresql+psycopg", "postgres")}
PATH_BACKEND = "tuning.store.sqlite:SqliteStore"  # a location that is no URL: a file
ENTRY_POINTS = "tunelab.store_backends"


def register_backend(scheme: str, target) -> None:
    """`scheme://...` locations are served by `target`: a MeasurementStore subclass or "module:Class"."""
    BACKENDS[scheme.lower()] = target


def _scheme(location) -> str | None:
    text = str(location).strip() if isinstance(location, str) else ""
    return text.split("://", 1)[0].lower() if "://" in text else None


def _known_schemes() -> dict:
    found = {ep.name.lower(): ep.value for ep in entry_points(group=ENTRY_POINTS)}
    return {**found, **BACKENDS}


def backend_for(location) -> type[MeasurementStore]:
    """The backend class a location names; a URL of no registered scheme is a StoreError."""
    scheme = _scheme(location)
    target = PATH_BACKEND if scheme is None else _known_schemes().get(scheme)
    if target is None:
        raise StoreError(f"{location}: no store backend for {scheme}:// (known: "
                         f"{', '.join(sorted(_known_schemes()))}; or a sqlite file's path)")
    if isinstance(target, str):
        module, _, name = target.partition(":")
        target = getattr(importlib.import_module(module), name)
    return target


def is_store_url(location) -> bool:
    """Whether `location` names a store by a URL (a server) rather than a sqlite file."""
    return _scheme(location) is not None and _scheme(location) != "file"


def display_location(location) -> str:
    """A store's location as messages and saved files may show it: a URL without its password."""
    if not is_store_url(location):
        return str(location)
    try:
        return backend_for(location).display(location)
    except StoreError:
        return str(location)


def store_argument(text: str):
    """A command-line store option: a URL as it is, else a Path."""
    return text if is_store_url(text) else Path(text)


def connect_store(location, read_only: bool = False, busy_timeout_s: float = 120.0) -> MeasurementStore:
    """The store a path (sqlite) or a URL names; it connects on first use (open_store connects at once)."""
    return backend_for(location)(location, busy_timeout_s=busy_timeout_s, read_only=read_only)


def open_store(path, key: str, read_only: bool = False) -> MeasurementStore:
    """The store at `path` (a file, or a URL), opened now: a store that cannot be read (or, for a
    writer, written) is refused before any work, by a StoreError naming the option `key` it came from."""
    try:
        store = connect_store(path, read_only=read_only)
        store.conn
    except StoreError as error:
        raise StoreError(f"{key}: {error}") from None
    return store
