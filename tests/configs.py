"""Where the test suites find config options: the repository's conf/ plus the directories in
TUNELAB_CONF_DIRS (os.pathsep-separated, each laid out like conf/), so a method added in its own
config directory, with no edit here, runs through every contract suite (tests/test_extending.py)."""
from __future__ import annotations

from pathlib import Path

CONF = Path(__file__).resolve().parents[1] / "conf"
# Real-hardware tests check the path (build, correctness check, timing, records, export), not the
# readings: fewer, shorter repeats than the measurement rules in conf/evaluator/fixed.yaml
# (5 x 50 ms per candidate, 20 for each finalist) cut a real run's timing by four fifths.
QUICK_TIMING = ("evaluator.repeat=2", "evaluator.min_repeat_ms=10", "evaluator.final_repeat=3")


def extra_conf_dirs() -> list[Path]:
    """TUNELAB_CONF_DIRS as the lab itself reads it."""
    from tuning.engine.run_folder import env_conf_dirs

    return env_conf_dirs()


def group_yamls(group: str) -> list[Path]:
    return sorted(p for d in (CONF, *extra_conf_dirs()) for p in (d / group).glob("*.yaml"))


def options(group: str) -> list[str]:
    return sorted({p.stem for p in group_yamls(group)})


def searchpath_overrides() -> list[str]:
    """The Hydra override that adds the extra directories to the config search path."""
    extra = extra_conf_dirs()
    return [f"hydra.searchpath=[{','.join(f'file://{d}' for d in extra)}]"] if extra else []


def compose_job(output_dir, *overrides: str):
    """The job config as run.py composes it (output_dir, the extra config directories, then `overrides`),
    its Hydra node kept and set as the Hydra context, so `${hydra:...}` resolves as in a real run; the
    caller clears it (HydraConfig.instance().cfg = None) when done."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"output_dir={output_dir}", *searchpath_overrides(), *overrides],
                      return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def load_option(path):
    """A group option's YAML as the component's node: its `defaults` list (a search selecting the
    sampler and cost model it needs, e.g. search=gbfs) is Hydra's, not a hyperparameter."""
    from omegaconf import OmegaConf

    node = OmegaConf.load(path)
    node.pop("defaults", None)
    return node


def instantiate_option(path, seed: int = 0):
    """A group option's YAML, as its file holds it, instantiated under a root whose `seed` its `${seed}`
    interpolations take (the contract suites' one component of a kind)."""
    import hydra.utils
    from omegaconf import OmegaConf

    return hydra.utils.instantiate(OmegaConf.create({"seed": seed, "node": OmegaConf.load(path)}).node)


def as_job(cfg, monkeypatch):
    """A composed config (with its Hydra node) as run.py's @hydra.main would hand it to
    tuning.engine.run.main, that run's Hydra context patched in and its convergence plot skipped
    (matplotlib: 0.3 s a run)."""
    from omegaconf import open_dict, read_write

    from tuning.engine import artifacts as export
    from tuning.engine import run

    info = {"choices": dict(cfg.hydra.runtime.choices), "overrides": list(cfg.hydra.overrides.task),
            "output_dir": cfg.output_dir}
    monkeypatch.setattr(run, "_hydra_info", lambda: info)
    monkeypatch.setattr(export, "convergence_png", lambda curves, path, **_: path)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg
