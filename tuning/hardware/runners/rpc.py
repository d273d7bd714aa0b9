"""hardware/runner=rpc: build on this host, time on devices reached through TVM's RPC tracker.

The devices are RPC servers registered with a tracker (`python -m tvm.exec.rpc_tracker`) under a
key: TVM's stock `python -m tvm.exec.rpc_server`, or the lab's `tunelab rpc-server`, which also says
what device it is (rpc_server.py). The runner holds up to `devices` sessions, each in its own
process (rpc_worker.py), so a dead server or a cut link costs a timeout, never the run. Batches are
built by the host's build processes (host_builds.py) and spread over the held devices
(Runner.run_batch) as they are built where the devices run on another machine (`overlaps_builds`:
a compile here does not slow them, so they time the first candidates while the rest build): each library is uploaded, checked, timed on
the device by its own time_evaluator and removed, and its record names the device. Only the device's reading is a
candidate's run time: waiting for a session or an upload is not.

A device that drops its session, or stops answering for `upload_timeout_s` beyond the evaluator's
timeout, costs the candidate in flight a `device_lost` record and its share of the batch goes to the
others. Before each batch the runner asks the tracker for free servers again, so a device that came
back (or a tracker that restarted) rejoins; with none to be had for `wait_for_devices_s` the run
stops with NoDeviceLeft and `resume=` continues it. Bad settings fail before any work
(`unreachable`, `unusable`): no tracker at the address, no server of the key, a device of another
architecture, a target its CPU cannot run. Of the capabilities of base.py it declares
RunsWholeModels (a whole model compiled here, run on one device of the key), not Exports or
TimesInModel.
"""
from __future__ import annotations

import itertools
import logging
import platform
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from tuning.core.records import MeasureResult
from tuning.hardware.runners.base import DeviceLost, NoDeviceLeft, Picked, Runner, RunsWholeModels, _Batch
from tuning.hardware.runners.host_builds import HostBuilds, then_removed
from tuning.hardware.workers import Worker

WORKER = "tuning.hardware.rpc_worker"
GROUP = "hardware.runner"  # where a runner's keys live in a run's config
log = logging.getLogger(__name__)


