"""Cluster services on this machine: a throwaway PostgreSQL, an MLflow tracking server and Ray nodes,
started and stopped by a test, a benchmark or `make cluster-demo` (docs/scaling.md).

    Postgres(folder).start()         Debian's PostgreSQL (or the first `initdb` on PATH) with its data
                                     in `folder`, loopback only; `url(db)` a database's SQLAlchemy URL,
                                     `create_database(name)`, `restart()`, `stop()`
    MLflowServer(backend_uri, artifacts, log).start()
                                     `mlflow server` with that backend store and artifact destination;
                                     `uri` is its http address; `kill()` (SIGKILL), `start()` again
    RayNodes(folder).start(workers=1)
                                     a Ray head (`ray start --head`) and worker nodes joining it
                                     (`ray start --address`), each its own raylet with `cpus` CPUs;
                                     `address`, `kill_worker(i)` (SIGKILL to the node's processes),
                                     `stop()`

PostgreSQL refuses to run as root: as root the server runs as the `postgres` system user (Debian's
package makes it) in a folder that user owns. Authentication is `trust` on 127.0.0.1 only: a cluster
that exists for one demo or test, reachable from nothing but this machine. A deployment's database
takes passwords (docs/scaling.md). Every process is started in its own session so that stopping it
stops its children; each one's output goes to a log file in its folder.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tuning.hardware.rpc_hosts import free_port

DEBIAN_BIN = Path("/usr/lib/postgresql")
PG_USER = "tunelab"


def wait_for_port(port: int, timeout_s: float, process: subprocess.Popen | None = None, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode} before listening on {port}")
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s:g} s")


def stop_group(process: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout_s: float = 20) -> None:
    """Signal the process's session (it and its children), wait, then SIGKILL what is left."""
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)
        process.wait(timeout_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(10)


def postgres_bin() -> Path:
    """The folder of initdb/postgres: Debian's newest version, else the one on PATH."""
    versions = sorted(DEBIAN_BIN.glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name)
                      if p.parent.parent.name.isdigit() else 0)
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    if found is None:
        raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql, or put initdb on PATH)")
    return Path(found).parent


class Postgres:
    """A PostgreSQL server with its data directory in `folder` (made on the first start)."""

    def __init__(self, folder: str | os.PathLike, port: int | None = None):
        self.folder = Path(folder).resolve()
        self.data = self.folder / "data"
        self.port = port or free_port()
        self.log = self.folder / "postgres.log"
        self.process: subprocess.Popen | None = None
        self.bin = postgres_bin()

    # ---- as whom -------------------------------------------------------------------------------
    def _as_owner(self, command: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return command
        return ["runuser", "-u", "postgres", "--", *command]

    def _hand_over(self, path: Path) -> None:
        """As root: the postgres user owns the folder and may reach it (each parent searchable)."""
        if os.geteuid() != 0:
            return
        shutil.chown(path, "postgres", "postgres")
        for parent in path.parents:
            if parent.stat().st_mode & 0o001 == 0:
                raise RuntimeError(f"PostgreSQL runs as the postgres user, which cannot enter {parent} "
                                   f"(chmod o+x {parent}, or keep the cluster elsewhere)")

    # ---- life ----------------------------------------------------------------------------------
    def start(self) -> "Postgres":
        self.folder.mkdir(parents=True, exist_ok=True)
        self._hand_over(self.folder)
        if not (self.data / "PG_VERSION").exists():
            subprocess.run(self._as_owner([str(self.bin / "initdb"), "-D", str(self.data), "-U", PG_USER,
                                           "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"]),
                           check=True, capture_output=True, text=True, timeout=120)
        settings = ["-c", "listen_addresses=127.0.0.1", "-c", f"port={self.port}",
                    "-c", f"unix_socket_directories={self.folder}", "-c", "max_connections=300",
                    "-c", "shared_buffers=128MB", "-c", "fsync=on"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self._as_owner([str(self.bin / "postgres"), "-D", str(self.data),
                                                            *settings]),
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready()
        return self

    def _wait_ready(self, timeout_s: float = 60) -> None:
        wait_for_port(self.port, timeout_s, self.process, "postgres")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                                  capture_output=True, timeout=30)
            if done.returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"postgres on port {self.port} not ready after {timeout_s:g} s; see {self.log}")

    def stop(self) -> None:
        """A fast shutdown (SIGINT: active sessions are ended, data flushed)."""
        stop_group(self.process, signal.SIGINT, timeout_s=60)
        self.process = None

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def __enter__(self) -> "Postgres":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- databases -----------------------------------------------------------------------------
    def url(self, database: str = PG_USER, driver: str = "") -> str:
        """The database's URL (`driver='psycopg'` gives SQLAlchemy's postgresql+psycopg://)."""
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return f"{scheme}://{PG_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Make the database if it is missing; its plain postgresql:// URL."""
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


