"""The measurement store: every reading of every (hardware, kernel, config), kept in one sqlite file
or one PostgreSQL database (docs/store.md).

    base.py      the contract (`MeasurementStore`, abstract) and the readers every backend shares
    sqlite.py    one sqlite file            postgres.py   one PostgreSQL database
    open.py      the backend a location names, by URL scheme (`register_backend` adds one)
    rows.py      one task's rows (`TaskRows`)            copy.py   one store into another

`tuning.testing.store_contract` is the suite a backend passes, the lab's and any other.
"""
from tuning.store.base import (
                               COLUMNS,
                               FORMAT,
                               OWN_TABLES,
                               READING_COLUMNS,
                               SOURCES,
                               MeasurementStore,
                               Row,
                               StoreError,
                               digest,
                               fingerprint,
                               jsonable,
                               reading_settings,
                               space_signature,
)
from tuning.store.copy import CopyCounts, copy_store
from tuning.store.open import (
                               backend_for,
                               connect_store,
                               display_location,
                               is_store_url,
                               open_store,
                               register_backend,
                               store_argument,
)
from tuning.store.rows import TaskRows
from tuning.store.sqlite import SqliteStore, unwritable

__all__ = ["COLUMNS", "FORMAT", "OWN_TABLES", "READING_COLUMNS", "SOURCES", "CopyCounts", "MeasurementStore", "Row",
           "SqliteStore", "StoreError", "TaskRows", "backend_for", "connect_store", "copy_store", "digest",
           "display_location", "fingerprint", "is_store_url", "jsonable", "open_store", "reading_settings",
           "register_backend", "space_signature", "store_argument", "unwritable"]