class RPCRunner(Runner, RunsWholeModels):
    """Hyperparameters:
    tracker             the RPC tracker, "host:port"
    key                 the device key its servers registered under
    devices             how many of the key's servers to hold at once; a batch is spread over them
    priority            the session requests' priority at the tracker (higher is served first)
    session_timeout_s   the server ends a session after this long (0: never); renewed before it would
    connect_timeout_s   the longest wait for the tracker's answer or a session
    upload_timeout_s    the longest upload and load of one library, on top of the evaluator's timeout_s:
                        a device silent for longer is lost for the candidate in flight
    wait_for_devices_s  with no device held, how long to wait for one before the run stops
    overlap_builds      time while the rest of a batch builds here: true, false, or null (only when
                        the devices say they run on another machine: a server on this host would
                        be timed beside the builds, and TVM's stock server says nothing of itself)
    """

    ranges = {"devices": (1, 4096), "priority": (0, 1_000_000), "session_timeout_s": (0, 1e7),
              "connect_timeout_s": (0.1, 600), "upload_timeout_s": (0.1, 3600), "wait_for_devices_s": (0, 1e6)}

    def __init__(self, tracker: str = "127.0.0.1:9190", key: str = "local", devices: int = 1, priority: int = 1,
                 session_timeout_s: float = 0.0, connect_timeout_s: float = 10.0, upload_timeout_s: float = 30.0,
                 wait_for_devices_s: float = 60.0, overlap_builds: bool | None = None):
        self.tracker = tracker
        self.key = key
        self.devices_wanted = devices
        self.priority = priority
        self.session_timeout_s = session_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.upload_timeout_s = upload_timeout_s
        self.wait_for_devices_s = wait_for_devices_s
        self.overlap_builds = overlap_builds
        self.builds: HostBuilds | None = None
        self._held: dict[str, Worker] = {}
        self._identity: dict | None = None
        self._numbers = itertools.count()
        # where the time goes (experiments/bench_rpc.py): seconds summed over candidates, except build_wall_s
        self.stats = {"sessions": 0, "session_s": 0.0, "build_wall_s": 0.0, "queue_s": 0.0, "upload_s": 0.0,
                      "run_s": 0.0, "timed": 0, "lost": 0}
        self._batch_started = 0.0
        self._stats_lock = threading.Lock()
        self._sessions_lock = threading.Lock()  # _held and _identity: device threads drop, a pool opens

    @classmethod
    def check(cls, params, group):
        problems = []
        host, _, port = str(params["tracker"]).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            problems.append(f"{group}.tracker: expected host:port, e.g. 127.0.0.1:9190, got {params['tracker']!r}")
        if not str(params["key"]).strip():
            problems.append(f"{group}.key: empty; the device key its servers registered under, e.g. local")
        if 0 < params["session_timeout_s"] < 60:
            problems.append(f"{group}.session_timeout_s: 0 (sessions never end) or at least 60 s, got "
                            f"{params['session_timeout_s']}")
        return problems

    # ---- what the devices are ---------------------------------------------------------------------
    @property
    def devices(self) -> list[str]:
        return list(self._held)

    def identity(self) -> dict:
        """What the key's devices say of themselves (the lab's server); {} from TVM's stock server.
        NoDeviceLeft when no session opens: `mcpu: auto` must not quietly become this host's."""
        if self._identity is None and not self._hold_some(self.connect_timeout_s):
            raise NoDeviceLeft(self.unreachable() or self._none_left(self.connect_timeout_s))
        return self._identity or {}

    def describe(self) -> dict:
        identity = self.identity()
        described = {"runner": "rpc", "rpc_key": self.key,
                     "cpu_model": identity.get("cpu_model") or f"unknown (TVM's stock RPC server, key {self.key})"}
        if identity.get("num_threads"):
            described["device_threads"] = identity["num_threads"]
        return described

    # ---- bad settings, before any work ------------------------------------------------------------
    def unreachable(self) -> str | None:
        """No tracker at the address, or no server of the key: said in seconds."""
        host, port = self._address()
        try:
            summary = self._summary()
        except OSError as error:
            return (f"{GROUP}.tracker={self.tracker}: no RPC tracker answers there ({error}); start one with "
                    f"`python -m tvm.exec.rpc_tracker --host {host} --port {port}`")
        keys = registered_keys(summary)
        if self.key not in keys:
            return (f"{GROUP}.key={self.key}: no server is registered under this key with the tracker at "
                    f"{self.tracker} (registered keys: {', '.join(sorted(keys)) or 'none'})")
        return None

    def unusable(self) -> str | None:
        """The attached target checked on the devices: their architecture, then the gauge kernel
        built for the target and run on each."""
        if not self._hold_some(self.connect_timeout_s):
            return (f"{GROUP}.key={self.key}: no server of the key became free within "
                    f"{GROUP}.connect_timeout_s={self.connect_timeout_s} s (all busy with other clients?)")
        identity = self.identity()
        triple, host_triple = identity.get("triple"), _host_triple()
        if triple and triple.split("-")[0] != host_triple.split("-")[0]:
            return (f"{GROUP}.key={self.key}: its devices are {triple} and this host builds for {host_triple}; "
                    f"cross-compiling for a remote architecture is not supported")
        threads = identity.get("num_threads")
        if threads and self.setup.num_threads and int(threads) != self.setup.num_threads:
            log.warning("rpc: the servers of key %s run kernels on %s thread(s) and the target is built for %s "
                        "(hardware.num_threads): set hardware.num_threads=%s", self.key, threads,
                        self.setup.num_threads, threads)
        missing = missing_extensions(self.setup.target, identity.get("isa"))
        if missing:
            return (f"{GROUP}.key={self.key}: its devices ({identity.get('cpu_model')}) lack "
                    f"{', '.join(missing)}, which kernels built for the target {self.setup.target} may use "
                    f"(set hardware.mcpu=auto, or the devices' own LLVM cpu name)")
        readings = self._gauge_each(dropping=False)
        failed = {device: r.get("lost") or r.get("message") for device, r in readings.items() if "seconds" not in r}
        for device in failed:
            self._drop(device)  # a device that came back joins at the next batch
        if failed and len(failed) == len(readings):
            device, why = next(iter(failed.items()))
            return (f"{GROUP}.key={self.key}: device {device} could not run the gauge kernel built for the "
                    f"target {self.setup.target} ({why})")
        return None

    # ---- measuring ----------------------------------------------------------------------------------
    def prepare(self, task) -> None:
        if self.builds is None:
            self.builds = HostBuilds(self.setup.target, self.setup.build_env, self.setup.build_workers)
            self.builds.start()
        if not self._hold_some(self.wait_for_devices_s):
            raise NoDeviceLeft(self._none_left(self.wait_for_devices_s))

    def _none_left(self, waited_s: float) -> str:
        return (f"{GROUP}.key={self.key}: no device of the key at the tracker {self.tracker} became free within "
                f"{waited_s} s")

    def build(self, task, configs, spec) -> list[dict]:
        started = time.perf_counter()
        built = self.builds.build(task, configs, spec)
        self._count(build_wall_s=time.perf_counter() - started)
        return built

    def overlaps_builds(self) -> bool:
        """`overlap_builds`, or where it is null, whether the devices said they run on another machine
        (their identity's hostname, from the lab's server)."""
        if self.overlap_builds is not None:
            return self.overlap_builds
        hostname = (self._identity or {}).get("hostname")
        return bool(hostname) and hostname != platform.node()

    def build_each(self, task, configs, spec, on_built, stopped=lambda: False) -> None:
        """The host's build processes hand each library on as it is built: the devices time the
        first while the rest build."""
        started = time.perf_counter()
        self.builds.build(task, configs, spec, on_built, stopped)
        self._count(build_wall_s=time.perf_counter() - started)

    def gauge(self) -> dict | None:
        """The drift gauge on each held device: {device: seconds}."""
        readings = self._gauge_each(dropping=True)
        seconds = {device: r["seconds"] for device, r in readings.items() if "seconds" in r}
        return seconds or None

    def run_batch(self, task, configs, built, spec, on_result=None) -> list[MeasureResult]:
        """Runner.run_batch over the held devices, again and again: configs that no device was left to
        take wait for a device to come back (NoDeviceLeft after `wait_for_devices_s`), so only the
        candidates in flight when a device went are `device_lost`."""
        batch, todo = _Batch(configs, on_result), list(range(len(configs)))
        while todo:  # each pass first asks for more sessions: a device that came back since joins
            if not self._hold_some(self.wait_for_devices_s):
                raise NoDeviceLeft(self._none_left(self.wait_for_devices_s))
            untaken: list[int] = []

            def handed(j, result, todo=todo, untaken=untaken):
                if result.error == "device_lost" and result.device is None:
                    untaken.append(todo[j])
                else:
                    batch.deliver(todo[j], result)

            self._batch_started = time.perf_counter()
            super().run_batch(task, [configs[i] for i in todo], Picked(built, todo), spec, handed)
            todo = untaken
        return batch.results

    def run_one(self, task, config, built: dict, spec, device: str) -> MeasureResult:
        """Upload, check, time and remove one library on `device`; the host's copy is removed too."""
        return then_removed(built, lambda: self._time(task, config, built, spec, device))

    def _time(self, task, config, built: dict, spec, device: str) -> MeasureResult:
        timings = {"build_s": built["build_s"], "config": tuple(built.get("config") or config), "device": device}
        if built["error"]:
            return MeasureResult.failed(built["error"], built["message"], **timings)
        worker = self._held.get(device)
        if worker is None:
            raise DeviceLost("its session was closed")
        # built, waiting for a device (from the batch's start, or from its build where it came later)
        self._count(queue_s=time.perf_counter() - max(self._batch_started, built.get("built_at", 0.0)))
        status, value = worker.call(f"{WORKER}:run", task.workload, self.setup.target, self.setup.device,
                                    built["path"], built["args"], asdict(spec), spec.timeout_s + self.upload_timeout_s,
                                    timeout=spec.timeout_s + self.upload_timeout_s)
        if status in ("timeout", "crash") or (status == "ok" and "lost" in value):
            self._drop(device)
            raise DeviceLost(value["lost"] if status == "ok" else f"{status}: {value}")
        if status != "ok":
            return MeasureResult.failed("run", str(value), **timings)
        self._count(upload_s=value.get("upload_s", 0.0), run_s=value["run_s"], timed=1)
        if value["error"]:
            return MeasureResult.failed(value["error"], value["message"], run_s=value["run_s"], **timings)
        return MeasureResult(costs=value["costs"], run_s=value["run_s"], message=value.get("message", ""),
                             screened=bool(value.get("screened")), **timings)

    def _count(self, **amounts) -> None:
        with self._stats_lock:  # the device threads add to them at once
            for name, amount in amounts.items():
                self.stats[name] += amount

    # ---- whole models ---------------------------------------------------------------------------------
    def evaluate_model(self, model_cfg, seed, database_dir, out_dir, timing) -> dict:
        """Compiled here, run and timed on one device of the key (its sessions are given back first, so
        a server is free for it); torch does not run there and is not timed."""
        from tuning.hardware.e2e import evaluate_model

        threads = int(self.identity().get("num_threads") or self.setup.num_threads or 0) or None
        self._release()
        self._wait_for_a_free_server()  # TVM's session request for a busy key would wait for good
        remote = {"tracker": self.tracker, "key": self.key, "priority": self.priority,
                  "session_timeout_s": self.session_timeout_s}
        return evaluate_model(model_cfg, seed, database_dir, out_dir, timing, target=self.setup.target,
                              device=self.setup.device, env={"TVM_NUM_THREADS": 1}, num_threads=threads,
                              weight_prepack=self.setup.weight_prepack, remote=remote)

    def _wait_for_a_free_server(self) -> None:
        """NoDeviceLeft naming the key when the tracker or the key is gone, or no server of it is free
        within `wait_for_devices_s`."""
        problem = self.unreachable()
        deadline = time.monotonic() + self.wait_for_devices_s
        while not problem and self._free_now() == 0:
            if time.monotonic() > deadline:
                problem = self.unreachable() or self._none_left(self.wait_for_devices_s)
            time.sleep(0.5)
        if problem:
            raise NoDeviceLeft(problem)

    def _free_now(self) -> int:
        try:
            return free_servers(self._summary(), self.key)
        except OSError:  # the tracker restarting: none free this time
            return 0

    def close(self) -> None:
        self._release()
        if self.builds:
            self.builds.close()
            self.builds = None

    # ---- sessions -----------------------------------------------------------------------------------
    def _hold_some(self, wait_s: float) -> bool:
        """Ask for sessions until `devices` are held or, holding none, `wait_s` has passed (retrying
        with backoff: a tracker that restarts, a server that comes back). Whether any is held."""
        deadline, pause = time.monotonic() + wait_s, 0.5
        while True:
            self._ask_for_sessions()
            if self._held or time.monotonic() >= deadline:
                return bool(self._held)
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 5.0)

    def _ask_for_sessions(self) -> None:
        """As many new sessions as the key has free servers, up to `devices` (a request for a busy key
        would wait in the tracker's queue for good)."""
        wanted = self.devices_wanted - len(self._held)
        if wanted <= 0:
            return
        try:
            free = free_servers(self._summary(), self.key)
        except OSError as error:
            log.warning("rpc: the tracker at %s does not answer (%s); trying again before the next batch",
                        self.tracker, error)
            return
        count = min(wanted, free)
        if count:
            with ThreadPoolExecutor(count) as pool:
                list(pool.map(lambda _: self._open_session(), range(count)))

    def _open_session(self) -> None:
        worker = Worker({"TVM_NUM_THREADS": 1}, f"{WORKER}:init")
        started = time.perf_counter()
        status, value = worker.call(f"{WORKER}:connect", self.tracker, self.key, self.priority, self.session_timeout_s,
                                    timeout=self.connect_timeout_s + 60)  # + the worker's TVM import
        self._count(session_s=time.perf_counter() - started)
        if status != "ok":
            worker.close()
            log.warning("rpc: no session with a server of key %s: %s", self.key, str(value)[-300:])
            return
        with self._sessions_lock:
            if self._identity is None:
                self._identity = value
            elif not same_device_kind(self._identity, value):
                worker.close()
                log.warning("rpc: %s is a %s, not the run's %s: not used (readings from different devices never "
                            "mix)", value.get("name"), value.get("cpu_model"), self._identity.get("cpu_model"))
                return
            name = f"{self.key}@{value['name']}" if value.get("name") else f"{self.key}#{next(self._numbers)}"
            if name in self._held:  # two servers that report the same name: keep both, told apart
                name = f"{name}#{next(self._numbers)}"
            self._held[name] = worker
        self._count(sessions=1)

    def _gauge_each(self, dropping: bool) -> dict[str, dict]:
        def read(item):
            device, worker = item
            status, value = worker.call(f"{WORKER}:gauge", self.setup.target, self.setup.device,
                                        timeout=self.upload_timeout_s + 60)
            return device, value if status == "ok" else {"lost": f"{status}: {value}"}

        held = list(self._held.items())
        if not held:
            return {}
        with ThreadPoolExecutor(len(held)) as pool:
            readings = dict(pool.map(read, held))
        for device, reading in readings.items():
            if dropping and "lost" in reading:
                self._drop(device)
        return readings

    def _drop(self, device: str) -> None:
        with self._sessions_lock:
            worker = self._held.pop(device, None)
        if worker is not None:
            worker.close()  # its socket closes: the server ends the session and registers again
            self._count(lost=1)
            log.warning("rpc: lost device %s", device)

    def _release(self) -> None:
        with self._sessions_lock:
            held, self._held = self._held, {}
        for worker in held.values():
            worker.close()

    # ---- the tracker ----------------------------------------------------------------------------------
    def _address(self) -> tuple[str, int]:
        host, _, port = self.tracker.rpartition(":")
        return host, int(port)

    def _summary(self) -> dict:
        """The tracker's summary over a socket with a timeout (TVM's own client retries for a
        minute); OSError when no tracker answers."""
        from tvm.rpc import base

        with socket.create_connection(self._address(), timeout=self.connect_timeout_s) as sock:
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            if struct.unpack("<i", base.recvall(sock, 4))[0] != base.RPC_TRACKER_MAGIC:
                raise ConnectionError(f"{self.tracker} is not a TVM RPC tracker")
            base.sendjson(sock, [base.TrackerCode.SUMMARY])
            code, summary = base.recvjson(sock)
        if code != base.TrackerCode.SUCCESS:
            raise ConnectionError(f"the tracker at {self.tracker} answered {code}")
        return summary


