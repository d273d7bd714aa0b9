"""A stand-in for a remote runner with two devices, for the runner contract's tests (no TVM).

`TwoDevices` is what an RPC runner looks like to TVMHardware: it "builds" nothing and times each
candidate on one of its devices with the synthetic landscape's costs, after a real pause so that two
devices overlap in time. It remembers when each device was busy; `lose` names a device that
disappears after timing `lose_after` candidates (it raises DeviceLost, as a runner whose RPC server
died would). A config its space does not hold fails to build: an error record, as a real
runner's failed build is. It declares no capability (runners/base.py): it exports nothing and runs no
whole model. `RemoteSynthetic` is a TVMHardware whose spaces are the synthetic ones, so the
backend's whole measuring path runs without TVM.
"""
from __future__ import annotations

import threading
import time

from tuning.core.records import MeasureResult
from tuning.hardware.runners.base import DeviceLost, Runner
from tuning.hardware.synthetic import SyntheticHardware, synthetic_space
from tuning.hardware.tvm_backend import TVMHardware


class TwoDevices(Runner):
    def __init__(self, lose: str | None = None, lose_after: int = 1, pause_s: float = 0.02):
        self.lose, self.lose_after, self.pause_s = lose, lose_after, pause_s
        self.landscape = SyntheticHardware()
        self.busy: list[tuple[str, float, float]] = []  # (device, start, end) of every timing
        self.lost: set = set()
        self.prepared: list = []
        self._lock = threading.Lock()

    @property
    def devices(self) -> list[str]:
        return [d for d in (f"{self.setup.device}:0", f"{self.setup.device}:1") if d not in self.lost]

    def prepare(self, task) -> None:
        self.prepared.append(task.key)

    def build(self, task, configs, spec) -> list:
        space = synthetic_space(task.workload)
        return [{"config": tuple(config), "error": None if space.is_valid(tuple(config)) else "build"}
                for config in configs]

    def run_one(self, task, config, built, spec, device):
        with self._lock:
            timed = sum(d == device for d, _, _ in self.busy)
            if device == self.lose and timed >= self.lose_after:
                self.lost.add(device)
                raise DeviceLost("connection reset by peer")
        if built["error"]:
            return MeasureResult.failed(built["error"], "not a config of the task's space", config=built["config"],
                                        device=device)
        start = time.monotonic()
        time.sleep(self.pause_s)
        result = self.landscape._measure_one(task, built["config"], spec)
        with self._lock:
            self.busy.append((device, start, time.monotonic()))
        result.device = device
        return result


class BuildsWhileTiming(TwoDevices):
    """TwoDevices whose builds arrive one by one, a pause each, while it times them (a remote runner's
    `overlaps_builds`); it remembers when each build was handed on. `fail_at`: the building stops
    with an error before that candidate."""

    def __init__(self, build_pause_s: float = 0.005, fail_at: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.build_pause_s, self.fail_at = build_pause_s, fail_at
        self.handed: list[float] = []

    def overlaps_builds(self) -> bool:
        return True

    def build_each(self, task, configs, spec, on_built, stopped=lambda: False) -> None:
        for i, built in enumerate(self.build(task, configs, spec)):
            if stopped():
                return
            if i == self.fail_at:
                raise OSError("no space left on the build host")
            time.sleep(self.build_pause_s)
            self.handed.append(time.monotonic())
            on_built(i, built)


class RemoteSynthetic(TVMHardware):
    name = "remote_synthetic"
    device = "remote"

    def __init__(self, runner: Runner | None = None):
        super().__init__(runner if runner is not None else TwoDevices())

    @property
    def target(self) -> dict:
        return {"kind": "remote"}

    def worker_env(self) -> dict:
        return {}

    def space(self, task):
        if task.key not in self._schedules:
            self._schedules[task.key] = synthetic_space(task.workload)
        return self._schedules[task.key]

    def describe(self) -> dict:
        return {"hardware": self.name, "device": self.device}
