"""Local RPC hosts: TVM's tracker and the lab's RPC servers on this machine, started and stopped by
a test, a benchmark or a demo (no TVM import here; the processes import it).

`Cluster(key, servers=2)` starts them on loopback; `namespaces=True` puts each server in its own
network namespace, joined to this host by a veth pair on a private bridge (addresses that exist only inside this machine), so a
test can cut a device's link (`cut`/`restore`: the host end of its veth goes down and up) as well as
kill it (`kill`). Without root or `ip netns`, the servers run on loopback and a cut is a SIGSTOP of
the server's processes (it stops answering, as a cut link does); `fallback` says why. The tracker is
TVM's own (`python -m tvm.exec.rpc_tracker`); the servers are `tuning.hardware.rpc_server`, each
pinned to one core with one thread, or TVM's stock server with `stock=True`.
"""
from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

_clusters = itertools.count()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


class Cluster:
    def __init__(self, key: str, servers: int = 2, namespaces: bool = False, stock: bool = False,
                 log_dir: Path | None = None):
        self.key, self.count, self.stock = key, servers, stock
        self.log_dir = Path(log_dir or "/tmp")
        number = next(_clusters) % 100
        self.tag = f"{os.getpid() % 1000}{number:02d}"  # names unique per process and cluster, under 15 chars
        self.subnet = f"10.{200 + number % 50}.{os.getpid() % 250}"
        self.fallback = None
        self.namespaces = namespaces and self._make_namespaces()
        self.host = f"{self.subnet}.1" if self.namespaces else "127.0.0.1"
        self.port = free_port()
        self.tracker = f"{self.host}:{self.port}"
        self.tracker_proc = None
        self.servers: list[subprocess.Popen] = []
        self.stopped: set[int] = set()

    # ---- namespaces ---------------------------------------------------------------------------------
    def _bridge(self) -> str:
        return f"tlbr{self.tag}"

    def _ns(self, i: int) -> str:
        return f"tl{self.tag}d{i}"

    def _veth(self, i: int) -> str:
        return f"tl{self.tag}h{i}"

    def _make_namespaces(self) -> bool:
        if os.geteuid() != 0:
            self.fallback = "not root: no network namespaces, servers on loopback"
            return False
        self._remove_namespaces()  # a killed earlier test of the same process id may have left them
        try:
            _ip("link", "add", self._bridge(), "type", "bridge")
            _ip("addr", "add", f"{self.subnet}.1/24", "dev", self._bridge())
            _ip("link", "set", self._bridge(), "up")
            for i in range(self.count):
                ns, host_end, device_end = self._ns(i), self._veth(i), f"tl{self.tag}n{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", host_end, "type", "veth", "peer", "name", device_end)
                _ip("link", "set", device_end, "netns", ns)
                _ip("link", "set", host_end, "master", self._bridge(), "up")
                _ip("-n", ns, "addr", "add", f"{self.subnet}.{10 + i}/24", "dev", device_end)
                _ip("-n", ns, "link", "set", device_end, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except (OSError, subprocess.CalledProcessError) as error:
            self._remove_namespaces()
            self.fallback = f"could not create network namespaces ({getattr(error, 'stderr', error)}): loopback"
            return False
        return True

    def _remove_namespaces(self) -> None:
        for i in range(self.count):
            subprocess.run(["ip", "netns", "del", self._ns(i)], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self._bridge()], capture_output=True, timeout=30)

    # ---- processes ----------------------------------------------------------------------------------
    def start(self) -> "Cluster":
        self.start_tracker()
        for i in range(self.count):
            self.servers.append(self._spawn(f"server{i}", self._server_command(i)))
        self.wait_registered(self.count)
        return self

    def start_tracker(self) -> None:
        self.tracker_proc = self._spawn("tracker", [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", self.host,
                                                    "--port", str(self.port), "--port-end", str(self.port + 1)])
        self._wait_for_port(self.host, self.port)

    def stop_tracker(self) -> None:
        os.killpg(self.tracker_proc.pid, signal.SIGKILL)
        self.tracker_proc.wait(timeout=30)

    def _server_command(self, i: int) -> list[str]:
        host = f"{self.subnet}.{10 + i}" if self.namespaces else "127.0.0.1"
        if self.stock:
            command = [sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", self.tracker, "--key", self.key,
                       "--host", host, "--port", "9091"]
        else:
            command = [sys.executable, "-m", "tuning.hardware.rpc_server", "--tracker", self.tracker, "--key", self.key,
                       "--host", host, "--port", "9091", "--cpus", str(i % os.cpu_count()), "--threads", "1"]
        return ["ip", "netns", "exec", self._ns(i), *command] if self.namespaces else command

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        with open(self.log_dir / f"rpc-{self.tag}-{name}.log", "w") as log:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    @staticmethod
    def _wait_for_port(host: str, port: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                socket.create_connection((host, port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"nothing listens on {host}:{port}")

    def summary(self) -> dict:
        from tvm import rpc

        return rpc.connect_tracker(self.host, self.port).summary()

    def free(self) -> int:
        return int(self.summary().get("queue_info", {}).get(self.key, {}).get("free", 0))

    def wait_registered(self, count: int, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while self.free() < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} servers of key {self.key} did not register: {self.summary()}")
            time.sleep(0.3)

    # ---- faults -------------------------------------------------------------------------------------
    def kill(self, i: int) -> None:
        os.killpg(self.servers[i].pid, signal.SIGKILL)
        self.servers[i].wait(timeout=30)

    def restart(self, i: int) -> None:
        """A killed server started again (it registers with the tracker when the tracker is up)."""
        self.servers[i] = self._spawn(f"server{i}", self._server_command(i))

    def cut(self, i: int) -> None:
        if self.namespaces:
            _ip("link", "set", self._veth(i), "down")
        else:
            os.killpg(self.servers[i].pid, signal.SIGSTOP)
        self.stopped.add(i)

    def restore(self, i: int) -> None:
        if self.namespaces:
            _ip("link", "set", self._veth(i), "up")
        else:
            os.killpg(self.servers[i].pid, signal.SIGCONT)
        self.stopped.discard(i)

    def stop(self) -> None:
        """Everything it started, whatever fails on the way."""
        try:
            for i in list(self.stopped):
                self.restore(i)
        finally:
            for proc in [*self.servers, *([self.tracker_proc] if self.tracker_proc else [])]:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
            if self.namespaces:
                self._remove_namespaces()

    def __enter__(self) -> "Cluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
