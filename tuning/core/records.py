"""Measurement results and the append-only records file.

Errors are values: a MeasureResult either has costs (seconds, every repeat
kept) or an error kind and message. Records are JSON lines, written and
flushed one by one as candidates are measured (fsynced once a round), so a
killed run loses nothing it measured and can resume from the file. A file is untrusted input
(`tuning.database` may name any file): every line is checked field by field,
and a line that is not a record raises RecordError naming the file and line.
A cost must be a plausible reading (tuning/core/plausible.py): a record carries
neither the task's FLOPs nor the device's description, so it is held to the bounds
that need neither (positive, 1 ns to an hour); a corrupt cost is refused like any
corrupt line, since compare, resume and tuning.database would otherwise rank
by it. A measured result outside its task's bounds becomes an `implausible`
error in its place (`MeasureResult.within`). Fields added later (`reused`, `gauge_s`, `device`, `screened`) are
left out at their defaults, so a run that does not use them writes the records it wrote before.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import IO, Any

from tuning.core import plausible

# device_lost: the device timing the config disappeared mid-batch (a remote board, a GPU of a cluster);
# a fact about the device, not the config. A GPU's own failures (tuning/hardware/gpu_pack_runner.py
# GPU_ERRORS, from the CUDA driver's message): launch_failed (an illegal address, an unspecified
# launch failure), out_of_resources (too many registers or threads for a launch), device_hang (the
# kernel did not finish: the watchdog's timeout, or no answer from the timing process)
ERROR_KINDS = ("build", "run", "timeout", "invalid", "wrong_answer", "not_in_store", "implausible", "device_lost",
               "launch_failed", "out_of_resources", "device_hang")


class RecordError(ValueError):
    """A line of a records file that is not a tunelab record ("<path>:<line>: ...")."""


@dataclass
class MeasureResult:
    costs: list[float] = field(default_factory=list)  # seconds, one per repeat
    error: str | None = None  # one of ERROR_KINDS, or None
    message: str = ""
    build_s: float = 0.0  # wall seconds spent building this candidate
    run_s: float = 0.0  # wall seconds spent measuring it
    config: tuple[int, ...] | None = None  # effective (canonical) config read back after replay, if known
    reused: bool = False  # answered from the measurement store, not measured by this run
    gauge_s: float | None = None  # the drift gauge's reading with this result's batch (tuning/store/)
    device: str | None = None  # which device timed it ("cuda:1"), when the runner has several
    screened: bool = False  # one run only: it took longer than the round's screening cut (MeasureSpec)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.costs)

    @property
    def cost(self) -> float:
        """Median of the repeats (inf on error). Not the mean: on a 2-core host a
        preempted run costs 10-50x a normal one, and one such spike in ten
        repeats would otherwise decide the ranking."""
        return statistics.median(self.costs) if self.ok else math.inf

    def gflops(self, flops: float) -> float:
        return flops / self.cost / 1e9 if self.ok else 0.0

    def within(self, limits: plausible.Bounds) -> MeasureResult:
        """This result, or an `implausible` error in its place when a cost lies outside `limits`:
        a clock glitch is not a reading to rank configs or train models by."""
        problem = limits.first_problem(self.costs)
        if problem is None:
            return self
        return replace(self, costs=[], error="implausible", message=f"{problem}; readings {self.costs}"[:2000])

    @classmethod
    def failed(cls, error: str, message: str, **timings: Any) -> MeasureResult:
        assert error in ERROR_KINDS, error
        return cls(error=error, message=message[-2000:], **timings)


@dataclass
class Record:
    task: str  # task name
    workload_key: str
    config: list[int]
    decisions: dict[str, Any]
    result: MeasureResult
    round: int
    method: str
    seed: int
    index: int  # 0-based measurement index within the task
    time: float  # unix time the result came back

    def to_json(self) -> str:
        # the fields as they are, not asdict's deep copy (the line is the same: json.dumps copies nothing)
        result = {name: getattr(self.result, name) for name in _RESULT_NAMES}
        for key, default in _RESULT_DEFAULTS.items():  # see the module docstring
            if result[key] == default:
                del result[key]
        data = {name: getattr(self, name) for name in _RECORD_NAMES}
        data["result"] = result
        return json.dumps(data, default=str)  # tuples are written as arrays by json itself

    @classmethod
    def from_json(cls, line: str) -> Record:
        """The record on one line; ValueError saying why when the line is not one."""
        data = json.loads(line)
        problem = _shape_problem(data, Record, RECORD_FIELDS, "")
        problem = problem or _shape_problem(data["result"], MeasureResult, RESULT_FIELDS, "result.")
        problem = problem or _costs_problem(data["result"].get("costs", []))
        if problem:
            raise ValueError(problem)
        result = data.pop("result")
        result["config"] = tuple(result["config"]) if result.get("config") is not None else None
        return cls(result=MeasureResult(**result), **data)


_RESULT_DEFAULTS = {"reused": False, "gauge_s": None, "device": None, "screened": False}
_RECORD_NAMES = tuple(f.name for f in fields(Record))
_RESULT_NAMES = tuple(f.name for f in fields(MeasureResult))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_ints(value: Any) -> bool:
    return isinstance(value, list) and all(map(_is_int, value))


# field -> (what it must be, test); a record's fields as to_json writes them
RECORD_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "task": ("a string", lambda v: isinstance(v, str)),
    "workload_key": ("a string", lambda v: isinstance(v, str)),
    "config": ("a list of ints", _is_ints),
    "decisions": ("an object", lambda v: isinstance(v, dict)),
    "result": ("an object", lambda v: isinstance(v, dict)),
    "round": ("an int", _is_int),
    "method": ("a string", lambda v: isinstance(v, str)),
    "seed": ("an int", _is_int),
    "index": ("an int", _is_int),
    "time": ("a finite number", _is_finite),
}
RESULT_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "costs": ("a list of finite numbers", lambda v: isinstance(v, list) and all(map(_is_finite, v))),
    "error": (f"null or one of {', '.join(ERROR_KINDS)}", lambda v: v is None or v in ERROR_KINDS),
    "message": ("a string", lambda v: isinstance(v, str)),
    "build_s": ("a finite number", _is_finite),
    "run_s": ("a finite number", _is_finite),
    "config": ("null or a list of ints", lambda v: v is None or _is_ints(v)),
    "reused": ("a boolean", lambda v: isinstance(v, bool)),
    "gauge_s": ("null or a finite number", lambda v: v is None or _is_finite(v)),
    "device": ("null or a string", lambda v: v is None or isinstance(v, str)),
    "screened": ("a boolean", lambda v: isinstance(v, bool)),
}


def _costs_problem(costs: list[Any]) -> str | None:
    """Why a record's costs are not plausible readings (positive, 1 ns to an hour), or None."""
    problem = plausible.ABSOLUTE.first_problem(costs)
    return f"result.costs: {problem}" if problem else None


