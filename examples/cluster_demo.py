"""A lab on a cluster, all on this machine (`make cluster-demo`; docs/scaling.md says what each piece is).

Brings up PostgreSQL (a throwaway cluster under outputs/cluster-demo/, loopback only, run as the
postgres user when started as root), an MLflow tracking server keeping its runs in PostgreSQL and its
artifacts under outputs/cluster-demo/artifacts, and a Ray head plus one worker node. Then:

  1. an Optuna sweep, 2 trials at a time on the Ray nodes (synthetic hardware: no timing), its study in
     PostgreSQL, every reading in the PostgreSQL measurement store;
  2. a 4-job grid of real tuning runs (gemm_64: sa and random, seeds 0 and 1), each job pinned to 2 CPUs
     of its own, so on this 2-core machine they measure one at a time whichever node runs them.

It prints where every result is and stops everything again, also on Ctrl-C. With --hold it waits for
Ctrl-C before stopping, so the MLflow server can be browsed.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tuning.cluster.hosts import MLflowServer, Postgres, RayNodes  # noqa: E402

DEFAULT_FOLDER = REPO / "outputs" / "cluster-demo"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
RAY_PREFIX = re.compile(r"^\((?:_tuning_job|raylet)[^)]*?pid=(\d+)[^)]*\)\s*")
SHOWN = ("pinned to CPUs", "resuming it", "] best ", "[HYDRA] \t#", "tunelab: sweep", "parent run", "did not finish")
STUDY = "kmeans_threshold-gemm_64"


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run_lab(args: list[str], env: dict, log: Path) -> None:
    """`python run.py -m ...` with its output on the terminal and in `log`."""
    command = [sys.executable, "run.py", "-m", *args]
    print("$ python run.py -m " + " ".join(args), flush=True)
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
        try:
            show(process, out)
        except BaseException:  # Ctrl-C or SIGTERM: the multirun ends as on Ctrl-C (its trials KILLED) first
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
            raise
        if process.wait() != 0:
            raise SystemExit(f"the multirun failed (exit {process.returncode}); its output: {log}")


def show(process: subprocess.Popen, out) -> None:
    """The multirun's output into its log, and its telling lines on the terminal."""
    shown = set()
    for line in process.stdout:
        out.write(line)
        text = RAY_PREFIX.sub(lambda m: f"[job pid {m[1]}] ", ANSI.sub("", line)).rstrip()
        text = text.split("[repeated")[0].rstrip()  # Ray's note on lines it printed once for several jobs
        if text not in shown and any(word in text for word in SHOWN):
            shown.add(text)
            print("   " + text[:170], flush=True)


def stop_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt("SIGTERM")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", action="store_true", help="keep the services up until Ctrl-C")
    parser.add_argument("--trials", type=int, default=4, help="the sweep's trials (2 at a time)")
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER, help="where everything is kept (emptied first)")
    options = parser.parse_args()
    here = options.folder.resolve()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also where a shell started it with SIGINT ignored
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    shutil.rmtree(here, ignore_errors=True)
    here.mkdir(parents=True)
    started = time.monotonic()
    services: list = []
    try:
        places = bring_up(here, services)
        print(f"   up in {time.monotonic() - started:.0f} s", flush=True)
        run_both(here, places, options.trials)
        step("where every result is")
        show_results(places, here)
        print(f"\n   demo wall time {time.monotonic() - started:.0f} s", flush=True)
        if options.hold:
            print("   services stay up until Ctrl-C", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        print("\ninterrupted", flush=True)
    finally:
        step("stopping Ray, the MLflow server and PostgreSQL")
        for service in reversed(services):
            service.stop()
        print(f"   stopped; their data stays in {here}", flush=True)


def bring_up(here: Path, services: list) -> dict:
    """PostgreSQL, the MLflow server and the Ray nodes, each added to `services` once started."""
    step(f"PostgreSQL, an MLflow server, a Ray head and a worker node (logs in {here})")
    pg = Postgres(here / "postgres").start()
    services.append(pg)
    places = {"optuna": pg.create_database("optuna"), "store": pg.create_database("store")}
    mlflow = MLflowServer(pg.create_database("mlflow"), here / "artifacts", here / "mlflow.log")
    services.append(mlflow.start())
    ray = RayNodes(here / "ray", cpus=2)
    services.append(ray)
    ray.start(workers=1)
    print(f"   PostgreSQL 127.0.0.1:{pg.port}  MLflow {mlflow.uri}  Ray {ray.address} (2 nodes x 2 CPUs)", flush=True)
    return {**places, "mlflow": mlflow.uri, "ray": ray.address, "ray_env": ray.env}


def run_both(here: Path, places: dict, trials: int) -> None:
    """The sweep, then the real grid, on the Ray nodes with storage=cluster."""
    env = {**os.environ, **places["ray_env"], "TUNELAB_OUTPUTS": str(here / "outputs"),
           "TUNELAB_MLFLOW_URI": places["mlflow"], "TUNELAB_OPTUNA_URI": places["optuna"], "PYTHONWARNINGS": "ignore"}
    env.pop("MLFLOW_TRACKING_URI", None)
    on_ray = ["hydra/launcher=ray", f"hydra.launcher.ray.init.address={places['ray']}", "storage=cluster",
              f"hardware.store={places['store']}"]
    step(f"an Optuna sweep: {trials} trials, 2 at a time, on synthetic hardware")
    run_lab(["hparams_search=kmeans_threshold", "hardware=synthetic", "model=gemm_64", "hardware.delay_s=0.02",
             "budget.trials=128", f"hydra.sweeper.n_trials={trials}", "hydra.sweeper.n_jobs=2",
             f"hydra.sweep.dir={here / 'sweep'}", *on_ray], env, here / "sweep.log")
    step("a real grid: gemm_64 x {sa, random} x seeds {0, 1}, each job on 2 CPUs of its own")
    run_lab(["model=gemm_64", "search=sa,random", "seed=0,1", "budget.trials=32", "budget.plan_size=16",
             "hardware.num_threads=1", "hardware.build_workers=1", f"hydra.sweep.dir={here / 'grid'}", *on_ray],
            env, here / "grid.log")


def show_results(places: dict, here: Path) -> None:
    import optuna
    from mlflow.tracking import MlflowClient

    from tuning.store import open_store

    client = MlflowClient(places["mlflow"])
    experiment = client.get_experiment_by_name("tunelab")
    runs = client.search_runs([experiment.experiment_id], max_results=500)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    print(f"   MLflow: {places['mlflow']}/#/experiments/{experiment.experiment_id}  {len(runs)} runs "
          f"({len(parents)} multirun parents with {len(runs) - len(parents)} children), artifacts in "
          f"{experiment.artifact_location} -> {here / 'artifacts'}")
    study = optuna.load_study(study_name=STUDY, storage=places["optuna"])
    states = {s: sum(t.state.name == s for t in study.trials) for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")}
    print(f"   Optuna study {STUDY!r} in {places['optuna']}: {states}, best {study.best_value:.1f} GFLOP/s "
          f"with {study.best_params}")
    store = open_store(places["store"], "store", read_only=True)
    print(f"   measurement store {places['store']}: {store.count()} readings of {len(store.keys())} "
          "(hardware, kernel, space) keys; `tunelab dataset stats --store URL` lists them")
    print(f"   job folders: {here / 'sweep'}/trial_*, {here / 'grid'}/<n>", flush=True)


if __name__ == "__main__":
    main()