class MLflowServer:
    """`mlflow server` on 127.0.0.1: runs in `backend_uri`, artifacts served from `artifacts`."""

    def __init__(self, backend_uri: str, artifacts: str | os.PathLike, log: str | os.PathLike,
                 port: int | None = None, python: str = sys.executable):
        self.backend_uri, self.artifacts = backend_uri, str(artifacts)
        self.log, self.port, self.python = Path(log), port or free_port(), python
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120) -> "MLflowServer":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        command = [self.python, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
                   "--backend-store-uri", self.backend_uri, "--artifacts-destination", self.artifacts,
                   "--workers", "2"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port(self.port, timeout_s, self.process, f"mlflow server (log {self.log})")
        return self

    def kill(self) -> None:
        stop_group(self.process, signal.SIGKILL)
        self.process = None

    def stop(self) -> None:
        stop_group(self.process)
        self.process = None


class RayNodes:
    """A Ray head and worker nodes on this machine, each a `ray start` of its own (a raylet with
    `cpus` CPUs), in Ray's default temp folder. Ray's token authentication is switched off
    (RAY_AUTH_MODE=disabled in `env`): the nodes exist on loopback only."""

    def __init__(self, folder: str | os.PathLike, cpus: int = 1, python: str = sys.executable):
        self.folder = Path(folder).resolve()
        self.cpus, self.python = cpus, python
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                    # a dead node is noticed within seconds, not Ray's default half minute
                    "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
        self.workers: list[subprocess.Popen | None] = []
        self.head: subprocess.Popen | None = None

    def _ray(self, *args: str, log: str) -> subprocess.Popen:
        self.folder.mkdir(parents=True, exist_ok=True)
        ray = Path(self.python).with_name("ray")
        command = [str(ray) if ray.exists() else "ray", "start", "--block", *args]
        with open(self.folder / log, "ab") as out:
            return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                    start_new_session=True)

    def start(self, workers: int = 1, timeout_s: float = 120) -> "RayNodes":
        self.head = self._ray("--head", "--node-ip-address=127.0.0.1", f"--port={self.port}",
                              f"--num-cpus={self.cpus}", "--include-dashboard=false",
                              "--disable-usage-stats", log="head.log")
        wait_for_port(self.port, timeout_s, self.head, f"ray head (log {self.folder / 'head.log'})")
        for _ in range(workers):
            self.add_worker()
        self.wait_for_nodes(1 + workers, timeout_s)
        return self

    def add_worker(self) -> int:
        self.workers.append(self._ray(f"--address={self.address}", "--node-ip-address=127.0.0.1",
                                      f"--num-cpus={self.cpus}", "--disable-usage-stats",
                                      log=f"worker{len(self.workers)}.log"))
        return len(self.workers) - 1

    def alive_nodes(self) -> int:
        """How many nodes the head counts alive (asked in a child process: this one stays out of Ray)."""
        code = ("import ray; ray.init(address='%s', logging_level='ERROR');"
                "print('ALIVE', sum(n['Alive'] for n in ray.nodes()))" % self.address)
        done = subprocess.run([self.python, "-c", code], capture_output=True, text=True, env=self.env, timeout=120)
        counts = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("ALIVE ")]
        return int(counts[-1]) if done.returncode == 0 and counts else 0

    def wait_for_nodes(self, count: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.alive_nodes() >= count:
                return
            time.sleep(1)
        raise RuntimeError(f"Ray: fewer than {count} nodes alive after {timeout_s:g} s; see {self.folder}")

    def kill_worker(self, i: int) -> None:
        """The worker node dies at once: its raylet and every process it started (SIGKILL), whatever
        session Ray put them in."""
        import psutil

        node = self.workers[i]
        try:
            tree = psutil.Process(node.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        stop_group(node, signal.SIGKILL)
        for process in tree:
            try:
                process.kill()
            except psutil.Error:
                pass
        self.workers[i] = None

    def stop(self) -> None:
        for i in range(len(self.workers)):
            stop_group(self.workers[i])
        stop_group(self.head)
        self.workers, self.head = [], None
