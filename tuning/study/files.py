"""A study's results: one small JSON file per finished block, written once and never rewritten.

    <results>/blocks/<task>-seed<seed>-<plan hash>-<host key>.json

A block file is made whole in a temporary file and moved into place, so a block killed at any moment
leaves no file: its (task, seed) is run again, from its start, by the next `study run` on any host.
Files are read back as untrusted input: plain JSON of known shape, checked before use; a file that is
not is named and left out of the table, never run or followed.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuning.cluster.host_identity import host_key

FORMAT = 1
MAX_BYTES = 4 << 20  # a block file holds a few thousand readings: a larger one is not one
SUFFIX = ".json"


@dataclass(frozen=True)
class BlockFile:
    path: Path
    data: dict[str, Any]

    @property
    def block(self) -> str:
        return str(self.data["block"])


def number(value: Any) -> float | None:
    """A number a block file holds, or None where the field is missing or not a number."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def blocks_dir(results: Path) -> Path:
    return results / "blocks"


def write_block(results: Path, data: dict[str, Any]) -> Path:
    """The block's file, made whole and then moved into place (0644); never over an existing one."""
    folder = blocks_dir(results)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{data['block']}-{data['plan_hash']}-{host_key(data['host'])}{SUFFIX}"
    text = json.dumps({"format": FORMAT, **data}, sort_keys=True, separators=(",", ":"), allow_nan=False)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text + "\n")
        os.chmod(temporary, 0o644)
        os.link(temporary, path)  # fails where the file exists: a block file is never rewritten
    finally:
        Path(temporary).unlink(missing_ok=True)
    return path


def finished_blocks(results: Path, study: str, arms: tuple[str, ...], plan_hash: str) -> set[str]:
    """The blocks (`<task>-seed<seed>`) some host has finished under this plan (files of another plan,
    or that do not read as block files, finish nothing: their blocks are made again)."""
    files, _ = read_blocks(results, study, arms)
    return {f.block for f in files if f.data["plan_hash"] == plan_hash}


def other_plans(results: Path, study: str, arms: tuple[str, ...], plan_hash: str) -> dict[str, int]:
    """Plan hash -> how many of the study's block files were made under it, for plans other than this one."""
    files, _ = read_blocks(results, study, arms)
    counts: dict[str, int] = {}
    for f in files:
        if f.data["plan_hash"] != plan_hash:
            counts[f.data["plan_hash"]] = counts.get(f.data["plan_hash"], 0) + 1
    return counts


def read_blocks(results: Path, study: str, arms: tuple[str, ...]) -> tuple[list[BlockFile], list[str]]:
    """The study's block files that read as such (the first of a block's under one plan, by name, where
    two hosts made it), and a line for each file left out and why."""
    found: dict[tuple[str, str], BlockFile] = {}
    problems: list[str] = []
    folder = blocks_dir(results)
    for path in sorted(folder.glob(f"*{SUFFIX}")) if folder.is_dir() else []:
        data, problem = _read(path, study, arms)
        if problem:
            problems.append(f"{path}: {problem}; left out")
        elif (data["block"], data["plan_hash"]) in found:
            first = found[data["block"], data["plan_hash"]].path.name
            problems.append(f"{path}: block {data['block']} made again (first: {first}); the first is used")
        else:
            found[data["block"], data["plan_hash"]] = BlockFile(path, data)
    return list(found.values()), problems


def _read(path: Path, study: str, arms: tuple[str, ...]) -> tuple[dict[str, Any], str | None]:
    if path.is_symlink() or not path.is_file():
        return {}, "not a plain file"
    if path.stat().st_size > MAX_BYTES:
        return {}, f"larger than {MAX_BYTES >> 20} MiB"
    try:
        data = json.loads(path.read_text(), parse_constant=_no_constant)
    except (OSError, ValueError, UnicodeDecodeError) as error:
        return {}, f"not JSON ({error})"
    return data, _shape_problem(data, study, arms)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a block file holds")


def _shape_problem(data, study: str, arms: tuple[str, ...]) -> str | None:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return f"not a block file of format {FORMAT}"
    if data.get("study") != study:
        return f"a block of study {data.get('study')!r}, not {study!r}"
    for key, kind in (("block", str), ("task", str), ("plan_hash", str), ("seed", int), ("host", dict),
                      ("arms", dict), ("panel", dict)):
        if not isinstance(data.get(key), kind):
            return f"{key}: expected {kind.__name__}"
    if data["block"] != f"{data['task']}-seed{data['seed']}":
        return "block: does not name its task and seed"
    for arm in arms:
        final = data["arms"].get(arm, {}).get("final_s") if isinstance(data["arms"].get(arm), dict) else "missing"
        if final is not None and not (isinstance(final, (int, float)) and math.isfinite(final) and final > 0):
            return f"arms.{arm}.final_s: expected a positive number or null, got {final!r}"
    return None
