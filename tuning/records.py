"""Measurement results and the append-only records file.

Errors are values: a MeasureResult either has costs (seconds, every repeat
kept) or an error kind and message. Records are JSON lines, written and
flushed one by one as candidates are measured, so a killed run loses
nothing it measured and can resume from the file.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

ERROR_KINDS = ("build", "run", "timeout", "invalid", "wrong_answer", "not_in_store")


@dataclass
class MeasureResult:
    costs: list[float] = field(default_factory=list)  # seconds, one per repeat
    error: str | None = None  # one of ERROR_KINDS, or None
    message: str = ""
    build_s: float = 0.0  # wall seconds spent building this candidate
    run_s: float = 0.0  # wall seconds spent measuring it
    config: tuple | None = None  # effective (canonical) config read back after replay, if known
    reused: bool = False  # answered from the measurement store, not measured by this run
    gauge_s: float | None = None  # the drift gauge's reading with this result's batch (tuning/store.py)

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

    @classmethod
    def failed(cls, error: str, message: str, **timings) -> "MeasureResult":
        assert error in ERROR_KINDS, error
        return cls(error=error, message=message[-2000:], **timings)


@dataclass
class Record:
    task: str  # task name
    workload_key: str
    config: list[int]
    decisions: dict
    result: MeasureResult
    round: int
    method: str
    seed: int
    index: int  # 0-based measurement index within the task
    time: float  # unix time the result came back

    def to_json(self) -> str:
        data = asdict(self)
        for key, default in _RESULT_DEFAULTS.items():  # records without the store read as before it
            if data["result"].get(key) == default:
                del data["result"][key]
        return json.dumps(data, default=str)  # tuples are written as arrays by json itself

    @classmethod
    def from_json(cls, line: str) -> "Record":
        data = json.loads(line)
        result = data.pop("result")
        result["config"] = tuple(result["config"]) if result.get("config") is not None else None
        return cls(result=MeasureResult(**result), **data)


_RESULT_DEFAULTS = {"reused": False, "gauge_s": None}


class RecordLog:
    """records.jsonl: append + flush + fsync per record; tolerant of a torn last line."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def load(self) -> list[Record]:
        if not self.path.exists():
            return []
        records = []
        with self.path.open() as f:
            for line in f:
                if line.endswith("\n"):  # a line without newline was cut by a kill
                    records.append(Record.from_json(line))
        return records

    def repair(self) -> None:
        """Drop a torn trailing line left by a kill, so appends start clean."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    def append(self, record: Record) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(record.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
