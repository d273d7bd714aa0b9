"""What a file the user did not write may make the lab do (tuning/config/untrusted.py, docs/runs.md §Trust):
a pack's overrides import nothing and load no config from elsewhere; a server a run folder or an
artifact names gets no credential unless the user names it too; the store's own connections never
send a password in clear; a refused run leaves no folder, and no password reaches a file on disk."""
from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers import run_py_completed, tune_run
from tuning.config import ConfigError
from tuning.config.untrusted import override_problems, unnamed_servers, user_named_servers, without_secrets
from tuning.engine.validate import validate

REPO = Path(__file__).resolve().parents[1]
SECRET = "s3cr3t-pw"
QUICK = ("hardware=synthetic", "tracking=none", "search=random", "cost_model=none", "model=gemm_64",
         "budget.trials=8", "budget.plan_size=4")


# ---- a server that would take a password -----------------------------------------------------------
class PasswordTrap:
    """A PostgreSQL server on 127.0.0.1 that asks every client for its password in clear text and
    keeps whatever it is sent."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(10)
        self.port = self.sock.getsockname()[1]
        self.received, self.connections = b"", 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def url(self, user: str = "lab") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/store?connect_timeout=5"

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.settimeout(5)
                try:
                    self._talk(conn)
                except OSError:
                    pass

    def _talk(self, conn):
        while True:  # SSLRequest / GSSENCRequest first: answered "no"; then the startup message
            length, code = struct.unpack("!ii", _read(conn, 8))
            body = _read(conn, length - 8)
            if code in (80877103, 80877104):
                conn.sendall(b"N")
                continue
            self.received += body
            break
        conn.sendall(b"R" + struct.pack("!ii", 8, 3))  # AuthenticationCleartextPassword
        while chunk := conn.recv(4096):
            self.received += chunk

    def close(self):
        self.sock.close()


def _read(conn, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = conn.recv(count - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data


@pytest.fixture
def trap(monkeypatch):
    server = PasswordTrap()
    monkeypatch.setenv("PGPASSWORD", SECRET)  # what docs/store.md recommends: the password from the environment
    for variable in ("TUNELAB_SERVERS", "MLFLOW_TRACKING_URI", "TUNELAB_MLFLOW_URI", "TUNELAB_OPTUNA_URI"):
        monkeypatch.delenv(variable, raising=False)
    yield server
    server.close()


# ---- the store's own connection ---------------------------------------------------------------------
def test_a_server_asking_for_the_password_in_clear_text_never_gets_it(trap):
    pytest.importorskip("psycopg")
    from tuning.store import StoreError
    from tuning.store.postgres import PostgresStore

    with pytest.raises(StoreError) as refused:
        PostgresStore(trap.url(), read_only=True).conn
    assert trap.connections == 1 and b"lab" in trap.received  # it did reach the server...
    assert SECRET.encode() not in trap.received  # ...which got no password
    assert SECRET not in str(refused.value)


def test_a_sweeps_study_storage_sends_no_clear_text_password_either(trap):
    pytest.importorskip("psycopg")
    import sqlalchemy

    from hydra_plugins.tunelab_optuna_sweeper._sweeper import pg_connect_args

    url = f"postgresql+psycopg://lab@127.0.0.1:{trap.port}/studies"
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool, connect_args=pg_connect_args(url))
    with pytest.raises(sqlalchemy.exc.OperationalError):
        engine.connect()
    assert trap.connections == 1 and SECRET.encode() not in trap.received


# ---- a GPU pack's manifest --------------------------------------------------------------------------
def pack_with_helper(tmp_path: Path, *overrides: str) -> Path:
    """A pack folder `conv_l8/` whose manifest is sound but for `overrides`, beside a helper.py that
    leaves a mark when imported."""
    from tuning.hardware.gpu_pack import PACK_FORMAT

    folder = tmp_path / "conv_l8"
    folder.mkdir()
    (folder / "helper.py").write_text(f"open({str(tmp_path / 'RAN')!r}, 'w').write('ran')\nclass X:\n    pass\n")
    (folder / "run_pack.py").write_text("")
    manifest = {"format": PACK_FORMAT, "id": "conv_l8", "overrides": ["hardware=synthetic", *overrides],
                "tasks": {"k": {"model": "gemm_64"}}, "libraries": [{"kernels": [{"name": "k0", "config": [0, 0],
                                                                                   "task": "k"}]}],
                "invalid": [], "build_errors": [], "device": "cpu", "made_on": {"time": 1.0e9}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    reading = {"kernel": "k0", "device": {"name": "x"}, "costs": [1e-3], "measured_at": 1.0e9 + 60}
    (folder / "readings.jsonl").write_text(json.dumps(reading) + "\n")
    return folder


def test_a_packs_target_runs_none_of_its_files(tmp_path):
    pack_with_helper(tmp_path, "hardware._target_=conv_l8.helper.X")
    done = subprocess.run([sys.executable, "-m", "tuning.tools.dataset", "import", "--store", "s.sqlite", "conv_l8"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)  # started beside the pack
    assert not (tmp_path / "RAN").exists()
    assert done.returncode == 2 and "overrides[1]" in done.stderr and "_target_" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("override,says", [
    ("hydra.searchpath=[file:///elsewhere]", "sets hydra"),
    ("+hardware.extra=1", "adds, removes or moves"),
    ("~hardware.num_threads", "adds, removes or moves"),
    ("hardware@hardware.backend=cpu", "adds, removes or moves"),
    ("model=gemm_64", "sets model"),
    ("hardware=../../elsewhere", "not an option name"),
    ("hardware.runner._target_=os.system", "instantiation key"),
    ("hardware.store=postgresql://lab@db.example/x", "have not named"),
    ("hardware.gpu=${oc.env:PGPASSWORD}", "interpolation"),
])
def test_a_pack_may_set_only_its_hardware_and_evaluator(tmp_path, override, says):
    from tuning.hardware.gpu_pack import PackError
    from tuning.tools.gpu_batch import read_manifest

    with pytest.raises(PackError) as refused:
        read_manifest(pack_with_helper(tmp_path, override))
    assert "overrides[1]" in str(refused.value) and says in str(refused.value), str(refused.value)


def test_the_overrides_a_pack_is_exported_with_pass_its_import_rule():
    ok = ["hardware=cuda", "hardware.arch=sm_90", "hardware.build_workers=2", "evaluator=adaptive",
          "hardware/runner=local", "hardware.runner.device_index=1"]
    assert override_problems(ok, "pack", ("hardware", "evaluator")) == []


def test_the_config_check_imports_no_unregistered_target(compose_cfg, tmp_path, monkeypatch):
    (tmp_path / "lab_plugin_probe.py").write_text(f"open({str(tmp_path / 'RAN')!r}, 'w')\nclass X:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"hardware\._target_: 'lab_plugin_probe\.X' is not a class tunelab registers"):
        validate(compose_cfg("model=gemm_64", "hardware._target_=lab_plugin_probe.X"))
    with pytest.raises(ConfigError, match=r"hardware\.runner\._target_: 'lab_plugin_probe\.X' is not a class"):
        validate(compose_cfg("model=gemm_64", "hardware.runner._target_=lab_plugin_probe.X"))
    assert not (tmp_path / "RAN").exists() and "lab_plugin_probe" not in sys.modules


def test_a_declared_config_directory_registers_its_own_targets(compose_cfg, tmp_path, monkeypatch):
    own = tmp_path / "own_conf" / "hardware"
    own.mkdir(parents=True)
    (own / "mine.yaml").write_text("_target_: tuning.hardware.synthetic.SyntheticHardware\n")
    (tmp_path / "lab_plugin_probe2.py").write_text("class X:\n    pass\n")
    (own / "probe.yaml").write_text("_target_: lab_plugin_probe2.X\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TUNELAB_CONF_DIRS", str(tmp_path / "own_conf"))
    with pytest.raises(ConfigError, match=r"lab_plugin_probe2\.X is not a tunelab component"):
        validate(compose_cfg("model=gemm_64", "hardware._target_=lab_plugin_probe2.X"))  # registered: imported, checked


# ---- servers named by files ------------------------------------------------------------------------
def test_compare_opens_no_server_an_artifact_names(trap, monkeypatch):
    from tuning.tools.compare.load import LoadedRun, task_truths

    task = {"name": "gemm_64", "key": "k", "store": trap.url(), "store_key": ["h", "t", "s"]}
    run = LoadedRun("0" * 32, "sa", {}, 0, "gemm_64", 0.0, 0, [], [task])
    with pytest.raises(SystemExit) as refused:
        task_truths([run], None)
    message = str(refused.value)
    assert "tasks.json of MLflow run" in message and "store=" in message and "--store" in message, message
    assert trap.connections == 0


def test_a_server_the_user_names_is_the_same_location_without_its_password(monkeypatch):
    monkeypatch.setenv("TUNELAB_SERVERS", "postgres://lab:other@DB.lab:5432/store")
    file_says = {"hardware": {"store": "postgresql+psycopg://lab@db.lab:5432/store"},
                 "tracking": {"uri": "http://mlflow.lab:5000"}, "tuning": {"database": "sqlite:////x.db"}}
    assert unnamed_servers(file_says, user_named_servers()) == [("tracking.uri", "http://mlflow.lab:5000")]
    elsewhere = {"hardware": {"store": "postgresql://lab@db.lab:5432/store?host=evil.example"}}
    assert unnamed_servers(elsewhere, user_named_servers()) != []  # a parameter sends it elsewhere


def test_resume_sends_no_password_to_a_server_a_shared_folder_names(trap, tmp_path, monkeypatch, compose_cfg):
    from configs import as_job
    from tuning.engine import run

    run_dir = tune_run(tmp_path, monkeypatch, *QUICK)
    saved = run_dir / "config.yaml"
    saved.write_text(saved.read_text().replace("store: null", f"store: {trap.url()}", 1))
    cfg = compose_cfg(f"resume={run_dir}", "budget.trials=16")
    with pytest.raises(SystemExit) as stopped:
        run.main(as_job(cfg, monkeypatch))
    assert stopped.value.code == 2 and trap.connections == 0


def test_resume_refusal_names_the_file_the_key_and_how_to_name_it(trap, tmp_path, monkeypatch, capsys):
    from tuning.engine.resume import resolve_resume

    run_dir = tune_run(tmp_path, monkeypatch, *QUICK)
    saved = run_dir / "config.yaml"
    saved.write_text(saved.read_text().replace("store: null", f"store: {trap.url()}", 1))
    from omegaconf import OmegaConf

    fresh = OmegaConf.create({"resume": str(run_dir), "hardware": {"store": None}})
    with pytest.raises(ConfigError) as refused:
        resolve_resume(fresh, {"overrides": [f"resume={run_dir}"]})
    message = str(refused.value)
    assert str(saved) in message and f"hardware.store={without_secrets(trap.url())}" in message, message
    assert "TUNELAB_SERVERS" in message and "command line" in message
    # named by the user on the command line, it is used (the connection comes later, at the run's store)
    named = OmegaConf.create({"resume": str(run_dir), "hardware": {"store": trap.url()}})
    cfg, _ = resolve_resume(named, {"overrides": [f"resume={run_dir}", f"hardware.store='{trap.url()}'"]})
    assert cfg.hardware.store == trap.url()


# ---- nothing secret on disk -------------------------------------------------------------------------
def files_holding(folder: Path, text: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_a_refused_run_leaves_no_folder_and_no_password(tmp_path):
    done = run_py_completed(*QUICK, f"hardware.store='postgresql://lab:{SECRET}@127.0.0.1:1/x?connect_timeout=2'",
                            f"hydra.run.dir={tmp_path / 'job'}", tmp=tmp_path, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and SECRET not in done.stderr + done.stdout
    assert not (tmp_path / "job").exists()
    assert files_holding(tmp_path, SECRET) == []


def test_a_run_writes_no_password_and_keeps_its_copies_private(tmp_path):
    optuna = f"postgresql+psycopg://lab:{SECRET}@db.example/studies"  # validated, never connected in a single run
    done = run_py_completed(*QUICK, f"storage.optuna_uri={optuna}", f"hydra.run.dir={tmp_path / 'job'}", tmp=tmp_path,
                            cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    job = tmp_path / "job"
    assert files_holding(tmp_path, SECRET) == []
    assert "postgresql+psycopg://lab@db.example/studies" in (job / ".hydra" / "overrides.yaml").read_text()
    for name in (".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml", "config.yaml", "tasks.json"):
        assert (job / name).stat().st_mode & 0o077 == 0, name


def test_a_registry_entry_s_files_are_fetched_only_from_a_named_host(monkeypatch):
    from tuning.tracking.registry import RegistryError, check_artifact_root

    monkeypatch.delenv("TUNELAB_SERVERS", raising=False)
    check_artifact_root("m/1", "/srv/mlruns/1/abc/artifacts/model", "sqlite:////srv/mlflow.db")
    check_artifact_root("m/1", "mlflow-artifacts:/1/abc/artifacts/model", "http://mlflow.lab:5000")
    check_artifact_root("m/1", "http://mlflow.lab:5000/api/2.0/mlflow-artifacts/artifacts/1", "http://mlflow.lab:5000")
    with pytest.raises(RegistryError, match="a server you have not named"):
        check_artifact_root("m/1", "http://collector.example/1/model", "http://mlflow.lab:5000")
    monkeypatch.setenv("TUNELAB_SERVERS", "s3://bucket.lab")
    check_artifact_root("m/1", "s3://bucket.lab/1/model", "http://mlflow.lab:5000")