def registered_keys(summary: dict) -> set[str]:
    """The device keys with a server registered (free or busy); the tracker's queue_info also names
    keys that were only ever asked for."""
    return {str(server.get("key", "")).removeprefix("server:") for server in summary.get("server_info", [])}


def free_servers(summary: dict, key: str) -> int:
    return int(summary.get("queue_info", {}).get(key, {}).get("free", 0))


def same_device_kind(first: dict, other: dict) -> bool:
    """Whether two servers' identities are the same kind of device (CPU model, LLVM cpu, threads)."""
    fields = ("cpu_model", "mcpu", "triple", "num_threads")
    return all(first.get(f) == other.get(f) for f in fields)


def missing_extensions(target: dict, device_isa: list | None) -> list[str]:
    """The x86 extensions the target's -mcpu switches on that the device reports it lacks ([] when
    the device reports none: TVM's stock server; the gauge run then finds out)."""
    if device_isa is None or target.get("kind") != "llvm":
        return []
    from tvm.target.codegen import llvm_get_cpu_features

    from tuning.hardware.rpc_server import ISA_EXTENSIONS, isa_name
    from tuning.hardware.tvm_space import make_target

    wanted = {isa_name(f) for f in llvm_get_cpu_features(make_target(target))} & ISA_EXTENSIONS
    return sorted(wanted - set(device_isa))


def _host_triple() -> str:
    from tvm.target.codegen import llvm_get_system_triple

    return str(llvm_get_system_triple())
