"""This machine as its readings depend on it: the CPU model, its flags (hashed) and its core count, and
a file name for it (`host_key`). Study blocks name their host by it."""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path


def host_identity(cpuinfo: str | None = None, cores: int | None = None) -> dict:
    """This machine as its readings depend on it: CPU model, the first processor's flags, core count."""
    model, flags = _model_and_flags(cpuinfo)
    return _identity(model, cores, flags)


def vector_isa(cpuinfo: str | None = None) -> str:
    """The widest x86 vector extension the CPU has ("avx512", "avx2", else "other"): kernels tuned on
    AVX-512 and AVX2 hosts differ in kind, so a study shows them apart where both appear."""
    _, flags = _model_and_flags(cpuinfo)
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"


def _model_and_flags(cpuinfo: str | None) -> tuple[str, list[str]]:
    """The CPU model and the first processor's flags, sorted."""
    fields = _cpu_fields(cpuinfo)
    return fields.get("model name", "unknown"), sorted(set(fields.get("flags", "").split()))


def _cpu_fields(cpuinfo: str | None) -> dict:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _identity(model: str, cores: int | None, flags: list[str]) -> dict:
    return {"cpu_model": model, "cores": cores or os.cpu_count() or 0,
            "flags": hashlib.sha1(" ".join(flags).encode()).hexdigest()[:12]}


def host_key(identity: dict) -> str:
    """A file name for the host: readable model, cores and a hash of the whole identity."""
    slug = re.sub(r"[^a-z0-9]+", "-", identity["cpu_model"].lower()).strip("-")[:40] or "unknown"
    whole = hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
    return f"{slug}-{identity['cores']}c-{whole}"
