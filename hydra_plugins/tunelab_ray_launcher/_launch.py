"""hydra/launcher=ray (hydra_plugins/tunelab_ray_launcher): Hydra's Ray launcher with what tuning jobs need.

Hydra's plugin (hydra-ray-launcher) submits each job of a multirun (a grid, or a batch of an Optuna
sweep's trials) as a Ray task and waits for all of them. The lab's launcher keeps its settings (`ray.init`, `ray.remote`) and adds:

  CPUs         each job reserves the CPUs its measurements need (`cpu_slots.cpus_needed`: hardware.num_threads
               plus hardware.build_workers for kernels timed on this node, build_workers for remote
               devices, 1 for synthetic or replayed hardware) and, on its node, holds and is pinned to
               that many cores of its own (tuning/cluster/cpu_slots.py): Ray's num_cpus alone places jobs but
               does not keep two of them off the same cores. Every task runs in a fresh worker
               process (max_calls=1), so a job's pinning, TVM threads and MLflow run end with it.
  one failure  a job whose Ray task fails (its worker or node died and Ray's max_retries are spent)
               is a FAILED JobReturn of its own: the sweeper fails that trial, the other jobs of the
               batch are told as usual. Ctrl-C cancels the batch's tasks.
  retries      Ray runs a task whose node died again (ray.remote.max_retries). The retry finds the dead
               attempt's job folder holding a run and resumes it (resume=<folder>): its records, search
               state and MLflow run continue, so a trial keeps one folder and one MLflow run.
  the job's    the sweep folder is made absolute, and each job starts in the launching folder and with
  context      its TUNELAB_*, MLFLOW_* and TVM_* environment (Ray's runtime_env), so that relative
               paths (outputs/, stores) mean on every node what they meant where the multirun started.
               On other nodes that folder must exist with the same path (a shared file system) and the
               lab must be installed (docs/scaling.md says what is shared and what is shipped).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict

from tuning.cluster import cpu_slots

try:
    import ray
    from hydra_plugins.hydra_ray_launcher._launcher_util import _run_job
except ImportError as missing:  # the [cluster] extra
    raise ImportError(f"hydra/launcher=ray needs Ray and Hydra's Ray launcher ({missing}): make setup-cluster, "
                      "or pip install 'tunelab[cluster]' && pip install --no-deps hydra-ray-launcher==1.2.2") from None

log = logging.getLogger(__name__)
FORWARDED_ENV = ("TUNELAB_", "MLFLOW_", "TVM_")


def launch(launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    """`launcher` is ray_launcher.RayLauncher: its ray_cfg (init, remote), pin_cpus and
    Hydra's context."""
    setup_globals()
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir)).resolve()  # resolved once, here: ${now:} too
    sweep_dir.mkdir(parents=True, exist_ok=True)
    log.info(f"Ray launcher: {len(job_overrides)} jobs, sweep output dir: {sweep_dir}")
    _start_ray(launcher.ray_cfg.init)
    largest = max((node["Resources"].get("CPU", 0) for node in ray.nodes() if node["Alive"]), default=1)
    jobs = [_submit(launcher, list(overrides), initial_job_idx + i, sweep_dir, int(largest))
            for i, overrides in enumerate(job_overrides)]
    try:
        return [_collect(*job) for job in jobs]
    except KeyboardInterrupt:
        for *_, ref in jobs:
            ray.cancel(ref, force=True)
        raise


def _start_ray(init: DictConfig) -> None:
    """ray.init with the launcher's settings. address null is a Ray instance of this process ("local":
    never a cluster found through RAY_ADDRESS or a file an earlier `ray start` left); a cluster's
    address is checked first, so that a wrong one is an error naming the key, not a hang."""
    if ray.is_initialized():
        return
    settings = OmegaConf.to_container(init, resolve=True) or {}
    address = settings.get("address") or "local"
    if address == "auto" and os.environ.get("RAY_ADDRESS"):
        address = os.environ["RAY_ADDRESS"]
    if address not in ("local", "auto") and not address.startswith("ray://"):
        _check_reachable(address)
    if address == "local":
        settings.setdefault("include_dashboard", False)
    log.info(f"Ray: {'a new instance in this process' if address == 'local' else address}")
    ray.init(**{**settings, "address": address})


