"""What the RPC runner's device processes run (imports TVM; never imported by the parent).

One process per held device (tuning/hardware/runners/rpc.py drives them): it asks TVM's tracker for
a session with one server of the key and keeps it. For each candidate it uploads the library built
on this host, loads it there, checks its answer against the untuned kernel's (computed on this
host's CPU: the same arithmetic), times it with the device's own time_evaluator (tvm_worker's
check_and_time: the network is never part of a reading) and removes it. A failure of the session
itself (the server died, the link is down, the server's session timeout struck) comes back as
{"lost": message}, so the runner can tell a lost device from a kernel that failed; a call that never
returns (a cut link) is the worker's timeout, which the runner treats the same way.
"""
from __future__ import annotations

import gc
import json
import os
import tempfile
import time

from tuning.hardware.rpc_server import IDENTITY_FUNCTION
from tuning.hardware.tvm_space import HOST_TARGET
from tuning.hardware.tvm_worker import (
    _compile,
    _key,
    check_and_time,
    export,
    gauge_module,
    gauge_timer,
    reference_arrays,
    without_torch,
)

_session: dict = {}  # "remote", "identity", "opened"
_references: dict = {}
_gauges: dict = {}


def init() -> None:
    without_torch()
    import tvm  # noqa: F401 - pay the import at worker start


def connect(tracker: str, key: str, priority: int, session_timeout_s: float) -> dict:
    """Hold a session with one free server of `key`; returns what the server says of itself (the
    lab's server: its name, CPU model, LLVM cpu and triple; TVM's stock server: {})."""
    from tvm import rpc

    host, port = tracker.rsplit(":", 1)
    remote = rpc.connect_tracker(host, int(port)).request(key, priority=priority, session_timeout=session_timeout_s,
                                                          max_retry=1)
    identity = _identity(remote)
    _session.update(remote=remote, identity=identity, opened=time.monotonic(),
                    again=(tracker, key, priority, session_timeout_s))
    _gauges.clear()
    return identity


def _identity(remote) -> dict:
    try:
        function = remote.get_function(IDENTITY_FUNCTION)
    except (AttributeError, RuntimeError):  # TVM's stock server: no such function
        return {}
    identity = json.loads(function())
    return identity if isinstance(identity, dict) else {}


def run(workload: dict, target: dict, kind: str, lib_path: str, args: list, spec: dict, longest_s: float) -> dict:
    """Upload, check, time and remove one library; the tvm_worker.run dict plus "upload_s".
    `longest_s`: the most this call may take (the session is renewed first if it would expire)."""
    reference = _reference(workload, target)
    problem = _renew_before_expiry(longest_s)
    if problem:
        return {"lost": problem}
    remote = _session["remote"]
    name = os.path.basename(lib_path)
    start = time.perf_counter()
    try:
        remote.upload(lib_path)
        lib = remote.load_module(name)
        upload_s = time.perf_counter() - start
        result = check_and_time(lib, remote.device(kind, 0), kind, reference, args, spec, time.perf_counter())
    except Exception as error:  # noqa: BLE001 - a session that is gone, or a kernel that failed on a live one
        failure = _failure("run", error)
        if "lost" not in failure:
            _remove(name)
        return failure
    _remove(name)
    return {**result, "upload_s": upload_s}


def _renew_before_expiry(margin_s: float) -> str | None:
    """A fresh session when the server's session timeout would strike within `margin_s` (the server
    kills a session at its timeout, whatever it is doing); why not, when the device cannot go on
    under its name (no new session, or one with another server)."""
    session_timeout_s = _session["again"][3]
    if not session_timeout_s or time.monotonic() - _session["opened"] <= session_timeout_s - margin_s:
        return None
    name = _session["identity"].get("name")
    _gauges.clear()  # its tensors hold the old session open
    _session["remote"] = None
    gc.collect()  # the old session closes: its server goes back to the tracker
    try:
        identity = connect(*_session["again"])
    except Exception as error:  # noqa: BLE001 - no new session: this device is gone for now
        return f"could not renew the session: {type(error).__name__}: {error}"
    if identity.get("name") != name:
        return f"the renewed session reached another server ({identity.get('name')})"
    return None


def _failure(kind: str, error: Exception) -> dict:
    """A kernel's failure as a record kind, or {"lost": ...} when the session itself is gone."""
    message = f"{type(error).__name__}: {error}"
    if not _alive():
        return {"lost": message}
    return {"error": kind, "message": message, "run_s": 0.0}


def _alive() -> bool:
    """A round trip to the server (a device's `exist` is answered here, without one)."""
    try:
        _session["remote"].get_function("tvm.rpc.server.remove")
    except AttributeError:  # the server answered that it has no such function
        return True
    except Exception:  # noqa: BLE001 - any other failure of the probe means the session is gone
        return False
    return True


def _remove(name: str) -> None:
    try:
        _session["remote"].remove(name)
    except Exception:  # noqa: BLE001 - the server deletes its work folder with the session anyway
        pass


def _reference(workload: dict, target: dict) -> tuple:
    key = _key(workload, target)
    if key not in _references:
        _references[key] = reference_arrays(workload, HOST_TARGET, "cpu")
    return _references[key]


def gauge(target: dict, kind: str) -> dict:
    """The drift gauge (tvm_worker.gauge_timer) timed on the device: {"seconds"} or {"lost"} /
    {"error"} (a device that cannot run what this target builds)."""
    try:
        if "timer" not in _gauges:
            mod = gauge_module(target)
            remote = _session["remote"]
            with tempfile.TemporaryDirectory(prefix="tunelab-gauge-") as folder:
                path = os.path.join(folder, "gauge.so")
                export(_compile(mod, target), target, path)
                remote.upload(path)
            _gauges["timer"] = gauge_timer(mod, remote.load_module("gauge.so"), remote.device(kind, 0))
        return {"seconds": _gauges["timer"]()}
    except Exception as error:  # noqa: BLE001
        _gauges.clear()
        return _failure("run", error)
