"""hydra/launcher=ray is the lab's launcher (ray_launcher.py here; the work is _launch.py's): Hydra's
Ray launcher plugin with each job pinned to CPUs of its own, retried jobs resuming their folder and a
failed job failing alone.

Registered here, after the plugin's own entry of the same name (imported first, so that whichever
order Hydra discovers plugins in, this entry is the one kept). Nothing here imports Ray: without the
[cluster] extra, choosing the launcher says what to install.

    python run.py -m hydra/launcher=ray search=sa,random seed=0,1                  # a Ray instance of its own
    python run.py -m hydra/launcher=ray hydra.launcher.ray.init.address=auto ...   # the cluster `ray start` made
"""
from dataclasses import dataclass, field
from typing import Any, Dict

from hydra.core.config_store import ConfigStore

try:  # the plugin's module registers its entry on import; ours below replaces it
    import hydra_plugins.hydra_ray_launcher._config  # noqa: F401
except ImportError:
    pass


@dataclass
class RaySettings:
    # ray.init's keyword arguments; address null: start Ray in this process; auto or host:port: join a
    # running cluster (`ray start`). Other keys with +hydra.launcher.ray.init.<key>=...
    init: Dict[str, Any] = field(default_factory=lambda: {"address": None})
    # ray.remote's options for every job; max_retries: how often Ray runs a job again whose worker or node
    # died (the retry resumes the job's folder). num_cpus is the lab's (each job's cpus_needed).
    remote: Dict[str, Any] = field(default_factory=lambda: {"max_retries": 3})


@dataclass
class RayLauncherConf:
    _target_: str = "hydra_plugins.tunelab_ray_launcher.ray_launcher.RayLauncher"
    ray: RaySettings = field(default_factory=RaySettings)
    pin_cpus: bool = True  # hold and pin each job to its CPUs on its node (false: Ray's bookkeeping only)


ConfigStore.instance().store(group="hydra/launcher", name="ray", node=RayLauncherConf, provider="tunelab")