def _shape_problem(data: Any, schema: type, checks: dict[str, tuple[str, Callable[[Any], bool]]],
                   prefix: str) -> str | None:
    """Why `data` (parsed JSON) cannot be the dataclass `schema`, or None. Fields with a
    default may be missing (to_json leaves out defaults, older files lack newer fields)."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"  # `result` was checked as a field
    required = [f.name for f in fields(schema) if f.default is MISSING and f.default_factory is MISSING]
    missing = [prefix + key for key in required if key not in data]
    unknown = [prefix + key for key in data if key not in checks]
    if missing or unknown:
        return "; ".join(f"{what} field {', '.join(keys)}" for what, keys in
                         (("missing", missing), ("unknown", unknown)) if keys)
    for key, (expected, ok) in checks.items():
        if key in data and not ok(data[key]):
            return f"{prefix}{key}: expected {expected}, got {json.dumps(data[key])[:80]}"
    return None


class RecordLog:
    """records.jsonl: appended (`writer`: flushed a record, fsynced on `sync`); tolerant of a torn last line."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> list[Record]:
        """Every record in the file. A last line without newline was cut by a kill and is not
        one; any other line that is not a record raises RecordError naming the file and line."""
        if not self.path.exists():
            return []
        records = []
        with self.path.open("rb") as f:
            for number, line in enumerate(f, start=1):
                if line.endswith(b"\n"):
                    records.append(self._parse(line, number))
        return records

    def _parse(self, line: bytes, number: int) -> Record:
        try:
            return Record.from_json(line.decode("utf-8"))
        except UnicodeDecodeError as error:
            reason = f"not UTF-8 text at byte {error.start}"
        except json.JSONDecodeError as error:
            reason = f"not JSON: {error.msg} at column {error.colno}"
        except ValueError as error:
            reason = str(error)
        raise RecordError(f"{self.path}:{number}: not a tunelab record ({reason})")

    def repair(self) -> None:
        """Drop a torn trailing line left by a kill, so appends start clean. The file is truncated
        in place, never rewritten: a kill during the repair cannot empty it."""
        if not self.path.exists():
            return
        with self.path.open("r+b") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0 or _byte_at(f, size - 1) == b"\n":
                return
            f.truncate(_end_of_last_line(f, size))
            f.flush()
            os.fsync(f.fileno())

    def append(self, record: Record) -> None:
        with self.writer() as writer:
            writer.write(record)

    def writer(self) -> RecordWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return RecordWriter(self.path.open("a"))


class RecordWriter:
    """Records appended to an open records.jsonl. Each line is handed to the OS as it is written
    (a killed process loses none); `sync` makes the file durable (the loop syncs after every
    round: a machine that loses power loses at most the round in flight). Closing syncs. (An fsync
    per record was most of what writing a replayed record cost.)"""

    def __init__(self, file: IO[str]) -> None:
        self.file = file

    def write(self, record: Record) -> None:
        self.file.write(record.to_json() + "\n")
        self.file.flush()

    def sync(self) -> None:
        os.fsync(self.file.fileno())

    def close(self) -> None:
        if not self.file.closed:
            self.sync()
            self.file.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _byte_at(f: IO[bytes], offset: int) -> bytes:
    f.seek(offset)
    return f.read(1)


def _end_of_last_line(f: IO[bytes], size: int, chunk: int = 1 << 16) -> int:
    """The offset just past the last newline in the file's first `size` bytes (0: none), read
    backwards a chunk at a time."""
    end = size
    while end > 0:
        start = max(0, end - chunk)
        f.seek(start)
        newline = f.read(end - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0