def _check_reachable(address: str) -> None:
    import socket

    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            return
    except (OSError, ValueError) as error:
        raise ConnectionError(f"hydra.launcher.ray.init.address: no Ray cluster at {address} ({error}); "
                              "start one with `ray start --head`, or leave the address null for a Ray "
                              "instance of this process") from None


def _submit(launcher, overrides: list[str], idx: int, sweep_dir: Path, largest_node: int) -> tuple:
    sweep_config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, overrides)
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"job_id_for_{idx}"
        sweep_config.hydra.job.num = idx
        sweep_config.hydra.sweep.dir = str(sweep_dir)
    cpus = cpu_slots.cpus_needed(sweep_config)
    if cpus > largest_node:  # Ray would keep the job waiting for a node that does not exist
        log.warning(f"job {idx} needs {cpus} CPUs (hardware.num_threads + hardware.build_workers); the largest "
                    f"node has {largest_node}: it gets them, and its builds share cores with its timing")
        cpus = max(1, largest_node)
    log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))} ({cpus} CPU{'s' if cpus > 1 else ''})")
    options = {**OmegaConf.to_container(launcher.ray_cfg.remote, resolve=True), "num_cpus": cpus, "max_calls": 1,
               "runtime_env": {"env_vars": {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}}}
    remote = ray.remote(**options)(_tuning_job)
    ref = remote.remote(launcher.hydra_context, sweep_config, launcher.task_function, Singleton.get_state(),
                        cpus if launcher.pin_cpus else 0, os.getcwd())
    return overrides, sweep_config, ref


def _tuning_job(hydra_context, sweep_config: DictConfig, task_function, singleton_state, cpus: int,
                launch_dir: str) -> JobReturn:
    """One job in its Ray worker: in the launching folder, on CPUs of its own, resuming its folder when
    an earlier attempt (on a node that died) left a run there."""
    from tuning.engine.run_folder import holds_run

    if Path(launch_dir).is_dir():
        os.chdir(launch_dir)
    if cpus:
        began = time.monotonic()
        pinned = cpu_slots.hold(cpus)
        waited = time.monotonic() - began
        print(f"tunelab: job {sweep_config.hydra.job.num} pinned to CPUs {pinned} of this node"
              + (f" (after {waited:.0f} s waiting for other jobs to free them)" if waited >= 1 else ""),
              file=sys.stderr, flush=True)
    job_dir = Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)
    if holds_run(job_dir) and "resume" in sweep_config and not sweep_config.resume:
        print(f"tunelab: job {sweep_config.hydra.job.num}: {job_dir} holds the run of an attempt whose node died; "
              "resuming it", file=sys.stderr, flush=True)
        with open_dict(sweep_config):
            sweep_config.resume = str(job_dir)
    try:
        return _run_job(hydra_context, sweep_config, task_function, singleton_state)
    except SystemExit as exit:
        # run.py exits on bad input (2) or a failed job (1): the job's own failure, not a dead worker to retry
        return JobReturn(cfg=sweep_config, status=JobStatus.FAILED,
                         _return_value=RuntimeError(f"the job exited with status {exit.code}"))


def _collect(overrides: list[str], sweep_config: DictConfig, ref) -> JobReturn:
    """The job's JobReturn; a Ray failure (worker or node died, retries spent) is a FAILED one."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayError as error:
        log.warning(f"job {sweep_config.hydra.job.num} ({' '.join(filter_overrides(overrides))}) did not finish: "
                    f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        return JobReturn(overrides=overrides, cfg=sweep_config, hydra_cfg=sweep_config, status=JobStatus.FAILED,
                         _return_value=RuntimeError(f"its Ray task failed: {type(error).__name__}"),
                         task_name=str(sweep_config.hydra.job.name))
