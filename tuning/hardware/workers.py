"""Long-lived isolated worker processes with per-call timeouts.

A worker is a spawned process that runs its initializer once (with JSON-able
`init_args`, e.g. the target, so it imports what that target needs) and then
serves calls `("module:function", args)` over a pipe. A call that takes
longer than its timeout, or a worker that dies (a segfaulting kernel), is
reported as a value and the worker is restarted on the next call, so the
tuning run goes on. This module does not import TVM; the functions the
workers run do.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import Connection


def _serve(conn, initializer: str | None, init_args: list) -> None:
    if initializer:
        _resolve(initializer)(*init_args)
    while True:
        try:
            function, args = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", _resolve(function)(*args)))
        except Exception:  # noqa: BLE001 - every failure goes back to the parent as a value
            conn.send(("error", traceback.format_exc()))


def _resolve(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


class Worker:
    """One restartable process. `call` returns (status, value): status is
    "ok", "error" (the function raised; value = traceback), "timeout" or "crash".
    Calls from several threads take turns: one pipe carries one call at a time, and two
    calls in flight on it could each receive the other's answer. A call's timeout starts
    when its turn comes."""

    def __init__(self, env: dict | None = None, initializer: str | None = None, start_timeout_s: float = 300.0,
                 init_args: tuple = ()):
        self.env = {k: str(v) for k, v in (env or {}).items()}
        self.initializer = initializer
        self.init_args = list(init_args)
        self.start_timeout_s = start_timeout_s
        self._process = None
        self._conn = None
        self._turn = threading.RLock()  # re-entrant: ensure_started calls call

    def _start(self) -> None:
        """A fresh interpreter (not fork: TVM's threads; not multiprocessing spawn,
        which re-imports the user's __main__), talking over two inherited pipes."""
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        command = [sys.executable, "-m", "tuning.hardware.workers", str(to_child_r), str(from_child_w),
                   self.initializer or "", json.dumps(self.init_args)]
        # TVM_NUM_THREADS must be in the environment before the TVM runtime starts.
        self._process = subprocess.Popen(command, env={**os.environ, **self.env},
                                         pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self._conn = _Pipes(Connection(from_child_r, writable=False), Connection(to_child_w, readable=False))

    def ensure_started(self) -> tuple[str, object]:
        """Start the worker and wait until its initializer has run."""
        with self._turn:
            if self._alive():
                return "ok", None
            self._start()
            return self.call("tuning.hardware.workers:ping", timeout=self.start_timeout_s)

    def call(self, function: str, *args, timeout: float) -> tuple[str, object]:
        with self._turn:
            return self._call(function, args, timeout)

    def _call(self, function: str, args: tuple, timeout: float) -> tuple[str, object]:
        if not self._alive():
            status, value = self.ensure_started()
            if status != "ok":
                return status, f"worker failed to start: {value}"
        try:
            self._conn.send((function, args))
            if not self._conn.poll(timeout):
                self.kill()
                return "timeout", f"no answer within {timeout:.1f} s"
            return self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            code = self._process.wait(timeout=10) if self._process else None
            self.kill()
            return "crash", f"worker died (exit code {code})"

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=10)
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    close = kill


def ping() -> str:
    return "pong"


class _Pipes:
    """A duplex connection made of two one-way ones."""

    def __init__(self, reader: Connection, writer: Connection):
        self.reader, self.writer = reader, writer

    def send(self, obj) -> None:
        self.writer.send(obj)

    def recv(self):
        return self.reader.recv()

    def poll(self, timeout: float) -> bool:
        return self.reader.poll(timeout)

    def close(self) -> None:
        self.reader.close()
        self.writer.close()


if __name__ == "__main__":
    # Ctrl-C reaches the whole process group: the parent stops (and kills) its workers, which would
    # otherwise each print a KeyboardInterrupt traceback over its "interrupted" line
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _serve(_Pipes(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False)),
           sys.argv[3] or None, json.loads(sys.argv[4]))
