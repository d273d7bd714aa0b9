"""Copying one measurement store into another, either backend to either (`dataset copy`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from tuning.store.base import READING_COLUMNS, MeasurementStore, _parse_row


@dataclass
class CopyCounts:
    """What `copy_store` did: readings copied, readings the target held already, readings no reader
    would accept (left behind), and the new rows of the describing tables (hardware, tasks, spaces,
    meta) with those that were not valid."""

    copied: int = 0
    held: int = 0
    unreadable: int = 0
    described: int = 0
    invalid: int = 0


def _text(value) -> bool:
    return isinstance(value, str)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_DESCRIBING = (  # table, columns, what a valid row holds
    ("meta", ("key", "value"), lambda r: _text(r[0]) and _text(r[1]) and r[0] != "format"),
    ("hardware", ("hash", "description"), lambda r: _text(r[0]) and _text(r[1])),
    ("tasks", ("key", "name", "flops", "workload"), lambda r: _text(r[0]) and _text(r[1]) and _number(r[2])
     and _text(r[3])),
    ("spaces", ("key", "size"), lambda r: _text(r[0]) and _number(r[1])),
)


def copy_store(source: MeasurementStore, target: MeasurementStore, chunk: int = 5000, progress=None) -> CopyCounts:
    """Every row of `source` that `target` lacks, into `target` (either backend to either).

    The describing tables first (a key the target holds keeps its row), then the readings in id
    order, as they are (not re-parsed, the target gives them new ids in the same order), `chunk` rows
    per transaction. The source is untrusted: only readings `_parse_row` accepts are copied (the
    rest count as unreadable), and a reading the target holds already (the same hardware, task,
    space, config, costs, error, message, measured_at and source) is skipped, so a copy that was
    killed resumes when run again. `progress(n)` is called after each chunk of n source rows."""
    counts = CopyCounts()
    for table, columns, valid in _DESCRIBING:
        rows = []
        for raw in source._fetch(f"SELECT {', '.join(columns)} FROM {table}"):
            described = tuple(map(target._stored, raw))
            if valid(described):
                rows.append(described)
            elif not (table == "meta" and described[0] == "format"):  # the target has its own
                counts.invalid += 1
        before = target._fetch(f"SELECT COUNT(*) FROM {table}")[0][0]
        target._insert_many(table, columns, rows, ignore=True)
        counts.described += target._fetch(f"SELECT COUNT(*) FROM {table}")[0][0] - before
    held: dict = {}  # (hardware, task, space) -> the target's readings of it, as identities
    for batch in source._stream(f"SELECT {', '.join(READING_COLUMNS)} FROM readings ORDER BY id", size=chunk):
        new = []
        for raw in batch:
            row = _copyable(tuple(map(target._stored, raw)), source)
            if row is None:
                counts.unreadable += 1
                continue
            key = row[:3]
            if key not in held:
                held[key] = set(map(tuple, target._fetch(
                    "SELECT config, costs, error, message, measured_at, source FROM readings "
                    "WHERE hardware = ? AND task = ? AND space = ?", key)))
            identity = (row[3], row[5], row[6], row[7], row[11], row[12])
            if identity in held[key]:
                counts.held += 1
                continue
            held[key].add(identity)
            new.append(row)
        if new:
            target._insert_many("readings", READING_COLUMNS, new)
        counts.copied += len(new)
        if progress:
            progress(len(batch))
    return counts


def _copyable(row: tuple, source: MeasurementStore) -> tuple | None:
    """A source reading as the target stores it (a missing message is ''), or None when a reader
    would skip it (or no store could hold it: a key or text that is not text)."""
    hardware, task, space, config, decisions, costs, error, message, build_s, run_s, gauge_s, measured_at, what = row
    if not (all(map(_text, (hardware, task, space, config, decisions, costs, what)))
            and (error is None or _text(error)) and (message is None or _text(message))):
        return None
    if _parse_row((config, costs, error, message, build_s, run_s, gauge_s, measured_at, what),
                  source.bounds(hardware, task)) is None:
        return None
    return (*row[:7], message or "", *row[8:])


