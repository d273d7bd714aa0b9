# tunelab: `make demo` and `make test` set everything up themselves (a .venv in this folder).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml setup.py | cksum | cut -d" " -f1)
STORE  := sqlite:///$(CURDIR)/outputs/mlflow.db

# The installed packages' bytecode, written once by importing what the lab imports: pip compiles one
# file at a time, and a process run with PYTHONDONTWRITEBYTECODE=1 never writes it, so it would compile
# each module it imports every time. Only the imported modules (about 4,600): compileall on the whole
# venv compiles 17,000 files and takes three times as long. Two processes, one per core (a .pyc is
# written atomically, so both may import the same module). A module not listed here that a `make test`
# process imports is written by that process (it runs with bytecode writing on).
define WARM_PY
import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as error:  # an optional extra that is not installed: no bytecode to write
        print(f"bytecode: {name} not imported ({error})", file=sys.stderr)
endef
export WARM_PY
WARM = PYTHONDONTWRITEBYTECODE= $(BIN)/python -c "$$WARM_PY"
TVM_SIDE = torch tvm tvm.relax tvm.relax.frontend.torch tvm.relax.frontend.onnx tvm.s_tir.meta_schedule \
	tvm.rpc tvm.script onnx onnxruntime
LAB_SIDE = tunelab tuning.engine.run tuning.engine.loop tuning.tools.compare mlflow mlflow.store.tracking.sqlalchemy_store \
	mlflow.server xgboost sklearn.ensemble sklearn.cluster scipy.stats scipy.spatial optuna optuna.storages \
	matplotlib.pyplot pandas pytest xdist
COMPILE = ($(WARM) $(TVM_SIDE) & $(WARM) $(LAB_SIDE); wait)

CLUSTER := $(VENV)/.cluster-$(shell cat pyproject.toml setup.py | cksum | cut -d" " -f1)

.PHONY: setup setup-cluster demo rpc-demo cluster-demo test test-full ui clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first: with the local CPU wheel in place nothing pulls the CUDA build
	$(BIN)/python -m pip install --quiet --no-compile torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-compile -e '.[test,rpc]'
	# the methodology score's reference (tests/test_compare.py); only its numpy/scipy parts are used,
	# so not its kernel_tuner, yappi, progressbar2 and nonconformist
	$(BIN)/python -m pip install --quiet --no-compile --no-deps autotuning-methodology==1.1.0
	$(COMPILE)
	rm -f $(VENV)/.installed-* && touch $@

# Ray, psycopg and Hydra's Ray launcher, the last without its pins: it asks for cloudpickle<3, which
# the installed joblib cannot use, and runs on cloudpickle 3 (docs/scaling.md)
setup-cluster: $(CLUSTER)

$(CLUSTER): $(STAMP)
	$(BIN)/python -m pip install --quiet --no-compile -e '.[test,rpc,cluster]'
	$(BIN)/python -m pip install --quiet --no-compile --no-deps hydra-ray-launcher==1.2.2
	$(WARM) ray hydra_plugins.hydra_ray_launcher._launcher_util psycopg
	rm -f $(VENV)/.cluster-* && touch $@

# A real tuning run on the default workload (conv_l8 = ResNet-18 conv task 11) in a few minutes.
demo: setup
	$(BIN)/tunelab run

# The same kind of run measured on two RPC servers through TVM's tracker, all on this machine:
# starts them, tunes, shows the tracker's view, stops them (examples/rpc_demo.sh).
rpc-demo: setup
	PYTHON=$(BIN)/python examples/rpc_demo.sh

# On this machine: PostgreSQL, an MLflow server and a Ray head plus a worker node; an Optuna sweep
# (2 trials at a time, synthetic hardware) and a 4-job real grid on them; where each result is; all
# stopped again, also on Ctrl-C (examples/cluster_demo.py; HOLD=1 keeps them up until Ctrl-C).
cluster-demo: setup-cluster
	$(BIN)/python examples/cluster_demo.py $(if $(HOLD),--hold)

# The suite in TEST_JOBS processes (pytest-xdist), a test module per process at a time (its fixtures built
# once): most tests wait on a subprocess's imports or a single-threaded TVM build, so two run side by side
# on two cores. TEST_JOBS=0 runs it in this process.
TEST_JOBS ?= 2

# Before pytest, each stopping the target when it fails: the package's layers (import-linter's contracts
# in pyproject.toml), ruff (pyflakes and syntax errors) and mypy (its scope in pyproject.toml).
test: setup
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m compileall -q -j 0 tuning tunelab hydra_plugins > /dev/null 2>&1 || true  # the lab's own bytecode
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder

# Everything, including the slow real-hardware checks.
test-full: setup-cluster
	@command -v chromium >/dev/null || apt-get install -y -q chromium >/dev/null 2>&1 \
		|| echo "no chromium (apt-get install -y chromium): the MLflow UI browser test will skip"
	$(BIN)/python -m pytest -q -m ""

ui: setup
	$(BIN)/tunelab ui --tracking-uri $(STORE)

clean:
	rm -rf outputs multirun build dist
